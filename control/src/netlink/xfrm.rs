//! IPsec (XFRM) policies as flannel's ipsec backend installs them
//! (fl:pkg/backend/ipsec/handle_xfrm.go): per peer an `out`, an `in` and a
//! `fwd` policy, ESP in tunnel mode between the two public IPs, reqid 11.
//! The SAs are charon's; weft only reads them back ([`XfrmSa`], one
//! `XFRM_MSG_GETSA` dump) to find a peer whose SAs were deleted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;
use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_xfrm::{
    IPPROTO_ESP, UserTemplate, XFRM_MODE_TUNNEL, XFRM_POLICY_ALLOW, XFRM_POLICY_FWD,
    XFRM_POLICY_IN, XFRM_POLICY_OUT,
};
use tokio::sync::OnceCell;

use super::{NetlinkError, XfrmClient};

/// A policy direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum XfrmDir {
    /// `dir out`.
    Out,
    /// `dir in`.
    In,
    /// `dir fwd`.
    Fwd,
}

impl XfrmDir {
    /// The kernel's `XFRM_POLICY_*` value.
    pub fn raw(self) -> u8 {
        match self {
            XfrmDir::Out => XFRM_POLICY_OUT,
            XfrmDir::In => XFRM_POLICY_IN,
            XfrmDir::Fwd => XFRM_POLICY_FWD,
        }
    }
}

/// `ip xfrm policy update src SRC dst DST dir DIR tmpl src TSRC dst TDST
/// proto esp reqid REQID mode tunnel` (action allow, priority 0).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct XfrmPolicy {
    /// Selector source prefix.
    pub src: IpNet,
    /// Selector destination prefix.
    pub dst: IpNet,
    /// Direction.
    pub dir: XfrmDir,
    /// Template (tunnel) source.
    pub tmpl_src: IpAddr,
    /// Template (tunnel) destination.
    pub tmpl_dst: IpAddr,
    /// Template reqid (flannel: 11).
    pub reqid: u32,
}

impl XfrmPolicy {
    /// The ESP tunnel-mode template (`proto` 50, `mode` 1).
    pub fn template(&self) -> UserTemplate {
        let mut t = UserTemplate::default();
        t.source(&self.tmpl_src);
        t.destination(&self.tmpl_dst);
        t.protocol(IPPROTO_ESP);
        t.mode(XFRM_MODE_TUNNEL);
        t.reqid(self.reqid);
        t
    }
}

impl std::fmt::Display for XfrmPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = match self.dir {
            XfrmDir::Out => "out",
            XfrmDir::In => "in",
            XfrmDir::Fwd => "fwd",
        };
        write!(
            f,
            "src {} dst {} dir {dir} tmpl src {} dst {} proto esp reqid {} mode tunnel",
            self.src, self.dst, self.tmpl_src, self.tmpl_dst, self.reqid
        )
    }
}

/// One SA as `ip xfrm state list` shows it (the fields reconciliation needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct XfrmSa {
    /// Outer source.
    pub src: IpAddr,
    /// Outer destination.
    pub dst: IpAddr,
    /// SPI (host order).
    pub spi: u32,
    /// reqid.
    pub reqid: u32,
}

impl XfrmSa {
    /// The ESP SA in one `XFRM_MSG_NEWSA` dump answer (`None`: another protocol).
    pub fn from_message(m: &netlink_packet_xfrm::state::ModifyMessage) -> Option<XfrmSa> {
        let i = &m.user_sa_info;
        if i.id.proto != IPPROTO_ESP {
            return None;
        }
        let ip = |a: &netlink_packet_xfrm::Address| -> Option<IpAddr> {
            match i32::from(i.family) {
                libc::AF_INET => Some(IpAddr::V4(a.to_ipv4())),
                libc::AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(a.addr))),
                _ => None,
            }
        };
        Some(XfrmSa {
            src: ip(&i.saddr)?,
            dst: ip(&i.id.daddr)?,
            spi: i.id.spi,
            reqid: i.reqid,
        })
    }
}

/// The real [`XfrmClient`]: a NETLINK_XFRM socket opened on first use.
#[derive(Debug, Clone, Default)]
pub struct XfrmNetlink {
    handle: std::sync::Arc<OnceCell<xfrmnetlink::Handle>>,
}

impl XfrmNetlink {
    /// A client; the socket opens on first use (inside a tokio runtime).
    pub fn new() -> XfrmNetlink {
        XfrmNetlink::default()
    }

    async fn handle(&self) -> Result<xfrmnetlink::Handle, NetlinkError> {
        self.handle
            .get_or_try_init(|| async {
                let (conn, handle, _) =
                    xfrmnetlink::new_connection().map_err(NetlinkError::Connect)?;
                tokio::spawn(conn);
                Ok(handle)
            })
            .await
            .cloned()
    }
}

fn xerr(op: String) -> impl FnOnce(xfrmnetlink::Error) -> NetlinkError {
    move |source| NetlinkError::Xfrm {
        op,
        source: Box::new(source),
    }
}

#[async_trait]
impl XfrmClient for XfrmNetlink {
    async fn policy_update(&self, p: &XfrmPolicy) -> Result<(), NetlinkError> {
        self.handle()
            .await?
            .policy()
            .update(
                p.src.addr(),
                p.src.prefix_len(),
                p.dst.addr(),
                p.dst.prefix_len(),
            )
            .direction(p.dir.raw())
            .action(XFRM_POLICY_ALLOW)
            .add_template(p.template())
            .execute()
            .await
            .map_err(xerr(format!("ip xfrm policy update {p}")))
    }

    async fn policy_del(&self, p: &XfrmPolicy) -> Result<(), NetlinkError> {
        let res = self
            .handle()
            .await?
            .policy()
            .delete(
                p.src.addr(),
                p.src.prefix_len(),
                p.dst.addr(),
                p.dst.prefix_len(),
            )
            .direction(p.dir.raw())
            .execute()
            .await
            .map_err(xerr(format!("ip xfrm policy delete {p}")));
        match res {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    async fn policy_exists(&self, p: &XfrmPolicy) -> Result<bool, NetlinkError> {
        let res: Result<Vec<_>, _> = self
            .handle()
            .await?
            .policy()
            .get(
                p.src.addr(),
                p.src.prefix_len(),
                p.dst.addr(),
                p.dst.prefix_len(),
            )
            .direction(p.dir.raw())
            .execute()
            .try_collect()
            .await;
        match res.map_err(xerr(format!("ip xfrm policy get {p}"))) {
            Ok(v) => Ok(!v.is_empty()),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn esp_supported(&self) -> Result<bool, NetlinkError> {
        // A throwaway SA between two loopback addresses with a fixed,
        // unlikely SPI; removed again at once when the kernel accepts it.
        let (src, dst) = (
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        );
        let spi = 0x7765_6674; // "weft"
        let h = self.handle().await?;
        let key = vec![0u8; 20];
        let add = h
            .state()
            .add(src, dst)
            .protocol(IPPROTO_ESP)
            .spi(spi)
            .mode(XFRM_MODE_TUNNEL)
            .reqid(0)
            .encryption_aead(xfrmnetlink::ENC_AEAD_ALG_AES_GCM, &key, 128)
            .map_err(xerr("ip xfrm state add (probe)".into()))?;
        match add
            .execute()
            .await
            .map_err(xerr("ip xfrm state add (probe)".into()))
        {
            Ok(()) => {
                let _ = h
                    .state()
                    .delete(src, dst)
                    .protocol(IPPROTO_ESP)
                    .spi(spi)
                    .execute()
                    .await;
                Ok(true)
            }
            Err(e) if e.is_unsupported() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn states(&self) -> Result<Vec<XfrmSa>, NetlinkError> {
        let msgs: Vec<_> = self
            .handle()
            .await?
            .state()
            .get_dump()
            .execute()
            .try_collect()
            .await
            .map_err(xerr("ip xfrm state list".into()))?;
        Ok(msgs.iter().filter_map(XfrmSa::from_message).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_xfrm::state::ModifyMessage;

    #[test]
    fn an_esp_sa_is_read_from_its_dump_answer() {
        let mut m = ModifyMessage::default();
        let (src, dst): (IpAddr, IpAddr) = (
            "192.0.2.1".parse().expect("ip"),
            "192.0.2.2".parse().expect("ip"),
        );
        m.user_sa_info.source(&src);
        m.user_sa_info.destination(&dst);
        m.user_sa_info.id.proto = IPPROTO_ESP;
        m.user_sa_info.id.spi = 0xc0ff_ee01;
        m.user_sa_info.reqid = 11;
        assert_eq!(
            XfrmSa::from_message(&m),
            Some(XfrmSa {
                src,
                dst,
                spi: 0xc0ff_ee01,
                reqid: 11
            })
        );
        m.user_sa_info.id.proto = 51; // AH
        assert_eq!(XfrmSa::from_message(&m), None);
    }
}
