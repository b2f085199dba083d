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
