use std::collections::HashMap;

use super::*;

fn load(vars: &[(&str, &str)], stdin: &str) -> Result<Command, Error> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut input = Vec::new();
    Command::load(&|k| map.get(k).cloned(), &mut stdin.as_bytes(), &mut input)
}

const CONF: &str = r#"{"cniVersion":"1.0.0","name":"cbr0","type":"flannel"}"#;

fn full(cmd: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "abc-1.2_x"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
}

#[test]
fn parses_each_verb() {
    assert!(
        matches!(load(&full("ADD"), CONF), Ok(Command::Add(r)) if r.env.container_id == "abc-1.2_x" && r.conf.name == "cbr0")
    );
    assert!(matches!(load(&full("DEL"), CONF), Ok(Command::Del(_))));
    assert!(matches!(load(&full("CHECK"), CONF), Ok(Command::Check(_))));
    let v11 = r#"{"cniVersion":"1.1.0","name":"cbr0"}"#;
    assert!(matches!(
        load(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/p")], v11),
        Ok(Command::Gc(_))
    ));
    assert!(matches!(
        load(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/p")], v11),
        Ok(Command::Status(_))
    ));
    assert!(
        matches!(load(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#), Ok(Command::Version { requested: Some(v) }) if v == "0.4.0")
    );
    assert!(matches!(
        load(&[("CNI_COMMAND", "VERSION")], ""),
        Ok(Command::Version { requested: None })
    ));
}

#[test]
fn missing_env_lists_every_missing_variable() {
    let e = load(&[("CNI_COMMAND", "ADD")], CONF).expect_err("missing");
    assert_eq!(
        e.to_string(),
        "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"
    );
    assert_eq!(e.to_cni(None).code, 4);
    // DEL does not need a netns.
    let vars: Vec<_> = full("DEL")
        .into_iter()
        .filter(|(k, _)| *k != "CNI_NETNS")
        .collect();
    assert!(matches!(load(&vars, CONF), Ok(Command::Del(_))));
    let e = load(&[], CONF).expect_err("no command");
    assert_eq!(
        e.to_string(),
        "required env variables [CNI_COMMAND] missing"
    );
    let e = load(&[("CNI_COMMAND", "FROB")], CONF).expect_err("unknown");
    assert_eq!(
        (e.to_string().as_str(), e.to_cni(None).code),
        ("unknown CNI_COMMAND: FROB", 4)
    );
}

#[test]
fn container_id_and_ifname_rules() {
    let with = |k: &'static str, v: &'static str| {
        let mut vars = full("ADD");
        vars.retain(|(n, _)| *n != k);
        vars.push((k, v));
        load(&vars, CONF)
    };
    for bad in ["-abc", "a/b", "a b", "ä"] {
        let e = with("CNI_CONTAINERID", bad).expect_err(bad);
        assert_eq!(
            (e.to_string().as_str(), e.to_cni(None).code),
            ("invalid characters in containerID", 4),
            "{bad}"
        );
    }
    let e = with("CNI_IFNAME", "0123456789abcdef").expect_err("too long");
    assert_eq!(e.to_string(), "interface name is too long");
    for bad in [".", "..", "a/b", "a:b", "a b"] {
        assert!(
            matches!(with("CNI_IFNAME", bad), Err(Error::InvalidEnv { .. })),
            "{bad}"
        );
    }
    assert!(
        with("CNI_IFNAME", "0123456789abcde").is_ok(),
        "15 bytes is fine"
    );
}

#[test]
fn config_errors_in_skel_order() {
    let e = load(&full("ADD"), "not json").expect_err("garbage");
    assert_eq!(e.to_cni(None).code, 6);
    let e = load(&full("ADD"), "").expect_err("empty");
    assert_eq!(e.to_cni(None).code, 6);
    let e = load(&full("ADD"), r#"{"cniVersion":"1.0.0"}"#).expect_err("no name");
    assert_eq!(
        (e.to_string().as_str(), e.to_cni(None).code),
        ("missing network name", 7)
    );
    let e = load(&full("ADD"), r#"{"name":"a b"}"#).expect_err("bad name");
    assert_eq!(
        e.to_cni(None),
        crate::error::CniError {
            cni_version: None,
            code: 7,
            msg: "invalid characters found in network name".into(),
            details: "a b".into()
        }
    );
    let e = load(&full("ADD"), r#"{"name":"n","cniVersion":"2.0.0"}"#).expect_err("version");
    assert_eq!(e.to_cni(Some("2.0.0")).code, 1);
    let e =
        load(&full("CHECK"), r#"{"name":"n","cniVersion":"0.3.1"}"#).expect_err("check too old");
    assert_eq!(
        (e.to_string().as_str(), e.to_cni(None).code),
        ("config version does not allow CHECK", 1)
    );
    let e = load(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/p")], CONF).expect_err("gc too old");
    assert_eq!(e.to_string(), "config version does not allow GC");
    assert!(
        load(&full("ADD"), r#"{"name":"n"}"#).is_ok(),
        "no cniVersion is 0.1.0, supported"
    );
}
