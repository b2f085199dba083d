//! Config parsing and `CheckNetworkConfig`, including flannel's config_test.go cases.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::*;

fn parse(s: &str) -> Config {
    parse_config(s.as_bytes()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn parse_err(s: &str) -> String {
    match parse_config(s.as_bytes()) {
        Ok(c) => panic!("{s} parsed: {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn checked(s: &str) -> Config {
    let mut c = parse(s);
    c.check_network_config()
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    c
}

fn check_err(s: &str) -> String {
    let mut c = parse(s);
    match c.check_network_config() {
        Ok(()) => panic!("{s} passed the check: {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().expect("test address")
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("test address")
}

fn net4(s: &str) -> Ipv4Net {
    s.parse().expect("test cidr")
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().expect("test cidr")
}

// ---- flannel config_test.go ----

#[test]
fn config_defaults() {
    let c = checked(r#"{ "network": "10.3.0.0/16" }"#);
    assert_eq!(c.network, Some(net4("10.3.0.0/16")));
    assert_eq!(c.subnet_len, 24);
    assert_eq!(c.subnet_min, v4("10.3.1.0"));
    assert_eq!(c.subnet_max, v4("10.3.255.0"));
    assert!(c.enable_ipv4);
    assert!(!c.enable_ipv6);
    assert_eq!(c.backend_type, "udp");
}

#[test]
fn ipv6_config_defaults() {
    let c = parse(r#"{ "enableIPv6": true, "ipv6Network": "fc00::/48" }"#);
    assert!(
        c.enable_ipv4 && c.enable_ipv6,
        "EnableIPv4 stays true by default"
    );
    let c = checked(r#"{ "enableIPv4": false, "enableIPv6": true, "ipv6Network": "fc00::/48" }"#);
    assert_eq!(c.ipv6_network, Some(net6("fc00::/48")));
    assert_eq!(c.ipv6_subnet_len, 64);
    assert_eq!(c.ipv6_subnet_min, Some(v6("fc00:0:0:1::")));
    assert_eq!(c.ipv6_subnet_max, Some(v6("fc00:0:0:ffff::")));
    assert_eq!(c.subnet_len, 0, "IPv4 untouched when disabled");
}

#[test]
fn config_overrides() {
    let c = checked(
        r#"{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.5.0", "SubnetMax": "10.3.8.0", "SubnetLen": 28 }"#,
    );
    assert_eq!(c.subnet_len, 28);
    assert_eq!(c.subnet_min, v4("10.3.5.0"));
    assert_eq!(c.subnet_max, v4("10.3.8.0"));
}

#[test]
fn ipv6_config_overrides() {
    let c = checked(
        r#"{ "EnableIPv6": true, "IPv6Network": "fc00::/48", "IPv6SubnetMin": "fc00:0:0:5::",
             "IPv6SubnetMax": "fc00:0:0:8::", "IPv6SubnetLen": 72, "Network": "10.3.0.0/16" }"#,
    );
    assert_eq!(c.ipv6_subnet_len, 72);
    assert_eq!(c.ipv6_subnet_min, Some(v6("fc00:0:0:5::")));
    assert_eq!(c.ipv6_subnet_max, Some(v6("fc00:0:0:8::")));
}

#[test]
fn default_subnet_len_by_prefix() {
    for (network, len) in [
        ("10.0.0.0/8", 24),
        ("10.3.0.0/22", 24),
        ("10.3.0.0/23", 25),
        ("10.3.0.0/28", 30),
    ] {
        let c = checked(&format!(r#"{{"Network":"{network}"}}"#));
        assert_eq!(c.subnet_len, len, "{network}");
    }
    // A /28 gives four /30s: the first is skipped, the last is included.
    let c = checked(r#"{"Network":"10.3.0.0/28"}"#);
    assert_eq!(
        (c.subnet_min, c.subnet_max),
        (v4("10.3.0.4"), v4("10.3.0.12"))
    );
}

#[test]
fn ipv6_default_subnet_len_by_prefix() {
    for (network, len) in [
        ("fc00::/32", 64),
        ("fc00::/62", 64),
        ("fc00::/63", 65),
        ("fc00::/124", 126),
    ] {
        let c = checked(&format!(
            r#"{{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"{network}"}}"#
        ));
        assert_eq!(c.ipv6_subnet_len, len, "{network}");
    }
}

#[test]
fn network_is_masked() {
    let c = parse(r#"{"Network":"10.3.7.9/16"}"#);
    assert_eq!(c.network, Some(net4("10.3.0.0/16")));
    let c = parse(r#"{"IPv6Network":"fc00::1:2:3/48"}"#);
    assert_eq!(c.ipv6_network, Some(net6("fc00::/48")));
}

// ---- every CheckNetworkConfig error string ----

#[test]
fn ipv4_check_errors() {
    let cases = [
        (
            r#"{}"#,
            "please define a correct Network parameter in the flannel config",
        ),
        (
            r#"{"Network":"0.0.0.0/0"}"#,
            "please define a correct Network parameter in the flannel config",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetLen":31}"#,
            "SubnetLen must be less than /31",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetLen":17}"#,
            "network must be able to accommodate at least four subnets",
        ),
        (
            r#"{"Network":"10.3.0.0/29"}"#,
            "network is too small. Minimum useful network prefix is /28",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetMin":"10.4.0.0"}"#,
            "SubnetMin is not in the range of the Network",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetMax":"10.2.255.0"}"#,
            "SubnetMax is not in the range of the Network",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetMin":"10.3.1.1"}"#,
            "SubnetMin is not on a SubnetLen boundary: 10.3.1.1",
        ),
        (
            r#"{"Network":"10.3.0.0/16","SubnetMax":"10.3.9.128"}"#,
            "SubnetMax is not on a SubnetLen boundary: 10.3.9.128",
        ),
    ];
    for (json, want) in cases {
        assert_eq!(check_err(json), want, "{json}");
    }
}

#[test]
fn ipv6_check_errors() {
    let pre = r#""EnableIPv4":false,"EnableIPv6":true"#;
    let cases = [
        (
            String::new(),
            "please define a correct IPv6Network parameter in the flannel config",
        ),
        (
            r#","IPv6Network":"::/0""#.into(),
            "please define a correct IPv6Network parameter in the flannel config",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetLen":127"#.into(),
            "SubnetLen must be less than /127",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetLen":49"#.into(),
            "network must be able to accommodate at least four subnets",
        ),
        (
            r#","IPv6Network":"fc00::/125""#.into(),
            "IPv6Network is too small. Minimum useful network prefix is /124",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetMin":"fc01::""#.into(),
            "IPv6SubnetMin is not in the range of the IPv6Network",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetMax":"fb00::""#.into(),
            "IPv6SubnetMax is not in the range of the IPv6Network",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetMin":"fc00:0:0:1::1""#.into(),
            "IPv6SubnetMin is not on a SubnetLen boundary: fc00:0:0:1::1",
        ),
        (
            r#","IPv6Network":"fc00::/48","IPv6SubnetMax":"fc00:0:0:2:8000::""#.into(),
            "IPv6SubnetMax is not on a SubnetLen boundary: fc00:0:0:2:8000::",
        ),
    ];
    for (rest, want) in cases {
        let json = format!("{{{pre}{rest}}}");
        assert_eq!(check_err(&json), want, "{json}");
    }
}

#[test]
fn ipv4_errors_come_before_ipv6() {
    assert_eq!(
        check_err(r#"{"EnableIPv6":true}"#),
        "please define a correct Network parameter in the flannel config"
    );
}

#[test]
fn disabled_families_are_not_checked() {
    let mut c = parse(r#"{"EnableIPv4":false}"#);
    c.check_network_config()
        .expect("nothing enabled, nothing to check");
    assert_eq!(
        c.ip_family().map_err(|e| e.to_string()),
        Err("none defined stack".to_string())
    );
}

#[test]
fn ip_family() {
    assert_eq!(parse("{}").ip_family().ok(), Some(IpStack::V4));
    assert_eq!(
        parse(r#"{"EnableIPv6":true}"#).ip_family().ok(),
        Some(IpStack::Dual)
    );
    assert_eq!(
        parse(r#"{"EnableIPv4":false,"EnableIPv6":true}"#)
            .ip_family()
            .ok(),
        Some(IpStack::V6)
    );
}

#[test]
fn zero_subnet_min_means_default() {
    let c = checked(r#"{"Network":"10.3.0.0/16","SubnetMin":"0.0.0.0","SubnetMax":"0.0.0.0"}"#);
    assert_eq!(
        (c.subnet_min, c.subnet_max),
        (v4("10.3.1.0"), v4("10.3.255.0"))
    );
    let c = checked(
        r#"{"EnableIPv6":true,"Network":"10.3.0.0/16","IPv6Network":"fc00::/48","IPv6SubnetMin":"::"}"#,
    );
    assert_eq!(c.ipv6_subnet_min, Some(v6("fc00:0:0:1::")));
}

#[test]
fn top_of_address_space() {
    // Network.Next() wraps in Go's uint32 / is 2^128 as a big int.
    let c = checked(r#"{"Network":"128.0.0.0/1"}"#);
    assert_eq!(c.subnet_max, v4("255.255.255.0"));
    let c = checked(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"8000::/1"}"#);
    assert_eq!(c.ipv6_subnet_max, Some(v6("ffff:ffff:ffff:ffff::")));
}

// ---- parsing: Go encoding/json semantics ----

#[test]
fn keys_are_case_insensitive() {
    let c = parse(
        r#"{"NETWORK":"10.3.0.0/16","subnetlen":26,"SUBNETMIN":"10.3.0.64","enableipv6":true,
            "IPV6NETWORK":"fc00::/48","ipv6SubnetLen":80,"EnableNfTables":true,"backend":{"TYPE":"vxlan"}}"#,
    );
    assert_eq!(c.network, Some(net4("10.3.0.0/16")));
    assert_eq!(c.subnet_len, 26);
    assert_eq!(c.subnet_min, v4("10.3.0.64"));
    assert!(c.enable_ipv6 && c.enable_nftables);
    assert_eq!(c.ipv6_network, Some(net6("fc00::/48")));
    assert_eq!(c.ipv6_subnet_len, 80);
    assert_eq!(c.backend_type, "vxlan");
}

#[test]
fn go_unicode_key_folding() {
    // Go folds U+017F (long s) to 's' and U+212A (Kelvin) to 'k'.
    let c = parse("{\"\u{17f}ubnetLen\":26,\"Bac\u{212a}end\":{\"Type\":\"alloc\"}}");
    assert_eq!(c.subnet_len, 26);
    assert_eq!(c.backend_type, "alloc");
}

#[test]
fn last_duplicate_wins_across_cases() {
    let c = parse(r#"{"Network":"10.1.0.0/16","network":"10.2.0.0/16","NetWork":"10.3.0.0/16"}"#);
    assert_eq!(c.network, Some(net4("10.3.0.0/16")));
    let c = parse(r#"{"EnableIPv4":false,"enableipv4":true}"#);
    assert!(c.enable_ipv4);
    let c = parse(r#"{"Backend":{"Type":"vxlan"},"backend":{"type":"host-gw"}}"#);
    assert_eq!(c.backend_type, "host-gw");
}

#[test]
fn bad_type_in_any_duplicate_is_an_error() {
    let e = parse_err(r#"{"SubnetLen":"24","subnetlen":24}"#);
    assert_eq!(
        e,
        "json: cannot unmarshal string into Go struct field Config.SubnetLen of type uint"
    );
}

#[test]
fn null_values() {
    // Plain fields: null is a no-op.
    let c = parse(r#"{"EnableIPv4":false,"EnableIPv4":null,"SubnetLen":26,"subnetlen":null}"#);
    assert!(!c.enable_ipv4);
    assert_eq!(c.subnet_len, 26);
    // Pointer fields: null resets.
    let c = parse(r#"{"IPv6SubnetMin":"fc00::","IPv6SubnetMin":null}"#);
    assert_eq!(c.ipv6_subnet_min, None);
    // flannel's ip types get "null" passed to UnmarshalJSON and fail.
    assert_eq!(
        parse_err(r#"{"Network":null}"#),
        "invalid CIDR address: null"
    );
    assert_eq!(
        parse_err(r#"{"SubnetMin":null}"#),
        "Invalid IP address format"
    );
    // The whole document `null` is a no-op decode.
    assert_eq!(parse("null"), Config::default());
}

#[test]
fn strict_types() {
    let cases = [
        (
            r#"{"EnableIPv4":"true"}"#,
            "json: cannot unmarshal string into Go struct field Config.EnableIPv4 of type bool",
        ),
        (
            r#"{"EnableIPv6":1}"#,
            "json: cannot unmarshal number into Go struct field Config.EnableIPv6 of type bool",
        ),
        (
            r#"{"SubnetLen":24.5}"#,
            "json: cannot unmarshal number 24.5 into Go struct field Config.SubnetLen of type uint",
        ),
        (
            r#"{"SubnetLen":-1}"#,
            "json: cannot unmarshal number -1 into Go struct field Config.SubnetLen of type uint",
        ),
        (
            r#"{"IPv6SubnetLen":[64]}"#,
            "json: cannot unmarshal array into Go struct field Config.IPv6SubnetLen of type uint",
        ),
        (
            r#"{"EnableNFTables":{}}"#,
            "json: cannot unmarshal object into Go struct field Config.EnableNFTables of type bool",
        ),
    ];
    for (json, want) in cases {
        assert_eq!(parse_err(json), want, "{json}");
    }
}

#[test]
fn address_field_errors() {
    assert_eq!(
        parse_err(r#"{"Network":"fc00::/48"}"#),
        "invalid IPv4 CIDR format"
    );
    assert_eq!(
        parse_err(r#"{"Network":"10.3.0.0"}"#),
        "invalid CIDR address: 10.3.0.0"
    );
    assert_eq!(
        parse_err(r#"{"Network":"10.3.0.0/33"}"#),
        "invalid CIDR address: 10.3.0.0/33"
    );
    assert_eq!(
        parse_err(r#"{"Network":"10.3.0.0/+8"}"#),
        "invalid CIDR address: 10.3.0.0/+8"
    );
    assert_eq!(parse_err(r#"{"Network":16}"#), "invalid CIDR address: 16");
    assert_eq!(
        parse_err(r#"{"IPv6Network":"10.0.0.0/8"}"#),
        "invalid IPv6 CIDR format"
    );
    assert_eq!(
        parse_err(r#"{"IPv6Network":"fc00::/129"}"#),
        "invalid CIDR address: fc00::/129"
    );
    assert_eq!(
        parse_err(r#"{"SubnetMin":"10.3.1"}"#),
        "Invalid IP address format"
    );
    assert_eq!(
        parse_err(r#"{"SubnetMax":"fc00::1"}"#),
        "Invalid IP address format"
    );
    assert_eq!(
        parse_err(r#"{"IPv6SubnetMax":"fc00::g"}"#),
        "Invalid IP address format"
    );
    // flannel's ip types see the raw JSON text: escapes are not decoded.
    assert_eq!(
        parse_err(r#"{"Network":"10.3.0.0\/16"}"#),
        r"invalid CIDR address: 10.3.0.0\/16"
    );
    assert_eq!(
        parse_err(r#"{"Network":" 10.3.0.0/16"}"#),
        "invalid CIDR address:  10.3.0.0/16"
    );
    // Go's ParseCIDR accepts leading zeros in the prefix length.
    assert_eq!(
        parse(r#"{"Network":"10.3.0.0/016"}"#).network,
        Some(net4("10.3.0.0/16"))
    );
    // An IPv4-mapped IPv6 address is an IPv4 address to Go's To4.
    assert_eq!(
        parse(r#"{"SubnetMin":"::ffff:10.3.1.0"}"#).subnet_min,
        v4("10.3.1.0")
    );
}

#[test]
fn document_errors() {
    assert_eq!(
        parse_err("[1]"),
        "json: cannot unmarshal array into Go value of type subnet.Config"
    );
    assert_eq!(
        parse_err(r#""x""#),
        "json: cannot unmarshal string into Go value of type subnet.Config"
    );
    assert!(parse_err("{").starts_with("invalid JSON"));
    assert!(parse_err("").starts_with("invalid JSON"));
    assert!(parse_err(r#"{"Network":"10.3.0.0/16"} x"#).starts_with("invalid JSON"));
}

#[test]
fn unknown_keys_and_removed_fields_are_ignored() {
    let c = parse(
        r#"{"Network":"10.3.0.0/16","Networks":["10.4.0.0/16"],"IPv6Networks":"junk","Foo":{"a":[1]},"BackendType":"vxlan"}"#,
    );
    assert_eq!(c.network, Some(net4("10.3.0.0/16")));
    assert_eq!(c.backend_type, "udp", "BackendType is json:\"-\" in Go");
}

#[test]
fn backend_type_rules() {
    assert_eq!(parse(r#"{}"#).backend_type, "udp");
    assert_eq!(parse(r#"{"Backend":{}}"#).backend_type, "");
    assert_eq!(parse(r#"{"Backend":null}"#).backend_type, "");
    assert_eq!(
        parse(r#"{"Backend":null}"#).backend.as_deref(),
        Some("null")
    );
    assert_eq!(
        parse(r#"{"Backend":{"Type":"VXLAN"}}"#).backend_type,
        "vxlan"
    );
    assert_eq!(
        parse(r#"{"Backend":{"Type":"Host-GW"}}"#).backend_type,
        "host-gw"
    );
    assert_eq!(
        parse(r#"{"Backend":{"Type":"vxlan","Type":null}}"#).backend_type,
        "vxlan"
    );
    assert_eq!(
        parse_err(r#"{"Backend":{"Type":5}}"#),
        "error decoding Backend property of config: json: cannot unmarshal number into Go struct field .Type of type string"
    );
    assert_eq!(
        parse_err(r#"{"Backend":"vxlan"}"#),
        "error decoding Backend property of config: json: cannot unmarshal string into Go value of type struct { Type string }"
    );
    // `Backend: {}` then fails backend selection exactly like flannel's GetBackend.
    let c = parse(r#"{"Backend":{}}"#);
    let e =
        BackendOptions::from_config(&c.backend_type, c.backend.as_deref()).expect_err("empty type");
    assert_eq!(e.to_string(), "unknown backend type: ");
}

// ---- allocator helpers ----

#[test]
fn subnet_candidates_walk_min_to_max() {
    let c = checked(r#"{"Network":"10.3.0.0/16"}"#);
    assert_eq!(c.subnet_size(), 256);
    let all: Vec<Ipv4Net> = c.subnet_candidates().collect();
    assert_eq!(all.len(), 255);
    assert_eq!(all.first(), Some(&net4("10.3.1.0/24")));
    assert_eq!(all.last(), Some(&net4("10.3.255.0/24")));
    assert!(
        all.windows(2)
            .all(|w| u32::from(w[1].addr()) - u32::from(w[0].addr()) == 256)
    );

    let c = checked(
        r#"{"Network":"10.3.0.0/16","SubnetMin":"10.3.5.0","SubnetMax":"10.3.8.0","SubnetLen":28}"#,
    );
    let all: Vec<Ipv4Net> = c.subnet_candidates().collect();
    assert_eq!(all.len(), (0x0800 - 0x0500) / 16 + 1);
    assert_eq!(all[1], net4("10.3.5.16/28"));

    // The walk stops at the top of the address space instead of wrapping.
    let c = checked(r#"{"Network":"128.0.0.0/1"}"#);
    assert_eq!(c.subnet_candidates().last(), Some(net4("255.255.255.0/24")));
    assert_eq!(c.subnet_candidates().count(), (1 << 23) - 1);

    // Unchecked config: nothing to walk.
    assert_eq!(
        parse(r#"{"Network":"10.3.0.0/16"}"#)
            .subnet_candidates()
            .count(),
        0
    );
}

#[test]
fn ipv6_subnet_candidates() {
    let c = checked(r#"{"EnableIPv6":true,"Network":"10.3.0.0/16","IPv6Network":"fc00::/56"}"#);
    assert_eq!(c.ipv6_subnet_size(), Some(1 << 64));
    let all: Vec<Ipv6Net> = c.ipv6_subnet_candidates().collect();
    assert_eq!(all.len(), 255);
    assert_eq!(all[0], net6("fc00:0:0:1::/64"));
    assert_eq!(all[254], net6("fc00:0:0:ff::/64"));
    let c = checked(
        r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}"#,
    );
    let all: Vec<Ipv6Net> = c.ipv6_subnet_candidates().collect();
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(parse("{}").ipv6_subnet_candidates().count(), 0);
}

#[test]
fn lease_compatibility() {
    let c = checked(r#"{"Network":"10.3.0.0/16","SubnetMin":"10.3.5.0","SubnetMax":"10.3.8.0"}"#);
    assert!(c.is_subnet_compatible(Some(net4("10.3.5.0/24"))));
    assert!(c.is_subnet_compatible(Some(net4("10.3.8.0/24"))));
    assert!(
        !c.is_subnet_compatible(Some(net4("10.3.4.0/24"))),
        "below min"
    );
    assert!(
        !c.is_subnet_compatible(Some(net4("10.3.9.0/24"))),
        "above max"
    );
    assert!(
        !c.is_subnet_compatible(Some(net4("10.3.6.0/25"))),
        "wrong length"
    );
    assert!(!c.is_subnet_compatible(None));
    // IPv6 disabled: the lease must have no IPv6 subnet.
    assert!(c.is_lease_compatible(Some(net4("10.3.6.0/24")), None));
    assert!(c.is_lease_compatible(Some(net4("10.3.6.0/24")), Some(net6("::/0"))));
    assert!(!c.is_lease_compatible(Some(net4("10.3.6.0/24")), Some(net6("fc00:0:0:1::/64"))));

    let c = checked(r#"{"EnableIPv6":true,"Network":"10.3.0.0/16","IPv6Network":"fc00::/48"}"#);
    assert!(c.is_lease_compatible(Some(net4("10.3.6.0/24")), Some(net6("fc00:0:0:1::/64"))));
    assert!(
        !c.is_lease_compatible(Some(net4("10.3.6.0/24")), None),
        "v6 enabled needs a v6 subnet"
    );
    assert!(
        !c.is_ipv6_subnet_compatible(Some(net6("fc00::/64"))),
        "first subnet is skipped"
    );
    assert!(!c.is_ipv6_subnet_compatible(Some(net6("fc00:0:0:1::/65"))));
    assert!(!c.is_ipv6_subnet_compatible(Some(net6("fc01::/64"))));

    // IPv6-only: Go's empty 0.0.0.0/0 lease subnet is compatible with an unset IPv4 range.
    let c = checked(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}"#);
    assert!(c.is_lease_compatible(None, Some(net6("fc00:0:0:2::/64"))));
    assert!(!c.is_lease_compatible(Some(net4("10.3.6.0/24")), Some(net6("fc00:0:0:2::/64"))));
}

// ---- robustness ----

#[test]
fn random_bytes_never_panic() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet: &[u8] = br#"{}[]":,.0123456789-+eE/ abcfnrtul\NetworkSubnetMinMaxLenBackendType:fc00::/48 10.3.0.0/16 null true false"#;
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 8 == 0 {
                    (r >> 8) as u8
                } else {
                    alphabet[(r >> 8) as usize % alphabet.len()]
                }
            })
            .collect();
        if let Ok(mut c) = parse_config(&bytes) {
            let _ = c.check_network_config();
            let _ = c.subnet_candidates().take(3).count();
            let _ = c.ipv6_subnet_candidates().take(3).count();
            let _ = BackendOptions::from_config(&c.backend_type, c.backend.as_deref());
        }
    }
}

#[test]
fn structured_random_configs_never_panic() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..5_000 {
        let p4 = next() % 34;
        let p6 = next() % 130;
        let json = format!(
            r#"{{"EnableIPv6":true,"Network":"10.{}.0.0/{p4}","IPv6Network":"fc00::/{p6}","SubnetLen":{},"IPv6SubnetLen":{},"SubnetMin":"10.{}.{}.0","IPv6SubnetMin":"fc00:0:{:x}::"}}"#,
            next() % 256,
            next() % 40,
            next() % 140,
            next() % 256,
            next() % 256,
            next() % 0x10000,
        );
        if let Ok(mut c) = parse_config(json.as_bytes())
            && c.check_network_config().is_ok()
        {
            // A valid config always yields at least one candidate in each family.
            assert!(c.subnet_candidates().next().is_some(), "{json}");
            assert!(c.ipv6_subnet_candidates().next().is_some(), "{json}");
        }
    }
}

#[test]
fn weft_nat_traversal_is_opt_in_and_typed() {
    assert!(!parse(r#"{"Network":"10.244.0.0/16"}"#).weft_nat_traversal);
    assert!(parse(r#"{"Network":"10.244.0.0/16","WeftNATTraversal":true}"#).weft_nat_traversal);
    assert!(parse(r#"{"weftnattraversal":true}"#).weft_nat_traversal);
    let e = parse_err(r#"{"WeftNATTraversal":"yes"}"#);
    assert!(e.contains("WeftNATTraversal"), "{e}");
}
