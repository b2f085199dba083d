//! The `ipsec` backend (fl:pkg/backend/ipsec, spec §2.5, checklist 24):
//! per peer three XFRM policies, ESP in tunnel mode between the public IPs,
//! reqid 11, exactly as flannel's `AddXFRMPolicy` installs them:
//! `out` (local subnet → peer subnet, tmpl local → peer), `in` and `fwd`
//! (peer subnet → local subnet, tmpl peer → local). No devices, no routes.
//! `FLANNEL_MTU` is ext − 77 (− 85 with UDPEncap).
//!
//! **Design choice: XFRM is programmed directly over netlink, not through
//! strongSwan.** flannel starts `charon` and loads the PSK and one IKEv2
//! connection per peer over VICI; charon then negotiates the SAs. weft does
//! not ship or drive charon (none is installed here, and a VICI client is a
//! sizeable protocol of its own), so weft owns the *policies* and leaves the
//! *SAs* to an IKE daemon configured with flannel's connection layout
//! (`<localPub>-<localSubnet>-<remoteSubnet>-<remotePub>`, reqid 11,
//! `install_policy = no`). What works today: validation of the options
//! (PSK ≥ 96 characters), the lease, the exact policies, their removal and
//! their reconciliation. What does not: key exchange — without an IKE daemon
//! the kernel holds traffic matching the policies (ACQUIRE) and nothing
//! flows. On a kernel without ESP (this machine) start-up fails clearly
//! before anything is installed (see [`super::probe`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net};

use super::{Backend, BackendError};
use crate::config::backend::IpsecOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{XfrmClient, XfrmDir, XfrmPolicy};

/// flannel's reqid for every policy template.
pub const REQID: u32 = 11;

/// See the module docs.
#[derive(Debug)]
pub struct Ipsec {
    opts: IpsecOptions,
    xfrm: Arc<dyn XfrmClient>,
    ext: Option<ExternalInterface>,
    own: Option<(Ipv4Net, IpAddr)>,
    peers: BTreeMap<Ipv4Net, [XfrmPolicy; 3]>,
}

impl Ipsec {
    /// An ipsec backend.
    pub fn new(opts: IpsecOptions, xfrm: Arc<dyn XfrmClient>) -> Ipsec {
        Ipsec {
            opts,
            xfrm,
            ext: None,
            own: None,
            peers: BTreeMap::new(),
        }
    }

    /// flannel's three policies between this node and a peer.
    pub fn policies(
        local: Ipv4Net,
        local_pub: IpAddr,
        remote: Ipv4Net,
        remote_pub: IpAddr,
    ) -> [XfrmPolicy; 3] {
        let pol = |src: Ipv4Net, dst: Ipv4Net, tsrc, tdst, dir| XfrmPolicy {
            src: IpNet::V4(src),
            dst: IpNet::V4(dst),
            dir,
            tmpl_src: tsrc,
            tmpl_dst: tdst,
            reqid: REQID,
        };
        [
            pol(local, remote, local_pub, remote_pub, XfrmDir::Out),
            pol(remote, local, remote_pub, local_pub, XfrmDir::In),
            pol(remote, local, remote_pub, local_pub, XfrmDir::Fwd),
        ]
    }
}

#[async_trait]
impl Backend for Ipsec {
    fn name(&self) -> &'static str {
        "ipsec"
    }

    fn dataplane(&self) -> &'static str {
        "kernel"
    }

    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        tracing::info!(
            "IPSec config: UDPEncap={} ESPProposal={}",
            self.opts.udp_encap,
            self.opts.esp_proposal
        );
        self.ext = Some(ext.clone());
        let public_ip = ext
            .ext_addr
            .ok_or_else(|| BackendError::Config("ipsec: no IPv4 public address".into()))?;
        Ok(LeaseAttrs {
            public_ip,
            backend_type: "ipsec".into(),
            ..Default::default()
        })
    }

    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError> {
        let ext = self
            .ext
            .as_ref()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))?;
        let sn = lease
            .subnet
            .ok_or_else(|| BackendError::Config("ipsec backend needs an IPv4 lease".into()))?;
        self.own = Some((sn, IpAddr::V4(lease.attrs.public_ip)));
        tracing::warn!(
            "ipsec: weft installs flannel's XFRM policies but runs no IKE daemon; SAs must come from one (see the backend docs)"
        );
        Ok(ext
            .iface
            .mtu
            .saturating_sub(if self.opts.udp_encap { 85 } else { 77 }))
    }

    async fn apply(&mut self, change: &Change) -> Result<(), BackendError> {
        let Some((local, local_pub)) = self.own else {
            return Ok(());
        };
        match change {
            Change::Add(l) => {
                if l.attrs.backend_type != "ipsec" {
                    tracing::warn!("Ignoring non-ipsec subnet: type={}", l.attrs.backend_type);
                    return Ok(());
                }
                let Some(remote) = l.subnet else {
                    return Ok(());
                };
                let ps = Ipsec::policies(local, local_pub, remote, IpAddr::V4(l.attrs.public_ip));
                if let Some(old) = self.peers.insert(remote, ps.clone())
                    && old != ps
                {
                    for p in &old {
                        let _ = self.xfrm.policy_del(p).await;
                    }
                }
                for p in &ps {
                    self.xfrm.policy_update(p).await?;
                }
            }
            Change::Remove(l) => {
                let Some(remote) = l.subnet else {
                    return Ok(());
                };
                if let Some(ps) = self.peers.remove(&remote) {
                    for p in &ps {
                        if let Err(e) = self.xfrm.policy_del(p).await {
                            tracing::error!("error deleting xfrm policy {p}: {e}");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        for p in self.peers.values().flatten() {
            if !self.xfrm.policy_exists(p).await? {
                self.xfrm.policy_update(p).await?;
                tracing::info!("XFRM policy recovered: {p}");
            }
        }
        Ok(())
    }

    async fn teardown(&mut self) {}

    async fn remove_all(&mut self) {
        for p in std::mem::take(&mut self.peers).into_values().flatten() {
            let _ = self.xfrm.policy_del(&p).await;
        }
    }
}
