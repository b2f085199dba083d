//! Dataplane choice, probing and switching, with fake implementations.

use std::sync::Mutex;

use super::*;
use crate::backend::host_gw::HostGw;
use crate::backend::test_util::{block_on, ext, fake, lease};
use crate::backend::vxlan::kernel::KernelVxlan;
use crate::config::backend::VxlanOptions;
use crate::netlink::{FakeNetlink, Op};

/// A userspace stand-in that records what it is asked to do.
#[derive(Debug)]
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
    attrs: LeaseAttrs,
    fail_setup: bool,
}

impl Observe for Recorder {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }
}

/// One type for the three stages (the stand-in has nothing to prepare).
#[async_trait]
impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    async fn lease_attrs(
        self: Box<Self>,
        _: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        self.log
            .lock()
            .expect("log")
            .push(format!("attrs prev={}", prev.is_some()));
        Ok(Prepared {
            attrs: self.attrs.clone(),
            backend: self,
        })
    }
}

#[async_trait]
impl Setup for Recorder {
    async fn setup(self: Box<Self>, _: &Lease) -> Result<Box<dyn Running>, BackendError> {
        self.log.lock().expect("log").push("setup".into());
        if self.fail_setup {
            return Err(BackendError::TunVanished("no".into()));
        }
        Ok(self)
    }
}

#[async_trait]
impl Running for Recorder {
    fn mtu(&self) -> u32 {
        1450
    }
    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        for c in batch.changes {
            let what = match c {
                Change::Add(l) => format!("add {}", l.key()),
                Change::Remove(l) => format!("remove {}", l.key()),
            };
            self.log.lock().expect("log").push(what);
        }
        Ok(())
    }
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn teardown(&mut self) {
        self.log.lock().expect("log").push("teardown".into());
    }
    async fn remove_all(&mut self) {
        self.log.lock().expect("log").push("remove_all".into());
    }
}

/// Runs `d` through its stages for `own`.
async fn up(d: Dual, own: &Lease) -> Box<dyn Switch> {
    let p = Box::new(d).lease_attrs(&ext(), None).await.expect("attrs");
    p.backend.setup(own).await.expect("setup")
}

fn vx_opts() -> VxlanOptions {
    VxlanOptions {
        vni: 1,
        port: 0,
        mtu: 0,
        gbp: false,
        learning: false,
        direct_routing: false,
    }
}

/// vxlan with the real kernel implementation (on the fake) and a recording
/// userspace one that publishes `user_attrs`.
fn vxlan_dual(
    choice: DataplaneChoice,
    f: &Arc<FakeNetlink>,
    user_attrs: LeaseAttrs,
    fail_setup: bool,
) -> (Dual, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (c, l) = (f.clone(), log.clone());
    let d = Dual::new("vxlan", choice, f.clone(), f.clone())
        .kernel(
            Some(Capability::Vxlan),
            Box::new(move || Box::new(KernelVxlan::new(vx_opts(), true, false, c.clone()))),
        )
        .userspace(Box::new(move || {
            Box::new(Recorder {
                log: l.clone(),
                attrs: user_attrs.clone(),
                fail_setup,
            })
        }))
        .kernel_links(vec!["flannel.1".into()]);
    (d, log)
}

async fn kernel_attrs() -> LeaseAttrs {
    let f = fake(&["vxlan"], false);
    Box::new(KernelVxlan::new(vx_opts(), true, false, f))
        .lease_attrs(&ext(), None)
        .await
        .expect("attrs")
        .attrs
}

/// The own lease with `attrs`.
fn own(attrs: &LeaseAttrs) -> Lease {
    let mut own = lease("10.244.1.0/24", "192.0.2.1", "vxlan", None);
    own.attrs = attrs.clone();
    own
}

#[test]
fn auto_prefers_the_kernel_and_falls_back_to_userspace() {
    block_on(async {
        let attrs = kernel_attrs().await;
        let with = fake(&["vxlan"], false);
        let (d, _) = vxlan_dual(DataplaneChoice::Auto, &with, attrs.clone(), false);
        assert_eq!(
            d.resolve(DataplaneChoice::Auto).await.expect("resolve").0,
            Dataplane::Kernel
        );
        // The probe left nothing behind.
        assert_eq!(with.links().len(), 2);
        let without = fake(&[], false);
        let (d, _) = vxlan_dual(DataplaneChoice::Auto, &without, attrs.clone(), false);
        assert_eq!(
            d.resolve(DataplaneChoice::Auto).await.expect("resolve").0,
            Dataplane::Userspace
        );
        let err = d
            .resolve(DataplaneChoice::Kernel)
            .await
            .expect_err("kernel");
        let s = up(d, &own(&attrs)).await;
        assert_eq!(s.dataplane(), Some(Dataplane::Userspace));
        assert_eq!(
            err.to_string(),
            "--dataplane=kernel: this kernel cannot run the vxlan backend: no vxlan support"
        );
    });
}

#[test]
fn kernel_only_and_userspace_only_backends_refuse_the_other_path() {
    block_on(async {
        let f = fake(&[], false);
        let c = f.clone();
        let hg = Dual::new("host-gw", DataplaneChoice::Auto, f.clone(), f.clone()).kernel(
            None,
            Box::new(move || Box::new(HostGw::new(true, false, c.clone()))),
        );
        assert_eq!(
            hg.resolve(DataplaneChoice::Auto).await.expect("auto").0,
            Dataplane::Kernel
        );
        let e = hg
            .resolve(DataplaneChoice::Userspace)
            .await
            .expect_err("userspace");
        assert!(e.to_string().contains("no userspace host-gw engine"), "{e}");
        let ipip = Dual::new("ipip", DataplaneChoice::Auto, f.clone(), f.clone()).kernel(
            Some(Capability::Ipip),
            Box::new(|| {
                Box::new(Recorder {
                    log: Arc::default(),
                    attrs: LeaseAttrs::default(),
                    fail_setup: false,
                })
            }),
        );
        let e = ipip
            .resolve(DataplaneChoice::Auto)
            .await
            .expect_err("no ipip here");
        assert_eq!(
            e.to_string(),
            "this kernel cannot run the ipip backend (no ipip support) and weft has no userspace ipip engine yet"
        );
        let esp = Dual::new("ipsec", DataplaneChoice::Auto, f.clone(), f.clone()).kernel(
            Some(Capability::Esp),
            Box::new(|| {
                Box::new(Recorder {
                    log: Arc::default(),
                    attrs: LeaseAttrs::default(),
                    fail_setup: false,
                })
            }),
        );
        assert!(
            esp.resolve(DataplaneChoice::Auto)
                .await
                .expect_err("no esp")
                .to_string()
                .contains("esp4")
        );
    });
}

#[test]
fn switching_keeps_the_lease_and_reapplies_every_peer() {
    block_on(async {
        let attrs = kernel_attrs().await;
        let f = fake(&["vxlan"], false);
        let (d, log) = vxlan_dual(DataplaneChoice::Kernel, &f, attrs.clone(), false);
        let p = Box::new(d).lease_attrs(&ext(), None).await.expect("attrs");
        assert_eq!(p.attrs, attrs);
        let mut d = p.backend.setup(&own(&attrs)).await.expect("setup");
        let mac = crate::backend::vxlan::backend_data(1, [2, 0, 0, 0, 0, 2]);
        d.apply(Batch::one(&Change::Add(lease(
            "10.244.2.0/24",
            "192.0.2.2",
            "vxlan",
            Some(&mac),
        ))))
        .await
        .expect("add");
        d.apply(Batch::one(&Change::Add(lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "vxlan",
            Some(&mac),
        ))))
        .await
        .expect("add");
        d.apply(Batch::one(&Change::Remove(lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "vxlan",
            None,
        ))))
        .await
        .expect("remove");
        assert_eq!(f.routes().len(), 1);

        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Userspace)
                .await
                .expect("switch"),
            Dataplane::Userspace
        );
        assert_eq!(d.dataplane(), Some(Dataplane::Userspace));
        // The kernel device went with all its entries; userspace got the lease and the live peer.
        assert!(f.links().values().all(|l| l.link.name != "flannel.1"));
        assert!(f.routes().is_empty() && f.all_fdbs().is_empty());
        assert_eq!(
            *log.lock().expect("log"),
            vec!["attrs prev=true", "setup", "add 10.244.2.0-24"]
        );

        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Kernel)
                .await
                .expect("back"),
            Dataplane::Kernel
        );
        assert!(log.lock().expect("log").contains(&"remove_all".to_string()));
        assert_eq!(f.routes().len(), 1);
        assert_eq!(f.all_neighs().len(), 1);
        // Same path again: nothing but the capability probe happens.
        f.take_ops();
        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Kernel)
                .await
                .expect("noop"),
            Dataplane::Kernel
        );
        let touched: Vec<Op> = f
            .take_ops()
            .into_iter()
            .filter(|o| {
                !matches!(o, Op::AddLink(l) if l.name() == "weftprobe-vx")
                    && !matches!(o, Op::DelLink(_))
            })
            .collect();
        assert_eq!(touched, vec![]);
        assert!(f.links().values().any(|l| l.link.name == "flannel.1"));
    });
}

#[test]
fn switching_is_refused_when_the_lease_would_change_and_rolled_back_on_failure() {
    block_on(async {
        let attrs = kernel_attrs().await;
        let mut other = attrs.clone();
        other.backend_data = Some(crate::backend::vxlan::backend_data(1, [2, 1, 1, 1, 1, 1]));
        let f = fake(&["vxlan"], false);
        let (d, log) = vxlan_dual(DataplaneChoice::Kernel, &f, other, false);
        let mut d = up(d, &own(&attrs)).await;
        let e = d
            .switch_dataplane(DataplaneChoice::Userspace)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains("different lease attributes"), "{e}");
        assert_eq!(d.dataplane(), Some(Dataplane::Kernel));
        assert!(
            f.links().values().any(|l| l.link.name == "flannel.1"),
            "the kernel path was left alone"
        );
        assert!(!log.lock().expect("log").contains(&"setup".to_string()));

        let (d, _) = vxlan_dual(DataplaneChoice::Kernel, &f, attrs.clone(), true);
        let mut d = up(d, &own(&attrs)).await;
        assert!(
            d.switch_dataplane(DataplaneChoice::Userspace)
                .await
                .is_err()
        );
        assert_eq!(d.dataplane(), Some(Dataplane::Kernel));
        assert!(
            f.links().values().any(|l| l.link.name == "flannel.1"),
            "rolled back to the kernel device"
        );
    });
}

/// A userspace stand-in whose peers accept the other path only from
/// `handover` on; records when it was removed.
#[derive(Debug)]
struct Handing {
    attrs: LeaseAttrs,
    handover: Arc<Mutex<Option<SystemTime>>>,
    removed: Arc<Mutex<Vec<SystemTime>>>,
}

impl Observe for Handing {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }
}

/// One type for the three stages.
#[async_trait]
impl Backend for Handing {
    fn name(&self) -> &'static str {
        "vxlan"
    }
    async fn lease_attrs(
        self: Box<Self>,
        _: &ExternalInterface,
        _: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        Ok(Prepared {
            attrs: self.attrs.clone(),
            backend: self,
        })
    }
}

#[async_trait]
impl Setup for Handing {
    async fn setup(self: Box<Self>, _: &Lease) -> Result<Box<dyn Running>, BackendError> {
        Ok(self)
    }
}

#[async_trait]
impl Running for Handing {
    fn mtu(&self) -> u32 {
        1450
    }
    async fn apply(&mut self, _: Batch<'_>) -> Result<(), ApplyError> {
        Ok(())
    }
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn teardown(&mut self) {}
    fn handover_at(&self) -> Option<SystemTime> {
        *self.handover.lock().expect("lock")
    }
    async fn remove_all(&mut self) {
        self.removed.lock().expect("lock").push(SystemTime::now());
    }
}

#[test]
fn switching_away_keeps_the_old_path_until_its_peers_accept_the_new_one() {
    block_on(async {
        let attrs = kernel_attrs().await;
        let f = fake(&["vxlan"], false);
        let handover = Arc::new(Mutex::new(None));
        let removed = Arc::new(Mutex::new(Vec::new()));
        let (c, a, h, r) = (f.clone(), attrs.clone(), handover.clone(), removed.clone());
        let d = Dual::new("vxlan", DataplaneChoice::Userspace, f.clone(), f.clone())
            .kernel(
                Some(Capability::Vxlan),
                Box::new(move || Box::new(KernelVxlan::new(vx_opts(), true, false, c.clone()))),
            )
            .userspace(Box::new(move || {
                Box::new(Handing {
                    attrs: a.clone(),
                    handover: h.clone(),
                    removed: r.clone(),
                })
            }));
        let mut d = up(d, &own(&attrs)).await;
        assert_eq!(d.dataplane(), Some(Dataplane::Userspace));

        // Peers accept the kernel path in 600 ms: the userspace path runs
        // until then, and the switch is pending instead of blocking.
        let at = SystemTime::now() + Duration::from_millis(600);
        *handover.lock().expect("lock") = Some(at);
        assert_eq!(d.handover_at(), Some(at));
        assert_eq!(d.switch_pending(), None);
        let t = Instant::now();
        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Kernel)
                .await
                .expect("switch"),
            Dataplane::Userspace
        );
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(d.switch_pending(), Some(at));
        // Peers arriving meanwhile reach the running path and the next one.
        let mac = crate::backend::vxlan::backend_data(1, [2, 0, 0, 0, 0, 9]);
        d.apply(Batch::one(&Change::Add(lease(
            "10.244.9.0/24",
            "192.0.2.9",
            "vxlan",
            Some(&mac),
        ))))
        .await
        .expect("apply while pending");
        // Called early (a SIGHUP repeating the request): still pending.
        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Kernel)
                .await
                .expect("early"),
            Dataplane::Userspace
        );
        assert!(removed.lock().expect("lock").is_empty());
        tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default()).await;
        assert_eq!(
            d.switch_dataplane(DataplaneChoice::Kernel)
                .await
                .expect("due"),
            Dataplane::Kernel
        );
        assert_eq!(d.switch_pending(), None);
        assert!(
            f.routes()
                .iter()
                .any(|r| r.dst.to_string() == "10.244.9.0/24"),
            "the peer added while pending is in the kernel path: {:?}",
            f.routes()
        );
        let gone = removed.lock().expect("lock").clone();
        assert_eq!(gone.len(), 1);
        assert!(gone[0] >= at, "removed {:?} before {at:?}", gone[0]);
        assert!(f.links().values().any(|l| l.link.name == "flannel.1"));
        // The kernel path asks for no wait; a time already past means none either.
        assert_eq!(d.handover_at(), None);
        d.switch_dataplane(DataplaneChoice::Userspace)
            .await
            .expect("back");
        *handover.lock().expect("lock") = Some(SystemTime::now() - Duration::from_secs(5));
        let t = Instant::now();
        d.switch_dataplane(DataplaneChoice::Kernel)
            .await
            .expect("again");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(removed.lock().expect("lock").len(), 2);
    });
}
