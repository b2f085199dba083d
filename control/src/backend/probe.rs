//! Kernel capability probing: can this kernel run a backend's kernel path?
//!
//! Link kinds (vxlan, ipip, wireguard) are probed the way the backend would
//! use them: by creating a throwaway, never-up link of that kind
//! (`weftprobe-*`) and deleting it at once. A kernel without the driver
//! answers EOPNOTSUPP (after trying to load the module), which also covers
//! built-in drivers and module autoloading that `/proc/modules` would miss.
//! ESP is probed by adding and removing a throwaway SA between two loopback
//! addresses (see [`XfrmClient::esp_supported`]). Nothing probed is ever up,
//! so no traffic or socket is affected.

use std::net::{IpAddr, Ipv4Addr};

use crate::netlink::{
    Client, IpipLink, LinkSpec, NetlinkError, VxlanLink, WireguardLink, XfrmClient,
};

/// A kernel feature a backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// The vxlan driver.
    Vxlan,
    /// The ipip driver.
    Ipip,
    /// The wireguard driver.
    Wireguard,
    /// ESP (XFRM states).
    Esp,
}

impl Capability {
    /// What to tell the operator is missing.
    pub fn module(self) -> &'static str {
        match self {
            Capability::Vxlan => "vxlan",
            Capability::Ipip => "ipip",
            Capability::Wireguard => "wireguard",
            Capability::Esp => "esp4 (CONFIG_INET_ESP)",
        }
    }

    fn probe_link(self) -> Option<LinkSpec> {
        Some(match self {
            Capability::Vxlan => LinkSpec::Vxlan(VxlanLink {
                name: "weftprobe-vx".into(),
                vni: 0x00ff_fff0,
                vtep_index: 0,
                local: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 0,
                learning: false,
                gbp: false,
                mtu: 1280,
                mac: [0x02, 0x77, 0x65, 0x66, 0x74, 0x01],
            }),
            Capability::Ipip => LinkSpec::Ipip(IpipLink {
                name: "weftprobe-ip".into(),
                local: Ipv4Addr::new(127, 0, 0, 253),
            }),
            Capability::Wireguard => LinkSpec::Wireguard(WireguardLink {
                name: "weftprobe-wg".into(),
                mtu: 1280,
            }),
            Capability::Esp => return None,
        })
    }
}

/// Whether the kernel has `cap`. Errors other than "not supported" are
/// returned (e.g. EPERM without CAP_NET_ADMIN).
pub async fn kernel_has(
    cap: Capability,
    nl: &dyn Client,
    xfrm: &dyn XfrmClient,
) -> Result<bool, NetlinkError> {
    let Some(spec) = cap.probe_link() else {
        return xfrm.esp_supported().await;
    };
    // A leftover from a crashed probe goes first.
    if let Some(d) = nl.link_detail(spec.name()).await? {
        nl.delete_link(d.link.index).await?;
    }
    match nl.add_link(&spec).await {
        Ok(()) => {
            if let Some(d) = nl.link_detail(spec.name()).await? {
                nl.delete_link(d.link.index).await?;
            }
            Ok(true)
        }
        Err(e) if e.is_unsupported() => {
            tracing::debug!("probe {}: {e}", cap.module());
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
