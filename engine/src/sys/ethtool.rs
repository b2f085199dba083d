//! A device's offload features over the `SIOCETHTOOL` ioctl: its
//! transmit checksum offload (`ethtool -k` / `ethtool -K DEV tx off`), the
//! one ethtool setting weft changes, flannel's documented workaround for the kernel vxlan
//! checksum-offload bug (flannel#1279, PR#1282; weftd's
//! `--vxlan-tx-checksum-offload`, `weft doctor`'s `vxlan_tx_csum_off`).
//!
//! The legacy `ETHTOOL_GTXCSUM`/`ETHTOOL_STXCSUM` commands read and set every
//! transmit checksum feature at once (`tx-checksum-ip-generic` on a vxlan
//! device); the kernel then drops the features that need them (TSO, GSO
//! with checksum), as `ethtool -K DEV tx off` does. Any socket in the
//! network namespace serves as the ioctl's handle.
//!
//! [`feature`] reads one feature by its `ethtool -k` name (weftd's
//! `--tunnel-gso=auto` asks for the uplink's `tx-udp_tnl-segmentation`):
//! `ETHTOOL_GSSET_INFO` gives the size of the `ETH_SS_FEATURES` string set,
//! `ETHTOOL_GSTRINGS` its names (the name's index is its bit) and
//! `ETHTOOL_GFEATURES` the active bits. Read only; no privilege needed.

use std::io;
use std::os::fd::AsRawFd;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
/// `ETH_SS_FEATURES`: the string set naming the netdev feature bits.
const ETH_SS_FEATURES: u32 = 4;
/// `ETH_GSTRING_LEN`.
const GSTRING_LEN: usize = 32;
/// More feature names than any kernel has (6.18: 69); a bound on the buffers.
const MAX_FEATURES: u32 = 1024;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ethtool_sset_info` asking for one string set.
#[repr(C)]
struct SsetInfo {
    cmd: u32,
    reserved: u32,
    sset_mask: u64,
    data: [u32; 1],
}

/// `struct ifreq` with `ifr_data` (40 bytes on 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ioctl(dev: &str, cmd: u32, data: u32) -> io::Result<u32> {
    let mut value = EthtoolValue { cmd, data };
    ioctl_buf(dev, (&mut value as *mut EthtoolValue).cast())?;
    Ok(value.data)
}

/// `SIOCETHTOOL` on `dev` with `ifr_data` = `data`, which must point at
/// an ethtool command structure of the size its command implies, alive
/// and writable for the call.
fn ioctl_buf(dev: &str, data: *mut libc::c_void) -> io::Result<()> {
    let bytes = dev.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{dev:?} is not an interface name"),
        ));
    }
    let sock =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // `req` is a valid ifreq whose ifr_data is the caller's command buffer
    // (alive for the call); the kernel reads the name and the buffer.
    super::syscall!(ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req))?;
    Ok(())
}

/// Whether feature `name` (as `ethtool -k` names it, e.g.
/// `tx-udp_tnl-segmentation`) is active on `dev`; `None` when this kernel
/// has no feature of that name. Allocates (a few KiB): control path only.
pub fn feature(dev: &str, name: &str) -> io::Result<Option<bool>> {
    let mut info = SsetInfo {
        cmd: ETHTOOL_GSSET_INFO,
        reserved: 0,
        sset_mask: 1 << ETH_SS_FEATURES,
        data: [0],
    };
    ioctl_buf(dev, (&mut info as *mut SsetInfo).cast())?;
    // The kernel clears the bits of the sets it does not have and fills
    // `data` for those it has.
    let count = info.data[0];
    if info.sset_mask & (1 << ETH_SS_FEATURES) == 0 || count == 0 || count > MAX_FEATURES {
        return Ok(None);
    }
    let n = count as usize;
    // struct ethtool_gstrings: cmd, string_set, len, u8 data[len * 32];
    // a u32 buffer keeps it aligned.
    let mut strings = vec![0u32; 3 + n * GSTRING_LEN / 4];
    strings[0] = ETHTOOL_GSTRINGS;
    strings[1] = ETH_SS_FEATURES;
    strings[2] = count;
    ioctl_buf(dev, strings.as_mut_ptr().cast())?;
    let got = (strings[2] as usize).min(n);
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let Some(bit) = bytes
        .chunks_exact(GSTRING_LEN)
        .take(got)
        .position(|s| s.split(|b| *b == 0).next() == Some(name.as_bytes()))
    else {
        return Ok(None);
    };
    // struct ethtool_gfeatures: cmd, size, then `size` blocks of
    // {available, requested, active, never_changed}.
    let blocks = n.div_ceil(32);
    let mut feats = vec![0u32; 2 + 4 * blocks];
    feats[0] = ETHTOOL_GFEATURES;
    feats[1] = blocks as u32;
    ioctl_buf(dev, feats.as_mut_ptr().cast())?;
    let active = feats[2 + 4 * (bit / 32) + 2];
    Ok(Some(active & (1 << (bit % 32)) != 0))
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

    /// `lo` exists in every network namespace: its `loopback` feature is
    /// on, the UDP-tunnel one is known (off or on), an invented name is not.
    #[test]
    fn features_are_read_by_name() {
        assert_eq!(feature("lo", "loopback").expect("lo"), Some(true));
        assert!(
            feature("lo", "tx-udp_tnl-segmentation")
                .expect("lo")
                .is_some()
        );
        assert_eq!(feature("lo", "no-such-feature").expect("lo"), None);
        let e = feature("", "loopback").expect_err("no name");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(feature("weft-nosuchdev", "loopback").is_err());
    }

    /// Agrees with `ethtool -k` on every interface (skips without the
    /// tool, and fails without it under CI: `weft_testenv`).
    #[test]
    fn features_agree_with_ethtool() {
        weft_testenv::require_tool!("ethtool", "/usr/sbin/ethtool", "ethtool");
        let links = std::fs::read_dir("/sys/class/net").expect("/sys/class/net");
        for l in links.flatten() {
            let dev = l.file_name().to_string_lossy().into_owned();
            let out = std::process::Command::new("/usr/sbin/ethtool")
                .args(["-k", &dev])
                .output()
                .expect("ethtool -k");
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines().skip(1) {
                let Some((name, state)) = line.trim().split_once(": ") else {
                    continue;
                };
                let on = state.starts_with("on");
                // ethtool's summary lines (`tx-checksumming`) are no features.
                if let Some(got) = feature(&dev, name).expect(&dev) {
                    assert_eq!(got, on, "{dev} {name}");
                }
            }
        }
    }

    #[test]
    fn ifreq_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfreqData>(), 40);
    }
}
