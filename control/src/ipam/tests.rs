//! The server over a real unix socket (no root needed).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use weft_compat::ipam::{self as proto, ErrorKind, Response};

use super::*;

async fn call(socket: &Path, line: &str) -> Response {
    let mut s = UnixStream::connect(socket).await.expect("connect");
    s.write_all(format!("{line}\n").as_bytes())
        .await
        .expect("write");
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out).await.expect("read");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("reply {out:?}: {e}"))
}

fn alloc(id: &str) -> String {
    format!(r#"{{"op":"allocate","containerID":"{id}","ifname":"eth0"}}"#)
}

#[test]
fn default_paths_follow_the_subnet_file() {
    let p = paths(Path::new("/run/flannel/subnet.env"), None, None).expect("enabled");
    assert_eq!(p.socket, Path::new("/run/flannel/weft.sock"));
    assert_eq!(p.state, Path::new("/run/flannel/weft-ipam.json"));
    let p = paths(Path::new("/tmp/x/n1.env"), None, None).expect("enabled");
    assert_eq!(p.socket, Path::new("/tmp/x/n1.weft.sock"));
    assert_eq!(p.state, Path::new("/tmp/x/n1.weft-ipam.json"));
    let p = paths(
        Path::new("/a/subnet.env"),
        Some(Path::new("/s/api.sock")),
        Some(Path::new("/d/st.json")),
    )
    .expect("enabled");
    assert_eq!(
        (p.socket.as_path(), p.state.as_path()),
        (Path::new("/s/api.sock"), Path::new("/d/st.json"))
    );
    assert_eq!(
        paths(Path::new("/a/subnet.env"), Some(Path::new("")), None),
        None
    );
}

#[tokio::test]
async fn serves_persists_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("weft.sock");
    let state = dir.path().join("state/ipam.json");
    let net = Some("10.244.7.0/24".parse().expect("net"));
    let server = server::serve(&socket, &state, net, None)
        .await
        .expect("serve");
    let mode = std::fs::metadata(&socket)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "root-only socket");

    let a = call(&socket, &alloc("a")).await;
    assert!(a.ok, "{a:?}");
    let ip_a = a.allocation.as_ref().and_then(|x| x.ipv4).expect("v4");
    assert_eq!(
        call(&socket, &alloc("a")).await.allocation,
        a.allocation,
        "idempotent"
    );
    let b = call(&socket, &alloc("b"))
        .await
        .allocation
        .and_then(|x| x.ipv4)
        .expect("v4");
    assert_ne!(ip_a, b);
    let status = call(&socket, r#"{"op":"status"}"#).await;
    assert_eq!(status.subnet, net);

    // Several requests on one connection; a bad one does not close it.
    let mut s = UnixStream::connect(&socket).await.expect("connect");
    s.write_all(b"{\"op\":\"list\"}\nnot json\n{\"op\":\"release\",\"containerID\":\"zz\",\"ifname\":\"eth0\"}\n")
        .await
        .expect("write");
    let mut lines = BufReader::new(s).lines();
    let list: Response =
        serde_json::from_str(&lines.next_line().await.expect("read").expect("line")).expect("json");
    assert_eq!(list.allocations.map(|l| l.len()), Some(2));
    let bad: Response =
        serde_json::from_str(&lines.next_line().await.expect("read").expect("line")).expect("json");
    assert_eq!(bad.error.map(|e| e.kind), Some(ErrorKind::Invalid));
    let none: Response =
        serde_json::from_str(&lines.next_line().await.expect("read").expect("line")).expect("json");
    assert!(
        none.ok && none.allocation.is_none(),
        "releasing an unknown key is a no-op"
    );

    // An oversized request is refused and the connection closed.
    let mut s = UnixStream::connect(&socket).await.expect("connect");
    s.write_all(&vec![b'x'; proto::MAX_REQUEST + 100])
        .await
        .expect("write");
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out).await.expect("read");
    assert!(out.contains("longer than"), "{out}");

    // Restart: a holds its address, nothing is handed out twice.
    drop(server);
    assert!(!socket.exists(), "socket removed on drop");
    let _server = server::serve(&socket, &state, net, None)
        .await
        .expect("serve again");
    let again = call(&socket, &alloc("a"))
        .await
        .allocation
        .and_then(|x| x.ipv4);
    assert_eq!(again, Some(ip_a));
    let c = call(&socket, &alloc("c"))
        .await
        .allocation
        .and_then(|x| x.ipv4)
        .expect("v4");
    assert!(c != ip_a && c != b);
    let released = call(
        &socket,
        r#"{"op":"release","containerID":"a","ifname":"eth0"}"#,
    )
    .await;
    assert_eq!(released.allocation.and_then(|x| x.ipv4), Some(ip_a));
    let list = call(&socket, r#"{"op":"list"}"#)
        .await
        .allocations
        .expect("list");
    let ids: Vec<&str> = list.iter().map(|x| x.container_id.as_str()).collect();
    assert_eq!(ids, vec!["b", "c"]);
}

#[tokio::test]
async fn corrupt_state_refuses_to_allocate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("weft.sock");
    let state = dir.path().join("ipam.json");
    std::fs::write(&state, "{\"version\":1,\"allocations\":[{\"containerID\":").expect("write");
    let _server = server::serve(
        &socket,
        &state,
        Some("10.244.7.0/24".parse().expect("net")),
        None,
    )
    .await
    .expect("serve");
    for req in [
        alloc("a").as_str(),
        r#"{"op":"status"}"#,
        r#"{"op":"list"}"#,
    ] {
        let r = call(&socket, req).await;
        let e = r.error.expect("error");
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(
            e.message.contains("is corrupt") && e.message.contains("ipam.json"),
            "{}",
            e.message
        );
    }
    assert!(
        std::fs::read_to_string(&state)
            .expect("read")
            .starts_with("{\"version\":1,\"allocations\":[{"),
        "the corrupt file is kept for the operator"
    );
}

/// Issue 29, finding 3: routed mode next to host-local's bridge pods. An
/// address host-local holds is never handed out; weftd's own are written
/// in host-local's format (existing ones on first sight of the directory)
/// and removed on release.
#[tokio::test]
async fn host_locals_addresses_are_avoided_and_ours_are_recorded_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("weft.sock");
    let state = dir.path().join("ipam.json");
    let hl = dir.path().join("networks/cbr0");
    std::fs::create_dir_all(&hl).expect("mkdir");
    let net = Some("10.244.88.0/24".parse().expect("net"));
    let server = server::serve(&socket, &state, net, None)
        .await
        .expect("serve");
    // A routed pod from before the mirror existed (an older plugin).
    let old = call(&socket, &alloc("old")).await;
    assert_eq!(
        old.allocation.and_then(|a| a.ipv4),
        Some("10.244.88.2".parse().expect("ip"))
    );
    // host-local gave .3 to a bridge pod.
    std::fs::write(hl.join("10.244.88.3"), "bridgepod\r\neth0").expect("write");
    let with_dir = |id: &str, op: &str| {
        format!(
            r#"{{"op":"{op}","containerID":"{id}","ifname":"eth0","hostLocalDir":"{}"}}"#,
            hl.display()
        )
    };
    let r = call(&socket, &with_dir("routed", "allocate")).await;
    let ip = r.allocation.and_then(|a| a.ipv4).expect("v4");
    assert_eq!(
        ip,
        "10.244.88.4".parse::<std::net::Ipv4Addr>().expect("ip"),
        "skips host-local's .3"
    );
    for (file, owner) in [
        ("10.244.88.2", "old\r\neth0"),
        ("10.244.88.4", "routed\r\neth0"),
    ] {
        assert_eq!(std::fs::read_to_string(hl.join(file)).expect(file), owner);
    }
    assert_eq!(
        std::fs::read_to_string(hl.join("10.244.88.3")).expect("kept"),
        "bridgepod\r\neth0"
    );
    // A release without the directory (an older plugin) still removes ours,
    // the directory being remembered in the state file.
    let r = call(
        &socket,
        r#"{"op":"release","containerID":"routed","ifname":"eth0"}"#,
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert!(!hl.join("10.244.88.4").exists());
    assert!(
        std::fs::read_to_string(&state)
            .expect("state")
            .contains("hostLocalDirs")
    );
    let r = call(
        &socket,
        &with_dir("x", "allocate").replace(&hl.display().to_string(), "rel/dir"),
    )
    .await;
    assert_eq!(r.error.map(|e| e.kind), Some(ErrorKind::Invalid));
    drop(server);
}

/// Two daemons given one `--ipam-state` (each with its own socket): the
/// second is refused, naming the first, instead of sharing allocations.
#[tokio::test]
async fn one_state_file_has_one_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("ipam.json");
    let net = Some("10.244.9.0/24".parse().expect("net"));
    let first = server::serve(&dir.path().join("a.sock"), &state, net, None)
        .await
        .expect("first");
    let e = server::serve(&dir.path().join("b.sock"), &state, net, None)
        .await
        .expect_err("second owner");
    let msg = e.to_string();
    assert!(
        msg.contains("in use by another weftd")
            && msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(
        !dir.path().join("b.sock").exists(),
        "the refused server bound its socket"
    );
    drop(first);
    drop(
        server::serve(&dir.path().join("b.sock"), &state, net, None)
            .await
            .expect("after the first is gone"),
    );
}
