//! The traits the kernel backends program through (real: [`super::Netlink`],
//! [`super::XfrmNetlink`]; test double: [`super::FakeNetlink`]).

use std::net::IpAddr;

use async_trait::async_trait;
use ipnet::IpNet;

use super::{
    Addr, Fdb, LinkDetail, LinkSpec, Neigh, NetlinkError, Route, WgDevice, WgSet, XfrmPolicy,
    XfrmSa,
};

/// Links, addresses, routes, neighbours and fdb entries in one network
/// namespace. Every method mirrors one `ip` / `bridge` command.
#[async_trait]
pub trait Client: Send + Sync + std::fmt::Debug {
    /// `ip -d link show dev NAME`; `None` if there is no such link.
    async fn link_detail(&self, name: &str) -> Result<Option<LinkDetail>, NetlinkError>;

    /// `ip link add ...` (fails with EEXIST if the name is taken).
    async fn add_link(&self, spec: &LinkSpec) -> Result<(), NetlinkError>;

    /// `ip link del dev INDEX`.
    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError>;

    /// `ip link set dev INDEX [mtu MTU] up`.
    async fn link_up(&self, index: u32, mtu: Option<u32>) -> Result<(), NetlinkError>;

    /// `ip addr show dev INDEX`.
    async fn addrs_on(&self, index: u32) -> Result<Vec<Addr>, NetlinkError>;

    /// `ip addr replace NET dev INDEX`.
    async fn add_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError>;

    /// `ip addr del NET dev INDEX`.
    async fn remove_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError>;

    /// `ip route replace ...`.
    async fn route_replace(&self, r: &Route) -> Result<(), NetlinkError>;

    /// `ip route del ...`; a missing route is not an error.
    async fn route_del(&self, r: &Route) -> Result<(), NetlinkError>;

    /// `ip route show exact DST` (main table).
    async fn routes_exact(&self, dst: IpNet) -> Result<Vec<Route>, NetlinkError>;

    /// `ip [-6] route show table main`: one dump, for checks over many routes.
    async fn routes_main(&self, v6: bool) -> Result<Vec<Route>, NetlinkError>;

    /// `ip route get IP`: the route(s) the kernel would use.
    async fn route_get(&self, ip: IpAddr) -> Result<Vec<Route>, NetlinkError>;

    /// `ip [-6] route show table main type blackhole`: each route's
    /// destination and metric.
    async fn blackholes(&self, v6: bool) -> Result<Vec<(IpNet, u32)>, NetlinkError>;

    /// `ip route add blackhole DST metric METRIC` (main table).
    async fn blackhole_add(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError>;

    /// `ip route del blackhole DST metric METRIC`; a missing route is not an error.
    async fn blackhole_del(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError>;

    /// `ip neigh replace IP lladdr MAC dev INDEX nud permanent`.
    async fn neigh_replace(&self, n: &Neigh) -> Result<(), NetlinkError>;

    /// `ip neigh del IP dev INDEX`; a missing entry is not an error.
    async fn neigh_del(&self, n: &Neigh) -> Result<(), NetlinkError>;

    /// `ip neigh show dev INDEX nud permanent`.
    async fn neighs(&self, index: u32) -> Result<Vec<Neigh>, NetlinkError>;

    /// `bridge fdb replace MAC dev INDEX dst DST self permanent`.
    async fn fdb_replace(&self, f: &Fdb) -> Result<(), NetlinkError>;

    /// `bridge fdb del MAC dev INDEX dst DST self`; a missing entry is not an error.
    async fn fdb_del(&self, f: &Fdb) -> Result<(), NetlinkError>;

    /// `bridge fdb show dev INDEX` (entries with a remote destination).
    async fn fdbs(&self, index: u32) -> Result<Vec<Fdb>, NetlinkError>;

    /// `sysctl -w KEY=VALUE`, where `key` is the path under /proc/sys
    /// (e.g. `net/ipv6/conf/flannel.1/accept_ra`).
    async fn sysctl(&self, key: &str, value: &str) -> Result<(), NetlinkError>;

    /// `sysctl -n KEY` (`key` as for [`Client::sysctl`]), trimmed.
    async fn sysctl_read(&self, key: &str) -> Result<String, NetlinkError>;

    /// `ethtool -k DEV`'s feature `name` (e.g. `tx-udp_tnl-segmentation`):
    /// whether it is on; `None` when the kernel has no feature of that name.
    async fn ethtool_feature(&self, dev: &str, name: &str) -> Result<Option<bool>, NetlinkError>;

    /// `ethtool -K DEV tx on|off` (every transmit checksum offload of the
    /// device); returns whether that changed it.
    async fn set_tx_checksum(&self, dev: &str, on: bool) -> Result<bool, NetlinkError>;
}

/// IPsec policies, the kernel's SAs (read only) and the ESP capability probe.
#[async_trait]
pub trait XfrmClient: Send + Sync + std::fmt::Debug {
    /// `ip xfrm policy update ...` (adds or replaces).
    async fn policy_update(&self, p: &XfrmPolicy) -> Result<(), NetlinkError>;

    /// `ip xfrm policy delete ...`; a missing policy is not an error.
    async fn policy_del(&self, p: &XfrmPolicy) -> Result<(), NetlinkError>;

    /// `ip xfrm policy get ...`: whether this policy is installed.
    async fn policy_exists(&self, p: &XfrmPolicy) -> Result<bool, NetlinkError>;

    /// Whether the kernel can hold ESP states (adds and removes a throwaway
    /// SA between two loopback addresses).
    async fn esp_supported(&self) -> Result<bool, NetlinkError>;

    /// `ip xfrm state list` (ESP only): one `XFRM_MSG_GETSA` dump.
    async fn states(&self) -> Result<Vec<XfrmSa>, NetlinkError>;
}

/// Kernel WireGuard devices over generic netlink (`wg set`).
#[async_trait]
pub trait WgClient: Send + Sync + std::fmt::Debug {
    /// `wg set DEV ...`: one `WG_CMD_SET_DEVICE` request.
    async fn wg_set(&self, set: &WgSet) -> Result<(), NetlinkError>;

    /// `wg show DEV`: one `WG_CMD_GET_DEVICE` dump (ENODEV: no such device).
    async fn wg_get(&self, ifname: &str) -> Result<WgDevice, NetlinkError>;
}
