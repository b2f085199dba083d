use super::*;

fn p(text: &str) -> Result<SubnetEnv, SubnetEnvError> {
    parse("/run/flannel/subnet.env", text.as_bytes())
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

#[test]
fn parses_flanneld_output() {
    let env = p("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n").expect("valid");
    assert_eq!(
        env,
        SubnetEnv {
            networks: vec![net("10.244.0.0/16")],
            subnet: Some(net("10.244.1.0/24")),
            ipv6_networks: vec![],
            ipv6_subnet: None,
            mtu: 1450,
            ipmasq: true,
        }
    );
}

#[test]
fn dual_stack_lists_crlf_and_unknown_lines() {
    let text = "# comment\r\nFLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16,10.1.0.0/16\r\nFLANNEL_SUBNET=10.1.17.1/24\r\n\
                FLANNEL_IPV6_NETWORK=2001:cafe:42::/56\r\nFLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\r\n\
                FLANNEL_MTU=1472\r\nFLANNEL_IPMASQ=True\r\nOTHER=x";
    let env = p(text).expect("valid");
    assert_eq!(env.networks, vec![net("10.1.0.0/16"), net("10.2.0.0/16")]);
    assert_eq!(env.subnet, Some(net("10.1.17.0/24")));
    assert_eq!(env.ipv6_networks, vec![net("2001:cafe:42::/56")]);
    assert_eq!(env.ipv6_subnet, Some(net("2001:cafe:42::/64")));
    assert_eq!(env.mtu, 1472);
    assert!(!env.ipmasq, "only the exact string `true` enables ipmasq");
}

#[test]
fn ipv6_only_is_complete() {
    let env = p("FLANNEL_IPV6_NETWORK=fd00::/48\nFLANNEL_IPV6_SUBNET=fd00:0:0:5::1/64\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ=false\n").expect("v6 only");
    assert!(env.networks.is_empty() && env.subnet.is_none());
    assert_eq!(env.ipv6_subnet, Some(net("fd00:0:0:5::/64")));
}

#[test]
fn last_value_wins() {
    let env = p("FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_NETWORK=10.9.0.0/16\nFLANNEL_SUBNET=10.9.3.1/24\nFLANNEL_MTU=1\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ=false\n").expect("valid");
    assert_eq!(env.networks, vec![net("10.9.0.0/16")]);
    assert_eq!(env.mtu, 1400);
}

#[test]
fn missing_message_lists_only_missing_groups() {
    let err = p("").expect_err("empty");
    assert_eq!(
        err.to_string(),
        "/run/flannel/subnet.env is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ"
    );
    let err = p("FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.1.1/24\nFLANNEL_IPMASQ=true\n")
        .expect_err("no mtu");
    assert_eq!(
        err.to_string(),
        "/run/flannel/subnet.env is missing FLANNEL_MTU"
    );
    let err = p("FLANNEL_IPV6_SUBNET=fd00::1/64\nFLANNEL_MTU=1400\n").expect_err("no network");
    assert_eq!(
        err.to_string(),
        "/run/flannel/subnet.env is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_IPMASQ"
    );
}

#[test]
fn keys_are_exact() {
    // Spaces, quotes and `export` make the key unknown, as in flannel.
    let err = p("FLANNEL_NETWORK =10.1.0.0/16\nexport FLANNEL_SUBNET=10.1.1.1/24\nFLANNEL_MTU=1400\nflannel_ipmasq=true\n").expect_err("keys unknown");
    assert!(matches!(err, SubnetEnvError::Missing { .. }), "{err}");
}

#[test]
fn bad_values_use_go_texts() {
    let e = p("FLANNEL_NETWORK=10.1.0.0/16,\n").expect_err("trailing comma");
    assert_eq!(e.to_string(), "invalid CIDR address: ");
    let e = p("FLANNEL_SUBNET=10.1.1.1\n").expect_err("no prefix");
    assert_eq!(e.to_string(), "invalid CIDR address: 10.1.1.1");
    let e = p("FLANNEL_MTU=abc\n").expect_err("mtu syntax");
    assert_eq!(
        e.to_string(),
        r#"strconv.ParseUint: parsing "abc": invalid syntax"#
    );
    let e = p("FLANNEL_MTU=4294967296\n").expect_err("mtu range");
    assert_eq!(
        e.to_string(),
        r#"strconv.ParseUint: parsing "4294967296": value out of range"#
    );
    let e = p("FLANNEL_MTU=-1\n").expect_err("mtu sign");
    assert!(e.to_string().ends_with("invalid syntax"));
    let e = p("FLANNEL_MTU\n").expect_err("no =");
    assert_eq!(e.to_string(), "FLANNEL_MTU has no value");
}

#[test]
fn overlong_line_is_token_too_long() {
    let long = format!("X={}\n", "a".repeat(70_000));
    assert!(matches!(p(&long), Err(SubnetEnvError::TokenTooLong)));
}

#[test]
fn open_error_is_go_path_error() {
    let err = load("/nonexistent-weft/subnet.env").expect_err("missing file");
    assert!(err.is_not_found());
    assert_eq!(
        err.to_string(),
        "open /nonexistent-weft/subnet.env: no such file or directory"
    );
}

#[test]
fn garbage_never_panics() {
    for text in [
        "=",
        "==",
        "\0\0\0",
        "FLANNEL_NETWORK=\u{fffd}/8",
        "FLANNEL_IPMASQ",
        "\n\n\r\r",
        "FLANNEL_SUBNET=::/0\n",
    ] {
        let _ = p(text);
    }
}

#[test]
fn reads_what_weftd_writes() {
    let written = crate::subnet_env::SubnetEnv {
        network: Some("10.244.0.0/16".parse().expect("net")),
        subnet: Some("10.244.1.0/24".parse().expect("net")),
        ipv6_network: Some("fc00::/48".parse().expect("net")),
        ipv6_subnet: Some("fc00:0:0:1::/64".parse().expect("net")),
        mtu: 1450,
        ipmasq: true,
    };
    let text = written.render().expect("complete");
    assert_eq!(
        p(&text).expect("the plugin reads weftd's file"),
        SubnetEnv {
            networks: vec![net("10.244.0.0/16")],
            subnet: Some(net("10.244.1.0/24")),
            ipv6_networks: vec![net("fc00::/48")],
            ipv6_subnet: Some(net("fc00:0:0:1::/64")),
            mtu: 1450,
            ipmasq: true,
        }
    );
}
