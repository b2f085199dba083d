//! Kernel WireGuard configuration over generic netlink (the `wireguard`
//! genl family), as flannel's wgctrl calls send it: [`WgSet`] is one
//! `WG_CMD_SET_DEVICE` request (`wg set DEV ...`), built into its message by
//! the pure [`WgSet::message`], shared by the real client ([`WgNetlink`]) and
//! the unit tests; [`super::FakeNetlink`] records it as [`super::Op::WgSet`].
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
use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use tokio::sync::OnceCell;

use super::{NetlinkError, WgClient};

/// One peer in a [`WgSet`] (`wg set DEV peer KEY ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One `WG_CMD_SET_DEVICE` request on the device named `ifname`.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
