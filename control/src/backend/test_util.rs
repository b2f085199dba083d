//! Shared fixtures for the backends' unit tests: an external interface
//! (`eth0`, index 2, 192.0.2.1/24) and leases.

use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{FakeNetlink, Link};

/// `eth0` (index 2, MTU 1500) with 192.0.2.1/24 as interface and public address.
pub fn ext() -> ExternalInterface {
    ExternalInterface {
        iface: Link {
            index: 2,
            name: "eth0".into(),
            mtu: 1500,
            up: true,
            mac: None,
        },
        iface_addr: Some(Ipv4Addr::new(192, 0, 2, 1)),
        iface_v6_addr: None,
        ext_addr: Some(Ipv4Addr::new(192, 0, 2, 1)),
        ext_v6_addr: None,
        connected: vec!["192.0.2.0/24".parse().expect("net")],
    }
}

/// A lease for `subnet` published by `public` with `backend_type` and `data`.
pub fn lease(subnet: &str, public: &str, backend_type: &str, data: Option<&str>) -> Lease {
    Lease {
        subnet: Some(subnet.parse().expect("subnet")),
        ipv6_subnet: None,
        attrs: LeaseAttrs {
            public_ip: public.parse().expect("ip"),
            backend_type: backend_type.into(),
            backend_data: data.map(String::from),
            ..Default::default()
        },
        expiration: None,
    }
}

/// A fake kernel supporting `kinds`, with 192.0.2.0/24 on-link on eth0 and a
/// default route via 192.0.2.254.
pub fn fake(kinds: &[&'static str], esp: bool) -> Arc<FakeNetlink> {
    let f = Arc::new(FakeNetlink::new(kinds, esp));
    f.set_connected("192.0.2.0/24".parse().expect("net"), 2);
    f.set_default_via("192.0.2.254".parse().expect("ip"), 2);
    f
}

/// Runs a future to completion on a current-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// An [`crate::backend::ipsec::Ike`] recording every VICI command; `get-conns`
/// answers with the connections loaded and not unloaded since.
#[derive(Debug, Clone, Default)]
pub struct RecordingIke {
    /// `(command, arguments)` in order, shared with the test.
    pub log: Arc<std::sync::Mutex<Vec<(String, crate::backend::ipsec::vici::Section)>>>,
    /// Connection names charon "has".
    pub conns: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl crate::backend::ipsec::Ike for RecordingIke {
    async fn start(&mut self) -> Result<(), crate::backend::ipsec::charon::CharonError> {
        self.log
            .lock()
            .expect("log")
            .push(("start".into(), Default::default()));
        Ok(())
    }
    async fn call(
        &mut self,
        cmd: &str,
        args: crate::backend::ipsec::vici::Section,
    ) -> Result<crate::backend::ipsec::vici::Section, crate::backend::ipsec::charon::CharonError>
    {
        let mut conns = self.conns.lock().expect("conns");
        match cmd {
            "load-conn" => conns.extend(args.0.iter().map(|(k, _)| k.clone())),
            "unload-conn" => {
                let name = args.str("name").unwrap_or_default();
                conns.retain(|c| *c != name);
            }
            _ => {}
        }
        self.log.lock().expect("log").push((cmd.into(), args));
        Ok(crate::backend::ipsec::vici::Section::new().kv("success", "yes"))
    }
    async fn query(
        &mut self,
        cmd: &str,
        args: crate::backend::ipsec::vici::Section,
    ) -> Result<crate::backend::ipsec::vici::Section, crate::backend::ipsec::charon::CharonError>
    {
        self.log.lock().expect("log").push((cmd.into(), args));
        let conns = self.conns.lock().expect("conns").clone();
        let refs: Vec<&str> = conns.iter().map(String::as_str).collect();
        Ok(crate::backend::ipsec::vici::Section::new().list("conns", &refs))
    }
    async fn stop(&mut self) {
        self.log
            .lock()
            .expect("log")
            .push(("stop".into(), Default::default()));
    }
}

/// `b`'s lease attributes for [`ext`] and `prev` (its first stage).
pub async fn attrs_of<B: crate::backend::Backend + 'static>(
    b: B,
    prev: Option<&Lease>,
) -> Result<LeaseAttrs, crate::backend::BackendError> {
    Ok(Box::new(b).lease_attrs(&ext(), prev).await?.attrs)
}

/// `b` run through its stages on [`ext`] for the own lease `own`.
pub async fn up<B: crate::backend::Backend + 'static>(
    b: B,
    own: &Lease,
) -> Result<Box<dyn crate::backend::Running>, crate::backend::BackendError> {
    up_on(b, &ext(), own).await
}

/// [`up`] on another external interface.
pub async fn up_on<B: crate::backend::Backend + 'static>(
    b: B,
    ext: &ExternalInterface,
    own: &Lease,
) -> Result<Box<dyn crate::backend::Running>, crate::backend::BackendError> {
    let p = Box::new(b).lease_attrs(ext, None).await?;
    p.backend.setup(own).await
}

/// A backend behind the calls its tests make, whatever its stage: the
/// lifecycle's order is the test's to keep (a call out of order panics).
#[derive(Debug)]
pub struct Staged {
    built: Option<Box<dyn crate::backend::Backend>>,
    prepared: Option<Box<dyn crate::backend::Setup>>,
    running: Option<Box<dyn crate::backend::Running>>,
}

impl std::fmt::Debug for dyn crate::backend::Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Debug for dyn crate::backend::Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("prepared")
    }
}

impl Staged {
    /// `b` as built.
    pub fn new(b: impl crate::backend::Backend + 'static) -> Staged {
        Staged {
            built: Some(Box::new(b)),
            prepared: None,
            running: None,
        }
    }

    /// The first stage: the lease attributes for `ext` and `prev`.
    pub async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, crate::backend::BackendError> {
        let b = self.built.take().expect("lease_attrs on a built backend");
        let p = b.lease_attrs(ext, prev).await?;
        self.prepared = Some(p.backend);
        Ok(p.attrs)
    }

    /// The second stage: set up for `lease`; returns `FLANNEL_MTU`.
    pub async fn setup(&mut self, lease: &Lease) -> Result<u32, crate::backend::BackendError> {
        let p = self.prepared.take().expect("setup on a prepared backend");
        let r = p.setup(lease).await?;
        let mtu = r.mtu();
        self.running = Some(r);
        Ok(mtu)
    }

    /// The running backend.
    pub fn running(&mut self) -> &mut dyn crate::backend::Running {
        self.running.as_deref_mut().expect("a running backend")
    }

    /// [`crate::backend::Running::apply`].
    pub async fn apply(
        &mut self,
        batch: crate::backend::Batch<'_>,
    ) -> Result<(), crate::backend::ApplyError> {
        self.running().apply(batch).await
    }

    /// [`crate::backend::Running::reconcile`].
    pub async fn reconcile(&mut self) -> Result<(), crate::backend::BackendError> {
        self.running().reconcile().await
    }

    /// [`crate::backend::Running::teardown`].
    pub async fn teardown(&mut self) {
        self.running().teardown().await
    }
}
