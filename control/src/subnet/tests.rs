//! Allocation tests on the real embedded store in a temp dir.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::config::parse_config;
use crate::store::embedded::EmbeddedStore;

fn cfg(text: &str) -> Config {
    let mut c = parse_config(text.as_bytes()).expect("parse");
    c.check_network_config().expect("check");
    c
}

fn attrs(last: u8) -> LeaseAttrs {
    LeaseAttrs {
        public_ip: Ipv4Addr::new(192, 0, 2, last),
        ..Default::default()
    }
}

async fn store() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = EmbeddedStore::open(dir.path().join("store"))
        .await
        .expect("open");
    (dir, s)
}

const TTL: Option<Duration> = Some(Duration::from_secs(3600));

#[tokio::test]
async fn distinct_subnets_inside_range() {
    let (_d, s) = store().await;
    let c = cfg(r#"{"Network":"10.244.0.0/16"}"#);
    let mut seen = BTreeSet::new();
    for i in 1..=30 {
        let m = LocalManager::new(s.clone(), c.clone(), Previous::default(), TTL);
        let l = m.acquire_lease(&attrs(i)).await.expect("acquire");
        let sn = l.subnet.expect("v4");
        assert_eq!(sn.prefix_len(), 24);
        assert!(
            sn.addr() >= Ipv4Addr::new(10, 244, 1, 0)
                && sn.addr() <= Ipv4Addr::new(10, 244, 255, 0),
            "{sn}"
        );
        assert!(seen.insert(sn), "{sn} handed out twice");
    }
}

#[tokio::test]
async fn same_public_ip_gets_same_subnet_back() {
    let (_d, s) = store().await;
    let c = cfg(r#"{"Network":"10.244.0.0/16"}"#);
    let m = LocalManager::new(s.clone(), c.clone(), Previous::default(), TTL);
    let a = m.acquire_lease(&attrs(1)).await.expect("acquire");
    let b = m.acquire_lease(&attrs(1)).await.expect("again");
    assert_eq!(a.subnet, b.subnet);
    assert_eq!(s.list_leases().await.expect("list").len(), 1);
}

#[tokio::test]
async fn previous_subnet_is_reused_when_free_and_skipped_when_taken() {
    let (_d, s) = store().await;
    let c = cfg(r#"{"Network":"10.244.0.0/16"}"#);
    let prev = Previous {
        subnet: Some("10.244.77.0/24".parse().expect("net")),
        ipv6_subnet: None,
    };
    let m = LocalManager::new(s.clone(), c.clone(), prev, TTL);
    let l = m.acquire_lease(&attrs(1)).await.expect("acquire");
    assert_eq!(l.subnet, prev.subnet);
    // Another node remembering the same subnet must not get it.
    let m2 = LocalManager::new(s.clone(), c.clone(), prev, TTL);
    let l2 = m2.acquire_lease(&attrs(2)).await.expect("acquire");
    assert_ne!(l2.subnet, prev.subnet);
}

#[tokio::test]
async fn incompatible_lease_is_replaced() {
    let (_d, s) = store().await;
    let old = LocalManager::new(
        s.clone(),
        cfg(r#"{"Network":"10.244.0.0/16","SubnetLen":25}"#),
        Previous::default(),
        TTL,
    );
    let l = old.acquire_lease(&attrs(1)).await.expect("acquire");
    assert_eq!(l.subnet.expect("v4").prefix_len(), 25);
    let new = LocalManager::new(
        s.clone(),
        cfg(r#"{"Network":"10.244.0.0/16"}"#),
        Previous::default(),
        TTL,
    );
    let l2 = new.acquire_lease(&attrs(1)).await.expect("acquire");
    assert_eq!(l2.subnet.expect("v4").prefix_len(), 24);
    let all = s.list_leases().await.expect("list");
    assert_eq!(all.len(), 1, "the old /25 lease must be gone: {all:?}");
    // And the new subnet must not overlap the old one's range rules.
    assert!(
        !l.subnet
            .expect("v4")
            .contains(&l2.subnet.expect("v4").network())
            || l.subnet == l2.subnet
    );
}

#[tokio::test]
async fn out_of_subnets() {
    let (_d, s) = store().await;
    // /28 network → SubnetLen 30 → subnets .4, .8, .12 (the first is skipped).
    let c = cfg(r#"{"Network":"10.9.0.0/28"}"#);
    for i in 1..=3 {
        LocalManager::new(s.clone(), c.clone(), Previous::default(), TTL)
            .acquire_lease(&attrs(i))
            .await
            .expect("acquire");
    }
    let err = LocalManager::new(s.clone(), c, Previous::default(), TTL)
        .acquire_lease(&attrs(9))
        .await;
    assert!(matches!(err, Err(SubnetError::OutOfSubnets)), "{err:?}");
}

#[tokio::test]
async fn dual_stack_and_v6_only() {
    let (_d, s) = store().await;
    let c =
        cfg(r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}"#);
    let l = LocalManager::new(s.clone(), c, Previous::default(), TTL)
        .acquire_lease(&attrs(1))
        .await
        .expect("acquire");
    assert_eq!(l.ipv6_subnet.expect("v6").prefix_len(), 64);
    assert!(l.subnet.is_some());
    let c6 = cfg(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:20::/48"}"#);
    let mut a = attrs(2);
    a.public_ipv6 = Some("2001:db8::2".parse().expect("v6"));
    let l6 = LocalManager::new(s.clone(), c6, Previous::default(), TTL)
        .acquire_lease(&a)
        .await
        .expect("acquire");
    assert!(l6.subnet.is_none());
    assert!(
        l6.ipv6_subnet.expect("v6").addr()
            >= "fd00:20:0:1::".parse::<std::net::Ipv6Addr>().expect("v6")
    );
}

#[test]
fn overlap_checks() {
    let taken: BTreeSet<Ipv4Net> = ["10.0.1.0/24", "10.0.3.0/24"]
        .iter()
        .map(|s| s.parse().expect("net"))
        .collect();
    let n = |s: &str| s.parse::<Ipv4Net>().expect("net");
    assert!(overlaps4(&taken, &[], n("10.0.1.0/24")));
    assert!(!overlaps4(&taken, &[], n("10.0.2.0/24")));
    assert!(overlaps4(&taken, &[], n("10.0.0.0/22")));
    let wide = [n("10.0.0.0/16")];
    assert!(overlaps4(&taken, &wide, n("10.0.9.0/24")));
}

#[test]
fn renew_time() {
    let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
    assert_eq!(
        renew_at(exp, Duration::from_secs(3600), Duration::from_secs(86_400)),
        exp - Duration::from_secs(3600)
    );
    assert_eq!(
        renew_at(exp, Duration::from_secs(3600), Duration::from_secs(10)),
        exp - Duration::from_secs(5)
    );
}
