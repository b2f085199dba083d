//! flanneld's command line (flannel-compat spec §9.1), plus weft's own flags.
//!
//! Go's `flag` package accepts `-name` as well as `--name`, `-name=value` and
//! `-name value`, and booleans only as `-name` or `-name=false`. Every flag not
//! given on the command line may come from `FLANNELD_<NAME>` (upper case, `-`
//! and `.` as `_`). [`Flags::parse_from_env_and_args`] reproduces all of that.

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
    /// Password for BasicAuth to etcd.
    #[arg(long, env = "FLANNELD_ETCD_PASSWORD", default_value = "")]
    pub etcd_password: String,
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
    /// klog verbosity (accepted for compatibility; mapped to log levels).
    #[arg(long = "v", env = "FLANNELD_V", default_value_t = 0)]
    pub verbosity: u32,
    /// klog option, accepted and ignored.
    #[arg(long = "vmodule", env = "FLANNELD_VMODULE", default_value = "")]
    pub vmodule: String,
    /// klog option, accepted and ignored.
    #[arg(
        long = "log_backtrace_at",
        env = "FLANNELD_LOG_BACKTRACE_AT",
        default_value = ""
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
    #[arg(long, env = "WEFT_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
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

/// Whether any etcd endpoint was given on the command line or in the environment.
pub fn etcd_explicit(args: &[String]) -> bool {
    std::env::var_os("FLANNELD_ETCD_ENDPOINTS").is_some()
        || args
            .iter()
            .any(|a| a.trim_start_matches('-').starts_with("etcd-endpoints"))
}

/// Rewrites Go-style `-name[=v]` into `--name[=v]`; leaves `--`, `-` and values alone.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest_is_positional = false;
    for (i, a) in args.into_iter().enumerate() {
        if i == 0 || rest_is_positional {
            out.push(a);
            continue;
        }
        if a == "--" {
            rest_is_positional = true;
            out.push(a);
        } else if a.len() > 2 && a.starts_with('-') && !a.starts_with("--") {
            out.push(format!("-{a}"));
        } else {
            out.push(a);
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
    fn store_selection() {
        let f = parse(&[]).expect("parse");
        assert_eq!(f.store_kind(false), StoreKind::Embedded);
        assert_eq!(f.store_kind(true), StoreKind::Etcd);
        let f = parse(&["-kube-subnet-mgr"]).expect("parse");
        assert_eq!(f.store_kind(true), StoreKind::Kube);
    }
}
