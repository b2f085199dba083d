//! The `ipip` backend: what its two dataplanes share. [`kernel`] runs it on
//! the kernel's ipip driver, [`userspace`] on weft's engine (a raw IPIP
//! socket) with the same wire format and lease; [`super::dual`] switches
//! between them.

pub mod kernel;
pub mod userspace;

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::backend::BackendError;
use crate::backend::Missing;
use crate::config::backend::IpipOptions;
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::Route;

/// The device name, the same on both paths (so routes and tools see one name).
pub const DEVICE: &str = "flannel.ipip";

/// The lease of an ipip node (flannel's): `PublicIP = ExtAddr`, BackendType
/// `"ipip"`, no BackendData; logs flannel's config line.
pub(super) fn lease_attrs(
    opts: &IpipOptions,
    ext: &ExternalInterface,
) -> Result<LeaseAttrs, BackendError> {
    tracing::info!("IPIP config: DirectRouting={}", opts.direct_routing);
    let public_ip = ext.ext_addr.ok_or(BackendError::Missing {
        backend: "ipip",
        what: Missing::PublicV4,
    })?;
    Ok(LeaseAttrs {
        public_ip,
        backend_type: "ipip".into(),
        ..Default::default()
    })
}

/// The device's MTU: the external interface's less the outer IPv4 header.
pub(super) fn mtu(ext: &ExternalInterface) -> u32 {
    ext.iface.mtu.saturating_sub(20)
}

/// The outer source address: the external interface's IPv4 address.
pub(super) fn local(ext: &ExternalInterface) -> Result<Ipv4Addr, BackendError> {
    ext.iface_addr.ok_or(BackendError::Missing {
        backend: "ipip",
        what: Missing::InterfaceV4,
    })
}

/// The device's address, `<subnet IP>/32`, from this node's lease.
pub(super) fn device_addr(lease: &Lease) -> Result<IpNet, BackendError> {
    let sn = lease.subnet.ok_or(BackendError::Missing {
        backend: "ipip",
        what: Missing::LeaseV4,
    })?;
    Ok(IpNet::from(IpAddr::V4(sn.network())))
}

/// Whether a peer lease is for this backend (others are logged and ignored,
/// as flannel does).
pub(super) fn accepts(lease: &Lease) -> bool {
    let ok = lease.attrs.backend_type == "ipip";
    if !ok {
        tracing::warn!(
            "Ignoring non-ipip subnet: type={}",
            lease.attrs.backend_type
        );
    }
    ok
}

/// flannel's route to a peer: `<subnet> via <PublicIP> dev <oif> onlink`
/// (the ipip device, or with DirectRouting the external interface).
pub(super) fn route(subnet: IpNet, public: Ipv4Addr, oif: u32) -> Route {
    Route {
        dst: subnet,
        gateway: Some(IpAddr::V4(public)),
        oif: Some(oif),
        onlink: true,
        scope_link: false,
    }
}
