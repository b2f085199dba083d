//! Throwaway Linux guests as cluster nodes, for the kernel datapaths this
//! machine's kernel lacks (ipip, WireGuard, ESP/XFRM, dummy): a [`Lab`] boots
//! N guests on Debian's stock kernel (`scripts/tools/setup-vm.sh` fetches it,
//! with qemu and busybox, into `${WEFT_TOOLS:-~/.cache/weft-tools}/vm`) whose
//! root is this machine's root filesystem, read-only, under a tmpfs overlay:
//! the guests run the workspace's own `target/` binaries, etcd, iproute2,
//! `wg`, charon and the CNI plugins unchanged. The CPU is QEMU's software
//! CPU (TCG: ~4 s to boot, slow): use guests for correctness, never speed.
//!
//! ```text
//!  test thread ──files──▶ <lab>/n1/q/<id>.sh ──9p──▶ agent (bash, guest n1)
//!              ◀─files─── <lab>/n1/o/<id>.{out,err,rc} ◀─┘    runs it as root
//!  qemu n1 ─┐
//!  qemu n2 ─┼─ -netdev dgram (unix datagram sockets) ─▶ hub thread (learning switch)
//!  qemu n3 ─┘     one L2 segment: eth0 = 192.0.2.<i>/24 (+ fd00::<i>/64)
//! ```
//!
//! - **Underlay**: one Ethernet segment. Every guest's `eth0` is a QEMU
//!   `-netdev dgram` endpoint on a unix datagram socket in the lab's run
//!   dir; a host thread ([`Lab`]'s hub) learns source MACs and forwards or
//!   floods frames between them. Nothing touches the host's network: no taps,
//!   no bridges, no multicast, no IP sockets. Node `i` (0-based) is
//!   `192.0.2.<i+1>/24` with a default route via `192.0.2.254 onlink` (so
//!   weftd finds `eth0` as on a real node), with [`LabSpec::ipv6`] also
//!   `fd00::<i+1>/64` and a default route via `fd00::fe`. IP forwarding is
//!   on, as on any Kubernetes node.
//! - **Agent**: the guest's PID 1 runs a bash loop that polls `<run>/q/` for
//!   command files (bash builtins only, every 20 ms) and runs each in the
//!   background, writing stdout, stderr and the exit status next to it. So
//!   [`Node::sh`] is one shell script in, one [`Output`] out, and many can
//!   run at once; [`Node::spawn`] starts a long-running process
//!   ([`Daemon`]: log, pid, stop). The run dir is the same path on both
//!   sides (shared over 9p), so files a guest writes there (command output,
//!   daemon logs) are plain host files. Everything else of a guest (`/run`,
//!   `/tmp`, `/var`, `/etc`: its own tmpfs overlay) is its own, so flannel's
//!   default paths (`/run/flannel/subnet.env`, `/run/flannel/wgkey`,
//!   `/var/run/charon.vici`) work per node.
//! - **Lifetime**: [`Lab::start`] returns once every guest's agent answers.
//!   Dropping the lab (also while a test panics) kills every qemu (each also
//!   gets `SIGKILL` if the test thread dies: `PR_SET_PDEATHSIG`), stops the
//!   hub and removes the run dirs; while panicking it first prints every
//!   node's console tail and every daemon's log, so a failure shows them.
//!   Only one lab runs at a time on the machine (a `flock` on
//!   `<kit>/labs.lock`): TCG guests that share two cores with another lab
//!   time out instead of failing usefully.
//!
//! Typical use (tests/vm_*.rs build on [`net`], which does this and more):
//!
//! ```no_run
//! let kit = weft_tests::require_vm!();
//! let lab = weft_tests::vm::Lab::start(&kit, &weft_tests::vm::LabSpec::new("wg", 3));
//! let etcd = lab.start_etcd(0, r#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}"#);
//! let weftds: Vec<_> = lab.nodes().iter()
//!     .map(|n| n.start_weftd(&[&etcd.flag(), "--iface=eth0"]))
//!     .collect();
//! for (n, d) in lab.nodes().iter().zip(&weftds) { n.wait_subnet_env(d, std::time::Duration::from_secs(60)); }
//! let a = lab.node(0).add_pod("a");
//! let b = lab.node(1).add_pod("b");
//! a.must_reach(&b.ip(false));
//! println!("{}", lab.node(0).ok("ip -d link show flannel.ipip"));
//! ```

pub mod net;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default timeout of [`Node::sh`].
pub const SH_TIMEOUT: Duration = Duration::from_secs(120);
/// Where the standard CNI plugins live on Debian.
pub const CNI_PLUGIN_DIR: &str = "/usr/lib/cni";
/// Where weftd writes subnet.env in a guest (flannel's default).
pub const SUBNET_ENV: &str = "/run/flannel/subnet.env";
/// etcd's client port in the guest running it.
pub const ETCD_PORT: u16 = 2379;

/// The unpacked guest kit (kernel, initramfs, qemu) made by
/// `scripts/tools/setup-vm.sh`.
#[derive(Debug, Clone)]
pub struct Kit {
    home: PathBuf,
    qemu: PathBuf,
    kvm: bool,
}

impl Kit {
    /// The kit's directory: `$WEFT_VM_HOME`, else `$WEFT_TOOLS/vm`, else
    /// `$HOME/.cache/weft-tools/vm` (setup-vm.sh's output).
    pub fn home() -> PathBuf {
        if let Some(h) = std::env::var_os("WEFT_VM_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(h);
        }
        let tools = std::env::var_os("WEFT_TOOLS")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                    .join(".cache/weft-tools")
            });
        tools.join("vm")
    }

    /// The kit at [`Kit::home`], or what is missing.
    pub fn find() -> Result<Kit, String> {
        let home = Kit::home();
        let missing = |what: &str| {
            format!(
                "the VM kit is missing {what} in {}: run scripts/tools/setup-vm.sh (downloads ~760 MB from Debian once)",
                home.display()
            )
        };
        for f in [".setup-done", "kernel/vmlinux", "initramfs.gz"] {
            if !home.join(f).exists() {
                return Err(missing(f));
            }
        }
        let qemu = [home.join("qemu/usr/bin/qemu-system-x86_64")]
            .into_iter()
            .chain(Some(PathBuf::from("/usr/bin/qemu-system-x86_64")))
            .find(|p| p.exists())
            .ok_or_else(|| missing("qemu-system-x86_64"))?;
        // /dev/kvm here is often nested paravirtual KVM (PVM), under which a
        // stock kernel does not get through early boot: TCG then.
        let kvm = std::env::var("WEFT_VM_ACCEL").map_or_else(
            |_| {
                let rw = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm")
                    .is_ok();
                rw && !Path::new("/sys/module/kvm_pvm").exists()
            },
            |a| a == "kvm",
        );
        Ok(Kit { home, qemu, kvm })
    }

    /// The kernel version the guests run.
    pub fn kernel_version(&self) -> String {
        std::fs::read_to_string(self.home.join(".setup-done"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The kit's static busybox (in the guests too): `nc`, `httpd`, `wget`
    /// for tests, where the machine has no netcat.
    pub fn busybox(&self) -> PathBuf {
        self.home.join("bb/bin/busybox")
    }

    /// Whether guests run under KVM (else TCG).
    pub fn kvm(&self) -> bool {
        self.kvm
    }
}

/// The guard: `Some(kit)` when running as root with the VM kit and the
/// workspace binaries in place; otherwise skips the test (`None`, logged) or,
/// under `CI=true`, fails it (see `weft_testenv`).
#[track_caller]
pub fn require() -> Option<Kit> {
    if !weft_testenv::require_root() {
        return None;
    }
    let kit = match Kit::find() {
        Ok(k) => k,
        Err(e) => {
            let _ = weft_testenv::require(false, &e);
            return None;
        }
    };
    let bins = crate::bins::dir();
    let missing: Vec<&str> = ["weftd", "weft", "flannel"]
        .into_iter()
        .filter(|b| !bins.join(b).exists())
        .collect();
    if !weft_testenv::require(
        missing.is_empty(),
        &format!(
            "{missing:?} not built in {}: run `cargo build --workspace --bins` first",
            bins.display()
        ),
    ) {
        return None;
    }
    Some(kit)
}

/// Returns from the calling test unless [`vm::require`](require) finds the
/// kit; evaluates to the [`Kit`].
#[macro_export]
macro_rules! require_vm {
    () => {
        match $crate::vm::require() {
            Some(kit) => kit,
            None => return,
        }
    };
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct LabSpec {
    /// A short tag for names (hostnames `<lab>-n<i>`, run dirs).
    pub tag: String,
    /// Number of guests (at most 250).
    pub nodes: usize,
    /// Memory per guest in MiB (the overlay's tmpfs gets half).
    pub mem_mb: u32,
    /// Also give every node `fd00::<i>/64` and an IPv6 default route.
    pub ipv6: bool,
    /// How long all guests may take to answer (TCG boot is ~4-7 s).
    pub boot_timeout: Duration,
}

impl LabSpec {
    /// `nodes` guests, 1 GiB each, IPv4 only.
    pub fn new(tag: &str, nodes: usize) -> LabSpec {
        LabSpec {
            tag: tag.to_string(),
            nodes,
            mem_mb: 1024,
            ipv6: false,
            boot_timeout: Duration::from_secs(180),
        }
    }

    /// The same with IPv6 on the underlay.
    pub fn with_ipv6(mut self) -> LabSpec {
        self.ipv6 = true;
        self
    }
}

/// The result of one guest command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit status (128 + n for a signal, as bash reports it).
    pub rc: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Output {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.rc == 0
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rc={}\n--- stdout\n{}--- stderr\n{}",
            self.rc, self.stdout, self.stderr
        )
    }
}

/// `s` as one single-quoted shell word.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[derive(Debug)]
struct Guest {
    name: String,
    index: usize,
    addr: Ipv4Addr,
    addr6: Option<Ipv6Addr>,
    run: PathBuf,
    qemu: Mutex<Option<Child>>,
    seq: AtomicU64,
    daemons: Mutex<Vec<(String, u64)>>,
}

/// One guest (a cheap handle; the [`Lab`] owns the guest's lifetime).
#[derive(Debug, Clone)]
pub struct Node(Arc<Guest>);

/// A long-running process in a guest, started by [`Node::spawn`]. It runs
/// until [`Daemon::stop`] or the end of the lab.
#[derive(Debug, Clone)]
pub struct Daemon {
    node: Node,
    name: String,
    id: u64,
}

/// A pod: a network namespace in a guest, attached by weft's CNI plugin
/// (`flannel`, delegating to bridge + host-local) as a kubelet would.
#[derive(Debug, Clone)]
pub struct Pod {
    /// The node it runs on.
    pub node: Node,
    /// Its namespace (`ip netns exec NS`).
    pub ns: String,
    /// Its IPv4 address (none in an IPv6-only network).
    pub ip4: Option<Ipv4Addr>,
    /// Its IPv6 address, in a dual-stack or IPv6-only network.
    pub ip6: Option<Ipv6Addr>,
}

/// etcd in a guest ([`Lab::start_etcd`]).
#[derive(Debug, Clone)]
pub struct Etcd {
    /// The daemon.
    pub daemon: Daemon,
    /// Its client URL on the underlay, e.g. `http://192.0.2.1:2379`.
    pub endpoint: String,
}

impl Etcd {
    /// `--etcd-endpoints=<endpoint>` for weftd.
    pub fn flag(&self) -> String {
        format!("--etcd-endpoints={}", self.endpoint)
    }
}

impl Node {
    /// The hostname, `<lab>-n<i+1>`.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// 0-based index in the lab.
    pub fn index(&self) -> usize {
        self.0.index
    }

    /// Its underlay address, `192.0.2.<index+1>`.
    pub fn addr(&self) -> Ipv4Addr {
        self.0.addr
    }

    /// Its IPv6 underlay address, `fd00::<index+1>`, with [`LabSpec::ipv6`].
    pub fn addr6(&self) -> Option<Ipv6Addr> {
        self.0.addr6
    }

    /// The run dir: the same path on the host and in the guest (writable in
    /// both, shared over 9p).
    pub fn run_dir(&self) -> &Path {
        &self.0.run
    }

    /// The guest kernel's console so far.
    pub fn console(&self) -> String {
        read_lossy(&self.0.run.join("console.log"))
    }

    fn submit(&self, script: &str) -> u64 {
        let id = self.0.seq.fetch_add(1, Ordering::Relaxed);
        self.submit_as(id, script);
        id
    }

    fn submit_as(&self, id: u64, script: &str) {
        let q = self.0.run.join("q");
        let tmp = q.join(format!("{id}.tmp"));
        std::fs::write(&tmp, script).expect("write command file");
        std::fs::rename(&tmp, q.join(format!("{id}.sh"))).expect("publish command file");
    }

    fn out_path(&self, id: u64, ext: &str) -> PathBuf {
        self.0.run.join("o").join(format!("{id}.{ext}"))
    }

    fn rc_of(&self, id: u64) -> Option<i32> {
        let s = std::fs::read_to_string(self.out_path(id, "rc")).ok()?;
        s.ends_with('\n').then(|| s.trim().parse().ok()).flatten()
    }

    fn alive(&self) -> bool {
        let mut q = self.0.qemu.lock().unwrap_or_else(|e| e.into_inner());
        q.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Runs `script` with bash in the guest as root (cwd `/`, stdin
    /// `/dev/null`) and waits up to `timeout`; `None` on timeout.
    pub fn try_sh(&self, script: &str, timeout: Duration) -> Option<Output> {
        let id = self.submit(script);
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_millis(2);
        loop {
            if let Some(rc) = self.rc_of(id) {
                let _ = std::fs::remove_file(self.0.run.join("q").join(format!("{id}.sh")));
                let out = Output {
                    rc,
                    stdout: read_lossy(&self.out_path(id, "out")),
                    stderr: read_lossy(&self.out_path(id, "err")),
                };
                for e in ["out", "err", "rc"] {
                    let _ = std::fs::remove_file(self.out_path(id, e));
                }
                return Some(out);
            }
            if Instant::now() > deadline {
                return None;
            }
            assert!(
                self.alive(),
                "guest {} died; console tail:\n{}",
                self.name(),
                tail(&self.console(), 30)
            );
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    /// [`Node::try_sh`] with `timeout`; panics on timeout.
    pub fn sh_timeout(&self, script: &str, timeout: Duration) -> Output {
        self.try_sh(script, timeout).unwrap_or_else(|| {
            panic!(
                "{}: `{script}` did not finish within {timeout:?}",
                self.name()
            )
        })
    }

    /// Runs `script` (see [`Node::try_sh`]); panics after [`SH_TIMEOUT`].
    pub fn sh(&self, script: &str) -> Output {
        self.sh_timeout(script, SH_TIMEOUT)
    }

    /// Runs `script` and returns its stdout; panics unless it exits 0.
    #[track_caller]
    pub fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.success(), "{}: `{script}` failed: {out}", self.name());
        out.stdout
    }

    /// Runs `script` every 100 ms until `accept` takes its output (returned),
    /// or panics after `timeout` with the last output.
    #[track_caller]
    pub fn wait_sh(
        &self,
        what: &str,
        timeout: Duration,
        script: &str,
        accept: impl Fn(&Output) -> bool,
    ) -> Output {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.sh(script);
            if accept(&out) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "{}: timed out after {timeout:?} waiting for {what}; last `{script}`: {out}",
                self.name()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A kernel-only baseline of this run's emulation speed: how long this
    /// guest's kernel takes to make a device of `kind` (`vxlan`, `ipip`,
    /// `wireguard`, ...) with an address and a route and delete it again,
    /// by hand with `ip` in a scratch namespace, timed inside the guest
    /// (median of 5). weftd does the same kind of work when it builds or
    /// restores a path, so tests bound what weftd takes in guests by a fixed
    /// multiple of this, measured in the same run, never by weftd's own
    /// report: the software CPU's speed varies 2× between sessions.
    pub fn kernel_build_time(&self, kind: &str) -> Duration {
        // A new namespace with the ipip module has its fallback device
        // (tunl0: any to any), so an ipip link needs its own local address.
        let add = match kind {
            "vxlan" => "ip -n w30b link add b0 type vxlan id 9 dstport 0".to_string(),
            "ipip" => "ip -n w30b link add b0 type ipip local 10.99.0.1".to_string(),
            kind => format!("ip -n w30b link add b0 type {kind}"),
        };
        let out = self.ok(&format!(
            "ip netns del w30b 2>/dev/null; ip netns add w30b; for i in 1 2 3 4 5; do t0=$(date +%s%N); {add} && \
             ip -n w30b addr add 10.99.0.1/32 dev b0 && ip -n w30b link set b0 up && \
             ip -n w30b route add 10.98.0.0/24 dev b0 && ip -n w30b link del b0 || exit 1; \
             echo $(( ($(date +%s%N) - t0) / 1000 )); done; ip netns del w30b"
        ));
        let mut us: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        us.sort_unstable();
        assert_eq!(us.len(), 5, "{}: kernel baseline: {out}", self.name());
        Duration::from_micros(us[2])
    }

    /// Starts `script` in the background as daemon `name` (log = its stdout
    /// and stderr). Use `exec` for the last command so that
    /// [`Daemon::stop`]'s signal reaches the program itself.
    pub fn spawn(&self, name: &str, script: &str) -> Daemon {
        let id = self.0.seq.fetch_add(1, Ordering::Relaxed);
        let pidf = self.out_path(id, "pid");
        // The agent's EXIT trap writes the status when the program ends;
        // `exec` would replace the subshell and lose it, so the program runs
        // as a child and its pid is published.
        let body = format!(
            "( {script}\n) &\necho $! > {pid}.tmp && mv {pid}.tmp {pid}\nwait $!\n",
            pid = quote(&pidf.to_string_lossy())
        );
        self.submit_as(id, &body);
        self.0
            .daemons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), id));
        let d = Daemon {
            node: self.clone(),
            name: name.to_string(),
            id,
        };
        crate::proc::wait_for(
            &format!("{name} to start on {}", self.name()),
            Duration::from_secs(60),
            || (d.pid().is_some() || d.exit_code().is_some()).then_some(()),
        );
        d
    }

    /// Starts weftd with `args` (logs: the daemon's log). It writes
    /// flannel's default `/run/flannel/subnet.env` ([`SUBNET_ENV`]) in the
    /// guest: unix sockets (IPAM, status) cannot live on the 9p run dir.
    pub fn start_weftd(&self, args: &[&str]) -> Daemon {
        let bin = crate::bins::path("weftd");
        // The dataplane switch at debug level: a switch that retries its
        // setup (a stall the tests' bounds fail) then says why in the log a
        // failing test prints.
        let mut cmd = format!(
            "RUST_LOG=info,weft_control::backend::dual=debug exec {}",
            quote(&bin.to_string_lossy())
        );
        for a in args {
            cmd.push(' ');
            cmd.push_str(&quote(a));
        }
        self.spawn("weftd", &cmd)
    }

    /// The node's subnet.env ([`SUBNET_ENV`]), parsed, once written.
    pub fn subnet_env(&self) -> Option<BTreeMap<String, String>> {
        let out = self.sh(&format!("cat {SUBNET_ENV} 2>/dev/null"));
        let env: BTreeMap<String, String> = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (!env.is_empty()).then_some(env)
    }

    /// Waits until `weftd` wrote subnet.env (panics with its log if it exits first).
    pub fn wait_subnet_env(&self, weftd: &Daemon, timeout: Duration) -> BTreeMap<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(env) = self.subnet_env() {
                return env;
            }
            assert!(
                weftd.running(),
                "{}: weftd exited ({:?}) before writing subnet.env; log:\n{}",
                self.name(),
                weftd.exit_code(),
                weftd.log()
            );
            assert!(
                Instant::now() < deadline,
                "{}: no subnet.env after {timeout:?}; weftd log:\n{}",
                self.name(),
                weftd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// This node's pod subnet from subnet.env (`FLANNEL_SUBNET`, as a
    /// network, e.g. `10.244.3.0/24`).
    pub fn pod_subnet(&self) -> String {
        let env = self.subnet_env().expect("subnet.env not written yet");
        let s = env.get("FLANNEL_SUBNET").expect("FLANNEL_SUBNET");
        let (ip, len) = s.split_once('/').expect("FLANNEL_SUBNET is a CIDR");
        let ip: Ipv4Addr = ip.parse().expect("FLANNEL_SUBNET address");
        let len: u32 = len.parse().expect("FLANNEL_SUBNET length");
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        format!("{}/{len}", Ipv4Addr::from(u32::from(ip) & mask))
    }

    /// The flannel CNI config for this node's pods.
    pub fn cni_conf(&self) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cbr0",
            "type": "flannel",
            "subnetFile": SUBNET_ENV,
            "delegate": { "hairpinMode": true, "isDefaultGateway": true }
        })
        .to_string()
    }

    /// Creates pod `name` (namespace `<node>-<name>`) through weft's CNI
    /// plugin (`CNI_COMMAND=ADD`); needs subnet.env.
    pub fn add_pod(&self, name: &str) -> Pod {
        let ns = format!("{}-{name}", self.name());
        let bins = crate::bins::dir();
        let script = format!(
            "set -e\nip netns add {ns}\nip -n {ns} link set lo up\nprintf '%s' {conf} | CNI_COMMAND=ADD CNI_CONTAINERID={ns} CNI_NETNS=/run/netns/{ns} CNI_IFNAME=eth0 CNI_PATH={path} {plugin}\n",
            conf = quote(&self.cni_conf()),
            path = quote(&format!("{}:{CNI_PLUGIN_DIR}", bins.display())),
            plugin = quote(&bins.join("flannel").to_string_lossy()),
        );
        let out = self.sh(&script);
        assert!(out.success(), "{}: CNI ADD {ns}: {out}", self.name());
        let v: serde_json::Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("CNI ADD {ns} returned no JSON ({e}): {out}"));
        let mut ip = None;
        let mut ip6 = None;
        for a in v["ips"].as_array().into_iter().flatten() {
            let addr = a["address"].as_str().and_then(|s| s.split('/').next());
            match addr.and_then(|s| s.parse::<std::net::IpAddr>().ok()) {
                Some(std::net::IpAddr::V4(x)) => ip = ip.or(Some(x)),
                Some(std::net::IpAddr::V6(x)) => ip6 = ip6.or(Some(x)),
                None => {}
            }
        }
        assert!(
            ip.is_some() || ip6.is_some(),
            "CNI ADD {ns}: no address: {out}"
        );
        Pod {
            node: self.clone(),
            ns,
            ip4: ip,
            ip6,
        }
    }
}

impl Daemon {
    /// The name given to [`Node::spawn`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Its stdout and stderr so far.
    pub fn log(&self) -> String {
        let mut s = read_lossy(&self.node.out_path(self.id, "out"));
        s.push_str(&read_lossy(&self.node.out_path(self.id, "err")));
        s
    }

    /// The guest pid of the program (the last command of its script).
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.node.out_path(self.id, "pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Its exit status once it ended.
    pub fn exit_code(&self) -> Option<i32> {
        self.node.rc_of(self.id)
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.exit_code().is_none()
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) and waits up to `timeout` for
    /// the exit status; `None` if it still runs then.
    pub fn stop(&self, signal: i32, timeout: Duration) -> Option<i32> {
        if let Some(pid) = self.pid() {
            self.node
                .sh(&format!("kill -{signal} {pid} 2>/dev/null; true"));
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(rc) = self.exit_code() {
                return Some(rc);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Waits until the log contains `needle`; panics with the log after
    /// `timeout` or when the daemon exits first.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return;
            }
            assert!(
                self.running() && Instant::now() < deadline,
                "{} on {}: {needle:?} not in its log (exit {:?}); log:\n{log}",
                self.name,
                self.node.name(),
                self.exit_code()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Pod {
    /// The pod's address of the family of `v6`; panics if it has none.
    pub fn ip(&self, v6: bool) -> String {
        if v6 {
            self.ip6
                .unwrap_or_else(|| panic!("pod {} has no IPv6 address", self.ns))
                .to_string()
        } else {
            self.ip4
                .unwrap_or_else(|| panic!("pod {} has no IPv4 address", self.ns))
                .to_string()
        }
    }

    /// Asserts that `dst` answers a ping within 30 s; returns how long it took.
    #[track_caller]
    pub fn must_reach(&self, dst: &str) -> Duration {
        let t = Instant::now();
        assert!(
            self.ping_within(dst, Duration::from_secs(30)),
            "pod {} cannot reach {dst} within 30 s",
            self.ns
        );
        t.elapsed()
    }

    /// Runs `script` inside the pod's namespace (see [`Node::sh`]).
    pub fn sh(&self, script: &str) -> Output {
        self.node.sh(&format!(
            "ip netns exec {} bash -c {}",
            self.ns,
            quote(script)
        ))
    }

    /// [`Pod::sh`], panicking unless it exits 0; returns stdout.
    #[track_caller]
    pub fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.success(), "pod {}: `{script}` failed: {out}", self.ns);
        out.stdout
    }

    /// Pings `dst` (v4 or v6) once a second (waiting 1 s per reply) until
    /// one reply or `timeout`, inside the guest; whether one came.
    pub fn ping_within(&self, dst: &str, timeout: Duration) -> bool {
        let n = timeout.as_secs().max(1);
        self.sh(&format!(
            "for i in $(seq {n}); do ping -c1 -W1 -n {dst} >/dev/null && exit 0; done; exit 1"
        ))
        .success()
    }
}

/// The running guests. See the module docs.
#[derive(Debug)]
pub struct Lab {
    name: String,
    nodes: Vec<Node>,
    hub: Option<Hub>,
    dir: PathBuf,
    boot: Duration,
    lock_wait: Duration,
    _slot: File,
}

impl Lab {
    /// Boots `spec.nodes` guests on one segment and waits for their agents.
    /// Blocks first while another lab runs on this machine.
    pub fn start(kit: &Kit, spec: &LabSpec) -> Lab {
        assert!((1..=250).contains(&spec.nodes), "1..=250 nodes");
        std::fs::create_dir_all(kit.home.join("run")).expect("create run dir");
        let slot = File::create(kit.home.join("labs.lock")).expect("labs.lock");
        let waited = Instant::now();
        slot.lock().expect("lock labs.lock");
        let lock_wait = waited.elapsed();
        if lock_wait > Duration::from_secs(1) {
            println!(
                "vm lab {}: waited {:?} for another lab to finish",
                spec.tag,
                waited.elapsed()
            );
        }
        let name = crate::unique(&spec.tag);
        let dir = kit.home.join("run").join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create lab dir");
        let hub_path = dir.join("hub.sock");
        let ports: Vec<PathBuf> = (1..=spec.nodes)
            .map(|i| dir.join(format!("n{i}.sock")))
            .collect();
        let hub = Hub::start(&hub_path, ports.clone());
        let needed = needed_dirs(kit);
        let hide = hidden_mounts(&needed);
        let shares = shared_dirs(&needed);
        let share_list: String = shares
            .iter()
            .map(|d| format!("{}\n", d.display()))
            .collect();
        let t0 = Instant::now();
        let mut lab = Lab {
            name: name.clone(),
            nodes: Vec::new(),
            hub: Some(hub),
            dir: dir.clone(),
            boot: Duration::ZERO,
            lock_wait,
            _slot: slot,
        };
        // Spawned from this thread: PR_SET_PDEATHSIG follows the spawning thread.
        for (i, port) in ports.iter().enumerate() {
            let host = format!("{name}-n{}", i + 1);
            let run = dir.join(format!("n{}", i + 1));
            for d in ["q", "o"] {
                std::fs::create_dir_all(run.join(d)).expect("create run dir");
            }
            let addr = Ipv4Addr::new(192, 0, 2, u8::try_from(i + 1).expect("index"));
            let addr6 = spec.ipv6.then(|| {
                Ipv6Addr::new(
                    0xfd00,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    u16::try_from(i + 1).expect("index"),
                )
            });
            std::fs::write(run.join("hide"), &hide).expect("write hide");
            std::fs::write(run.join("shares"), &share_list).expect("write shares");
            std::fs::write(run.join("stage2.sh"), stage2(&host, &run, addr, addr6))
                .expect("write stage2");
            std::fs::write(run.join("agent.sh"), AGENT).expect("write agent");
            let child = qemu_command(kit, spec, &run, port, &hub_path, i, &shares)
                .spawn()
                .unwrap_or_else(|e| panic!("start qemu {}: {e}", kit.qemu.display()));
            lab.nodes.push(Node(Arc::new(Guest {
                name: host,
                index: i,
                addr,
                addr6,
                run,
                qemu: Mutex::new(Some(child)),
                seq: AtomicU64::new(0),
                daemons: Mutex::new(Vec::new()),
            })));
        }
        let deadline = t0 + spec.boot_timeout;
        for n in &lab.nodes {
            loop {
                if n.run_dir().join("ready").exists() {
                    break;
                }
                if !n.alive() || Instant::now() > deadline {
                    let err = read_lossy(&n.run_dir().join("qemu.err"));
                    panic!(
                        "guest {} did not boot (qemu {}) within {:?}; qemu stderr:\n{err}\nconsole tail:\n{}",
                        n.name(),
                        if n.alive() { "running" } else { "exited" },
                        spec.boot_timeout,
                        tail(&n.console(), 40)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        lab.boot = t0.elapsed();
        println!(
            "vm lab {name}: {} guest(s) ({}, kernel {}) answering after {:?}",
            spec.nodes,
            if kit.kvm { "kvm" } else { "tcg" },
            kit.kernel_version(),
            lab.boot
        );
        lab
    }

    /// The lab's unique name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long the guests took to answer.
    pub fn boot_time(&self) -> Duration {
        self.boot
    }

    /// How long [`Lab::start`] waited for another lab on this machine.
    pub fn lock_wait(&self) -> Duration {
        self.lock_wait
    }

    /// The guests, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Guest `i` (0-based; address `192.0.2.<i+1>`).
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Starts a single-member etcd in guest `i` on its underlay address
    /// (the guests cannot reach the host's loopback), waits until it is
    /// healthy and puts `net_conf` at flannel's `/coreos.com/network/config`.
    pub fn start_etcd(&self, i: usize, net_conf: &str) -> Etcd {
        let n = self.node(i);
        let ip = n.addr();
        let url = format!("http://{ip}:{ETCD_PORT}");
        let d = n.spawn(
            "etcd",
            &format!(
                "exec etcd --name {name} --data-dir /tmp/etcd --listen-client-urls {url},http://127.0.0.1:{ETCD_PORT} \
                 --advertise-client-urls {url} --listen-peer-urls http://127.0.0.1:2380 \
                 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster {name}=http://127.0.0.1:2380",
                name = n.name()
            ),
        );
        let put = format!(
            "for i in $(seq 300); do etcdctl --endpoints={url} --dial-timeout=1s put /coreos.com/network/config {} && exit 0; sleep 0.2; done; exit 1",
            quote(net_conf)
        );
        let out = n.sh(&put);
        assert!(
            out.success(),
            "etcd on {} did not take the network config: {out}\netcd log:\n{}",
            n.name(),
            d.log()
        );
        Etcd {
            daemon: d,
            endpoint: url,
        }
    }

    fn dump(&self) {
        for n in &self.nodes {
            eprintln!(
                "==== {} ({}) console tail:\n{}",
                n.name(),
                n.addr(),
                tail(&n.console(), 25)
            );
            let agent = read_lossy(&n.run_dir().join("agent.log"));
            if !agent.trim().is_empty() {
                eprintln!("==== {} agent log:\n{}", n.name(), tail(&agent, 20));
            }
            let daemons =
                n.0.daemons
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
            for (name, id) in daemons {
                let d = Daemon {
                    node: n.clone(),
                    name: name.clone(),
                    id,
                };
                eprintln!(
                    "==== {} {name} (exit {:?}) log:\n{}",
                    n.name(),
                    d.exit_code(),
                    tail(&d.log(), 150)
                );
            }
        }
        if let Some(h) = &self.hub {
            eprintln!(
                "==== hub: {} frames forwarded, {} flooded",
                h.stats.forwarded.load(Ordering::Relaxed),
                h.stats.flooded.load(Ordering::Relaxed)
            );
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
        for n in &self.nodes {
            let mut q = n.0.qemu.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut c) = q.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.hub.take();
        if std::env::var_os("WEFT_VM_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("vm lab {}: kept {}", self.name, self.dir.display());
        }
    }
}

/// The learning switch between the guests' sockets.
#[derive(Debug)]
struct Hub {
    stop: Arc<AtomicBool>,
    stats: Arc<HubStats>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct HubStats {
    forwarded: AtomicU64,
    flooded: AtomicU64,
}

impl Hub {
    fn start(path: &Path, ports: Vec<PathBuf>) -> Hub {
        let sock = UnixDatagram::bind(path).expect("bind hub socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("hub read timeout");
        // A guest that does not read (stopped, dying) must not stall the others.
        sock.set_write_timeout(Some(Duration::from_millis(20)))
            .expect("hub write timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(HubStats::default());
        let (s2, st2) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("vm-hub".into())
            .spawn(move || hub_loop(&sock, &ports, &s2, &st2))
            .expect("spawn hub");
        Hub {
            stop,
            stats,
            thread: Some(thread),
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Forwards each frame to the port that last sent from its destination MAC,
/// or floods it (broadcast, multicast, unknown) to every other port.
fn hub_loop(sock: &UnixDatagram, ports: &[PathBuf], stop: &AtomicBool, stats: &HubStats) {
    let mut fdb: HashMap<[u8; 6], usize> = HashMap::new();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => continue,
        };
        let Some(src_port) = from
            .as_pathname()
            .and_then(|p| ports.iter().position(|q| q == p))
        else {
            continue;
        };
        if n < 14 {
            continue;
        }
        let frame = &buf[..n];
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&frame[..6]);
        src.copy_from_slice(&frame[6..12]);
        if src[0] & 1 == 0 {
            fdb.insert(src, src_port);
        }
        match (dst[0] & 1 == 0).then(|| fdb.get(&dst).copied()).flatten() {
            Some(p) if p == src_port => {}
            Some(p) => {
                let _ = sock.send_to(frame, &ports[p]);
                stats.forwarded.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                for (i, p) in ports.iter().enumerate() {
                    if i != src_port {
                        let _ = sock.send_to(frame, p);
                    }
                }
                stats.flooded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn qemu_command(
    kit: &Kit,
    spec: &LabSpec,
    run: &Path,
    port: &Path,
    hub: &Path,
    i: usize,
    shares: &[PathBuf],
) -> Command {
    let h = &kit.home;
    let q = h.join("qemu");
    let mut cmd = Command::new(&kit.qemu);
    let ld = format!(
        "{}:{}",
        q.join("usr/lib/x86_64-linux-gnu").display(),
        q.join("lib/x86_64-linux-gnu").display()
    );
    cmd.env("LD_LIBRARY_PATH", ld);
    cmd.arg("-L")
        .arg(q.join("usr/share/qemu"))
        .arg("-L")
        .arg(q.join("usr/share/seabios"));
    if kit.kvm {
        cmd.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        cmd.args(["-accel", "tcg", "-cpu", "max"]);
    }
    let mac = format!("52:54:00:77:00:{:02x}", i + 1);
    cmd.args(["-smp", "1", "-m", &spec.mem_mb.to_string()])
        .args([
            "-display",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(h.join("kernel/vmlinux"))
        .arg("-initrd")
        .arg(h.join("initramfs.gz"))
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 cryptomgr.notests=1 vmt_run={} vmt_mods={}",
            run.display(),
            h.join("kernel").display()
        ))
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=vmtrun,security_model=none",
            run.display()
        ))
        .args(shares.iter().enumerate().flat_map(|(n, d)| {
            [
                "-virtfs".to_string(),
                format!(
                    "local,path={},mount_tag=share{n},security_model=none,readonly=on",
                    d.display()
                ),
            ]
        }))
        .arg("-netdev")
        .arg(format!(
            "dgram,id=n0,local.type=unix,local.path={},remote.type=unix,remote.path={}",
            port.display(),
            hub.display()
        ))
        .arg("-device")
        .arg(format!("virtio-net-pci,netdev=n0,mac={mac},romfile="))
        .arg("-serial")
        .arg(format!("file:{}", run.join("console.log").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            File::create(run.join("qemu.err")).expect("qemu.err"),
        ));
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl(2), which is async-signal-safe; no memory is shared.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Directories the guests must see as on the host: the workspace's
/// binaries and the kit (busybox, the kernel's modules).
fn needed_dirs(kit: &Kit) -> Vec<PathBuf> {
    let canon = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
    vec![canon(crate::bins::dir()), canon(kit.home.clone())]
}

/// The guest mounts its own tmpfs on these: host paths under them are not
/// visible through the shared root.
const GUEST_OWN: [&str; 5] = ["/proc", "/sys", "/dev", "/run", "/tmp"];

fn under(p: &Path, dir: &str) -> bool {
    p.starts_with(dir)
}

/// Host mounts other than the ones the guest replaces: hidden in the guest
/// (the initramfs mounts an empty read-only tmpfs on each), except those
/// holding a [`needed_dirs`] path.
fn hidden_mounts(needed: &[PathBuf]) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut v: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| {
            m != "/"
                && !GUEST_OWN.iter().any(|p| under(Path::new(m), p))
                && !needed.iter().any(|n| n.starts_with(m))
        })
        .collect();
    v.sort();
    v.dedup();
    v.into_iter().map(|m| m + "\n").collect()
}

/// [`needed_dirs`] the guest's own /tmp or /run would hide (e.g. a checkout
/// under /tmp): shared read-only over 9p at the same path instead.
fn shared_dirs(needed: &[PathBuf]) -> Vec<PathBuf> {
    needed
        .iter()
        .filter(|n| GUEST_OWN.iter().any(|p| under(n, p)))
        .cloned()
        .collect()
}

/// PID 1 in the guest's final root (run by /bin/sh after switch_root).
fn stage2(host: &str, run: &Path, addr: Ipv4Addr, addr6: Option<Ipv6Addr>) -> String {
    let run = run.display();
    let v6 = addr6.map_or(String::new(), |a| {
        format!(
            "sysctl -qw net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.all.forwarding=1\n\
             ip -6 addr add {a}/64 dev eth0 nodad\n\
             ip -6 route add default via fd00::fe dev eth0 onlink\n"
        )
    });
    format!(
        "#!/bin/sh\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8\n\
         export VMT_RUN='{run}' VMT_NAME='{host}'\n\
         hostname '{host}'\n\
         ip link set lo up\n\
         ip link set eth0 up\n\
         ip addr add {addr}/24 dev eth0\n\
         ip route add default via 192.0.2.254 dev eth0 onlink\n\
         sysctl -qw net.ipv4.ip_forward=1\n\
         {v6}\
         echo \"vmt: boot-to-agent $(cut -d' ' -f1 /proc/uptime)s\" > /dev/console\n\
         exec /bin/bash '{run}/agent.sh' > '{run}/agent.log' 2>&1\n"
    )
}

/// The guest's command agent (bash, PID 1): runs every new `q/<id>.sh` in
/// a background subshell with `o/<id>.out`, `.err` and, at exit, `.rc`.
/// Only builtins in the loop (`read -t` on a private fifo is the sleep), so
/// idle guests cost little CPU.
const AGENT: &str = r#"R=$VMT_RUN; Q=$R/q; O=$R/o
mkfifo /run/vmt-agent.fifo; exec 9<>/run/vmt-agent.fifo
declare -A seen
cut -d' ' -f1 /proc/uptime > "$R/ready"
while :; do
  for f in "$Q"/*.sh; do
    [ -e "$f" ] || continue
    id=${f##*/}; id=${id%.sh}
    [ -n "${seen[$id]}" ] && continue
    seen[$id]=1
    (
      trap 'echo $? > "$O/$id.rc"' EXIT
      cd / && exec </dev/null >"$O/$id.out" 2>"$O/$id.err"
      . "$f"
    ) &
  done
  read -t 0.02 -u 9
done
"#;

fn read_lossy(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
