//! Backend selection, option decoding and FLANNEL_MTU.

use std::time::Duration;

use super::*;
use crate::config::parse_config;

fn opts(json: &str) -> Result<BackendOptions, OptionsError> {
    let c = parse_config(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
    BackendOptions::from_config(&c.backend_type, c.backend.as_deref())
}

fn ok(json: &str) -> BackendOptions {
    opts(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn err(json: &str) -> String {
    match opts(json) {
        Ok(o) => panic!("{json} decoded: {o:?}"),
        Err(e) => e.to_string(),
    }
}

fn psk(n: usize) -> String {
    "k".repeat(n)
}

#[test]
fn kinds_parse_case_insensitively() {
    let all = [
        ("udp", BackendKind::Udp),
        ("VXLAN", BackendKind::Vxlan),
        ("Host-Gw", BackendKind::HostGw),
        ("IPIP", BackendKind::Ipip),
        ("IPsec", BackendKind::Ipsec),
        ("WireGuard", BackendKind::Wireguard),
        ("Alloc", BackendKind::Alloc),
        ("Extension", BackendKind::Extension),
        ("TENCENT-VPC", BackendKind::TencentVpc),
    ];
    for (name, kind) in all {
        assert_eq!(name.parse::<BackendKind>(), Ok(kind), "{name}");
        assert_eq!(kind.name(), name.to_lowercase());
        assert_eq!(kind.to_string().parse::<BackendKind>(), Ok(kind));
    }
    assert_eq!(
        "hostgw".parse::<BackendKind>().map_err(|e| e.to_string()),
        Err("unknown backend type: hostgw".into())
    );
    assert_eq!(
        "".parse::<BackendKind>().map_err(|e| e.to_string()),
        Err("unknown backend type: ".into())
    );
    assert_eq!(
        "GENEVE".parse::<BackendKind>().map_err(|e| e.to_string()),
        Err("unknown backend type: geneve".into())
    );
}

#[test]
fn missing_backend_is_udp_with_defaults() {
    assert_eq!(
        ok(r#"{"Network":"10.0.0.0/8"}"#),
        BackendOptions::Udp(UdpOptions { port: 8285 })
    );
    assert_eq!(
        ok(r#"{"Backend":{"Type":"udp","Port":9000}}"#),
        BackendOptions::Udp(UdpOptions { port: 9000 })
    );
}

#[test]
fn vxlan_defaults_and_options() {
    let BackendOptions::Vxlan(o) = ok(r#"{"Backend":{"Type":"vxlan"}}"#) else {
        panic!("not vxlan")
    };
    assert_eq!(
        o,
        VxlanOptions {
            vni: 1,
            port: 0,
            mtu: 0,
            gbp: false,
            learning: false,
            direct_routing: false
        }
    );
    assert_eq!(o.effective_port(), 8472);
    // Documented (upper-case) and tag (lower-case) spellings both work.
    let BackendOptions::Vxlan(o) = ok(
        r#"{"Backend":{"Type":"vxlan","VNI":4096,"Port":4789,"MTU":9000,"GBP":true,"Learning":true,"DirectRouting":true}}"#,
    ) else {
        panic!("not vxlan")
    };
    assert_eq!(
        o,
        VxlanOptions {
            vni: 4096,
            port: 4789,
            mtu: 9000,
            gbp: true,
            learning: true,
            direct_routing: true
        }
    );
    assert_eq!(o.effective_port(), 4789);
    let BackendOptions::Vxlan(o) =
        ok(r#"{"Backend":{"type":"vxlan","vni":7,"directRouting":true}}"#)
    else {
        panic!("not vxlan")
    };
    assert_eq!((o.vni, o.direct_routing), (7, true));
}

#[test]
fn strict_option_types() {
    assert_eq!(
        err(r#"{"Backend":{"Type":"vxlan","Port":"8472"}}"#),
        "error decoding VXLAN backend config: json: cannot unmarshal string into Go struct field .port of type int"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"vxlan","VNI":1.0}}"#),
        "error decoding VXLAN backend config: json: cannot unmarshal number 1.0 into Go struct field .vni of type int"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"udp","Port":true}}"#),
        "error decoding UDP backend config: json: cannot unmarshal bool into Go struct field .Port of type int"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"ipip","DirectRouting":"true"}}"#),
        "error decoding IPIP backend config: json: cannot unmarshal string into Go struct field .DirectRouting of type bool"
    );
    assert_eq!(
        err(&format!(
            r#"{{"Backend":{{"Type":"ipsec","PSK":"{}","UDPEncap":1}}}}"#,
            psk(96)
        )),
        "error decoding IPSEC backend config: json: cannot unmarshal number into Go struct field .UDPEncap of type bool"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"wireguard","PersistentKeepaliveInterval":"25s"}}"#),
        "error decoding backend config: json: cannot unmarshal string into Go struct field .PersistentKeepaliveInterval of type time.Duration"
    );
}

#[test]
fn out_of_range_options() {
    assert_eq!(
        err(r#"{"Backend":{"Type":"vxlan","VNI":16777216}}"#),
        "error decoding VXLAN backend config: VNI 16777216 is out of range"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"vxlan","Port":65536}}"#),
        "error decoding VXLAN backend config: Port 65536 is out of range"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"udp","Port":-1}}"#),
        "error decoding UDP backend config: Port -1 is out of range"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"wireguard","MTU":-5}}"#),
        "error decoding backend config: MTU -5 is out of range"
    );
}

#[test]
fn duplicate_option_keys_last_wins() {
    let BackendOptions::Vxlan(o) = ok(r#"{"Backend":{"Type":"vxlan","VNI":2,"vni":3,"Vni":null}}"#)
    else {
        panic!("not vxlan")
    };
    assert_eq!(o.vni, 3);
}

#[test]
fn host_gw_alloc_and_others_have_no_options() {
    assert_eq!(
        ok(r#"{"Backend":{"Type":"host-gw","Port":"ignored"}}"#),
        BackendOptions::HostGw
    );
    assert_eq!(ok(r#"{"Backend":{"Type":"alloc"}}"#), BackendOptions::Alloc);
    assert_eq!(
        ok(r#"{"Backend":{"Type":"extension","SubnetAddCommand":"x"}}"#),
        BackendOptions::Extension
    );
    assert_eq!(
        ok(r#"{"Backend":{"Type":"tencent-vpc"}}"#),
        BackendOptions::TencentVpc
    );
    assert_eq!(err(r#"{"Backend":{}}"#), "unknown backend type: ");
    assert_eq!(err(r#"{"Backend":null}"#), "unknown backend type: ");
    assert_eq!(
        err(r#"{"Backend":{"Type":"bogus"}}"#),
        "unknown backend type: bogus"
    );
}

#[test]
fn ipsec_options() {
    assert_eq!(
        err(r#"{"Backend":{"Type":"ipsec"}}"#),
        "config error, password is too short"
    );
    assert_eq!(
        err(&format!(
            r#"{{"Backend":{{"Type":"ipsec","PSK":"{}"}}}}"#,
            psk(95)
        )),
        "config error, password is too short"
    );
    let BackendOptions::Ipsec(o) = ok(&format!(
        r#"{{"Backend":{{"Type":"ipsec","PSK":"{}"}}}}"#,
        psk(96)
    )) else {
        panic!("not ipsec")
    };
    assert_eq!(o.psk.expose().len(), 96);
    assert!(!o.udp_encap);
    assert_eq!(o.esp_proposal, "aes128gcm16-sha256-prfsha256-ecp256");
    let BackendOptions::Ipsec(o) = ok(&format!(
        r#"{{"Backend":{{"Type":"IPSEC","psk":"{}","udpencap":true,"ESPProposal":"aes256gcm16-sha384"}}}}"#,
        psk(100)
    )) else {
        panic!("not ipsec")
    };
    assert!(o.udp_encap);
    assert_eq!(o.esp_proposal, "aes256gcm16-sha384");
}

#[test]
fn wireguard_options() {
    let BackendOptions::Wireguard(o) = ok(r#"{"Backend":{"Type":"wireguard"}}"#) else {
        panic!("not wg")
    };
    assert_eq!(
        o,
        WireguardOptions {
            listen_port: 51820,
            listen_port_v6: 51821,
            mtu: 0,
            psk: Default::default(),
            persistent_keepalive_interval: Duration::ZERO,
            mode: WireguardMode::Separate,
        }
    );
    let BackendOptions::Wireguard(o) = ok(
        r#"{"Backend":{"Type":"wireguard","ListenPort":51000,"ListenPortV6":51001,"MTU":1400,
            "PSK":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=","PersistentKeepaliveInterval":25,"Mode":"auto"}}"#,
    ) else {
        panic!("not wg")
    };
    assert_eq!(
        (o.listen_port, o.listen_port_v6, o.mtu),
        (51000, 51001, 1400)
    );
    assert_eq!(
        o.persistent_keepalive_interval,
        Duration::from_secs(25),
        "JSON integer is seconds"
    );
    assert_eq!(o.mode, WireguardMode::Auto);
    for (mode, want) in [
        ("separate", WireguardMode::Separate),
        ("ipv4", WireguardMode::Ipv4),
        ("ipv6", WireguardMode::Ipv6),
    ] {
        let BackendOptions::Wireguard(o) = ok(&format!(
            r#"{{"Backend":{{"Type":"wireguard","Mode":"{mode}"}}}}"#
        )) else {
            panic!("not wg")
        };
        assert_eq!(o.mode, want);
    }
    // Go compares Mode case-sensitively.
    assert_eq!(
        err(r#"{"Backend":{"Type":"wireguard","Mode":"Auto"}}"#),
        "no valid Mode configured"
    );
    assert_eq!(
        err(r#"{"Backend":{"Type":"wireguard","Mode":""}}"#),
        "no valid Mode configured"
    );
}

#[test]
fn flannel_mtu_per_backend() {
    let ext = 1500;
    let cases = [
        (r#"{"Backend":{"Type":"udp"}}"#.to_string(), 1472),
        (r#"{}"#.to_string(), 1472),
        (r#"{"Backend":{"Type":"vxlan"}}"#.to_string(), 1450),
        (
            r#"{"Backend":{"Type":"vxlan","MTU":9000}}"#.to_string(),
            8950,
        ),
        (r#"{"Backend":{"Type":"host-gw"}}"#.to_string(), 1500),
        (r#"{"Backend":{"Type":"ipip"}}"#.to_string(), 1480),
        (
            format!(r#"{{"Backend":{{"Type":"ipsec","PSK":"{}"}}}}"#, psk(96)),
            1423,
        ),
        (
            format!(
                r#"{{"Backend":{{"Type":"ipsec","PSK":"{}","UDPEncap":true}}}}"#,
                psk(96)
            ),
            1415,
        ),
        (r#"{"Backend":{"Type":"wireguard"}}"#.to_string(), 1420),
        (
            r#"{"Backend":{"Type":"wireguard","MTU":1380}}"#.to_string(),
            1300,
        ),
        (r#"{"Backend":{"Type":"alloc"}}"#.to_string(), 1500),
        (r#"{"Backend":{"Type":"extension"}}"#.to_string(), 1500),
    ];
    for (json, want) in cases {
        let o = ok(&json);
        assert_eq!(mtu(&o, ext), want, "{json}");
        assert_eq!(o.mtu(ext), want, "{json}");
    }
    // Tiny interfaces do not underflow.
    assert_eq!(ok(r#"{"Backend":{"Type":"vxlan"}}"#).mtu(20), 0);
}

#[test]
fn kind_round_trips_through_options() {
    for name in [
        "udp",
        "vxlan",
        "host-gw",
        "ipip",
        "wireguard",
        "alloc",
        "extension",
        "tencent-vpc",
    ] {
        let kind: BackendKind = name.parse().expect("known");
        let o = BackendOptions::parse(kind, None).expect("defaults decode");
        assert_eq!(o.kind(), kind);
    }
    assert_eq!(
        BackendOptions::parse(BackendKind::Ipsec, None),
        Err(OptionsError::PasswordTooShort)
    );
}
