//! The clusters a chaos run drives. One flannel network has one backend, so
//! the mix of backends and stores needs three clusters side by side (each
//! has its own underlay bridge and namespaces, so their addresses never meet):
//!
//! - `etcd`: a real etcd (reached from every node namespace through an
//!   [`TcpProxy`]), vxlan, 3 nodes: userspace, kernel, and a userspace node
//!   that the scheduler switches live between the dataplanes; the default
//!   iptables traffic manager with `--ip-masq` (so hand-deleted chains matter);
//! - `embedded`: the embedded store in a 4 MiB tmpfs (so the disk can be
//!   filled), WireGuard (userspace: this kernel has no WireGuard module),
//!   2 nodes;
//! - `udp`: an etcd of its own, flannel's `udp` backend (always on the
//!   userspace engine: TUN `flannel0`, one route for the network), 2 nodes,
//!   iptables with `--ip-masq`.
//!
//! Dropping a [`ChaosCluster`] stops its daemons, deletes its namespaces,
//! stops etcd and unmounts the tmpfs (field order).

use std::path::{Path, PathBuf};
use std::process::Command;

use weft_tests::cluster::{Cluster, ClusterStore, net_conf_below_64, spec};
use weft_tests::etcd::Etcd;

use weft_tests::proxy::{TcpProxy, ns_proxy};

/// Where weftd inside a node namespace finds etcd.
const ETCD_IN_NS: &str = "http://127.0.0.1:2379";
/// The etcd key prefix of the leases.
pub const SUBNETS: &str = "/coreos.com/network/subnets/";

/// A tmpfs mounted for the run, unmounted on drop.
#[derive(Debug)]
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `4m`) at `path` (created).
    pub fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).expect("tmpfs mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("spawn mount")
            .success();
        assert!(ok, "mount tmpfs at {}", path.display());
        Tmpfs {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Which store a cluster uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A real etcd.
    Etcd,
    /// The embedded store on a tmpfs.
    Embedded,
}

/// One cluster of the run. Field order is drop order.
pub struct ChaosCluster {
    /// The cluster (daemons, namespaces, pods).
    pub c: Cluster,
    /// Proxies to etcd inside the node namespaces (etcd cluster only).
    pub proxies: Vec<TcpProxy>,
    /// The etcd (etcd cluster only).
    pub etcd: Option<Etcd>,
    /// The tmpfs under the embedded store.
    pub _tmpfs: Option<Tmpfs>,
    /// Short name for logs (`etcd`, `embedded`).
    pub name: &'static str,
    /// The store kind.
    pub store: StoreKind,
    /// The backend type (`vxlan`, `wireguard`, `udp`).
    pub backend: &'static str,
    /// Whether weftd runs the iptables traffic manager (`--ip-masq`), so
    /// that flannel's chains must exist and may be deleted by hand.
    pub iptables: bool,
    /// Per node: whether it may be switched between dataplanes live.
    pub switchable: Vec<bool>,
    /// Per node: the dataplane it runs now (`userspace`, `kernel`).
    pub dataplane: Vec<&'static str>,
    /// Per node: weftd starts so far (for archived logs).
    pub starts: Vec<u32>,
    _work: tempfile::TempDir,
}

/// Every cluster of the run.
pub struct Rig {
    /// The clusters.
    pub clusters: Vec<ChaosCluster>,
}

impl Rig {
    /// Builds both clusters, one pod per node; panics (cleaning up) on failure.
    pub fn start() -> Rig {
        Rig {
            clusters: vec![
                etcd_cluster(EtcdSpec {
                    name: "etcd",
                    tag: "ce",
                    backend: "vxlan",
                    dataplanes: &["userspace", "kernel", "userspace"],
                    switchable: &[false, false, true],
                }),
                embedded_cluster(),
                etcd_cluster(EtcdSpec {
                    name: "udp",
                    tag: "cu",
                    backend: "udp",
                    dataplanes: &["userspace", "userspace"],
                    switchable: &[false, false],
                }),
            ],
        }
    }
}

/// An etcd-backed cluster: its own etcd, one node per dataplane given.
struct EtcdSpec {
    name: &'static str,
    tag: &'static str,
    backend: &'static str,
    dataplanes: &'static [&'static str],
    switchable: &'static [bool],
}

fn etcd_cluster(e: EtcdSpec) -> ChaosCluster {
    let etcd = Etcd::start();
    etcd.etcdctl_ok(&[
        "put",
        "/coreos.com/network/config",
        &net_conf_below_64(e.backend),
    ]);
    let work = tempfile::tempdir().expect("tempdir");
    let common = ["--ip-masq", "--iptables-resync=2", "--engine-workers=1"];
    let nodes = u8::try_from(e.dataplanes.len()).expect("nodes");
    let s = spec(
        e.tag,
        &net_conf_below_64(e.backend),
        nodes,
        &common,
        work.path(),
    );
    let node_args = e
        .dataplanes
        .iter()
        .map(|d| vec![format!("--dataplane={d}")])
        .collect();
    let store = ClusterStore::Etcd(ETCD_IN_NS.into());
    let mut c = Cluster::create(s, &store, node_args)
        .unwrap_or_else(|err| panic!("{} cluster: {err}", e.name));
    let proxies = c
        .nodes
        .iter()
        .map(|n| ns_proxy(&n.ns.path(), 2379, etcd.port()))
        .collect();
    c.start_all()
        .unwrap_or_else(|err| panic!("{} cluster: {err}", e.name));
    let mut cc = ChaosCluster {
        c,
        proxies,
        etcd: Some(etcd),
        _tmpfs: None,
        name: e.name,
        store: StoreKind::Etcd,
        backend: e.backend,
        iptables: true,
        switchable: e.switchable.to_vec(),
        dataplane: e.dataplanes.to_vec(),
        starts: vec![1; e.dataplanes.len()],
        _work: work,
    };
    cc.add_pods();
    cc
}

fn embedded_cluster() -> ChaosCluster {
    let work = tempfile::tempdir().expect("tempdir");
    let tmpfs = Tmpfs::mount(&work.path().join("store"), "4m");
    let common = [
        "--dataplane=userspace",
        "--engine-workers=1",
        "--traffic-manager=none",
    ];
    let s = spec(
        "cw",
        &net_conf_below_64("wireguard"),
        2,
        &common,
        work.path(),
    );
    let c = Cluster::start(s).unwrap_or_else(|e| panic!("embedded cluster: {e}"));
    let mut cc = ChaosCluster {
        c,
        proxies: Vec::new(),
        etcd: None,
        _tmpfs: Some(tmpfs),
        name: "embedded",
        store: StoreKind::Embedded,
        backend: "wireguard",
        iptables: false,
        switchable: vec![false, false],
        dataplane: vec!["userspace", "userspace"],
        starts: vec![1; 2],
        _work: work,
    };
    cc.add_pods();
    cc
}

/// A lease as the store holds it: key (`10.244.5.0-24`) and, when it parses,
/// its public IP and (vxlan) VTEP MAC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredLease {
    /// The subnet key.
    pub key: String,
    /// `PublicIP`, `None` for a value that is not a lease (garbage).
    pub public_ip: Option<String>,
    /// `BackendData.VtepMAC` (vxlan leases).
    pub vtep_mac: Option<String>,
}

impl StoredLease {
    /// Reads a lease's JSON value (`None`: not JSON, or no `PublicIP`).
    fn parse(key: String, v: Option<&serde_json::Value>) -> StoredLease {
        let s = |f: &serde_json::Value| f.as_str().map(str::to_string);
        StoredLease {
            key,
            public_ip: v.and_then(|v| s(&v["PublicIP"])),
            vtep_mac: v.and_then(|v| s(&v["BackendData"]["VtepMAC"])),
        }
    }
}

impl ChaosCluster {
    /// Whether the backend runs one route for the whole network into the
    /// userspace engine's TUN (WireGuard, udp), so that the engine's peer
    /// table, not the routes, follows the leases.
    pub fn one_route(&self) -> bool {
        self.backend != "vxlan"
    }

    /// The backend's device: `flannel.1` (vxlan, both paths), `flannel-wg`,
    /// `flannel0` (udp).
    pub fn device(&self) -> &'static str {
        match self.backend {
            "wireguard" => "flannel-wg",
            "udp" => "flannel0",
            _ => "flannel.1",
        }
    }

    fn add_pods(&mut self) {
        for i in 0..self.c.nodes.len() {
            self.c
                .add_pod(i, &format!("p{i}"))
                .unwrap_or_else(|e| panic!("{} pod on node {i}: {e}", self.name));
        }
    }

    /// The store's leases, or `None` when the store cannot be read now.
    pub fn leases(&self) -> Option<Vec<StoredLease>> {
        match self.store {
            StoreKind::Etcd => {
                let etcd = self.etcd.as_ref()?;
                let out = etcd.etcdctl(&[
                    "get",
                    "--prefix",
                    SUBNETS,
                    "--dial-timeout=1s",
                    "--command-timeout=2s",
                ]);
                if !out.status.success() {
                    return None;
                }
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                Some(
                    lines
                        .chunks(2)
                        .filter_map(|kv| {
                            let key = kv.first()?.strip_prefix(SUBNETS)?.to_string();
                            let v: Option<serde_json::Value> =
                                kv.get(1).and_then(|v| serde_json::from_str(v).ok());
                            Some(StoredLease::parse(key, v.as_ref()))
                        })
                        .collect(),
                )
            }
            StoreKind::Embedded => {
                let out = self.c.weft_leases(&["--json"]).ok()?;
                let v: serde_json::Value = serde_json::from_str(&out).ok()?;
                Some(
                    v.as_array()?
                        .iter()
                        .filter_map(|l| {
                            let key = l["key"].as_str()?.to_string();
                            Some(StoredLease::parse(key, Some(&l["value"])))
                        })
                        .collect(),
                )
            }
        }
    }

    /// Writes lease `key` = `value` (JSON; raw for etcd, parsed for the embedded store).
    pub fn put_lease(&self, key: &str, value: &str) -> Result<(), String> {
        match (&self.etcd, self.store) {
            (Some(etcd), StoreKind::Etcd) => {
                let k = format!("{SUBNETS}{key}");
                let out = etcd.etcdctl(&[
                    "put",
                    &k,
                    value,
                    "--dial-timeout=1s",
                    "--command-timeout=2s",
                ]);
                out.status
                    .success()
                    .then_some(())
                    .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
            }
            _ => self
                .c
                .weft_leases(&["put", key, value, "--ttl=0"])
                .map(|_| ()),
        }
    }

    /// Deletes lease `key`.
    pub fn rm_lease(&self, key: &str) -> Result<(), String> {
        match (&self.etcd, self.store) {
            (Some(etcd), StoreKind::Etcd) => {
                let k = format!("{SUBNETS}{key}");
                let out = etcd.etcdctl(&["del", &k, "--dial-timeout=1s", "--command-timeout=2s"]);
                out.status
                    .success()
                    .then_some(())
                    .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
            }
            _ => self.c.weft_leases(&["rm", key]).map(|_| ()),
        }
    }

    /// Node `i`'s subnet (`10.244.5.0/24`) from its subnet.env, if written.
    pub fn subnet(&self, i: usize) -> Option<String> {
        let env = self.c.subnet_env(i)?;
        let s = env
            .lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?;
        let (ip, len) = s.split_once('/')?;
        let base = ip.rsplit_once('.')?.0;
        Some(format!("{base}.0/{len}"))
    }

    /// Node `i`'s weftd pid, if one runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.c.nodes[i].weftd.as_ref().map(std::process::Child::id)
    }

    /// Node `i`'s subnet.env path.
    pub fn subnet_file(&self, i: usize) -> PathBuf {
        self.c.nodes[i].dir.join("subnet.env")
    }

    /// Keeps node `i`'s current log (a restart truncates `weftd.log`) and
    /// starts its weftd again.
    pub fn restart(&mut self, i: usize) {
        self.archive_log(i);
        self.starts[i] += 1;
        if let Err(e) = self.c.start_weftd(i) {
            panic!("{} node {i}: restart: {e}", self.name);
        }
    }

    /// Copies node `i`'s log to `weftd.<start>.log` next to it.
    pub fn archive_log(&self, i: usize) {
        let dir = &self.c.nodes[i].dir;
        let _ = std::fs::copy(
            dir.join("weftd.log"),
            dir.join(format!("weftd.{}.log", self.starts[i])),
        );
    }

    /// Every log node `i` has written (archived starts, then the current one).
    pub fn all_logs(&self, i: usize) -> String {
        let dir = &self.c.nodes[i].dir;
        let mut s = String::new();
        for n in 1..self.starts[i] {
            s += &std::fs::read_to_string(dir.join(format!("weftd.{n}.log"))).unwrap_or_default();
        }
        s + &self.c.log(i)
    }
}
