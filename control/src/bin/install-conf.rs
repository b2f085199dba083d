//! `install-conf <src> <dest>`: flannel's `/opt/bin/install-conf`
//! (fl:cmd/install_conf/main.go), the DaemonSet's `install-cni` init step.
//!
//! Copies `src` to `dest` atomically: a temp file `.<dest name>.tmp<random>`
//! in the destination directory receives the bytes, is fsynced, gets the
//! source's permission bits, and is renamed over `dest`, so the container
//! runtime never reads a half-written CNI config. Exit 1 with flannel's texts
//! on a wrong argument count or any failure.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        let me = args.first().map_or("install-conf", String::as_str);
        eprintln!("usage: {me} <src> <dest>");
        return ExitCode::from(1);
    }
    match install(Path::new(&args[1]), Path::new(&args[2])) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error installing {:?}: {e}", args[1]);
            ExitCode::from(1)
        }
    }
}

fn install(src: &Path, dest: &Path) -> io::Result<()> {
    let data = fs::read(src)?;
    let mode = fs::metadata(src)?.permissions().mode() & 0o7777;
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "destination has no file name"))?
        .to_string_lossy()
        .into_owned();
    let (tmp, mut f) = create_temp(&dir, &name)?;
    let res = (|| {
        f.write_all(&data)?;
        f.sync_all()?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        drop(f);
        fs::rename(&tmp, dest)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// `os.CreateTemp(dir, ".<name>.tmp*")`: a new file with a random suffix.
fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    let seed = std::process::id() as u64 ^ nanos();
    for i in 0..10_000u64 {
        let suffix = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i) % 1_000_000_000;
        let path = dir.join(format!(".{name}.tmp{suffix}"));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary file name",
    ))
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_atomically_with_source_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("cni-conf.json");
        fs::write(&src, b"{\"name\":\"cbr0\"}").expect("write src");
        fs::set_permissions(&src, fs::Permissions::from_mode(0o640)).expect("chmod");
        let dest = dir.path().join("net.d/10-flannel.conflist");
        fs::create_dir(dir.path().join("net.d")).expect("mkdir");
        fs::write(&dest, b"old").expect("old dest");
        install(&src, &dest).expect("install");
        assert_eq!(fs::read(&dest).expect("read dest"), b"{\"name\":\"cbr0\"}");
        assert_eq!(
            fs::metadata(&dest).expect("stat").permissions().mode() & 0o7777,
            0o640
        );
        let left: Vec<_> = fs::read_dir(dir.path().join("net.d"))
            .expect("ls")
            .collect();
        assert_eq!(left.len(), 1, "no temp file may be left behind");
    }

    #[test]
    fn missing_source_or_directory_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(install(&dir.path().join("nope"), &dir.path().join("x")).is_err());
        let src = dir.path().join("s");
        fs::write(&src, b"x").expect("write");
        assert!(install(&src, &dir.path().join("no/such/dir/x")).is_err());
    }
}
