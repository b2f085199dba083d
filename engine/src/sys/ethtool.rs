//! Transmit checksum offload of a device, over the `SIOCETHTOOL` ioctl
//! (`ethtool -k` / `ethtool -K DEV tx off`): the one ethtool setting weft
//! changes, flannel's documented workaround for the kernel vxlan
//! checksum-offload bug (flannel#1279, PR#1282; weftd's
//! `--vxlan-tx-checksum-offload`, `weft doctor`'s `vxlan_tx_csum_off`).
//!
//! The legacy `ETHTOOL_GTXCSUM`/`ETHTOOL_STXCSUM` commands read and set every
//! transmit checksum feature at once (`tx-checksum-ip-generic` on a vxlan
//! device); the kernel then drops the features that need them (TSO, GSO
//! with checksum), as `ethtool -K DEV tx off` does. Any socket in the
//! network namespace serves as the ioctl's handle.

use std::io;
use std::os::fd::AsRawFd;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with `ifr_data` (40 bytes on 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

fn ioctl(dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let bytes = dev.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{dev:?} is not an interface name"),
        ));
    }
    let sock =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: &mut value,
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // `req` is a valid ifreq whose ifr_data points at `value`, both alive
    // for the call; the kernel reads the name and reads/writes `value`.
    super::syscall!(ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req))?;
    Ok(value.data)
}

/// Whether `dev` offloads transmit checksums (`ethtool -k DEV`'s `tx-checksumming`).
pub fn tx_checksum(dev: &str) -> io::Result<bool> {
    ioctl(dev, ETHTOOL_GTXCSUM, 0).map(|d| d != 0)
}

/// Turns `dev`'s transmit checksum offload on or off (`ethtool -K DEV tx
/// on|off`); returns whether that changed it.
pub fn set_tx_checksum(dev: &str, on: bool) -> io::Result<bool> {
    if tx_checksum(dev)? == on {
        return Ok(false);
    }
    ioctl(dev, ETHTOOL_STXCSUM, u32::from(on))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_the_kernel() {
        for name in ["", "a-name-longer-than-15", "nul\0"] {
            let e = tx_checksum(name).expect_err(name);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }

    #[test]
    fn ifreq_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfreqData>(), 40);
    }
}
