//! flanneld's command line (flannel-compat spec §9.1), plus weft's own flags.
//!
//! Go's `flag` package accepts `-name` as well as `--name`, `-name=value` and
//! `-name value` (`-v 2`, `--v=2`, ...), and booleans only as `-name` or
//! `-name=false` (`-name false` is not a value: Go stops parsing there, weftd
//! refuses it). Every flag not given on the command line may come from
//! `FLANNELD_<NAME>` (upper case, `-` and `.` as `_`); weft's own flags from
//! `WEFT_<NAME>`. [`Flags::parse_from_env_and_args`] reproduces all of that.
//!
//! No flag is accepted and then ignored: klog's `-vmodule` and
//! `-log_backtrace_at`, which have no counterpart here, are refused when
//! given a value.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use clap::{ArgAction, Parser};

/// Parses a Go `strconv.ParseBool` value.
fn go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean value {s:?}")),
    }
}

/// Which lease store weftd uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// The embedded file store (weft's default when no etcd endpoint is given).
    Embedded,
    /// etcd v3 (`--etcd-*`).
    Etcd,
    /// The Kubernetes API (`--kube-subnet-mgr`).
    Kube,
}

/// Which dataplane runs a backend that exists both in the kernel and in weft's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dataplane {
    /// The kernel when it can, else the userspace engine.
    Auto,
    /// Only the kernel.
    Kernel,
    /// Only the userspace engine.
    Userspace,
}

/// How the userspace engine checks the sources of decapsulated packets
/// (`weft_engine::antispoof`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AntiSpoofingMode {
    /// The outer source must be the peer's published public IP and the inner
    /// source must lie in that peer's subnet.
    Strict,
    /// As strict, except that a packet from another outer source is still
    /// accepted when its inner source lies in a peer's subnet (a node with
    /// `--public-ip` behind NAT, a multi-homed host); counted and logged
    /// once per peer.
    Subnet,
    /// No source checks (flannel's backends check none).
    Off,
}

impl AntiSpoofingMode {
    /// The engine's mode.
    pub fn engine(self) -> weft_engine::AntiSpoofing {
        match self {
            AntiSpoofingMode::Strict => weft_engine::AntiSpoofing::Strict,
            AntiSpoofingMode::Subnet => weft_engine::AntiSpoofing::Subnet,
            AntiSpoofingMode::Off => weft_engine::AntiSpoofing::Off,
        }
    }
}

/// Refuses any value of a klog flag weftd cannot honour (`name`: the flag,
/// `instead`: what to use).
fn unsupported(
    name: &'static str,
    instead: &'static str,
) -> impl Fn(&str) -> Result<String, String> + Clone {
    move |s: &str| {
        if s.is_empty() {
            Ok(String::new())
        } else {
            Err(format!("weftd does not support klog's -{name}; {instead}"))
        }
    }
}

/// Which host firewall manager weftd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TrafficManagerKind {
    /// iptables, or nftables when the config sets EnableNFTables (flannel's choice).
    Auto,
    /// No host rules at all (and no br_netfilter check).
    None,
}

/// weftd's flags. Names, defaults and env variables are flanneld's.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "weftd",
    about = "weft node daemon, a drop-in for flanneld",
    disable_version_flag = true
)]
pub struct Flags {
    /// A comma-delimited list of etcd endpoints.
    #[arg(
        long,
        env = "FLANNELD_ETCD_ENDPOINTS",
        default_value = "http://127.0.0.1:4001,http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: String,
    /// etcd prefix.
    #[arg(
        long,
        env = "FLANNELD_ETCD_PREFIX",
        default_value = "/coreos.com/network"
    )]
    pub etcd_prefix: String,
    /// SSL key file used to secure etcd communication.
    #[arg(long, env = "FLANNELD_ETCD_KEYFILE", default_value = "")]
    pub etcd_keyfile: String,
    /// SSL certification file used to secure etcd communication.
    #[arg(long, env = "FLANNELD_ETCD_CERTFILE", default_value = "")]
    pub etcd_certfile: String,
    /// SSL Certificate Authority file used to secure etcd communication.
    #[arg(long, env = "FLANNELD_ETCD_CAFILE", default_value = "")]
    pub etcd_cafile: String,
    /// Username for BasicAuth to etcd.
    #[arg(long, env = "FLANNELD_ETCD_USERNAME", default_value = "")]
    pub etcd_username: String,
    /// Password for BasicAuth to etcd (never logged).
    #[arg(long, env = "FLANNELD_ETCD_PASSWORD", default_value = "", value_parser = crate::secret::Secret::parse)]
    pub etcd_password: crate::secret::Secret,
    /// Interface to use (IP or name) for inter-host communication; repeatable.
    #[arg(long, env = "FLANNELD_IFACE", action = ArgAction::Append)]
    pub iface: Vec<String>,
    /// Regex expression to match the first interface to use (IP or name); repeatable.
    #[arg(long, env = "FLANNELD_IFACE_REGEX", action = ArgAction::Append)]
    pub iface_regex: Vec<String>,
    /// Detect the interface to use for inter-host communication by the route to this IP.
    #[arg(long, env = "FLANNELD_IFACE_CAN_REACH")]
    pub iface_can_reach: Option<IpAddr>,
    /// Filename where env variables (subnet, MTU, ...) will be written to.
    #[arg(
        long,
        env = "FLANNELD_SUBNET_FILE",
        default_value = "/run/flannel/subnet.env"
    )]
    pub subnet_file: PathBuf,
    /// IP accessible by other nodes for inter-host communication.
    #[arg(long, env = "FLANNELD_PUBLIC_IP")]
    pub public_ip: Option<Ipv4Addr>,
    /// IPv6 accessible by other nodes for inter-host communication.
    #[arg(long = "public-ipv6", env = "FLANNELD_PUBLIC_IPV6")]
    pub public_ipv6: Option<Ipv6Addr>,
    /// Subnet lease renewal margin, in minutes, ranging from 1 to 1439.
    #[arg(long, env = "FLANNELD_SUBNET_LEASE_RENEW_MARGIN", default_value_t = 60)]
    pub subnet_lease_renew_margin: i64,
    /// Setup IP masquerade rule for traffic destined outside of overlay network.
    #[arg(long, env = "FLANNELD_IP_MASQ", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub ip_masq: bool,
    /// Disable fully random source port allocation for masqueraded traffic.
    #[arg(long, env = "FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub ip_masq_fully_random_disable: bool,
    /// Contact the Kubernetes API for subnet assignment instead of etcd.
    #[arg(long, env = "FLANNELD_KUBE_SUBNET_MGR", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub kube_subnet_mgr: bool,
    /// Kubernetes API server URL. Does not need to be specified if flannel is running in a pod.
    #[arg(long, env = "FLANNELD_KUBE_API_URL", default_value = "")]
    pub kube_api_url: String,
    /// Kubernetes annotation prefix.
    #[arg(
        long,
        env = "FLANNELD_KUBE_ANNOTATION_PREFIX",
        default_value = "flannel.alpha.coreos.com"
    )]
    pub kube_annotation_prefix: String,
    /// kubeconfig file location.
    #[arg(long, env = "FLANNELD_KUBECONFIG_FILE", default_value = "")]
    pub kubeconfig_file: String,
    /// Print version and exit.
    #[arg(long, default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub version: bool,
    /// The IP address on which to listen for health checks.
    #[arg(long, env = "FLANNELD_HEALTHZ_IP", default_value = "0.0.0.0")]
    pub healthz_ip: IpAddr,
    /// The port to listen on for health checks (0 disables).
    #[arg(long, env = "FLANNELD_HEALTHZ_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// weft: the UDP port of the overlay probes between nodes, bound on the
    /// node's overlay address (docs/probes.md; every node must use the same;
    /// 0 disables).
    #[arg(long, env = "WEFT_PROBE_PORT", default_value_t = crate::probe::DEFAULT_PORT)]
    pub probe_port: u16,
    /// weft: lower the route MTU of a peer whose path carries less than the
    /// overlay MTU (found by the path-MTU probes), and restore it when the
    /// path is whole again; only weft's own routes are touched (udp and
    /// WireGuard, one route for the network: a route for that peer alone).
    #[arg(long, env = "WEFT_PROBE_ROUTE_MTU", default_value = "true", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub probe_route_mtu: bool,
    /// weft: the kernel vxlan device's transmit checksum offload: `auto`
    /// (off below kernel 5.7, where the checksum bug that stalls NATed
    /// connections for 63 s lives; else the kernel's default), `off`
    /// (flannel's `ethtool -K flannel.1 tx-checksum-ip-generic off`, kept
    /// across restarts and recreated devices) or `on`.
    #[arg(
        long,
        env = "WEFT_VXLAN_TX_CHECKSUM_OFFLOAD",
        default_value = "auto",
        value_name = "auto|on|off"
    )]
    pub vxlan_tx_checksum_offload: crate::backend::vxlan::TxCsumOffload,
    /// weft: the userspace vxlan or udp engine on an IPv4 node writes each TCP
    /// super-packet whole to the tunnel TAP `weft-gso0` with UDP-tunnel GSO
    /// (Linux 6.17+) and the uplink segments it (docs/performance.md, "The
    /// engine writing through it"): `off` (the engine's UDP sockets), `auto`
    /// (the TAP where the uplink has `tx-udp_tnl-segmentation`,
    /// `net.ipv4.ip_forward` is 1 and `net.ipv4.conf.all.rp_filter` is not 1,
    /// else the sockets; weftd changes none of these) or `on` (the same
    /// conditions, each a start-up error). udp: only toward peers whose lease
    /// has `WeftGSO` (weft nodes with `auto` or `on`), never to flanneld.
    #[arg(
        long,
        env = "WEFT_TUNNEL_GSO",
        default_value = "off",
        value_name = "off|auto|on"
    )]
    pub tunnel_gso: crate::backend::tunnel::gso::TunnelGso,
    /// weft: nodes behind NAT (docs/nat.md): discover the endpoint this node
    /// is seen from on the backend port, publish it in the lease and punch
    /// holes to peers that do the same (userspace wireguard, vxlan and udp).
    /// Also on when net-conf.json has `"WeftNATTraversal": true`.
    #[arg(long, env = "WEFT_NAT_TRAVERSAL", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub nat_traversal: bool,
    /// weft: relay WireGuard datagrams for nodes behind NATs that cannot
    /// punch (docs/nat.md "Relays"; turns on --nat-traversal): the lease's
    /// WeftNAT gets `"Relay":true`. For a node with a reachable address.
    #[arg(long, env = "WEFT_NAT_RELAY", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub nat_relay: bool,
    /// weft: the UDP port a relay listens on (--nat-relay).
    #[arg(long, env = "WEFT_NAT_RELAY_PORT", default_value_t = 51830)]
    pub nat_relay_port: u16,
    /// weft: a relay's bandwidth limit in Mbit/s; datagrams over it are
    /// dropped and counted (0: no limit).
    #[arg(
        long,
        env = "WEFT_NAT_RELAY_LIMIT",
        default_value_t = 0,
        value_name = "MBIT/S"
    )]
    pub nat_relay_limit: u64,
    /// Resync period for iptables rules, in seconds.
    #[arg(long, env = "FLANNELD_IPTABLES_RESYNC", default_value_t = 5)]
    pub iptables_resync: u64,
    /// Add default accept rules to the FORWARD chain in iptables.
    #[arg(long, env = "FLANNELD_IPTABLES_FORWARD_RULES", default_value = "true", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub iptables_forward_rules: bool,
    /// Add a blackhole route covering the node's own subnet.
    #[arg(long, env = "FLANNELD_IP_BLACKHOLE_ROUTE", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub ip_blackhole_route: bool,
    /// Path to the network configuration file.
    #[arg(
        long,
        env = "FLANNELD_NET_CONFIG_PATH",
        default_value = "/etc/kube-flannel/net-conf.json"
    )]
    pub net_config_path: PathBuf,
    /// Set the NetworkUnavailable node condition to False after setup.
    #[arg(long, env = "FLANNELD_SET_NODE_NETWORK_UNAVAILABLE", default_value = "true", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub set_node_network_unavailable: bool,
    /// klog verbosity: 0-3 info, 4-9 debug, 10 and more trace (RUST_LOG overrides it).
    #[arg(long = "v", env = "FLANNELD_V", default_value_t = 0)]
    pub verbosity: u32,
    /// klog per-file verbosity: not supported, refused unless empty (use -v or RUST_LOG).
    #[arg(long = "vmodule", env = "FLANNELD_VMODULE", default_value = "",
        value_parser = unsupported("vmodule", "use -v=N, or RUST_LOG (e.g. RUST_LOG=info,weft_control::backend=debug) for per-module levels"))]
    pub vmodule: String,
    /// klog stack trace at file:line: not supported, refused unless empty (use RUST_BACKTRACE=1).
    #[arg(
        long = "log_backtrace_at",
        env = "FLANNELD_LOG_BACKTRACE_AT",
        default_value = "",
        value_parser = unsupported("log_backtrace_at", "set RUST_BACKTRACE=1 for backtraces of errors")
    )]
    pub log_backtrace_at: String,

    // --- weft's own flags ---
    /// Lease store: embedded (default without etcd flags), etcd or kube.
    #[arg(long, env = "WEFT_STORE")]
    pub store: Option<StoreKind>,
    /// Directory of the embedded lease store.
    #[arg(long, env = "WEFT_STORE_PATH", default_value = "/var/lib/weft/store")]
    pub store_path: PathBuf,
    /// Lease TTL in seconds (flannel: 24 h; shorter only for tests).
    #[arg(long, env = "WEFT_LEASE_TTL", default_value_t = 86_400, hide = true)]
    pub lease_ttl: u64,
    /// Test hook: the backend's task waits this long (milliseconds) before
    /// each batch of peer changes, as a slow kernel would make it (0: off).
    #[arg(
        long,
        env = "WEFT_TEST_APPLY_DELAY_MS",
        default_value_t = 0,
        hide = true
    )]
    pub test_apply_delay_ms: u64,
    /// Kernel or userspace dataplane for backends that have both.
    #[arg(long, env = "WEFT_DATAPLANE", value_enum, default_value = "auto")]
    pub dataplane: Dataplane,
    /// Userspace engine worker threads (0 = one per CPU).
    #[arg(long, env = "WEFT_ENGINE_WORKERS", default_value_t = 0)]
    pub engine_workers: usize,
    /// Host firewall rules: `auto` (iptables, or nftables with EnableNFTables)
    /// or `none` for nodes that manage their own firewall.
    #[arg(long, env = "WEFT_TRAFFIC_MANAGER", value_enum, default_value = "auto")]
    pub traffic_manager: TrafficManagerKind,
    /// Log format: text or json.
    #[arg(long, env = "WEFT_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// How the userspace engine checks decapsulated packets: `strict` (the
    /// outer source must be the sending node's published public IP and the
    /// inner source in its subnet), `subnet` (as strict, but a packet from
    /// another outer source is accepted when its inner source lies in a
    /// node's subnet: nodes whose `--public-ip` is not the address their
    /// packets leave from, behind NAT or multi-homed; counted and logged once
    /// per node) or `off`. Kernel dataplanes check nothing, as flannel's.
    #[arg(long, env = "WEFT_ANTI_SPOOFING", value_enum, default_value = "subnet")]
    pub anti_spoofing: AntiSpoofingMode,
    /// Unix socket of the pod IPAM API (CNI routed mode), mode 0600.
    /// Default: `weft.sock` next to --subnet-file; empty disables the API.
    #[arg(long, env = "WEFT_IPAM_SOCKET")]
    pub ipam_socket: Option<PathBuf>,
    /// File keeping the pod IPAM allocations across restarts.
    /// Default: `weft-ipam.json` next to --subnet-file.
    #[arg(long, env = "WEFT_IPAM_STATE")]
    pub ipam_state: Option<PathBuf>,
}

impl Flags {
    /// Parses the process's arguments with Go's single-dash conventions.
    pub fn parse_from_env_and_args() -> Result<Flags, clap::Error> {
        Flags::try_parse_from(normalize_args(std::env::args()))
    }

    /// The store to use: `--store`, else kube with `--kube-subnet-mgr`, else
    /// etcd when an etcd endpoint was configured explicitly, else embedded.
    pub fn store_kind(&self, etcd_explicit: bool) -> StoreKind {
        match self.store {
            Some(s) => s,
            None if self.kube_subnet_mgr => StoreKind::Kube,
            None if etcd_explicit => StoreKind::Etcd,
            None => StoreKind::Embedded,
        }
    }

    /// Validates cross-flag rules flanneld checks at start.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..1440).contains(&self.subnet_lease_renew_margin) {
            return Err("Invalid subnet-lease-renew-margin option, out of acceptable range".into());
        }
        Ok(())
    }
}

/// Whether `--name`/`-name` (with or without `=value`) is on the command line.
fn given(args: &[String], name: &str) -> bool {
    args.iter().skip(1).take_while(|a| *a != "--").any(|a| {
        let body = a.trim_start_matches('-');
        a.starts_with('-') && (body == name || body.starts_with(&format!("{name}=")))
    })
}

impl Flags {
    /// Refuses flags on the command line (`args`, the program name first)
    /// that select two stores, or that apply to a store not in use: weftd
    /// would otherwise take one and silently ignore the other.
    pub fn conflicts(&self, args: &[String]) -> Result<(), String> {
        let etcd = given(args, "etcd-endpoints");
        let store = match self.store {
            Some(s) if given(args, "store") => s,
            _ => self.store_kind(etcd),
        };
        let clash = |a: &str, b: &str| {
            Err(format!(
                "{a} and {b} select different lease stores: give one"
            ))
        };
        match store {
            StoreKind::Embedded if self.kube_subnet_mgr => {
                return clash("--store=embedded", "--kube-subnet-mgr");
            }
            StoreKind::Embedded if etcd => return clash("--store=embedded", "--etcd-endpoints"),
            StoreKind::Etcd if self.kube_subnet_mgr => {
                return clash("--store=etcd", "--kube-subnet-mgr");
            }
            StoreKind::Kube if etcd && self.store.is_some() => {
                return clash("--store=kube", "--etcd-endpoints");
            }
            _ => {}
        }
        // flanneld silently connects without TLS (or without auth) here.
        if self.etcd_keyfile.is_empty() != self.etcd_certfile.is_empty() {
            return Err(
                "--etcd-keyfile and --etcd-certfile go together: with only one of them the \
                 connection would be made without a client certificate"
                    .into(),
            );
        }
        if self.etcd_username.is_empty() && !self.etcd_password.is_empty() {
            return Err("--etcd-password without --etcd-username would not be used".into());
        }
        if store != StoreKind::Embedded && given(args, "store-path") {
            return Err(format!(
                "--store-path applies to the embedded store; this weftd uses the {} store",
                match store {
                    StoreKind::Etcd => "etcd",
                    _ => "kube",
                }
            ));
        }
        Ok(())
    }
}

/// Whether any etcd endpoint was given on the command line or in the environment.
pub fn etcd_explicit(args: &[String]) -> bool {
    std::env::var_os("FLANNELD_ETCD_ENDPOINTS").is_some()
        || args
            .iter()
            .any(|a| a.trim_start_matches('-').starts_with("etcd-endpoints"))
}

/// Rewrites Go `flag` syntax into clap's: `-name`, `--name`, `-name=v`,
/// `--name=v`, and `-name v` / `--name v` for flags that take a value,
/// become `--name` / `--name=v` (a separate value is joined with `=`, so a
/// value that starts with `-` stays a value, as in Go). `-h` and `-help` are
/// `--help`. Booleans never take the next argument (Go's rule), `--` and
/// everything after it, a lone `-`, and other arguments are left alone.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    use clap::CommandFactory;
    let cmd = Flags::command();
    // Flags that take a value and may be given it as the next argument
    // (Go's booleans are the `require_equals` ones).
    let separate_value = |name: &str| {
        cmd.get_arguments().any(|a| {
            a.get_long() == Some(name)
                && a.get_action().takes_values()
                && !a.is_require_equals_set()
        })
    };
    let mut out = Vec::new();
    let mut it = args.into_iter();
    out.extend(it.next());
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a);
            out.extend(it);
            break;
        }
        let body = a
            .strip_prefix("--")
            .or_else(|| a.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !b.starts_with(['-', '=']));
        let Some(body) = body else {
            out.push(a);
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        match (name, value) {
            ("h" | "help", None) => out.push("--help".into()),
            (_, Some(v)) => out.push(format!("--{name}={v}")),
            (_, None) if separate_value(name) => match it.next() {
                Some(v) => out.push(format!("--{name}={v}")),
                None => out.push(format!("--{name}")),
            },
            (_, None) => out.push(format!("--{name}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let v: Vec<String> = std::iter::once("weftd")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        Flags::try_parse_from(normalize_args(v))
    }

    #[test]
    fn defaults_match_flanneld() {
        let f = parse(&[]).expect("parse");
        assert_eq!(
            f.etcd_endpoints,
            "http://127.0.0.1:4001,http://127.0.0.1:2379"
        );
        assert_eq!(f.etcd_prefix, "/coreos.com/network");
        assert_eq!(f.subnet_file, PathBuf::from("/run/flannel/subnet.env"));
        assert_eq!(f.subnet_lease_renew_margin, 60);
        assert!(!f.ip_masq && f.iptables_forward_rules && f.set_node_network_unavailable);
        assert_eq!(f.iptables_resync, 5);
        assert_eq!(f.healthz_port, 0);
        assert_eq!(
            f.net_config_path,
            PathBuf::from("/etc/kube-flannel/net-conf.json")
        );
        assert_eq!(f.kube_annotation_prefix, "flannel.alpha.coreos.com");
    }

    #[test]
    fn single_and_double_dash_and_go_booleans() {
        let f = parse(&[
            "-ip-masq",
            "--iface=eth0",
            "-iface",
            "eth1",
            "-healthz-port=8081",
            "-iptables-forward-rules=false",
        ])
        .expect("parse");
        assert!(f.ip_masq);
        assert_eq!(f.iface, vec!["eth0", "eth1"]);
        assert_eq!(f.healthz_port, 8081);
        assert!(!f.iptables_forward_rules);
        let f = parse(&["--ip-masq=F", "-kube-subnet-mgr=1"]).expect("parse");
        assert!(!f.ip_masq && f.kube_subnet_mgr);
        assert!(parse(&["--ip-masq=maybe"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
    }

    /// klog's `-v` in each of Go's four spellings, and a value that starts
    /// with a dash stays a value.
    #[test]
    fn verbosity_in_every_go_form() {
        for args in [&["-v", "2"][..], &["-v=2"], &["--v", "2"], &["--v=2"]] {
            let f = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(f.verbosity, 2, "{args:?}");
        }
        assert_eq!(
            parse(&["-v", "10", "-ip-masq"]).expect("parse").verbosity,
            10
        );
        assert!(parse(&["-v", "x"]).is_err());
        assert!(parse(&["-v"]).is_err(), "-v needs a value");
        let f = parse(&["-etcd-prefix", "-odd", "-v", "3"]).expect("parse");
        assert_eq!((f.etcd_prefix.as_str(), f.verbosity), ("-odd", 3));
        assert!(parse(&["-healthz-port", "-1"]).is_err());
    }

    /// Every flag: one that takes a value takes it in all four forms, a
    /// boolean only as `-x` or `-x=v`, never from the next argument.
    #[test]
    fn every_flag_in_every_form() {
        use clap::CommandFactory;
        let cmd = Flags::command();
        let norm = |a: &[&str]| {
            normalize_args(
                std::iter::once("weftd")
                    .chain(a.iter().copied())
                    .map(String::from),
            )[1..]
                .to_vec()
        };
        let mut seen = (0, 0);
        for arg in cmd.get_arguments() {
            let Some(name) = arg.get_long() else { continue };
            if name == "help" {
                continue;
            }
            let (one, two) = (format!("-{name}"), format!("--{name}"));
            let joined = format!("--{name}=VAL");
            if arg.is_require_equals_set() {
                seen.1 += 1;
                for f in [&one, &two] {
                    assert_eq!(norm(&[f]), vec![two.clone()], "{f}");
                    assert_eq!(norm(&[&format!("{f}=false")]), vec![format!("{two}=false")]);
                    // The next argument is not the boolean's value.
                    assert_eq!(norm(&[f, "false"]), vec![two.clone(), "false".into()]);
                }
            } else {
                seen.0 += 1;
                for f in [&one, &two] {
                    assert_eq!(norm(&[f, "VAL"]), vec![joined.clone()], "{f} VAL");
                    assert_eq!(
                        norm(&[&format!("{f}=VAL")]),
                        vec![joined.clone()],
                        "{f}=VAL"
                    );
                }
            }
        }
        // flanneld's 7 booleans, weft's --probe-route-mtu and
        // --nat-traversal and --nat-relay; flanneld's 20 value flags and weft's own.
        assert!(seen.0 >= 30 && seen.1 == 10, "{seen:?}");
        // `--` ends the flags; a lone `-` and non-flags are left alone.
        assert_eq!(norm(&["--", "-v", "2"]), vec!["--", "-v", "2"]);
        assert_eq!(norm(&["-", "x"]), vec!["-", "x"]);
        assert_eq!(norm(&["-h"]), vec!["--help"]);
        assert_eq!(norm(&["-help"]), vec!["--help"]);
    }

    #[test]
    fn booleans_take_no_separate_value() {
        for args in [
            &["-ip-masq"][..],
            &["--ip-masq"],
            &["-ip-masq=true"],
            &["--ip-masq=1"],
        ] {
            assert!(parse(args).expect("parse").ip_masq, "{args:?}");
        }
        assert!(!parse(&["-ip-masq=false"]).expect("parse").ip_masq);
        // Go stops at `false` and ignores the rest; weftd refuses instead.
        assert!(parse(&["-ip-masq", "false"]).is_err());
        assert!(parse(&["--ip-masq", "true"]).is_err());
        let f = parse(&["-ip-blackhole-route", "-iptables-forward-rules=false"]).expect("parse");
        assert!(f.ip_blackhole_route && !f.iptables_forward_rules);
    }

    #[test]
    fn help_exits_zero_with_usage() {
        for h in ["-h", "-help", "--help"] {
            let e = parse(&[h]).expect_err("help is an early exit");
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{h}");
            assert_eq!(e.exit_code(), 0);
            assert!(
                e.to_string().contains("--anti-spoofing"),
                "the help documents it"
            );
        }
    }

    /// Flags weftd cannot honour are refused, not accepted and ignored.
    #[test]
    fn unsupported_values_are_refused() {
        let e = parse(&["-vmodule=vxlan=5"]).expect_err("refused");
        assert!(
            e.to_string().contains("does not support klog's -vmodule"),
            "{e}"
        );
        let e = parse(&["-log_backtrace_at", "main.go:10"]).expect_err("refused");
        assert!(e.to_string().contains("RUST_BACKTRACE"), "{e}");
        // Empty values (the defaults) are fine.
        let f = parse(&["-vmodule=", "--log_backtrace_at="]).expect("parse");
        assert!(f.vmodule.is_empty() && f.log_backtrace_at.is_empty());
        assert!(parse(&["--log-format=xml"]).is_err());
        assert_eq!(
            parse(&["--log-format", "json"]).expect("parse").log_format,
            "json"
        );
    }

    #[test]
    fn anti_spoofing_modes() {
        use weft_engine::AntiSpoofing;
        assert_eq!(
            parse(&[]).expect("parse").anti_spoofing.engine(),
            AntiSpoofing::Subnet
        );
        for (v, m) in [
            ("strict", AntiSpoofing::Strict),
            ("subnet", AntiSpoofing::Subnet),
            ("off", AntiSpoofing::Off),
        ] {
            assert_eq!(
                parse(&["-anti-spoofing", v])
                    .expect("parse")
                    .anti_spoofing
                    .engine(),
                m
            );
        }
        assert!(parse(&["--anti-spoofing=loose"]).is_err());
    }

    #[test]
    fn tunnel_gso_modes() {
        use crate::backend::tunnel::gso::TunnelGso;
        assert_eq!(parse(&[]).expect("parse").tunnel_gso, TunnelGso::Off);
        for (v, m) in [
            ("off", TunnelGso::Off),
            ("auto", TunnelGso::Auto),
            ("on", TunnelGso::On),
        ] {
            assert_eq!(parse(&["-tunnel-gso", v]).expect("parse").tunnel_gso, m);
            let f = parse(&[&format!("--tunnel-gso={v}")]).expect("parse");
            assert_eq!(f.tunnel_gso, m);
        }
        let e = parse(&["--tunnel-gso=yes"]).expect_err("refused");
        assert!(e.to_string().contains("not one of off, auto, on"), "{e}");
        assert!(parse(&["--tunnel-gso"]).is_err(), "needs a value");
    }

    #[test]
    fn renew_margin_range() {
        assert!(
            parse(&["-subnet-lease-renew-margin=0"])
                .expect("parse")
                .validate()
                .is_err()
        );
        assert!(
            parse(&["-subnet-lease-renew-margin=1440"])
                .expect("parse")
                .validate()
                .is_err()
        );
        assert!(
            parse(&["-subnet-lease-renew-margin=1439"])
                .expect("parse")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn flags_that_select_two_stores_are_refused() {
        let check = |a: &[&str]| {
            let args: Vec<String> = std::iter::once("weftd")
                .chain(a.iter().copied())
                .map(String::from)
                .collect();
            let f = Flags::try_parse_from(normalize_args(args.clone())).expect("parse");
            f.conflicts(&args)
        };
        for (args, want) in [
            (
                &["--store=embedded", "--etcd-endpoints=http://x"][..],
                "--store=embedded and --etcd-endpoints",
            ),
            (
                &["-store", "embedded", "-kube-subnet-mgr"],
                "--store=embedded and --kube-subnet-mgr",
            ),
            (
                &["--store=etcd", "--kube-subnet-mgr"],
                "--store=etcd and --kube-subnet-mgr",
            ),
            (
                &["--store=kube", "--etcd-endpoints", "http://x"],
                "--store=kube and --etcd-endpoints",
            ),
            (
                &["--etcd-endpoints=http://x", "--store-path=/s"],
                "--store-path applies to the embedded store",
            ),
            (
                &["--etcd-keyfile=/k"],
                "--etcd-keyfile and --etcd-certfile go together",
            ),
            (
                &["--etcd-certfile=/c"],
                "--etcd-keyfile and --etcd-certfile go together",
            ),
            (&["--etcd-password=p"], "without --etcd-username"),
        ] {
            let e = check(args).expect_err(&format!("{args:?}"));
            assert!(e.contains(want), "{args:?}: {e}");
        }
        for ok in [
            &["--store-path=/s"][..],
            &["--etcd-endpoints=http://x", "--etcd-prefix=/p"],
            // flanneld: the kube manager wins over etcd flags.
            &["--kube-subnet-mgr", "--etcd-endpoints=http://x"],
            &["--store=etcd", "--etcd-endpoints=http://x"],
        ] {
            assert_eq!(check(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn store_selection() {
        let f = parse(&[]).expect("parse");
        assert_eq!(f.store_kind(false), StoreKind::Embedded);
        assert_eq!(f.store_kind(true), StoreKind::Etcd);
        let f = parse(&["-kube-subnet-mgr"]).expect("parse");
        assert_eq!(f.store_kind(true), StoreKind::Kube);
    }
}
