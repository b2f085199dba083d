//! The plugin against a scripted CNI 1.1 delegate (no root needed): what is
//! forwarded (GC with the valid list, STATUS, CHECK with prevResult), which
//! environment the delegate sees, and ADD's rollback when the delegate's
//! result is unusable. Debian's real plugins (1.1.1) predate GC/STATUS, so
//! these paths can only be seen with a fake.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const FLANNEL: &str = env!("CARGO_BIN_EXE_flannel");

/// A temp node whose only delegate is the script `fake11`.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display().to_string();
        let script = format!(
            r#"#!/bin/sh
input=$(cat)
printf '%s|%s|%s|%s|%s\n' "$CNI_COMMAND" "${{CNI_CONTAINERID-}}" "${{CNI_IFNAME-}}" "${{CNI_NETNS-unset}}" "$input" >> {d}/calls
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}}' ;;
ADD) if [ -e {d}/garbage ]; then echo 'not json'; else
     echo '{{"cniVersion":"1.1.0","ips":[{{"address":"10.244.9.5/24","gateway":"10.244.9.1"}}],"routes":[{{"dst":"10.244.0.0/16"}}]}}'; fi ;;
STATUS) if [ -e {d}/unready ]; then echo '{{"code":51,"msg":"fake not ready","details":"d"}}'; exit 1; fi ;;
esac
"#
        );
        std::fs::create_dir(dir.path().join("bin")).expect("mkdir");
        let p = dir.path().join("bin/fake11");
        std::fs::write(&p, script).expect("write fake");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(
            dir.path().join("subnet.env"),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.9.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        )
        .expect("subnet.env");
        Node { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn conf(&self) -> Value {
        json!({"cniVersion": "1.1.0", "name": "cbr0", "type": "flannel",
               "subnetFile": self.path("subnet.env"), "dataDir": self.path("data"),
               "delegate": {"type": "fake11"}, "ipam": {"type": "fake11"}})
    }

    /// Runs the plugin; returns (exit code, stdout).
    fn run(&self, cmd: &str, vars: &[(&str, &str)], conf: &Value) -> (i32, String) {
        use std::io::Write;
        let mut c = Command::new(FLANNEL);
        c.env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_PATH", self.path("bin"))
            .env("CNI_ARGS", "IgnoreUnknown=1");
        for (k, v) in vars {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&serde_json::to_vec(conf).expect("json"))
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// The delegate's calls: (command, container ID, ifname, netns, stdin JSON).
    fn calls(&self) -> Vec<(String, String, String, String, Value)> {
        let text = std::fs::read_to_string(self.path("calls")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let parts: Vec<&str> = l.splitn(5, '|').collect();
                assert_eq!(parts.len(), 5, "{l}");
                let stdin = serde_json::from_str(parts[4]).unwrap_or(Value::Null);
                (
                    parts[0].into(),
                    parts[1].into(),
                    parts[2].into(),
                    parts[3].into(),
                    stdin,
                )
            })
            .filter(|c| c.0 != "VERSION")
            .collect()
    }

    fn saved(&self, id: &str) -> bool {
        Path::new(&self.path("data")).join(id).exists()
    }
}

fn attach<'a>(id: &'a str, ifname: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("CNI_CONTAINERID", id),
        ("CNI_IFNAME", ifname),
        ("CNI_NETNS", "/var/run/netns/none"),
    ]
}

#[test]
fn add_keeps_1_1_0_for_a_1_1_delegate_and_check_gets_prev_result() {
    let n = Node::new();
    let (code, out) = n.run("ADD", &attach("c1", "eth0"), &n.conf());
    assert_eq!(code, 0, "{out}");
    let result: Value = serde_json::from_str(&out).expect("result");
    assert_eq!(result["cniVersion"], "1.1.0");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(n.path("data/c1")).expect("saved")).expect("json");
    assert_eq!(
        saved["cniVersion"], "1.1.0",
        "no downgrade for a 1.1 delegate"
    );
    assert_eq!(saved["ipam"]["type"], "fake11");

    let mut check = n.conf();
    check["prevResult"] = result;
    let (code, out) = n.run("CHECK", &attach("c1", "eth0"), &check);
    assert_eq!(code, 0, "{out}");
    let calls = n.calls();
    let (cmd, id, _, _, stdin) = calls.last().expect("check call");
    assert_eq!((cmd.as_str(), id.as_str()), ("CHECK", "c1"));
    assert_eq!(
        stdin["prevResult"]["routes"][0],
        json!({"dst": "10.244.0.0/16", "gw": "10.244.9.1"})
    );
    assert_eq!(
        stdin["type"], "fake11",
        "the saved config, not a rebuilt one"
    );
}

#[test]
fn unusable_result_rolls_back_with_delegate_del() {
    let n = Node::new();
    std::fs::write(n.path("garbage"), "").expect("flag");
    let (code, out) = n.run("ADD", &attach("c2", "eth0"), &n.conf());
    assert_eq!(code, 1);
    let e: Value = serde_json::from_str(&out).expect("error json");
    assert_eq!(e["code"], 999, "{e}");
    let cmds: Vec<String> = n.calls().into_iter().map(|c| c.0).collect();
    assert_eq!(
        cmds,
        vec!["ADD", "DEL"],
        "delegate DEL after a successful delegate ADD"
    );
    assert!(!n.saved("c2"), "saved config removed after rollback");
}

#[test]
fn gc_releases_stale_then_forwards_valid_list() {
    let n = Node::new();
    for (id, ifname) in [("keep", "eth0"), ("stale", "net1")] {
        let (code, out) = n.run("ADD", &attach(id, ifname), &n.conf());
        assert_eq!(code, 0, "{out}");
    }
    let mut gc = n.conf();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let (code, out) = n.run("GC", &[], &gc);
    assert_eq!((code, out.as_str()), (0, ""));
    let calls = n.calls();
    let tail: Vec<_> = calls.iter().skip(2).collect();
    assert_eq!(tail.len(), 2, "{calls:?}");
    let (cmd, id, ifname, netns, _) = tail[0];
    assert_eq!(
        (cmd.as_str(), id.as_str(), ifname.as_str(), netns.as_str()),
        ("DEL", "stale", "net1", "unset")
    );
    let (cmd, _, _, _, stdin) = tail[1];
    assert_eq!(cmd, "GC");
    assert_eq!(
        stdin["cni.dev/valid-attachments"],
        json!([{"containerID": "keep", "ifname": "eth0"}])
    );
    assert_eq!(
        stdin["cni.dev/attachments"],
        stdin["cni.dev/valid-attachments"]
    );
    assert_eq!(stdin["ipam"]["ranges"][0][0]["subnet"], "10.244.9.0/24");
    assert!(n.saved("keep") && !n.saved("stale"));
}

#[test]
fn status_is_forwarded_and_passes_the_delegate_error_through() {
    let n = Node::new();
    let (code, out) = n.run("STATUS", &[], &n.conf());
    assert_eq!((code, out.as_str()), (0, ""));
    assert_eq!(
        n.calls().last().map(|c| c.0.clone()),
        Some("STATUS".to_string())
    );
    std::fs::write(n.path("unready"), "").expect("flag");
    let (code, out) = n.run("STATUS", &[], &n.conf());
    assert_eq!(code, 1);
    let e: Value = serde_json::from_str(&out).expect("error json");
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str(), e["details"].as_str()),
        (Some(51), Some("fake not ready"), Some("d"))
    );
}
