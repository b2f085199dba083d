//! Kernel capability probing: can this kernel run a backend's kernel path?
//!
//! Link kinds (vxlan, ipip, wireguard) are probed the way the backend would
//! use them: by creating a throwaway, never-up link of that kind
//! (`weftprobe-*`) and deleting it at once. A kernel without the driver
//! answers EOPNOTSUPP (after trying to load the module), which also covers
//! built-in drivers and module autoloading that `/proc/modules` would miss.
//! ESP is probed by adding and removing a throwaway SA between two loopback
//! addresses (see [`XfrmClient::esp_supported`]). Nothing probed is ever up,
//! so no traffic or socket is affected.

use std::net::{IpAddr, Ipv4Addr};

use crate::netlink::{
    Client, IpipLink, LinkSpec, NetlinkError, VxlanLink, WireguardLink, XfrmClient,
};

/// A kernel feature a backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// The vxlan driver.
    Vxlan,
    /// The ipip driver.
    Ipip,
    /// The wireguard driver.
    Wireguard,
    /// ESP (XFRM states).
    Esp,
}

impl Capability {
    /// What to tell the operator is missing.
    pub fn module(self) -> &'static str {
        match self {
            Capability::Vxlan => "vxlan",
            Capability::Ipip => "ipip",
            Capability::Wireguard => "wireguard",
            Capability::Esp => "esp4 (CONFIG_INET_ESP)",
        }
    }

    fn probe_link(self) -> Option<LinkSpec> {
        Some(match self {
            Capability::Vxlan => LinkSpec::Vxlan(VxlanLink {
                name: "weftprobe-vx".into(),
                vni: 0x00ff_fff0,
                vtep_index: 0,
                local: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 0,
                learning: false,
                gbp: false,
                mtu: 1280,
                mac: [0x02, 0x77, 0x65, 0x66, 0x74, 0x01],
            }),
            Capability::Ipip => LinkSpec::Ipip(IpipLink {
                name: "weftprobe-ip".into(),
                local: Ipv4Addr::new(127, 0, 0, 253),
            }),
            Capability::Wireguard => LinkSpec::Wireguard(WireguardLink {
                name: "weftprobe-wg".into(),
                mtu: 1280,
            }),
            Capability::Esp => return None,
        })
    }
}

/// Whether the kernel has `cap`. Errors other than "not supported" are
/// returned (e.g. EPERM without CAP_NET_ADMIN).
pub async fn kernel_has(
    cap: Capability,
    nl: &dyn Client,
    xfrm: &dyn XfrmClient,
) -> Result<bool, NetlinkError> {
    let Some(spec) = cap.probe_link() else {
        return xfrm.esp_supported().await;
    };
    // A leftover from a crashed probe goes first.
    if let Some(d) = nl.link_detail(spec.name()).await? {
        nl.delete_link(d.link.index).await?;
    }
    match nl.add_link(&spec).await {
        Ok(()) => {
            if let Some(d) = nl.link_detail(spec.name()).await? {
                nl.delete_link(d.link.index).await?;
            }
            Ok(true)
        }
        Err(e) if e.is_unsupported() => {
            tracing::debug!("probe {}: {e}", cap.module());
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// A failed start of the userspace engine as weftd reports it: the error with
/// its cause (the OS error) said once and, when the TUN device could not be
/// opened or created, what to do about it.
pub fn engine_error(e: &weft_engine::EngineError) -> String {
    let text = crate::logging::error_chain(e);
    match e {
        weft_engine::EngineError::Tun { name, source } => match tun_fix(name, source) {
            Some(fix) => format!("{text}; {fix}"),
            None => text,
        },
        _ => text,
    }
}

/// The fix for a TUN failure by its errno: `open("/dev/net/tun")` gives
/// ENOENT without the device node, ENODEV (ENXIO) without the driver, EPERM
/// when a container's device rules deny it; `TUNSETIFF` gives EPERM without
/// CAP_NET_ADMIN, and EBUSY or EINVAL for a device of that name that is no
/// multi-queue TUN.
fn tun_fix(name: &str, e: &std::io::Error) -> Option<String> {
    const DEVICE_RULE: &str = "a device rule allowing `c 10:200 rwm`";
    Some(match e.raw_os_error()? {
        libc::ENOENT => format!(
            "/dev/net/tun is missing: on the node, `modprobe tun` (the device node comes with \
             the module; or `mkdir -p /dev/net && mknod /dev/net/tun c 10 200`); in a container, \
             mount the node's /dev/net/tun (deploy/kube-flannel.yml's hostPath of type \
             CharDevice, `docker run --device /dev/net/tun`) and keep {DEVICE_RULE}"
        ),
        libc::ENODEV | libc::ENXIO => "the kernel has no tun driver: `modprobe tun` on the node \
             (a kernel built without CONFIG_TUN cannot run the userspace backends)"
            .to_string(),
        libc::EPERM | libc::EACCES => format!(
            "weftd needs CAP_NET_ADMIN to create a TUN device, and in a container access to \
             /dev/net/tun: {DEVICE_RULE} (the default of runc and crun) or a privileged container"
        ),
        libc::EBUSY | libc::EINVAL => format!(
            "a device named {name} exists and is not a multi-queue TUN (a kernel backend's \
             device, or another program's): delete it with `ip link del {name}`"
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::io;

    use weft_engine::EngineError;

    use super::engine_error;

    fn tun(errno: i32) -> String {
        engine_error(&EngineError::Tun {
            name: "flannel-wg".into(),
            source: io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn tun_failures_name_the_os_error_and_the_fix() {
        assert_eq!(
            tun(libc::ENODEV),
            "cannot open tun device flannel-wg: No such device (os error 19); the kernel has \
             no tun driver: `modprobe tun` on the node (a kernel built without CONFIG_TUN \
             cannot run the userspace backends)"
        );
        let missing = tun(libc::ENOENT);
        assert!(
            missing.starts_with(
                "cannot open tun device flannel-wg: No such file or directory (os error 2); \
                 /dev/net/tun is missing: on the node, `modprobe tun`"
            ),
            "{missing}"
        );
        assert!(missing.contains("--device /dev/net/tun"), "{missing}");
        assert!(missing.contains("`c 10:200 rwm`"), "{missing}");
        let denied = tun(libc::EPERM);
        assert!(
            denied.starts_with(
                "cannot open tun device flannel-wg: Operation not permitted (os error 1); \
                 weftd needs CAP_NET_ADMIN"
            ),
            "{denied}"
        );
        assert!(denied.contains("`c 10:200 rwm`"), "{denied}");
        assert!(
            tun(libc::EBUSY).ends_with("delete it with `ip link del flannel-wg`"),
            "{}",
            tun(libc::EBUSY)
        );
        // Any other errno: the OS error, no guessed fix.
        assert_eq!(
            tun(libc::ENOMEM),
            "cannot open tun device flannel-wg: Cannot allocate memory (os error 12)"
        );
        // Other engine errors keep their cause too (`{:#}` dropped it).
        let bind = engine_error(&EngineError::Socket {
            addr: "0.0.0.0:51820".parse().expect("addr"),
            source: io::Error::from_raw_os_error(libc::EADDRINUSE),
        });
        assert_eq!(
            bind,
            "cannot bind udp socket 0.0.0.0:51820: Address already in use (os error 98)"
        );
    }
}
