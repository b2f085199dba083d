//! subnet.env rendering, atomic writing and reading.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Mutex;

use nix::sys::stat::{Mode, umask};

use super::*;

/// Serializes the tests that change the process umask.
static UMASK: Mutex<()> = Mutex::new(());

fn net4(s: &str) -> Ipv4Net {
    s.parse().expect("test cidr")
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().expect("test cidr")
}

fn v4_env() -> SubnetEnv {
    SubnetEnv {
        network: Some(net4("10.244.0.0/16")),
        subnet: Some(net4("10.244.1.0/24")),
        ipv6_network: None,
        ipv6_subnet: None,
        mtu: 1450,
        ipmasq: true,
    }
}

fn dual_env() -> SubnetEnv {
    SubnetEnv {
        ipv6_network: Some(net6("2001:cafe:42::/56")),
        ipv6_subnet: Some(net6("2001:cafe:42::/64")),
        ipmasq: false,
        ..v4_env()
    }
}

#[test]
fn exact_bytes_ipv4() {
    assert_eq!(
        v4_env().render().expect("complete"),
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
    );
}

#[test]
fn exact_bytes_ipv6_only() {
    let env = SubnetEnv {
        network: None,
        subnet: None,
        ..dual_env()
    };
    assert_eq!(
        env.render().expect("complete"),
        "FLANNEL_IPV6_NETWORK=2001:cafe:42::/56\nFLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
    );
}

#[test]
fn exact_bytes_dual_stack() {
    let env = SubnetEnv {
        ipv6_subnet: Some(net6("fc00:0:0:1::/64")),
        ipv6_network: Some(net6("fc00::/48")),
        ..dual_env()
    };
    assert_eq!(
        env.render().expect("complete"),
        "FLANNEL_NETWORK=10.244.0.0/16\n\
         FLANNEL_SUBNET=10.244.1.1/24\n\
         FLANNEL_IPV6_NETWORK=fc00::/48\n\
         FLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\n\
         FLANNEL_MTU=1450\n\
         FLANNEL_IPMASQ=false\n"
    );
}

#[test]
fn half_a_family_is_an_error() {
    let env = SubnetEnv {
        subnet: None,
        ..v4_env()
    };
    assert_eq!(
        env.render().map_err(|e| e.to_string()).err().as_deref(),
        Some("subnet.env needs both the IPv4 network and the IPv4 subnet")
    );
    let env = SubnetEnv {
        ipv6_network: None,
        ..dual_env()
    };
    assert!(matches!(
        env.render(),
        Err(SubnetEnvError::Incomplete("IPv6"))
    ));
}

#[test]
fn write_creates_dir_and_is_0644_under_restrictive_umask() {
    let _guard = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("run/flannel/subnet.env");
    let old = umask(Mode::from_bits_truncate(0o077));
    let result = dual_env().write(&path);
    umask(old);
    result.expect("write");
    let meta = fs::metadata(&path).expect("written");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
    assert_eq!(
        fs::read_to_string(&path).expect("read"),
        dual_env().render().expect("complete")
    );
    assert!(path.parent().is_some_and(|p| p.is_dir()));
}

#[test]
fn write_dir_mode_is_0755() {
    let _guard = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("a/b");
    let old = umask(Mode::from_bits_truncate(0o022));
    let result = v4_env().write(&dir.join("subnet.env"));
    umask(old);
    result.expect("write");
    assert_eq!(
        fs::metadata(&dir).expect("dir").permissions().mode() & 0o7777,
        0o755
    );
}

#[test]
fn write_replaces_atomically() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("subnet.env");
    v4_env().write(&path).expect("first write");
    let first_ino = fs::metadata(&path).expect("meta").ino();
    let old_reader = fs::File::open(&path).expect("open old");

    let second = SubnetEnv {
        mtu: 1400,
        ..v4_env()
    };
    second.write(&path).expect("second write");

    // A new file was renamed over the old one: an open reader keeps the old
    // content, the path shows the new one, and no temporary file is left behind.
    assert_ne!(fs::metadata(&path).expect("meta").ino(), first_ino);
    assert_eq!(
        io::read_to_string(old_reader).expect("old content"),
        v4_env().render().expect("ok")
    );
    assert_eq!(
        fs::read_to_string(&path).expect("new"),
        second.render().expect("ok")
    );
    let names: Vec<String> = fs::read_dir(tmp.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["subnet.env"]);
    assert_eq!(
        fs::metadata(&path).expect("meta").permissions().mode() & 0o7777,
        0o644
    );
}

#[test]
fn write_errors_are_reported_and_leave_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("file");
    fs::write(&file, "x").expect("setup");
    // Parent is a regular file.
    let err = v4_env()
        .write(&file.join("subnet.env"))
        .expect_err("cannot create dir");
    assert!(
        matches!(
            err,
            SubnetEnvError::Io {
                op: "create directory",
                ..
            }
        ),
        "{err}"
    );
    // Target is a directory: the rename fails and the temp file is removed.
    let target = tmp.path().join("dir");
    fs::create_dir(&target).expect("setup");
    fs::write(target.join("keep"), "x").expect("setup");
    let err = v4_env()
        .write(&target)
        .expect_err("cannot rename over a non-empty dir");
    assert!(
        matches!(err, SubnetEnvError::Io { op: "rename", .. }),
        "{err}"
    );
    let mut names: Vec<String> = fs::read_dir(tmp.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "file"]);
}

#[test]
fn read_missing_is_none() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        SubnetEnv::read(&tmp.path().join("nope")).expect("no error"),
        None
    );
}

#[test]
fn read_back_round_trips() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("subnet.env");
    for env in [
        v4_env(),
        dual_env(),
        SubnetEnv {
            network: None,
            subnet: None,
            ..dual_env()
        },
    ] {
        env.write(&path).expect("write");
        assert_eq!(SubnetEnv::read(&path).expect("read"), Some(env));
    }
}

#[test]
fn flannel_subnet_to_lease_subnet() {
    assert_eq!(
        lease_subnet_from_env("10.244.1.1/24"),
        Some(net4("10.244.1.0/24"))
    );
    assert_eq!(
        lease_ipv6_subnet_from_env("2001:cafe:42::1/64"),
        Some(net6("2001:cafe:42::/64"))
    );
    assert_eq!(lease_subnet_from_env("fc00::1/64"), None, "wrong family");
    assert_eq!(
        lease_ipv6_subnet_from_env("10.0.0.1/8"),
        None,
        "wrong family"
    );
    assert_eq!(lease_subnet_from_env("10.244.1.1"), None);
    assert_eq!(lease_subnet_from_env(""), None);
}

#[test]
fn comma_lists_need_exactly_one_valid_cidr() {
    // flannel main_test.go: invalid entries are skipped.
    assert_eq!(
        lease_subnet_from_env("garbage,10.244.1.1/24"),
        Some(net4("10.244.1.0/24"))
    );
    assert_eq!(
        lease_subnet_from_env("10.244.1.1/24,10.244.1.300/24,"),
        Some(net4("10.244.1.0/24"))
    );
    assert_eq!(
        lease_subnet_from_env("10.244.1.1/24,10.245.0.0/16"),
        None,
        "two valid entries"
    );
    assert_eq!(lease_subnet_from_env("a,b,c"), None, "no valid entry");
    // Items are not trimmed, as in Go's strings.Split + net.ParseCIDR.
    assert_eq!(
        lease_subnet_from_env("10.0.0.0/8, 10.1.0.0/16"),
        Some(net4("10.0.0.0/8"))
    );
    let env = SubnetEnv::parse(
        "FLANNEL_NETWORK=10.42.0.0/16,10.43.0.0/16\nFLANNEL_SUBNET=x,10.42.3.1/24\n",
    );
    assert_eq!(env.network, None);
    assert_eq!(env.subnet, Some(net4("10.42.3.0/24")));
}

#[test]
fn reader_is_forgiving() {
    let text = "# written by hand\r\n\
                garbage line without separator\n\
                =novalue\n\
                export FLANNEL_NETWORK=10.244.0.0/16\r\n\
                FLANNEL_SUBNET=\"10.244.7.1/24\"\n\
                FLANNEL_IPV6_NETWORK='fc00::/48'\n\
                FLANNEL_IPV6_SUBNET = fc00:0:0:7::1/64 # inline comment\n\
                FLANNEL_MTU=not-a-number\n\
                FLANNEL_MTU=1400\n\
                FLANNEL_IPMASQ=\"unterminated\n\
                \u{0}\u{ff}=\n";
    let env = SubnetEnv::parse(text);
    assert_eq!(env.network, Some(net4("10.244.0.0/16")));
    assert_eq!(env.subnet, Some(net4("10.244.7.0/24")));
    assert_eq!(env.ipv6_network, Some(net6("fc00::/48")));
    assert_eq!(env.ipv6_subnet, Some(net6("fc00:0:0:7::/64")));
    assert_eq!(env.mtu, 1400, "last duplicate wins");
    assert!(!env.ipmasq);
    let env = SubnetEnv::parse("FLANNEL_IPMASQ=true\nFLANNEL_MTU: 9001\n");
    assert!(env.ipmasq);
    assert_eq!(env.mtu, 9001, "godotenv accepts KEY: VALUE");
    assert_eq!(SubnetEnv::parse("").network, None);
}

#[test]
fn read_non_utf8_file_does_not_fail() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("subnet.env");
    fs::write(
        &path,
        b"\xff\xfe\nFLANNEL_SUBNET=10.244.9.1/24\n\x80=\x81\n",
    )
    .expect("setup");
    let env = SubnetEnv::read(&path).expect("read").expect("present");
    assert_eq!(env.subnet, Some(net4("10.244.9.0/24")));
}

#[test]
fn random_text_never_panics() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet = "FLANNEL_SUBNET=NETWORK_IPV6:#'\"\\ ,/.0123456789abcdef\n\r\t export€";
    let chars: Vec<char> = alphabet.chars().collect();
    for _ in 0..20_000 {
        let len = (next() % 80) as usize;
        let text: String = (0..len)
            .map(|_| chars[(next() % chars.len() as u64) as usize])
            .collect();
        let env = SubnetEnv::parse(&text);
        let _ = env.render();
    }
}
