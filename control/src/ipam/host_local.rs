//! host-local's allocations on this node, so that routed mode and bridge
//! mode never hand out one address twice.
//!
//! host-local (containernetworking-plugins, `backend/disk`) keeps one file
//! per allocated address in `<dataDir>/<network name>/` (by default
//! `/var/lib/cni/networks/cbr0/10.244.1.5`), created with `O_EXCL` and
//! holding `<containerID>\r\n<ifname>`, under an exclusive `flock` of the
//! directory's `lock` file, and skips every address that has a file. weftd's
//! IPAM speaks the same protocol on the directory the CNI plugin names in
//! its request (`hostLocalDir`):
//! - it never hands out an address host-local holds (bridge pods made
//!   before the node went routed);
//! - it writes a file of its own for every address it hands out, in
//!   host-local's format, so that host-local skips it when the node goes
//!   back to bridge mode while routed pods still run (and host-local's DEL
//!   of that container removes it, as it would its own);
//! - it removes a file on release only if it still holds that attachment's
//!   `containerID\r\nifname` (a file another owner wrote is left alone).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use weft_compat::ipam::Allocation;

/// host-local's line break between container ID and interface name.
const LINE_BREAK: &str = "\r\n";

/// One host-local network directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostLocalDir {
    path: PathBuf,
}

/// The held `flock` of a directory's `lock` file.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl HostLocalDir {
    /// The directory at `path`: absolute, without `.` or `..` components
    /// (it comes from a request on the root-only IPAM socket).
    pub fn new(path: &str) -> Result<HostLocalDir, String> {
        let p = Path::new(path);
        let plain = p
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !p.is_absolute() || !plain {
            return Err(format!(
                "hostLocalDir {path:?} must be an absolute path without . or .."
            ));
        }
        Ok(HostLocalDir {
            path: p.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the directory (0755, as host-local does) and takes its lock.
    pub fn lock(&self) -> io::Result<DirLock> {
        std::fs::create_dir_all(&self.path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(self.path.join("lock"))?;
        file.lock()?;
        Ok(DirLock { _file: file })
    }

    /// Every address with a file, and the file's owner line
    /// (`containerID\r\nifname`, or a bare container ID from old host-local).
    pub fn taken(&self) -> io::Result<BTreeMap<IpAddr, String>> {
        let mut out = BTreeMap::new();
        let entries = match std::fs::read_dir(&self.path) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let mut owner = String::new();
            if let Ok(f) = File::open(entry.path()) {
                let _ = f.take(1024).read_to_string(&mut owner);
            }
            out.insert(ip, owner.trim().to_string());
        }
        Ok(out)
    }

    /// Writes `a`'s files (`O_EXCL`); an address whose file already names
    /// this attachment is fine, one another owner holds is returned as a
    /// conflict with that owner (and nothing is written for it).
    pub fn reserve(&self, a: &Allocation) -> io::Result<Vec<(IpAddr, String)>> {
        let mut conflicts = Vec::new();
        let me = owner(a);
        for ip in ips(a) {
            let path = self.path.join(ip.to_string());
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
            {
                Ok(mut f) => {
                    if let Err(e) = f.write_all(me.as_bytes()) {
                        let _ = std::fs::remove_file(&path);
                        return Err(e);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let held = std::fs::read_to_string(&path).unwrap_or_default();
                    if held.trim() != me {
                        conflicts.push((ip, held.trim().replace(LINE_BREAK, "/")));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(conflicts)
    }

    /// Removes `a`'s files that still name this attachment.
    pub fn release(&self, a: &Allocation) {
        let me = owner(a);
        for ip in ips(a) {
            let path = self.path.join(ip.to_string());
            if std::fs::read_to_string(&path).is_ok_and(|held| held.trim() == me) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// The addresses in `taken` that are not `mine` (weftd's own files).
pub fn others(taken: &BTreeMap<IpAddr, String>, mine: &[Allocation]) -> BTreeSet<IpAddr> {
    taken
        .iter()
        .filter(|(ip, held)| {
            !mine
                .iter()
                .any(|a| ips(a).any(|x| x == **ip) && **held == owner(a))
        })
        .map(|(ip, _)| *ip)
        .collect()
}

/// host-local's file content for `a`.
fn owner(a: &Allocation) -> String {
    format!("{}{LINE_BREAK}{}", a.container_id.trim(), a.ifname)
}

fn ips(a: &Allocation) -> impl Iterator<Item = IpAddr> {
    a.ipv4
        .map(IpAddr::V4)
        .into_iter()
        .chain(a.ipv6.map(IpAddr::V6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: &str, ip: &str) -> Allocation {
        Allocation {
            container_id: id.into(),
            ifname: "eth0".into(),
            ipv4: Some(ip.parse().expect("ip")),
            ipv6: None,
        }
    }

    #[test]
    fn speaks_host_locals_file_protocol() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = HostLocalDir::new(&tmp.path().join("cbr0").to_string_lossy()).expect("dir");
        let _lock = dir.lock().expect("lock");
        assert!(tmp.path().join("cbr0/lock").exists());
        // What host-local 1.1 writes for a bridge pod, and its cursor file.
        std::fs::write(tmp.path().join("cbr0/10.244.88.2"), "bridgepod\r\neth0").expect("write");
        std::fs::write(tmp.path().join("cbr0/last_reserved_ip.0"), "10.244.88.2").expect("write");
        let taken = dir.taken().expect("taken");
        assert_eq!(taken.len(), 1, "{taken:?}");
        let mine = alloc("routedpod", "10.244.88.3");
        assert!(dir.reserve(&mine).expect("reserve").is_empty());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("cbr0/10.244.88.3")).expect("file"),
            "routedpod\r\neth0"
        );
        assert!(dir.reserve(&mine).expect("again").is_empty(), "idempotent");
        let taken = dir.taken().expect("taken");
        let others = others(&taken, std::slice::from_ref(&mine));
        assert_eq!(
            others.into_iter().collect::<Vec<_>>(),
            vec!["10.244.88.2".parse::<IpAddr>().expect("ip")]
        );
        // The double booking of issue 29 is reported, not written.
        let clash = dir
            .reserve(&alloc("routed2", "10.244.88.2"))
            .expect("reserve");
        assert_eq!(
            clash,
            vec![(
                "10.244.88.2".parse().expect("ip"),
                "bridgepod/eth0".to_string()
            )]
        );
        // Release removes only what names the attachment.
        dir.release(&alloc("routed2", "10.244.88.2"));
        assert!(tmp.path().join("cbr0/10.244.88.2").exists());
        dir.release(&mine);
        assert!(!tmp.path().join("cbr0/10.244.88.3").exists());
    }

    #[test]
    fn only_plain_absolute_paths_are_accepted() {
        for bad in ["cbr0", "/var/lib/cni/networks/../../etc", "./cbr0", ""] {
            assert!(HostLocalDir::new(bad).is_err(), "{bad}");
        }
        assert!(HostLocalDir::new("/var/lib/cni/networks/cbr0").is_ok());
    }
}
