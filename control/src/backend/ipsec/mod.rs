//! The `ipsec` backend (fl:pkg/backend/ipsec, spec §2.5, checklist 24).
//!
//! **Design: flannel's own — strongSwan charon negotiates, weft owns the
//! policies.** weft starts (or reuses) charon ([`charon`]) and
//! configures it over VICI ([`vici`]) with exactly the shared key and
//! connections flannel loads, and installs flannel's XFRM policies itself.
//! Why not program ESP SAs directly: a weft node must interoperate with
//! flannel ipsec nodes, which only speak IKEv2 through charon with these
//! connection names, proposals and PSK; keying, rekeying (1 h), DPD and
//! NAT-T are charon's job on both sides.
//!
//! Per node and peer (flannel's `handleSubnetEvents`):
//! - at setup: charon, then `load-shared` {type IKE, data PSK, owners [own PublicIP]};
//! - peer added: three XFRM policies, reqid 11, ESP tunnel between the public
//!   IPs: `out` (local subnet → peer subnet, tmpl local → peer), `in` and
//!   `fwd` (peer subnet → local subnet, tmpl peer → local); `load-shared`
//!   owners [peer PublicIP]; `load-conn` `<localPub>-<localSubnet>-<remoteSubnet>-<remotePub>`
//!   ([`connection`]: IKE `aes256-sha256-modp4096`, version 2, keyingtries 0,
//!   psk both ways, encap `true|false`; child `<localSubnet>-<remoteSubnet>`
//!   with the ESPProposal, start_action start, close_action trap,
//!   dpd_action restart, reqid 11, rekey_time 1h, mode tunnel, policies no).
//!   Empty `id`/`rekey_time` values are sent as flannel's Go VICI client
//!   sends them (charon reads them as `%any` and 0);
//! - peer removed: `unload-conn`, then the policies go (the key stays, as in flannel).
//! - reconciliation: missing policies are restored; connections charon no
//!   longer lists (`get-conns`, e.g. after a charon restart) are loaded again;
//!   a peer whose ESP SAs (`ip xfrm state`, either direction, reqid 11) are
//!   missing gets its child renewed over VICI: `rekey` child + ike (new SAs
//!   on both sides, the stale ones dropped; charon answers at once), and
//!   when charon has no such child, `initiate` (timeout −1: in the
//!   background): when the SAs were seen before (deleted by hand, a flush),
//!   at most once per [`REINITIATE_EVERY`]; when they were never seen, once,
//!   [`SA_SETTLE`] after the connection was loaded (they may have been
//!   deleted before a reconcile saw them); otherwise charon's own start and
//!   retries (keyingtries 0) are left alone. charon itself would not notice
//!   before the 1 h rekey (flannel has this gap).
//! - teardown stops charon if weft started it; policies stay, as in flannel.
//!
//! No devices, no routes. `FLANNEL_MTU` is ext − 77 (− 85 with UDPEncap).
//! On a kernel without ESP (this machine) [`crate::backend::dual`] refuses to start
//! with "no esp4 (CONFIG_INET_ESP) support" before anything is installed;
//! with ESP but charon missing, setup fails naming the searched paths.

pub mod charon;
pub mod vici;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net};

use crate::backend::Missing;
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, Observe, Prepared, Running, Setup,
};
use crate::config::backend::IpsecOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{XfrmClient, XfrmDir, XfrmPolicy};
use charon::{Charon, CharonError, DEFAULT_VICI, Launch};
use vici::{Section, Value, ViciError};

/// flannel's reqid for every policy template.
pub const REQID: u32 = 11;
/// flannel's IKE proposal.
pub const IKE_PROPOSAL: &str = "aes256-sha256-modp4096";
/// The least time between two renewals (`rekey`) of one peer's child.
pub const REINITIATE_EVERY: Duration = Duration::from_secs(60);
/// How long after loading a connection its SAs may take to appear.
pub const SA_SETTLE: Duration = Duration::from_secs(15);

/// What reconciliation knows about one peer's SAs.
#[derive(Debug, Clone, Copy)]
struct SaWatch {
    /// Its SAs were in the kernel at some reconcile.
    seen: bool,
    /// When its connection was loaded.
    loaded: std::time::Instant,
    /// When reconciliation last renewed its child.
    kicked: Option<std::time::Instant>,
}

impl SaWatch {
    fn new() -> SaWatch {
        SaWatch {
            seen: false,
            loaded: std::time::Instant::now(),
            kicked: None,
        }
    }
}

/// The IKE daemon as the backend uses it (real: [`CharonIke`]).
#[async_trait]
pub trait Ike: Send + std::fmt::Debug {
    /// Makes the daemon reachable (starting it if needed).
    async fn start(&mut self) -> Result<(), CharonError>;
    /// One VICI command answering `success = yes|no`; returns the answer.
    async fn call(&mut self, cmd: &str, args: Section) -> Result<Section, CharonError>;
    /// One VICI command whose answer has no `success` (e.g. `get-conns`).
    async fn query(&mut self, cmd: &str, args: Section) -> Result<Section, CharonError>;
    /// Stops the daemon if this node started it.
    async fn stop(&mut self);
}

/// [`Ike`] on a real charon.
#[derive(Debug)]
pub struct CharonIke {
    vici: PathBuf,
    launch: Option<Launch>,
    charon: Option<Charon>,
}

impl CharonIke {
    /// charon on `vici`, started with `launch` (`None`: found as flannel finds it).
    pub fn new(vici: PathBuf, launch: Option<Launch>) -> CharonIke {
        CharonIke {
            vici,
            launch,
            charon: None,
        }
    }
}

impl CharonIke {
    /// One command; when the socket is gone (charon died), charon is
    /// started again (or the new one reused) and the command retried once.
    /// The caller's reconciliation then finds the connections missing.
    async fn exchange(
        &mut self,
        cmd: &str,
        args: Section,
        checked: bool,
    ) -> Result<Section, CharonError> {
        let mut retried = false;
        loop {
            self.start().await?;
            let c = self
                .charon
                .as_ref()
                .ok_or_else(|| CharonError::Timeout(self.vici.clone()))?;
            let res = if checked {
                c.call(cmd, args.clone()).await
            } else {
                c.query(cmd, args.clone()).await
            };
            match res {
                Err(CharonError::Vici(ViciError::Io { .. })) if !retried => {
                    tracing::warn!(
                        "charon's VICI socket {} is gone; starting charon again",
                        self.vici.display()
                    );
                    self.stop().await;
                    retried = true;
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl Ike for CharonIke {
    async fn start(&mut self) -> Result<(), CharonError> {
        if self.charon.is_none() {
            let c =
                Charon::connect_or_start(&self.vici, self.launch.clone(), Duration::from_secs(30))
                    .await?;
            self.charon = Some(c);
        }
        Ok(())
    }

    async fn call(&mut self, cmd: &str, args: Section) -> Result<Section, CharonError> {
        self.exchange(cmd, args, true).await
    }

    async fn query(&mut self, cmd: &str, args: Section) -> Result<Section, CharonError> {
        self.exchange(cmd, args, false).await
    }

    async fn stop(&mut self) {
        if let Some(mut c) = self.charon.take() {
            c.stop().await;
        }
    }
}

/// `load-shared`: flannel's IKE key for `owner`.
pub fn shared_key(psk: &str, owner: IpAddr) -> Section {
    Section::new()
        .kv("type", "IKE")
        .kv("data", psk)
        .list("owners", &[&owner.to_string()])
}

/// flannel's connection name `<localPub>-<localSubnet>-<remoteSubnet>-<remotePub>`.
pub fn conn_name(local: Ipv4Net, local_pub: IpAddr, remote: Ipv4Net, remote_pub: IpAddr) -> String {
    format!("{local_pub}-{local}-{remote}-{remote_pub}")
}

/// `load-conn`: flannel's connection to a peer (see the module docs).
pub fn connection(
    local: Ipv4Net,
    local_pub: IpAddr,
    remote: Ipv4Net,
    remote_pub: IpAddr,
    esp: &str,
    encap: bool,
) -> Section {
    let (l, r, lp, rp) = (
        local.to_string(),
        remote.to_string(),
        local_pub.to_string(),
        remote_pub.to_string(),
    );
    let auth = || Section::new().kv("id", "").kv("auth", "psk");
    let child = Section::new()
        .list("local_ts", &[&l])
        .list("remote_ts", &[&r])
        .list("esp_proposals", &[esp])
        .kv("start_action", "start")
        .kv("close_action", "trap")
        .kv("dpd_action", "restart")
        .kv("reqid", &REQID.to_string())
        .kv("rekey_time", "1h")
        .kv("mode", "tunnel")
        .kv("policies", "no");
    let ike = Section::new()
        .list("local_addrs", &[&lp])
        .list("remote_addrs", &[&rp])
        .list("proposals", &[IKE_PROPOSAL])
        .kv("version", "2")
        .kv("encap", if encap { "true" } else { "false" })
        .kv("keyingtries", "0")
        .kv("rekey_time", "")
        .section("local", auth())
        .section("remote", auth())
        .section(
            "children",
            Section::new().section(&format!("{local}-{remote}"), child),
        );
    Section::new().section(&conn_name(local, local_pub, remote, remote_pub), ike)
}

/// What one peer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerState {
    public: IpAddr,
    policies: [XfrmPolicy; 3],
}

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct Ipsec {
    opts: IpsecOptions,
    xfrm: Arc<dyn XfrmClient>,
    ike: Box<dyn Ike>,
    /// [`SA_SETTLE`] (shorter in tests).
    sa_settle: Duration,
}

/// [`Ipsec`] with its lease attributes.
#[derive(Debug)]
struct Ready {
    ipsec: Ipsec,
    iface_mtu: u32,
}

/// [`Ipsec`] running: charon and the peers' policies.
#[derive(Debug)]
struct Live {
    opts: IpsecOptions,
    xfrm: Arc<dyn XfrmClient>,
    ike: Box<dyn Ike>,
    /// The own subnet and public address.
    own: (Ipv4Net, IpAddr),
    peers: BTreeMap<Ipv4Net, PeerState>,
    /// Per peer subnet: what reconciliation knows about its SAs.
    sa_watch: BTreeMap<Ipv4Net, SaWatch>,
    sa_settle: Duration,
    mtu: u32,
}

impl Ipsec {
    /// An ipsec backend talking to charon on flannel's socket.
    pub fn new(opts: IpsecOptions, xfrm: Arc<dyn XfrmClient>) -> Ipsec {
        let ike = Box::new(CharonIke::new(PathBuf::from(DEFAULT_VICI), None));
        Ipsec {
            opts,
            xfrm,
            ike,
            sa_settle: SA_SETTLE,
        }
    }

    /// Waits `d` instead of [`SA_SETTLE`] for a new connection's SAs (tests).
    pub fn with_sa_settle(mut self, d: Duration) -> Ipsec {
        self.sa_settle = d;
        self
    }

    /// Uses `ike` instead of charon on `/var/run/charon.vici`.
    pub fn with_ike(mut self, ike: Box<dyn Ike>) -> Ipsec {
        self.ike = ike;
        self
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

impl Live {
    /// Loads the peer's key and connection into charon.
    async fn load_peer(&mut self, remote: Ipv4Net, public: IpAddr) -> Result<(), BackendError> {
        let (local, local_pub) = self.own;
        self.ike
            .call("load-shared", shared_key(self.opts.psk.expose(), public))
            .await?;
        let conn = connection(
            local,
            local_pub,
            remote,
            public,
            &self.opts.esp_proposal,
            self.opts.udp_encap,
        );
        self.ike.call("load-conn", conn).await?;
        tracing::info!(
            "Loaded connection: {}",
            conn_name(local, local_pub, remote, public)
        );
        Ok(())
    }
}

impl Live {
    /// Renews the child of every peer whose SAs are missing from the
    /// kernel (see the module docs).
    async fn reconcile_sas(
        &mut self,
        local: Ipv4Net,
        local_pub: IpAddr,
    ) -> Result<(), BackendError> {
        let sas = self.xfrm.states().await?;
        let has = |src: IpAddr, dst: IpAddr| {
            sas.iter()
                .any(|sa| sa.src == src && sa.dst == dst && sa.reqid == REQID)
        };
        let now = std::time::Instant::now();
        let mut kick = Vec::new();
        for (remote, st) in &self.peers {
            let w = self.sa_watch.entry(*remote).or_insert_with(SaWatch::new);
            if has(local_pub, st.public) && has(st.public, local_pub) {
                w.seen = true;
                continue;
            }
            let due = if w.seen {
                w.kicked
                    .is_none_or(|t| now.duration_since(t) >= REINITIATE_EVERY)
            } else {
                w.kicked.is_none() && now.duration_since(w.loaded) >= self.sa_settle
            };
            if due {
                w.kicked = Some(now);
                kick.push((*remote, st.public));
            }
        }
        for (remote, public) in kick {
            let ike = conn_name(local, local_pub, remote, public);
            let child = format!("{local}-{remote}");
            tracing::warn!(
                "ESP SAs to {public} ({remote}) are gone from the kernel; rekeying CHILD_SA {child}"
            );
            let args = Section::new().kv("child", &child).kv("ike", &ike);
            if let Err(e) = self.ike.call("rekey", args.clone()).await {
                tracing::warn!("rekeying CHILD_SA {child} failed ({e}); initiating it");
                let args = args.kv("timeout", "-1");
                if let Err(e) = self.ike.call("initiate", args).await {
                    tracing::error!("error initiating CHILD_SA {child}: {e}");
                }
            }
        }
        Ok(())
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "ipsec"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }
}

#[async_trait]
impl Backend for Ipsec {
    fn name(&self) -> &'static str {
        "ipsec"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        tracing::info!(
            "IPSec config: UDPEncap={} ESPProposal={}",
            self.opts.udp_encap,
            self.opts.esp_proposal
        );
        let public_ip = ext.ext_addr.ok_or(BackendError::Missing {
            backend: "ipsec",
            what: Missing::PublicV4,
        })?;
        let attrs = LeaseAttrs {
            public_ip,
            backend_type: "ipsec".into(),
            ..Default::default()
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(Ready {
                ipsec: *self,
                iface_mtu: ext.iface.mtu,
            }),
        })
    }
}

#[async_trait]
impl Setup for Ready {
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let Ready { ipsec, iface_mtu } = *self;
        let mtu = iface_mtu.saturating_sub(if ipsec.opts.udp_encap { 85 } else { 77 });
        let sn = lease.subnet.ok_or(BackendError::Missing {
            backend: "ipsec",
            what: Missing::LeaseV4,
        })?;
        let own_pub = IpAddr::V4(lease.attrs.public_ip);
        let mut live = Live {
            opts: ipsec.opts,
            xfrm: ipsec.xfrm,
            ike: ipsec.ike,
            own: (sn, own_pub),
            peers: BTreeMap::new(),
            sa_watch: BTreeMap::new(),
            sa_settle: ipsec.sa_settle,
            mtu,
        };
        live.ike.start().await?;
        live.ike
            .call("load-shared", shared_key(live.opts.psk.expose(), own_pub))
            .await?;
        tracing::info!("Loaded shared key for: {own_pub}");
        Ok(Box::new(live))
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        for p in self.peers.values().flat_map(|s| s.policies.iter()) {
            if !self.xfrm.policy_exists(p).await? {
                self.xfrm.policy_update(p).await?;
                tracing::info!("XFRM policy recovered: {p}");
            }
        }
        let (local, local_pub) = self.own;
        if self.peers.is_empty() {
            return Ok(());
        }
        let loaded = self.ike.query("get-conns", Section::new()).await?;
        let names: Vec<String> = match loaded.get("conns") {
            Some(Value::List(v)) => v
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect(),
            _ => Vec::new(),
        };
        let missing: Vec<(Ipv4Net, IpAddr)> = self
            .peers
            .iter()
            .filter(|(r, s)| !names.contains(&conn_name(local, local_pub, **r, s.public)))
            .map(|(r, s)| (*r, s.public))
            .collect();
        if !missing.is_empty() {
            self.ike
                .call("load-shared", shared_key(self.opts.psk.expose(), local_pub))
                .await?;
        }
        for (remote, public) in missing {
            tracing::info!("charon lost the connection to {remote}; loading it again");
            self.sa_watch.insert(remote, SaWatch::new());
            self.load_peer(remote, public).await?;
        }
        self.reconcile_sas(local, local_pub).await
    }

    async fn teardown(&mut self) {
        self.ike.stop().await;
    }

    async fn remove_all(&mut self) {
        let (local, local_pub) = self.own;
        for (remote, st) in std::mem::take(&mut self.peers) {
            let name = conn_name(local, local_pub, remote, st.public);
            let _ = self
                .ike
                .call("unload-conn", Section::new().kv("name", &name))
                .await;
            for p in &st.policies {
                let _ = self.xfrm.policy_del(p).await;
            }
        }
        self.ike.stop().await;
    }
}

impl Live {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let (local, local_pub) = self.own;
        let (l, add) = match change {
            Change::Add(l) => (l, true),
            Change::Remove(l) => (l, false),
        };
        if l.attrs.backend_type != "ipsec" {
            tracing::warn!("Ignoring non-ipsec event: type: {}", l.attrs.backend_type);
            return Ok(());
        }
        let Some(remote) = l.subnet.filter(|s| *s != local) else {
            return Ok(());
        };
        let public = IpAddr::V4(l.attrs.public_ip);
        if add {
            let policies = Ipsec::policies(local, local_pub, remote, public);
            let st = PeerState { public, policies };
            self.sa_watch.insert(remote, SaWatch::new());
            if let Some(old) = self.peers.insert(remote, st.clone())
                && old != st
            {
                let name = conn_name(local, local_pub, remote, old.public);
                if let Err(e) = self
                    .ike
                    .call("unload-conn", Section::new().kv("name", &name))
                    .await
                {
                    tracing::warn!("error unloading charon connection {name}: {e}");
                }
                for p in &old.policies {
                    let _ = self.xfrm.policy_del(p).await;
                }
            }
            for p in &st.policies {
                self.xfrm.policy_update(p).await?;
            }
            self.load_peer(remote, public).await?;
        } else if let Some(st) = self.peers.remove(&remote) {
            self.sa_watch.remove(&remote);
            let name = conn_name(local, local_pub, remote, st.public);
            match self
                .ike
                .call("unload-conn", Section::new().kv("name", &name))
                .await
            {
                Ok(_) => tracing::info!("Unloaded connection: {name}"),
                Err(e) => tracing::error!("error unloading charon connections: {e}"),
            }
            for p in &st.policies {
                if let Err(e) = self.xfrm.policy_del(p).await {
                    tracing::error!("error deleting xfrm policy {p}: {e}");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "charon_tests.rs"]
mod charon_tests;
