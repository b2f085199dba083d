//! Unit tests: rule text against flannel's exact lines (flannel-compat §8, fl:e2e/rules.go),
//! payloads, listing checks, the `none` driver, the resync loop and the br_netfilter check.

use std::{sync::Arc, time::Duration};

use ipnet::IpNet;

use super::{
    nft_rules,
    rules::{self, Family},
    *,
};

fn net(s: &str) -> IpNet {
    s.parse().expect("test cidr")
}

/// fl:e2e/rules.go `expectedIptablesPostrouting`, minus the `-N` line (jump first).
fn flannel_postrtg(p: &str, n: &str, mcast: &str, rf: &str) -> Vec<String> {
    vec![
        r#"-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG"#.to_string(),
        r#"-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN"#.to_string(),
        format!(r#"-A FLANNEL-POSTRTG -s {p} -d {n} -m comment --comment "flanneld masq" -j RETURN"#),
        format!(r#"-A FLANNEL-POSTRTG -s {n} -d {p} -m comment --comment "flanneld masq" -j RETURN"#),
        format!(r#"-A FLANNEL-POSTRTG ! -s {n} -d {p} -m comment --comment "flanneld masq" -j RETURN"#),
        format!(r#"-A FLANNEL-POSTRTG -s {n} ! -d {mcast} -m comment --comment "flanneld masq" -j MASQUERADE{rf}"#),
        format!(r#"-A FLANNEL-POSTRTG ! -s {n} -d {n} -m comment --comment "flanneld masq" -j MASQUERADE{rf}"#),
    ]
}

fn lines(cr: &rules::ChainRules) -> Vec<String> {
    std::iter::once(cr.jump.clone())
        .chain(cr.rules.iter().cloned())
        .collect()
}

#[test]
fn iptables_masq_rules_match_flannel_v4() {
    let cr = rules::masq_rules(net("10.244.0.0/16"), net("10.244.1.0/24"), true);
    assert_eq!(
        lines(&cr),
        flannel_postrtg(
            "10.244.1.0/24",
            "10.244.0.0/16",
            "224.0.0.0/4",
            " --random-fully"
        )
    );
    assert_eq!(
        (cr.family, cr.table, cr.builtin, cr.chain),
        (Family::V4, "nat", "POSTROUTING", "FLANNEL-POSTRTG")
    );
    assert!(
        cr.chain_listing()
            .starts_with("-N FLANNEL-POSTRTG\n-A FLANNEL-POSTRTG -m mark")
    );
}

#[test]
fn iptables_masq_rules_match_flannel_v6_without_random_fully() {
    let cr = rules::masq_rules(net("2001:cafe:42::/56"), net("2001:cafe:42:1::/64"), false);
    assert_eq!(
        lines(&cr),
        flannel_postrtg("2001:cafe:42:1::/64", "2001:cafe:42::/56", "ff00::/8", "")
    );
    assert_eq!(cr.family, Family::V6);
}

#[test]
fn iptables_forward_rules_match_flannel() {
    let cr = rules::forward_rules(net("10.244.0.0/16"), None);
    assert_eq!(
        lines(&cr),
        [
            r#"-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD"#,
            r#"-A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT"#,
            r#"-A FLANNEL-FWD -d 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT"#,
        ]
    );
    assert_eq!((cr.table, cr.builtin), ("filter", "FORWARD"));
}

/// `--tunnel-gso`: packets forwarded in from weft's tunnel TAP (node
/// address to peer node) are accepted, in the same chain, removed with it.
#[test]
fn the_tunnel_tap_gets_a_forward_accept() {
    let cr = rules::forward_rules(net("10.244.0.0/16"), Some("weft-gso0"));
    assert_eq!(
        cr.rules[2],
        r#"-A FLANNEL-FWD -i weft-gso0 -m comment --comment "flanneld forward" -j ACCEPT"#
    );
    assert_eq!(cr.rules.len(), 3);
    let fwd = nft_rules::forward_chain(net("10.244.0.0/16"), Some("weft-gso0"));
    assert_eq!(fwd.rules[2], r#"iifname "weft-gso0" accept"#);
    let mgr = NoneManager::new();
    let network = Networks {
        v4: Some("10.244.0.0/16".parse().expect("cidr")),
        v6: None,
    };
    let flags = Flags {
        accept_in: Some("weft-gso0"),
        ..Flags::default()
    };
    install(&mgr, &flags, &network, &network, None).expect("install");
    assert_eq!(
        mgr.calls(),
        [Call::SetupForward {
            network,
            accept_in: Some("weft-gso0".into())
        }]
    );
}

#[test]
fn apply_payload_flushes_chain_and_moves_every_jump_copy_to_the_end() {
    let cr = rules::forward_rules(net("10.244.0.0/16"), None);
    let builtin = format!(
        "-P FORWARD ACCEPT\n{0}\n-A FORWARD -j KUBE-FORWARD\n{0}\n",
        cr.jump
    );
    let payload = cr.apply_payload(&builtin);
    let want = format!(
        "*filter\n:FLANNEL-FWD - [0:0]\n{d}\n{d}\n{j}\n{}\n{}\nCOMMIT\n",
        cr.rules[0],
        cr.rules[1],
        d = rules::to_delete(&cr.jump),
        j = cr.jump
    );
    assert_eq!(payload, want);
    assert!(
        payload.contains(r#"--comment "flanneld forward""#),
        "comment stays quoted"
    );
    // Nothing to delete on a fresh table.
    assert!(!cr.apply_payload("-P FORWARD ACCEPT\n").contains("-D "));
}

#[test]
fn intact_check_needs_exact_rules_and_a_single_jump() {
    let cr = rules::masq_rules(net("10.244.0.0/16"), net("10.244.1.0/24"), true);
    let builtin = format!(
        "-P POSTROUTING ACCEPT\n-A POSTROUTING -j KUBE-POSTROUTING\n{}\n",
        cr.jump
    );
    let chain = cr.chain_listing();
    assert!(cr.is_intact(&builtin, Some(&chain)));
    assert!(!cr.is_intact(&builtin, None), "chain missing");
    assert!(
        !cr.is_intact("-P POSTROUTING ACCEPT\n", Some(&chain)),
        "jump missing"
    );
    assert!(
        !cr.is_intact(&format!("{builtin}{}\n", cr.jump), Some(&chain)),
        "jump duplicated"
    );
    let missing_rule = chain.replace(&format!("{}\n", cr.rules[3]), "");
    assert!(!cr.is_intact(&builtin, Some(&missing_rule)), "rule missing");
    let reordered = format!("-N FLANNEL-POSTRTG\n{}\n{}\n", cr.rules[1], cr.rules[0]);
    assert!(!cr.is_intact(&builtin, Some(&reordered)), "order matters");
}

#[test]
fn teardown_payload_deletes_only_existing_copies() {
    let old = rules::masq_rules(net("10.244.0.0/16"), net("10.244.1.0/24"), true);
    let builtin = format!("-P POSTROUTING ACCEPT\n{}\n", old.jump);
    let chain = format!(
        "-N FLANNEL-POSTRTG\n{0}\n{0}\n{1}\n",
        old.rules[1], old.rules[4]
    );
    let payload = old
        .teardown_payload(&builtin, Some(&chain))
        .expect("something to delete");
    let want = format!(
        "*nat\n{}\n{r1}\n{r1}\n{}\nCOMMIT\n",
        rules::to_delete(&old.jump),
        rules::to_delete(&old.rules[4]),
        r1 = rules::to_delete(&old.rules[1]),
    );
    assert_eq!(payload, want);
    assert_eq!(old.teardown_payload("-P POSTROUTING ACCEPT\n", None), None);
}

#[test]
fn delete_chain_payload_removes_every_jump_then_the_chain() {
    let builtin = "-P POSTROUTING ACCEPT\n\
        -A POSTROUTING -j KUBE-POSTROUTING\n\
        -A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
        -A POSTROUTING -s 10.0.0.0/8 -j FLANNEL-POSTRTG\n\
        -A POSTROUTING -j FLANNEL-POSTRTG-X\n";
    let payload =
        rules::delete_chain_payload("nat", "POSTROUTING", "FLANNEL-POSTRTG", builtin, true);
    assert_eq!(
        payload.as_deref(),
        Some(
            "*nat\n-D POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG\n\
             -D POSTROUTING -s 10.0.0.0/8 -j FLANNEL-POSTRTG\n-F FLANNEL-POSTRTG\n-X FLANNEL-POSTRTG\nCOMMIT\n"
        )
    );
    assert_eq!(
        rules::delete_chain_payload(
            "nat",
            "POSTROUTING",
            "FLANNEL-POSTRTG",
            "-P POSTROUTING ACCEPT\n",
            false
        ),
        None
    );
}

#[test]
fn version_probe_matches_go_iptables() {
    assert_eq!(
        rules::parse_version("iptables v1.8.9 (nf_tables)\n"),
        Some((1, 8, 9))
    );
    assert_eq!(
        rules::parse_version("ip6tables-restore v1.6.1"),
        Some((1, 6, 1))
    );
    assert_eq!(rules::parse_version("version unknown"), None);
    assert!(rules::has_random_fully((1, 6, 2)) && !rules::has_random_fully((1, 6, 1)));
    assert!(rules::has_random_fully((2, 0, 0)) && rules::has_random_fully((1, 8, 0)));
    assert!(rules::has_wait((1, 4, 20)) && !rules::has_wait((1, 4, 19)));
    assert!(rules::has_restore_wait((1, 6, 2)) && !rules::has_restore_wait((1, 6, 1)));
}

/// fl:e2e/rules.go `expectedNftPostrouting`.
fn flannel_nft_postrouting(p: &str, n: &str) -> String {
    [
        "table ip flannel-ipv4 {",
        "\tchain postrtg {",
        "\t\tcomment \"chain to manage traffic masquerading by flannel\"",
        "\t\ttype nat hook postrouting priority srcnat; policy accept;",
        "\t\tmeta mark 0x00004000 return",
        &format!("\t\tip saddr {p} ip daddr {n} return"),
        &format!("\t\tip saddr {n} ip daddr {p} return"),
        &format!("\t\tip saddr != {p} ip daddr {n} return"),
        &format!("\t\tip saddr {n} ip daddr != 224.0.0.0/4 masquerade fully-random"),
        &format!("\t\tip saddr != {n} ip daddr {n} masquerade fully-random"),
        "\t}",
        "}",
    ]
    .join("\n")
}

#[test]
fn nft_listings_match_flannel_e2e() {
    let masq = nft_rules::masq_chain(net("10.244.0.0/16"), net("10.244.1.0/24"), true);
    assert_eq!(
        masq.listing().trim_end(),
        flannel_nft_postrouting("10.244.1.0/24", "10.244.0.0/16")
    );
    let fwd = nft_rules::forward_chain(net("10.244.0.0/16"), None);
    let want = "table ip flannel-ipv4 {\n\tchain forward {\n\t\tcomment \"chain to accept flannel traffic\"\n\
        \t\ttype filter hook forward priority filter; policy accept;\n\
        \t\tip saddr 10.244.0.0/16 accept\n\t\tip daddr 10.244.0.0/16 accept\n\t}\n}";
    assert_eq!(fwd.listing().trim_end(), want);
    assert_eq!(
        fwd.list_args(),
        ["list", "chain", "ip", "flannel-ipv4", "forward"]
    );
}

#[test]
fn nft_v6_uses_ip6_and_ff00() {
    let masq = nft_rules::masq_chain(net("2001:cafe:42::/56"), net("2001:cafe:42:1::/64"), false);
    assert_eq!(masq.family, Family::V6);
    assert_eq!(
        masq.rules[3..],
        [
            "ip6 saddr != 2001:cafe:42:1::/64 ip6 daddr 2001:cafe:42::/56 return",
            "ip6 saddr 2001:cafe:42::/56 ip6 daddr != ff00::/8 masquerade",
            "ip6 saddr != 2001:cafe:42::/56 ip6 daddr 2001:cafe:42::/56 masquerade",
        ]
    );
    assert!(masq.listing().starts_with("table ip6 flannel-ipv6 {\n"));
}

#[test]
fn nft_payloads() {
    let fwd = nft_rules::forward_chain(net("10.244.0.0/16"), None);
    assert_eq!(
        fwd.payload(),
        "add table ip flannel-ipv4 { comment \"rules for flannel-ipv4\" ; }\n\
         add chain ip flannel-ipv4 forward { type filter hook forward priority filter ; comment \"chain to accept flannel traffic\" ; }\n\
         flush chain ip flannel-ipv4 forward\n\
         add rule ip flannel-ipv4 forward ip saddr 10.244.0.0/16 accept\n\
         add rule ip flannel-ipv4 forward ip daddr 10.244.0.0/16 accept\n"
    );
    assert_eq!(
        nft_rules::init_payload(),
        "add table ip flannel-ipv4 { comment \"rules for flannel-ipv4\" ; }\n\
         add table ip6 flannel-ipv6 { comment \"rules for flannel-ipv6\" ; }\n"
    );
    assert!(nft_rules::probe_payload().contains(
        "add rule ip flannel-ipv4 masqueradeTest ip saddr != 127.0.0.1 masquerade fully-random\n"
    ));
    let tables = "table ip nat\ntable ip6 flannel-ipv6\ntable inet flannel-ipv4\n";
    assert_eq!(nft_rules::parse_tables(tables), [Family::V6]);
    assert_eq!(
        nft_rules::delete_tables_payload(&[Family::V6]).as_deref(),
        Some("delete table ip6 flannel-ipv6\n")
    );
    assert_eq!(nft_rules::delete_tables_payload(&[]), None);
}

#[test]
fn masq_plan_masks_host_bits_and_needs_a_subnet() {
    let network = Networks {
        v4: Some("10.244.0.0/16".parse().expect("cidr")),
        v6: None,
    };
    let subnet = Networks {
        v4: Some("10.244.1.1/24".parse().expect("cidr")),
        v6: None,
    };
    let (cur, prev) = masq_plan(Family::V4, &network, &subnet, None).expect("plan");
    assert_eq!(cur.subnet, Some(net("10.244.1.0/24")));
    assert_eq!(prev, None);
    let err = masq_plan(Family::V4, &network, &Networks::default(), None).expect_err("no subnet");
    assert_eq!(err.to_string(), "no lease subnet for network 10.244.0.0/16");
    let (cur, _) = masq_plan(Family::V6, &network, &subnet, None).expect("plan");
    assert_eq!((cur.network, cur.subnet), (None, None));
}

#[test]
fn install_follows_the_flags() {
    let mgr = NoneManager::new();
    let network = Networks {
        v4: Some("10.244.0.0/16".parse().expect("cidr")),
        v6: None,
    };
    let subnet = Networks {
        v4: Some("10.244.1.0/24".parse().expect("cidr")),
        v6: None,
    };
    let prev = Previous { network, subnet };
    install(&mgr, &Flags::default(), &network, &subnet, Some(&prev)).expect("install");
    assert_eq!(
        mgr.calls(),
        [Call::SetupForward {
            network,
            accept_in: None
        }]
    );
    let flags = Flags {
        ip_masq: true,
        forward_rules: false,
        ..Flags::default()
    };
    install(&mgr, &flags, &network, &subnet, Some(&prev)).expect("install");
    assert_eq!(
        mgr.calls()[1],
        Call::SetupMasq {
            network,
            subnet,
            prev: Some(prev)
        }
    );
    assert_eq!(mgr.calls().len(), 2);
}

#[test]
fn factory_names_each_driver() {
    assert_eq!(Kind::from_config(true), Kind::Nftables);
    assert_eq!(Kind::from_config(false), Kind::Iptables);
    for (kind, name) in [
        (Kind::Iptables, "iptables"),
        (Kind::Nftables, "nftables"),
        (Kind::None, "none"),
    ] {
        assert_eq!(new_manager(kind, false, Runner::new()).name(), name);
    }
}

#[test]
fn resync_thread_calls_ensure_until_stopped() {
    let mgr = Arc::new(NoneManager::new());
    mgr.report_missing(1);
    assert!(resync_once(mgr.as_ref()), "first ensure reports a repair");
    assert!(!resync_once(mgr.as_ref()));
    let handle = spawn_resync(mgr.clone(), Duration::from_millis(1)).expect("spawn");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while mgr.calls().len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    handle.stop();
    let n = mgr.calls().len();
    assert!(n >= 4, "resync ran {n} times");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(mgr.calls().len(), n, "no ensure after stop");
    assert!(mgr.calls().iter().all(|c| *c == Call::Ensure));
}

#[test]
fn br_netfilter_check_reports_flannels_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = check_br_netfilter(dir.path(), false).expect_err("missing file");
    let path = dir.path().join(BRIDGE_NF_CALL_IPTABLES);
    assert_eq!(
        err.to_string(),
        format!("stat {}: no such file or directory", path.display())
    );
    let bridge = dir.path().join("sys/net/bridge");
    std::fs::create_dir_all(&bridge).expect("mkdir");
    std::fs::write(bridge.join("bridge-nf-call-iptables"), "1\n").expect("write");
    check_br_netfilter(dir.path(), false).expect("v4 file present");
    let err = check_br_netfilter(dir.path(), true).expect_err("v6 file missing");
    assert!(
        err.to_string()
            .ends_with("bridge-nf-call-ip6tables: no such file or directory"),
        "{err}"
    );
    std::fs::write(bridge.join("bridge-nf-call-ip6tables"), "1\n").expect("write");
    check_br_netfilter(dir.path(), true).expect("both present");
}

#[test]
fn br_netfilter_is_loaded_when_missing_and_else_the_error_says_how_to_fix_it() {
    use super::ensure_br_netfilter;
    let dir = tempfile::tempdir().expect("tempdir");
    let bridge = dir.path().join("sys/net/bridge");
    // Missing: the loader runs once, and the files it brings make the check pass.
    let mut calls = 0;
    let loaded = ensure_br_netfilter(dir.path(), true, &mut || {
        calls += 1;
        std::fs::create_dir_all(&bridge).map_err(|e| e.to_string())?;
        for f in ["bridge-nf-call-iptables", "bridge-nf-call-ip6tables"] {
            std::fs::write(bridge.join(f), "1\n").map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .expect("loaded");
    assert!(loaded);
    assert_eq!(calls, 1);
    // Present: nothing is loaded.
    let present = ensure_br_netfilter(dir.path(), true, &mut || panic!("loader called"));
    assert!(!present.expect("present"));

    // Loading fails: flannel's line, why loading failed, and the fix.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(BRIDGE_NF_CALL_IPTABLES);
    let why = "`/sbin/modprobe br_netfilter`: modprobe: FATAL: Module br_netfilter not found in directory /lib/modules/6.1.0-9-amd64";
    let err = ensure_br_netfilter(dir.path(), false, &mut || Err(why.to_string()))
        .expect_err("still missing");
    assert_eq!(
        format!("Failed to check br_netfilter: {err}"),
        format!(
            "Failed to check br_netfilter: stat {}: no such file or directory: the br_netfilter \
             module is not loaded and weftd could not load it ({why}). Without it, traffic \
             between pods on the node's bridge bypasses iptables and Services break. Fix on \
             the node: `modprobe br_netfilter`, and to load it at every boot \
             `echo br_netfilter > /etc/modules-load.d/br_netfilter.conf`",
            path.display()
        )
    );
    // A loader that succeeds without the files appearing is reported as such.
    let err = ensure_br_netfilter(dir.path(), false, &mut || Ok(())).expect_err("still missing");
    assert!(
        err.to_string()
            .contains("(modprobe succeeded but the files did not appear)"),
        "{err}"
    );
}
