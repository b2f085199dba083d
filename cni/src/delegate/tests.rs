use weft_compat::subnet_env::plugin as subnet_env;

use super::*;

fn env(text: &str) -> SubnetEnv {
    subnet_env::parse("subnet.env", text.as_bytes()).expect("test subnet.env")
}

const V4: &str = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";

fn built(conf: &str, env_text: &str) -> String {
    let conf = NetConf::parse(conf.as_bytes()).expect("test conf");
    String::from_utf8(to_bytes(&build(&conf, &env(env_text)).expect("build"))).expect("utf8")
}

#[test]
fn spec_example_standard_conflist() {
    // The kube-flannel.yml conflist as libcni hands it to the plugin.
    let got = built(
        r#"{"cniVersion":"0.3.1","name":"cbr0","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}"#,
        V4,
    );
    assert_eq!(
        got,
        r#"{"cniVersion":"0.3.1","hairpinMode":true,"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"isDefaultGateway":true,"isGateway":true,"mtu":1450,"name":"cbr0","type":"bridge"}"#
    );
}

#[test]
fn flannel_unit_test_v4_no_version() {
    // cni:flannel_linux_test.go: no cniVersion in the conf, ipmasq false → ipMasq true.
    let got = built(
        r#"{"name":"loopback","type":"flannel","subnetFile":"/x","dataDir":"/y"}"#,
        "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n",
    );
    assert_eq!(
        got,
        r#"{"ipMasq":true,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"isGateway":true,"mtu":1472,"name":"loopback","type":"bridge"}"#
    );
}

#[test]
fn dual_stack_two_networks_and_custom_ipam() {
    let got = built(
        r#"{"cniVersion":"1.0.0","name":"n","type":"flannel",
            "ipam":{"type":"my-ipam","zeta":{"b":1,"a":2},"routes":[{"dst":"10.9.9.9/32","gw":"10.1.17.254","unknown":1},{"dst":"fd00::/8"}]},
            "runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"tcp"}]}}"#,
        "FLANNEL_NETWORK=10.1.0.0/16,10.2.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPV6_NETWORK=2001:cafe:42::/56\n\
         FLANNEL_IPV6_SUBNET=2001:cafe:42::1/64\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ=true\n",
    );
    assert_eq!(
        got,
        concat!(
            r#"{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}],[{"subnet":"2001:cafe:42::/64"}]],"#,
            r#""routes":[{"dst":"10.9.9.9/32","gw":"10.1.17.254"},{"dst":"fd00::/8"},{"dst":"10.1.0.0/16"},{"dst":"10.2.0.0/16"},{"dst":"2001:cafe:42::/56"}],"#,
            r#""type":"my-ipam","zeta":{"a":2,"b":1}},"isGateway":true,"mtu":1400,"name":"n","#,
            r#""runtimeConfig":{"portMappings":[{"containerPort":8080,"hostPort":80,"protocol":"tcp"}]},"type":"bridge"}"#
        )
    );
}

#[test]
fn delegate_values_win_and_non_bridge_gets_no_gateway() {
    let got = built(
        r#"{"name":"n","cniVersion":"0.4.0","delegate":{"type":"ipvlan","ipMasq":true,"mtu":9000,"master":"eth1","cniVersion":"9"}}"#,
        V4,
    );
    assert_eq!(
        got,
        r#"{"cniVersion":"0.4.0","ipMasq":true,"ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],"type":"host-local"},"master":"eth1","mtu":9000,"name":"n","type":"ipvlan"}"#
    );
    let got = built(r#"{"name":"n","delegate":{"isGateway":false}}"#, V4);
    assert!(got.contains(r#""isGateway":false"#), "{got}");
}

#[test]
fn rejects_name_ipam_and_non_string_type_with_flannel_messages() {
    let e = |conf: &str| {
        let conf = NetConf::parse(conf.as_bytes()).expect("test conf");
        build(&conf, &env(V4))
            .expect_err("must be rejected")
            .to_string()
    };
    assert_eq!(
        e(r#"{"name":"n","delegate":{"name":"x"}}"#),
        "'delegate' dictionary must not have 'name' field, it'll be set by flannel"
    );
    assert_eq!(
        e(r#"{"name":"n","delegate":{"ipam":{}}}"#),
        "'delegate' dictionary must not have 'ipam' field, it'll be set by flannel"
    );
    assert_eq!(
        e(r#"{"name":"n","delegate":{"type":1}}"#),
        "'delegate' dictionary, if present, must have (string) 'type' field"
    );
    assert!(e(r#"{"name":"n","ipam":{"routes":{}}}"#).starts_with("failed to assemble Delegate IPAM: failed to read IPAM routes: failed to parse ipam.routes: "));
    assert!(
        e(r#"{"name":"n","ipam":{"routes":[{"dst":"bad"}]}}"#)
            .ends_with("invalid CIDR address: bad")
    );
    assert!(
        e(r#"{"name":"n","ipam":{"routes":[{"dst":"10.0.0.0/8","gw":"x"}]}}"#)
            .ends_with("invalid IP address: x")
    );
    assert!(
        e(r#"{"name":"n","ipam":{"routes":[{"dst":"10.0.0.0/8","mtu":1.5}]}}"#)
            .contains("route.mtu of type int")
    );
}

#[test]
fn route_fields_keep_go_struct_order() {
    let r = Route::parse(&json!({"scope": 253, "table": 0, "priority": 5, "advmss": 1400, "mtu": 1450.0, "gw": "", "DST": "10.1.2.3/16"})).expect("route");
    assert_eq!(
        serde_json::to_string(&r.to_json()).expect("json"),
        r#"{"dst":"10.1.2.3/16","mtu":1450,"advmss":1400,"priority":5,"table":0,"scope":253}"#
    );
}

#[test]
fn html_characters_are_escaped_like_go() {
    let got = built(r#"{"name":"n","delegate":{"note":"<a&b>"}}"#, V4);
    assert!(got.contains(r#""note":"\u003ca\u0026b\u003e""#), "{got}");
}
