//! The embedded store's on-disk format and its locked read-modify-write cycle.
//!
//! One data file, `leases.db`, holds everything:
//!
//! ```text
//! weft-store 1 <revision> <body length> <fnv1a-64 of the body, 16 hex digits>
//! C "<network config as a JSON string>"
//! L <subnet key> <expiry in ms since the epoch, or -> <LeaseAttrs JSON>
//! ```
//!
//! The header line guards the body: a file whose body length or checksum does
//! not match is reported as [`StoreError::Corrupt`], naming the file and its
//! backup (`leases.db.prev`, the generation before the last write). It is never
//! read as empty, and writers refuse to overwrite it.
//!
//! Writers serialise on an exclusive `flock` of `lock` (per open file
//! description, so threads and processes exclude each other alike), read the
//! current generation, drop expired leases, apply their change and publish the
//! new generation atomically: write `leases.db.tmp`, fsync, hard-link the
//! current file to `leases.db.prev`, rename the temp file over `leases.db`,
//! fsync the directory. Readers take no lock: they always see a complete
//! generation because the data file is only ever replaced by `rename`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::StoreError;

/// Name of the data file inside the store directory.
pub const DATA_FILE: &str = "leases.db";
const PREV_FILE: &str = "leases.db.prev";
const TMP_FILE: &str = "leases.db.tmp";
const PREV_TMP_FILE: &str = "leases.db.prev.tmp";
const LOCK_FILE: &str = "lock";
const MAGIC: &str = "weft-store";
const VERSION: u32 = 1;

/// The paths of one store directory.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The store directory.
    pub dir: PathBuf,
    /// The data file.
    pub data: PathBuf,
    /// The previous generation of the data file.
    pub prev: PathBuf,
    tmp: PathBuf,
    prev_tmp: PathBuf,
    lock: PathBuf,
}

impl Paths {
    /// The paths for store directory `dir`.
    pub fn new(dir: PathBuf) -> Paths {
        Paths {
            data: dir.join(DATA_FILE),
            prev: dir.join(PREV_FILE),
            tmp: dir.join(TMP_FILE),
            prev_tmp: dir.join(PREV_TMP_FILE),
            lock: dir.join(LOCK_FILE),
            dir,
        }
    }
}

/// One stored lease, kept as text until someone needs it decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The LeaseAttrs JSON, one line.
    pub attrs: String,
    /// Expiry in milliseconds since the epoch; `None` for a reservation.
    pub expires_ms: Option<u64>,
}

impl Entry {
    /// Whether the lease has run out at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|e| e <= now_ms)
    }

    /// The expiry as a wall-clock time.
    pub fn expiration(&self) -> Option<SystemTime> {
        self.expires_ms
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }
}

/// One generation of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// Incremented by every write.
    pub revision: u64,
    /// The network config text.
    pub config: Option<String>,
    /// Leases by subnet key text (`10.244.1.0-24`).
    pub leases: BTreeMap<String, Entry>,
}

/// Identifies one generation of the data file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of(m: &fs::Metadata) -> FileId {
        FileId {
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> u64 {
    ms_since_epoch(SystemTime::now())
}

/// Milliseconds since the epoch of `t` (0 before the epoch).
pub fn ms_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// 64-bit FNV-1a: enough to catch truncation and torn or damaged bytes.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The checksum covers the header fields before it and the body.
fn checksum(header: &[u8], body: &[u8]) -> u64 {
    fnv1a64(&[header, body])
}

/// Encodes a generation (header and body).
pub fn encode(data: &Data) -> Vec<u8> {
    let mut body = String::with_capacity(64 + data.leases.len() * 160);
    if let Some(cfg) = &data.config {
        body.push_str("C ");
        body.push_str(&serde_json::Value::from(cfg.as_str()).to_string());
        body.push('\n');
    }
    for (key, e) in &data.leases {
        body.push_str("L ");
        body.push_str(key);
        match e.expires_ms {
            Some(ms) => {
                let _ = write!(body, " {ms} ");
            }
            None => body.push_str(" - "),
        }
        // JSON allows a line break only as whitespace outside strings, so
        // turning one into a space keeps the value the same.
        body.extend(
            e.attrs
                .chars()
                .map(|c| if c == '\n' || c == '\r' { ' ' } else { c }),
        );
        body.push('\n');
    }
    let mut out = format!("{MAGIC} {VERSION} {} {} ", data.revision, body.len()).into_bytes();
    let sum = checksum(&out, body.as_bytes());
    out.extend_from_slice(format!("{sum:016x}\n").as_bytes());
    out.extend_from_slice(body.as_bytes());
    out
}

/// Decodes a generation; `what` explains the damage when it fails.
pub fn decode(bytes: &[u8]) -> Result<Data, String> {
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no header line (truncated?)")?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| "header is not text")?;
    let f: Vec<&str> = header.split(' ').collect();
    if f.len() != 5 || f[0] != MAGIC {
        return Err(format!("bad header {header:?}"));
    }
    if f[1] != VERSION.to_string() {
        return Err(format!("unsupported format version {}", f[1]));
    }
    let revision: u64 = f[2]
        .parse()
        .map_err(|_| format!("bad revision {:?}", f[2]))?;
    let len: usize = f[3].parse().map_err(|_| format!("bad length {:?}", f[3]))?;
    let sum =
        u64::from_str_radix(f[4], 16).map_err(|_| format!("bad checksum field {:?}", f[4]))?;
    let body = &bytes[nl + 1..];
    if body.len() != len {
        return Err(format!(
            "body is {} bytes, header says {len} (truncated or torn write)",
            body.len()
        ));
    }
    let covered = &header.as_bytes()[..header.len() - f[4].len()];
    if checksum(covered, body) != sum {
        return Err("checksum mismatch (damaged contents)".to_string());
    }
    let body = std::str::from_utf8(body).map_err(|_| "body is not UTF-8")?;
    let mut data = Data {
        revision,
        ..Data::default()
    };
    for (i, line) in body.lines().enumerate() {
        let bad = |what: &str| format!("line {}: {what}", i + 2);
        if let Some(cfg) = line.strip_prefix("C ") {
            data.config = Some(serde_json::from_str(cfg).map_err(|_| bad("bad config string"))?);
        } else if let Some(rest) = line.strip_prefix("L ") {
            let mut parts = rest.splitn(3, ' ');
            let (Some(key), Some(exp), Some(attrs)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("short lease line"));
            };
            let expires_ms = match exp {
                "-" => None,
                n => Some(n.parse().map_err(|_| bad("bad expiry"))?),
            };
            data.leases.insert(
                key.to_string(),
                Entry {
                    attrs: attrs.to_string(),
                    expires_ms,
                },
            );
        } else {
            return Err(bad("unknown record"));
        }
    }
    Ok(data)
}

fn corrupt(paths: &Paths, why: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "{} is damaged: {why}; refusing to treat it as empty. The previous generation is kept in {} \
         (check it, then copy it over the damaged file to recover)",
        paths.data.display(),
        paths.prev.display()
    ))
}

/// A full disk (or quota) passes once space is freed, so it is
/// [`StoreError::Unavailable`] and callers retry (weftd starting on a full
/// disk waits, as it waits for an unreachable etcd, instead of exiting 1);
/// every other I/O failure is [`StoreError::Other`].
fn io_err(what: &str, path: &Path, e: io::Error) -> StoreError {
    let msg = format!("{what} {}: {e}", path.display());
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => StoreError::Unavailable(msg),
        _ => StoreError::Other(msg),
    }
}

/// Reads the current generation with its file identity (`None` when the
/// store was never written).
pub fn read(paths: &Paths) -> Result<(Data, Option<FileId>), StoreError> {
    let mut f = match File::open(&paths.data) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if paths.prev.exists() {
                return Err(corrupt(
                    paths,
                    "the data file is missing but a backup exists",
                ));
            }
            return Ok((Data::default(), None));
        }
        Err(e) => return Err(io_err("open", &paths.data, e)),
    };
    let meta = f.metadata().map_err(|e| io_err("stat", &paths.data, e))?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.read_to_end(&mut bytes)
        .map_err(|e| io_err("read", &paths.data, e))?;
    let data = decode(&bytes).map_err(|why| corrupt(paths, &why))?;
    Ok((data, Some(FileId::of(&meta))))
}

/// The identity of the current data file, if there is one.
pub fn file_id(paths: &Paths) -> Result<Option<FileId>, StoreError> {
    match fs::metadata(&paths.data) {
        Ok(m) => Ok(Some(FileId::of(&m))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("stat", &paths.data, e)),
    }
}

/// Creates the store directory if needed.
pub fn ensure_dir(paths: &Paths) -> Result<(), StoreError> {
    fs::create_dir_all(&paths.dir).map_err(|e| io_err("create directory", &paths.dir, e))
}

/// Runs `change` on the current generation under the store lock and publishes
/// the result if `change` reports a modification (or expired leases were
/// dropped). `change` gets the data and the current time in ms.
pub fn modify<T>(
    paths: &Paths,
    change: impl FnOnce(&mut Data, u64) -> Result<(T, bool), StoreError>,
) -> Result<T, StoreError> {
    ensure_dir(paths)?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&paths.lock)
        .map_err(|e| io_err("open", &paths.lock, e))?;
    lock.lock().map_err(|e| io_err("lock", &paths.lock, e))?;
    let (mut data, _) = read(paths)?;
    let now = now_ms();
    let before = data.leases.len();
    data.leases.retain(|_, e| !e.expired(now));
    let purged = data.leases.len() != before;
    let (out, changed) = change(&mut data, now)?;
    if changed || purged {
        data.revision += 1;
        publish(paths, &encode(&data))?;
    }
    drop(lock);
    Ok(out)
}

/// Atomically replaces the data file, keeping the old one as the backup.
fn publish(paths: &Paths, bytes: &[u8]) -> Result<(), StoreError> {
    let mut tmp = File::create(&paths.tmp).map_err(|e| io_err("create", &paths.tmp, e))?;
    tmp.write_all(bytes)
        .map_err(|e| io_err("write", &paths.tmp, e))?;
    tmp.sync_all().map_err(|e| io_err("fsync", &paths.tmp, e))?;
    drop(tmp);
    if paths.data.exists() {
        let _ = fs::remove_file(&paths.prev_tmp);
        fs::hard_link(&paths.data, &paths.prev_tmp)
            .map_err(|e| io_err("link", &paths.prev_tmp, e))?;
        fs::rename(&paths.prev_tmp, &paths.prev).map_err(|e| io_err("rename", &paths.prev, e))?;
    }
    fs::rename(&paths.tmp, &paths.data).map_err(|e| io_err("rename", &paths.data, e))?;
    File::open(&paths.dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync", &paths.dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (chaos run, issue 22): a weftd restarted while the
    /// embedded store's disk was full exited 1 ("failed to acquire lease:
    /// ... No space left on device") instead of waiting for space.
    #[test]
    fn a_full_disk_is_retryable_other_io_errors_are_not() {
        let p = Path::new("/s/leases.db.tmp");
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = io_err("write", p, io::Error::from_raw_os_error(errno));
            assert!(e.is_retryable(), "{e}");
        }
        let e = io_err("open", p, io::Error::from_raw_os_error(libc::EACCES));
        assert!(!e.is_retryable(), "{e}");
    }

    fn sample() -> Data {
        let mut d = Data {
            revision: 7,
            config: Some("{\"Network\": \"10.244.0.0/16\"}\n".into()),
            ..Data::default()
        };
        d.leases.insert(
            "10.244.1.0-24".into(),
            Entry {
                attrs: r#"{"PublicIP":"192.0.2.1","PublicIPv6":null}"#.into(),
                expires_ms: Some(1_700_000_000_000),
            },
        );
        d.leases.insert(
            "10.244.2.0-24&fd00::-64".into(),
            Entry {
                attrs: r#"{"PublicIP":"192.0.2.2","PublicIPv6":null}"#.into(),
                expires_ms: None,
            },
        );
        d
    }

    #[test]
    fn round_trip() {
        let d = sample();
        assert_eq!(decode(&encode(&d)).expect("decode"), d);
        assert_eq!(
            decode(&encode(&Data::default())).expect("empty"),
            Data::default()
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let bytes = encode(&sample());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "truncated to {n} bytes");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x04;
            assert!(decode(&b).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn line_breaks_in_attrs_stay_on_one_line() {
        let mut d = Data::default();
        d.leases.insert(
            "10.0.0.0-24".into(),
            Entry {
                attrs: "{\"A\":\n1}".into(),
                expires_ms: None,
            },
        );
        let back = decode(&encode(&d)).expect("decode");
        assert_eq!(back.leases["10.0.0.0-24"].attrs, "{\"A\": 1}");
    }
}
