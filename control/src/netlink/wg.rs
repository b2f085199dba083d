//! Kernel WireGuard configuration over generic netlink (the `wireguard`
//! genl family), as flannel's wgctrl calls send it: [`WgSet`] is one
//! `WG_CMD_SET_DEVICE` request (`wg set DEV ...`), built into its message by
//! the pure [`WgSet::message`], shared by the real client ([`WgNetlink`]) and
//! the unit tests; [`super::FakeNetlink`] records it as [`super::Op::WgSet`].
//! [`WgDevice`] is what a `WG_CMD_GET_DEVICE` dump answers (`wg show DEV`),
//! parsed from the answer messages by the pure [`WgDevice::from_messages`].
//!
//! wgctrl (and so flannel) sends, per `ConfigureDevice`: `IFNAME`, then
//! `PRIVATE_KEY` and `LISTEN_PORT` when set, `FLAGS` = REPLACE_PEERS when
//! asked, and per peer `PUBLIC_KEY`, `FLAGS` (REMOVE_ME /
//! REPLACE_ALLOWEDIPS), `PRESHARED_KEY`, `ENDPOINT`,
//! `PERSISTENT_KEEPALIVE_INTERVAL` when set, and `ALLOWEDIPS` (family,
//! address, cidr). The kernel takes attributes in any order.

use std::net::SocketAddr;

use async_trait::async_trait;
use futures::StreamExt;
use ipnet::IpNet;
use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardDeviceFlags, WireguardMessage, WireguardPeer, WireguardPeerAttribute,
    WireguardPeerFlags,
};
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use tokio::sync::OnceCell;

use super::{NetlinkError, WgClient};

/// One peer in a [`WgSet`] (`wg set DEV peer KEY ...`); `Debug` hides the PSK.
#[derive(Clone, PartialEq, Eq)]
pub struct WgPeerSet {
    /// The peer's public key.
    pub public_key: [u8; 32],
    /// `remove`: drop the peer (everything else is ignored).
    pub remove: bool,
    /// `preshared-key`.
    pub psk: Option<[u8; 32]>,
    /// `endpoint`.
    pub endpoint: Option<SocketAddr>,
    /// `persistent-keepalive` in seconds (`Some(0)` turns it off).
    pub keepalive: Option<u16>,
    /// `allowed-ips`, replacing the peer's current ones.
    pub allowed_ips: Vec<IpNet>,
}

impl std::fmt::Debug for WgPeerSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgPeerSet")
            .field(
                "public_key",
                &weft_engine::wg::key_to_base64(&self.public_key),
            )
            .field("remove", &self.remove)
            .field("psk", &crate::secret::redacted(&self.psk))
            .field("endpoint", &self.endpoint)
            .field("keepalive", &self.keepalive)
            .field("allowed_ips", &self.allowed_ips)
            .finish()
    }
}

impl WgPeerSet {
    /// A request removing the peer with `public_key`.
    pub fn removal(public_key: [u8; 32]) -> WgPeerSet {
        WgPeerSet {
            public_key,
            remove: true,
            psk: None,
            endpoint: None,
            keepalive: None,
            allowed_ips: Vec::new(),
        }
    }

    fn attributes(&self) -> Vec<WireguardPeerAttribute> {
        let mut a = vec![WireguardPeerAttribute::PublicKey(self.public_key)];
        if self.remove {
            a.push(WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe));
            return a;
        }
        a.push(WireguardPeerAttribute::Flags(
            WireguardPeerFlags::ReplaceAllowedIps,
        ));
        if let Some(k) = self.psk {
            a.push(WireguardPeerAttribute::PresharedKey(k));
        }
        if let Some(e) = self.endpoint {
            a.push(WireguardPeerAttribute::Endpoint(e));
        }
        if let Some(k) = self.keepalive {
            a.push(WireguardPeerAttribute::PersistentKeepalive(k));
        }
        let ips = self
            .allowed_ips
            .iter()
            .map(|n| {
                let family = match n {
                    IpNet::V4(_) => WireguardAddressFamily::Ipv4,
                    IpNet::V6(_) => WireguardAddressFamily::Ipv6,
                };
                WireguardAllowedIp(vec![
                    WireguardAllowedIpAttr::Family(family),
                    WireguardAllowedIpAttr::IpAddr(n.network()),
                    WireguardAllowedIpAttr::Cidr(n.prefix_len()),
                ])
            })
            .collect();
        a.push(WireguardPeerAttribute::AllowedIps(ips));
        a
    }
}

/// One `WG_CMD_SET_DEVICE` request on the device named `ifname`; `Debug`
/// hides the private key.
#[derive(Clone, PartialEq, Eq)]
pub struct WgSet {
    /// The wireguard link's name.
    pub ifname: String,
    /// `private-key`.
    pub private_key: Option<[u8; 32]>,
    /// `listen-port`.
    pub listen_port: Option<u16>,
    /// Drop every peer not in `peers` (wgctrl's `ReplacePeers`).
    pub replace_peers: bool,
    /// Peers to add, update or remove.
    pub peers: Vec<WgPeerSet>,
}

impl std::fmt::Debug for WgSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgSet")
            .field("ifname", &self.ifname)
            .field("private_key", &crate::secret::redacted(&self.private_key))
            .field("listen_port", &self.listen_port)
            .field("replace_peers", &self.replace_peers)
            .field("peers", &self.peers)
            .finish()
    }
}

impl WgSet {
    /// The generic netlink payload (the family id is resolved when sent).
    pub fn message(&self) -> WireguardMessage {
        let mut attributes = vec![WireguardAttribute::IfName(self.ifname.clone())];
        if let Some(k) = self.private_key {
            attributes.push(WireguardAttribute::PrivateKey(k));
        }
        if let Some(p) = self.listen_port {
            attributes.push(WireguardAttribute::ListenPort(p));
        }
        if self.replace_peers {
            attributes.push(WireguardAttribute::Flags(
                WireguardDeviceFlags::ReplacePeers,
            ));
        }
        if !self.peers.is_empty() {
            let peers = self
                .peers
                .iter()
                .map(|p| WireguardPeer(p.attributes()))
                .collect();
            attributes.push(WireguardAttribute::Peers(peers));
        }
        WireguardMessage {
            cmd: WireguardCmd::SetDevice,
            attributes,
        }
    }

    /// `wg set ...` as logged (keys are not shown).
    pub fn describe(&self) -> String {
        format!(
            "wg set {} ({} peers{})",
            self.ifname,
            self.peers.len(),
            if self.replace_peers {
                ", replace-peers"
            } else {
                ""
            }
        )
    }
}

/// One peer as the kernel reports it (`wg show DEV`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeer {
    /// The peer's public key.
    pub public_key: [u8; 32],
    /// The current endpoint (roams with the peer's packets).
    pub endpoint: Option<SocketAddr>,
    /// `persistent-keepalive` in seconds (0: off).
    pub keepalive: u16,
    /// `allowed-ips`.
    pub allowed_ips: Vec<IpNet>,
}

/// A device's state from one `WG_CMD_GET_DEVICE` dump (`wg show DEV`;
/// private and preshared keys are not kept).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WgDevice {
    /// `listen-port`.
    pub listen_port: u16,
    /// The peers, in the kernel's order.
    pub peers: Vec<WgPeer>,
}

impl WgDevice {
    /// The `WG_CMD_GET_DEVICE` dump request for `ifname`.
    pub fn request(ifname: &str) -> WireguardMessage {
        WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::IfName(ifname.into())],
        }
    }

    /// The device from the dump's answers: the kernel splits a big device
    /// over several messages, continuing a peer (same key) with more
    /// allowed-ips in the next one.
    pub fn from_messages(msgs: &[WireguardMessage]) -> WgDevice {
        let mut dev = WgDevice::default();
        for m in msgs {
            for a in &m.attributes {
                match a {
                    WireguardAttribute::ListenPort(p) => dev.listen_port = *p,
                    WireguardAttribute::Peers(peers) => {
                        for p in peers {
                            dev.merge_peer(&p.0);
                        }
                    }
                    _ => {}
                }
            }
        }
        dev
    }

    fn merge_peer(&mut self, attrs: &[WireguardPeerAttribute]) {
        let Some(key) = attrs.iter().find_map(|a| match a {
            WireguardPeerAttribute::PublicKey(k) => Some(*k),
            _ => None,
        }) else {
            return;
        };
        let i = match self.peers.iter().position(|p| p.public_key == key) {
            Some(i) => i,
            None => {
                self.peers.push(WgPeer {
                    public_key: key,
                    endpoint: None,
                    keepalive: 0,
                    allowed_ips: Vec::new(),
                });
                self.peers.len() - 1
            }
        };
        let peer = &mut self.peers[i];
        for a in attrs {
            match a {
                WireguardPeerAttribute::Endpoint(e) => peer.endpoint = Some(*e),
                WireguardPeerAttribute::PersistentKeepalive(k) => peer.keepalive = *k,
                WireguardPeerAttribute::AllowedIps(ips) => {
                    for ip in ips {
                        let (mut addr, mut cidr) = (None, None);
                        for x in &ip.0 {
                            match x {
                                WireguardAllowedIpAttr::IpAddr(a) => addr = Some(*a),
                                WireguardAllowedIpAttr::Cidr(c) => cidr = Some(*c),
                                _ => {}
                            }
                        }
                        if let (Some(a), Some(c)) = (addr, cidr)
                            && let Ok(n) = IpNet::new(a, c)
                        {
                            peer.allowed_ips.push(n);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The peer with `key`.
    pub fn peer(&self, key: &[u8; 32]) -> Option<&WgPeer> {
        self.peers.iter().find(|p| p.public_key == *key)
    }
}

/// The real [`WgClient`]: a NETLINK_GENERIC socket opened on first use.
#[derive(Debug, Clone, Default)]
pub struct WgNetlink {
    handle: std::sync::Arc<OnceCell<genetlink::GenetlinkHandle>>,
}

impl WgNetlink {
    /// A client; the socket opens on first use (inside a tokio runtime).
    pub fn new() -> WgNetlink {
        WgNetlink::default()
    }

    async fn handle(&self) -> Result<genetlink::GenetlinkHandle, NetlinkError> {
        self.handle
            .get_or_try_init(|| async {
                let (conn, handle, _) =
                    genetlink::new_connection().map_err(NetlinkError::Connect)?;
                tokio::spawn(conn);
                Ok(handle)
            })
            .await
            .cloned()
    }
}

/// A genetlink failure as a [`NetlinkError`] (errno kept when the kernel gave one).
fn genl_err(op: &str, e: genetlink::GenetlinkError) -> NetlinkError {
    match e {
        genetlink::GenetlinkError::NetlinkError(io) => match io.raw_os_error() {
            Some(errno) => NetlinkError::Errno {
                op: op.to_string(),
                errno,
            },
            None => NetlinkError::Genl {
                op: op.to_string(),
                msg: io.to_string(),
            },
        },
        // The family lookup fails this way when the wireguard module is absent.
        genetlink::GenetlinkError::AttributeNotFound(_) => NetlinkError::Errno {
            op: op.to_string(),
            errno: libc::ENOENT,
        },
        other => NetlinkError::Genl {
            op: op.to_string(),
            msg: other.to_string(),
        },
    }
}

#[async_trait]
impl WgClient for WgNetlink {
    async fn wg_set(&self, set: &WgSet) -> Result<(), NetlinkError> {
        let op = set.describe();
        let mut h = self.handle().await?;
        let mut msg = NetlinkMessage::from(GenlMessage::from_payload(set.message()));
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut answers = h.request(msg).await.map_err(|e| genl_err(&op, e))?;
        while let Some(answer) = answers.next().await {
            let answer = answer.map_err(|e| NetlinkError::Genl {
                op: op.clone(),
                msg: e.to_string(),
            })?;
            if let NetlinkPayload::Error(e) = answer.payload
                && let Some(code) = e.code
            {
                return Err(NetlinkError::Errno {
                    op,
                    errno: -code.get(),
                });
            }
        }
        Ok(())
    }

    async fn wg_get(&self, ifname: &str) -> Result<WgDevice, NetlinkError> {
        let op = format!("wg show {ifname}");
        let mut h = self.handle().await?;
        let mut msg = NetlinkMessage::from(GenlMessage::from_payload(WgDevice::request(ifname)));
        msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut answers = h.request(msg).await.map_err(|e| genl_err(&op, e))?;
        let mut msgs = Vec::new();
        while let Some(answer) = answers.next().await {
            let answer = answer.map_err(|e| NetlinkError::Genl {
                op: op.clone(),
                msg: e.to_string(),
            })?;
            match answer.payload {
                NetlinkPayload::InnerMessage(genl) => msgs.push(genl.payload),
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(NetlinkError::Errno {
                            op,
                            errno: -code.get(),
                        });
                    }
                }
                _ => {}
            }
        }
        Ok(WgDevice::from_messages(&msgs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key bytes never reach a log through `Debug` (issue 29).
    #[test]
    fn debug_hides_private_keys_and_psks() {
        let mut peer = WgPeerSet::removal([3; 32]);
        peer.psk = Some([0xab; 32]);
        let set = WgSet {
            ifname: "flannel-wg".into(),
            private_key: Some([0xcd; 32]),
            listen_port: Some(51820),
            replace_peers: true,
            peers: vec![peer],
        };
        let shown = format!("{set:?}");
        for secret in ["171", "205", "0xab", "0xcd"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert_eq!(shown.matches("<redacted>").count(), 2, "{shown}");
        assert!(
            shown.contains("AwMD"),
            "the public key stays visible: {shown}"
        );
    }

    fn allowed(n: IpNet) -> WireguardAllowedIp {
        WireguardAllowedIp(vec![
            WireguardAllowedIpAttr::Family(WireguardAddressFamily::Ipv4),
            WireguardAllowedIpAttr::IpAddr(n.network()),
            WireguardAllowedIpAttr::Cidr(n.prefix_len()),
        ])
    }

    /// A dump split over two messages (the second continues peer 2's
    /// allowed-ips) parses into one device with both peers whole.
    #[test]
    fn a_split_dump_parses_into_one_device() {
        let ep: SocketAddr = "192.0.2.2:51820".parse().expect("parse");
        let n = |s: &str| s.parse::<IpNet>().expect("peer");
        let first = WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![
                WireguardAttribute::IfName("flannel-wg".into()),
                WireguardAttribute::ListenPort(51820),
                WireguardAttribute::Peers(vec![
                    WireguardPeer(vec![
                        WireguardPeerAttribute::PublicKey([1; 32]),
                        WireguardPeerAttribute::Endpoint(ep),
                        WireguardPeerAttribute::PersistentKeepalive(25),
                        WireguardPeerAttribute::AllowedIps(vec![allowed(n("10.244.1.0/24"))]),
                    ]),
                    WireguardPeer(vec![
                        WireguardPeerAttribute::PublicKey([2; 32]),
                        WireguardPeerAttribute::AllowedIps(vec![allowed(n("10.244.2.0/24"))]),
                    ]),
                ]),
            ],
        };
        let second = WireguardMessage {
            cmd: WireguardCmd::GetDevice,
            attributes: vec![WireguardAttribute::Peers(vec![WireguardPeer(vec![
                WireguardPeerAttribute::PublicKey([2; 32]),
                WireguardPeerAttribute::AllowedIps(vec![allowed(n("10.245.2.0/24"))]),
            ])])],
        };
        let d = WgDevice::from_messages(&[first, second]);
        assert_eq!(d.listen_port, 51820);
        assert_eq!(d.peers.len(), 2);
        let p1 = d.peer(&[1; 32]).expect("peer");
        assert_eq!(
            (p1.endpoint, p1.keepalive, p1.allowed_ips.clone()),
            (Some(ep), 25, vec![n("10.244.1.0/24")])
        );
        let p2 = d.peer(&[2; 32]).expect("peer");
        assert_eq!(p2.endpoint, None);
        assert_eq!(p2.allowed_ips, vec![n("10.244.2.0/24"), n("10.245.2.0/24")]);
        assert_eq!(
            WgDevice::request("flannel-wg").attributes,
            vec![WireguardAttribute::IfName("flannel-wg".into())]
        );
    }

    /// Against the real kernel: this one has no wireguard module, so the genl
    /// family lookup fails and the error says "not supported" (what the
    /// probe and the backend rely on). With the module, the device is missing.
    #[tokio::test]
    async fn real_kernel_answers_a_set_request() {
        let set = WgSet {
            ifname: format!("wt-wgx{}", std::process::id() % 10_000),
            private_key: Some([1; 32]),
            listen_port: Some(0),
            replace_peers: true,
            peers: Vec::new(),
        };
        let e = WgNetlink::new()
            .wg_set(&set)
            .await
            .expect_err("no such device");
        eprintln!("kernel answered: {e}");
        let wireguard_loaded = std::path::Path::new("/sys/module/wireguard").exists();
        if wireguard_loaded {
            assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
        } else {
            assert!(e.is_unsupported(), "{e:?}");
        }
        assert!(
            e.to_string().starts_with(&format!("wg set {}", set.ifname)),
            "{e}"
        );
    }
}
