//! The published snapshots: what readers build from them, and readiness.

use std::time::{Duration, SystemTime};

use super::*;
use crate::lease::LeaseAttrs;

fn lease(s: &str, ip: [u8; 4], expires: Option<SystemTime>) -> Lease {
    let key: crate::lease::SubnetKey = s.parse().expect("key");
    Lease {
        subnet: key.v4,
        ipv6_subnet: key.v6,
        attrs: LeaseAttrs {
            public_ip: ip.into(),
            backend_type: "vxlan".into(),
            ..Default::default()
        },
        expiration: expires,
    }
}

/// A device that counts how often it was asked.
#[derive(Debug, Default)]
struct Counted(std::sync::atomic::AtomicUsize);

impl DeviceProbe for Counted {
    fn report(&self, st: &mut BackendStatus) {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u64;
        st.devices.push(DeviceStatus {
            name: "flannel.1".into(),
            kind: "engine".into(),
            workers: Some(1),
            offloads: None,
            counters: Counters {
                tx_packets: n,
                ..Default::default()
            },
            batching: None,
            drops: None,
            peers: None,
            poll_window: None,
            tunnel_gso: None,
        });
    }
}

#[test]
fn status_is_built_from_the_latest_snapshots_and_asks_each_device_each_time() {
    let p = Publisher::new();
    let o = p.observer();
    assert!(o.status().is_none(), "nothing before the backend is set up");
    let dev = Arc::new(Counted::default());
    p.backend()
        .publish(BackendView::new("vxlan", Some(Dataplane::Userspace)).device(dev.clone()));
    let st = o.status().expect("status");
    assert_eq!(st.lease, None);
    assert_eq!(st.backend.dataplane, "userspace");
    let own = lease("10.244.1.0-24", [192, 0, 2, 1], None);
    let peers: Arc<[Arc<Lease>]> = vec![
        Arc::new(lease("10.244.2.0-24", [192, 0, 2, 2], None)),
        Arc::new(lease("10.244.3.0-24", [192, 0, 2, 3], None)),
    ]
    .into();
    p.daemon(|d| {
        d.lease = Some(own.clone());
        d.peers = peers;
        d.requested = "auto".into();
    });
    let st = o.status().expect("status");
    assert_eq!(st.peers.len(), 2);
    assert_eq!(st.backend.requested, "auto");
    assert_eq!(
        st.lease.and_then(|l| l.subnet),
        Some("10.244.1.0/24".into())
    );
    // Counters are read at the time of asking, not when published.
    assert_eq!(o.status().expect("status").totals().tx_packets, 2);
}

#[test]
fn ready_means_lease_held_subnet_env_written_and_the_snapshot_programmed() {
    let now = SystemTime::now();
    let mut d = DaemonView::default();
    assert_eq!(d.unready(now), Some("no lease yet"));
    d.lease = Some(lease(
        "10.244.1.0-24",
        [192, 0, 2, 1],
        Some(now + Duration::from_secs(60)),
    ));
    assert_eq!(d.unready(now), Some("subnet.env not written yet"));
    d.subnet_env = true;
    assert!(d.unready(now).is_some_and(|w| w.contains("snapshot")));
    d.synced = true;
    assert_eq!(d.unready(now), None);
    // Renewals failed until the lease ran out: no longer ready, without anyone publishing.
    assert!(
        d.unready(now + Duration::from_secs(61))
            .is_some_and(|w| w.contains("expired"))
    );
    let p = Publisher::new();
    assert_eq!(p.observer().unready(), Some("starting"));
    p.daemon(|v| *v = d.clone());
    assert_eq!(p.observer().unready(), None);
}

#[test]
fn a_gone_kernel_device_reports_nothing() {
    let v = BackendView::new("vxlan", Some(Dataplane::Kernel))
        .device(devices::KernelDevice::probe("w33-no-such-device"));
    let st = v.read();
    assert_eq!(
        (st.name.as_str(), st.dataplane.as_str()),
        ("vxlan", "kernel")
    );
    assert!(st.devices.is_empty());
}
