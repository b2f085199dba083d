//! CNI plugin targets: the invocation (`CNI_*` variables and stdin) as the
//! binary decodes it, and the network config plus subnet.env as ADD turns
//! them into the delegate config that is saved and replayed on DEL/CHECK.

use std::collections::HashMap;

use serde_json::Value;
use weft_cni::compat::subnet_env::plugin as subnet_env;
use weft_cni::config::NetConf;
use weft_cni::{Command, delegate, version};

/// A subnet.env as weftd writes it for a dual-stack node.
const SUBNET_ENV: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

const VERBS: [&str; 7] = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "BOGUS"];

/// One invocation. Input: a selector byte (verb = `VERBS[b % 7]`; bit 7:
/// `KEY=VALUE` lines up to the first empty line override the environment),
/// then stdin. Errors must map to a CNI error object that is valid JSON.
pub fn cni_command(data: &[u8]) {
    let Some((&sel, mut stdin)) = data.split_first() else {
        return;
    };
    let mut env: HashMap<String, String> = [
        ("CNI_COMMAND", VERBS[usize::from(sel) % VERBS.len()]),
        ("CNI_CONTAINERID", "0123456789abcdef"),
        ("CNI_NETNS", "/var/run/netns/cni-1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if sel & 0x80 != 0 {
        let end = stdin
            .windows(2)
            .position(|w| w == b"\n\n")
            .unwrap_or(stdin.len());
        for line in String::from_utf8_lossy(&stdin[..end]).lines() {
            if let Some((k, v)) = line.split_once('=') {
                env.insert(k.to_string(), v.to_string());
            }
        }
        stdin = stdin.get(end + 2..).unwrap_or_default();
    }
    let getenv = |k: &str| env.get(k).cloned();
    let mut input = Vec::new();
    match Command::load(&getenv, &mut &stdin[..], &mut input) {
        Ok(Command::Version { requested }) => {
            let reply = version::reply(requested.as_deref());
            assert!(reply.is_object(), "VERSION reply is not an object");
        }
        Ok(
            Command::Add(req)
            | Command::Del(req)
            | Command::Check(req)
            | Command::Gc(req)
            | Command::Status(req),
        ) => {
            assert!(!req.conf.name.is_empty());
            let _ = req.conf.gc_attachments();
            let env = subnet_env::parse("subnet.env", SUBNET_ENV.as_bytes())
                .expect("the fixed subnet.env parses");
            delegate_round_trip(&req.conf, &env);
        }
        Err(e) => {
            let cni = e.to_cni(Some("1.0.0"));
            assert!(cni.code > 0);
            let json = cni.to_json();
            let v: Value = serde_json::from_slice(&json).expect("CNI error output is JSON");
            assert_eq!(v["code"], Value::from(cni.code));
        }
    }
}

/// Network config and subnet.env. Input: the config JSON, optionally followed
/// by a NUL byte and subnet.env text (else a fixed dual-stack one).
pub fn cni_config(data: &[u8]) {
    let (conf, env) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, SUBNET_ENV.as_bytes()),
    };
    let env = subnet_env::parse("subnet.env", env);
    let Ok(conf) = NetConf::parse(conf) else {
        return;
    };
    let _ = conf.delegate_type();
    let _ = conf.gc_attachments();
    if let Ok(env) = env {
        delegate_round_trip(&conf, &env);
    }
}

/// ADD's delegate config: built, serialized as saved, read back as DEL does.
fn delegate_round_trip(conf: &NetConf, env: &subnet_env::SubnetEnv) {
    let _ = delegate::validate(conf);
    let Ok(d) = delegate::build(conf, env) else {
        return;
    };
    let bytes = delegate::to_bytes(&d);
    let v: Value = serde_json::from_slice(&bytes).expect("saved delegate config is JSON");
    assert!(
        v.get("name").is_some_and(Value::is_string),
        "delegate without a name"
    );
    if let Ok((m, _ty)) = delegate::parse_saved(&bytes) {
        assert_eq!(Value::Object(m), v);
    }
}
