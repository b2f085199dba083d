//! Operator mistakes never break a node (issue 29): every `weft` and
//! `weftd` command with wrong, missing, duplicated and conflicting
//! arguments, against a running and a stopped node, and every file weftd or
//! the CNI plugin persists, left in a state that used to break the next
//! start.
//!
//! Each row of [`the_running_node_survives_every_mistake`] is a mistake,
//! the refusal expected (exit code and the key words of the message) and,
//! after it, the proof that nothing was lost: the first weftd (same PID)
//! still serves status, its sockets are the ones it bound, its route is in
//! place, pods on the two nodes still ping each other, the store is
//! unchanged and no store was created where none was named. The rows share
//! one 2-node udp cluster (one namespace more, with no weftd, for mistakes
//! made on a stopped node); the mistakes that need their own daemons
//! (restarts, etcd, routed mode, the demo) have their own tests below.
//!
//! Run `cargo build --workspace --bins` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::demo::netns::Netns;
use weft_testenv::require_root;
use weft_tests::cluster::{Cluster, ClusterSpec, CniMode};
use weft_tests::proc::wait_for;

/// A command's exit code (-1: killed after [`LIMIT`]) and its output.
#[derive(Debug)]
struct Out {
    code: i32,
    text: String,
}

impl Out {
    /// Marks the row failed (exit 99) with `what` when `broken`.
    fn unless(mut self, broken: bool, what: &str) -> Out {
        if broken {
            self.code = 99;
            self.text.push_str(&format!("\nMISTAKE NOT CAUGHT: {what}"));
        }
        self
    }
}

/// How long a refused command may take: a refusal is immediate, a command
/// that is still running after this was not refused.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `cmd` to completion (killed after [`LIMIT`]).
fn run(cmd: &mut Command) -> Out {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("out");
    let f = std::fs::File::create(&log).expect("log");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("dup"))
        .stderr(f)
        .spawn()
        .expect("spawn");
    let t = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.code().unwrap_or(-1);
        }
        if t.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break -1;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code,
        text: std::fs::read_to_string(&log).unwrap_or_default(),
    }
}

fn weft(args: &[&str]) -> Out {
    run(Command::new(weft_tests::bins::path("weft")).args(args))
}

/// The CNI config every test cluster uses (udp here: no kernel dataplane,
/// so a switch to the kernel is refused by weftd itself).
fn spec(prefix: String, work: &Path, backend: &str, nodes: u8) -> ClusterSpec {
    ClusterSpec {
        prefix,
        nodes,
        net_conf: format!(r#"{{"Network":"10.244.0.0/16","Backend":{{"Type":"{backend}"}}}}"#),
        weftd_args: vec!["--traffic-manager=none".into()],
        bin_dir: weft_tests::bins::dir(),
        work: work.to_path_buf(),
    }
}

/// The shared node and what must hold after every row.
struct Shared {
    c: Cluster,
    /// Node 1's subnet.env.
    env: PathBuf,
    env_s: String,
    store: String,
    /// Node 1's weftd PID and its sockets' inodes.
    pid: u64,
    sockets: Vec<(PathBuf, u64)>,
    /// The store's leases (taken again after a row that changed them, so
    /// that each row is judged on its own).
    leases: std::cell::RefCell<String>,
    default_store_existed: bool,
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).map_or(0, |m| m.ino())
}

impl Shared {
    fn start(work: &Path) -> Shared {
        // Three namespaces, weftd on the first two: the third is a node
        // with no weftd for the "stopped node" rows.
        let mut c = Cluster::create(
            spec(weft_tests::unique("op"), work, "udp", 3),
            &Default::default(),
            Vec::new(),
        )
        .unwrap_or_else(|e| panic!("cluster: {e}"));
        for i in 0..2 {
            c.start_weftd(i).expect("start");
        }
        for i in 0..2 {
            c.wait_ready(i, Duration::from_secs(60)).expect("ready");
        }
        c.add_pod(0, "p1").expect("pod 1");
        c.add_pod(1, "p2").expect("pod 2");
        assert!(ping(&c), "no pod traffic at the start:\n{}", c.log(0));
        let env = c.nodes[0].dir.join("subnet.env");
        let env_s = env.display().to_string();
        let store = work.join("store").display().to_string();
        let st = weft(&["status", "--json", "--subnet-file", &env_s]);
        assert_eq!(st.code, 0, "{}", st.text);
        let pid = json(&st.text)["pid"].as_u64().expect("pid");
        let sockets: Vec<(PathBuf, u64)> = ["weft-status.sock", "weft.sock"]
            .iter()
            .map(|n| {
                let p = c.nodes[0].dir.join(n);
                let i = inode(&p);
                assert_ne!(i, 0, "{} missing", p.display());
                (p, i)
            })
            .collect();
        let leases = weft(&["leases", "--json", "--store-path", &store]).text;
        Shared {
            c,
            env,
            env_s,
            store,
            pid,
            sockets,
            leases: std::cell::RefCell::new(leases),
            default_store_existed: Path::new("/var/lib/weft/store").exists(),
        }
    }

    /// The proof that a row lost nothing: what was lost, if anything.
    fn lost(&self) -> Vec<String> {
        let mut lost = Vec::new();
        let st = weft(&["status", "--json", "--subnet-file", &self.env_s]);
        if st.code != 0 {
            lost.push(format!("node 1's status: {}", st.text));
        } else if json(&st.text)["pid"].as_u64() != Some(self.pid) {
            lost.push("node 1's weftd changed".into());
        }
        for (p, i) in &self.sockets {
            if inode(p) != *i {
                lost.push(format!("{} is not weftd's socket any more", p.display()));
            }
        }
        let routes = self.c.nodes[0].ns.exec(&["ip", "route"]);
        if !routes.contains("10.244.0.0/16 dev flannel0") {
            lost.push(format!("node 1's network route is gone:\n{routes}"));
        }
        if !ping(&self.c) {
            lost.push("pods lost their traffic".into());
        }
        let leases = weft(&["leases", "--json", "--store-path", &self.store]).text;
        if leases != *self.leases.borrow() {
            lost.push(format!("the store changed:\n{leases}"));
            *self.leases.borrow_mut() = leases;
        }
        if !self.default_store_existed && Path::new("/var/lib/weft/store").exists() {
            lost.push("a store was created at /var/lib/weft/store".into());
            let _ = std::fs::remove_dir_all("/var/lib/weft");
        }
        lost
    }

    /// weftd in node `i`'s namespace with the cluster's flags and `extra`,
    /// run to completion.
    fn weftd(&self, i: usize, extra: &[&str]) -> Out {
        run(&mut self.weftd_command(i, extra))
    }

    fn weftd_command(&self, i: usize, extra: &[&str]) -> Command {
        let ns = &self.c.nodes[i].ns;
        let mut cmd = ns.command(&weft_tests::bins::path("weftd").to_string_lossy());
        cmd.arg("--traffic-manager=none")
            .arg(format!("--net-config-path={}", self.net_conf()))
            .args(extra);
        cmd
    }

    /// A weftd on the node with no weftd (its own store, so that the shared
    /// one stays unchanged) with `flag`, until it is ready, then SIGTERM.
    fn spare(&self, flag: &str) -> Out {
        let dir = &self.c.nodes[2].dir;
        let cmd = self.weftd_command(
            2,
            &[
                &format!("--store-path={}", dir.join("store").display()),
                &format!("--subnet-file={}", dir.join("subnet.env").display()),
                flag,
            ],
        );
        let mut p = weft_tests::proc::Proc::spawn("spare", cmd, &dir.join("spare.log"));
        wait_for("the spare weftd", Duration::from_secs(30), || {
            p.log().contains("flannel is ready").then_some(())
        });
        let code = p.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap_or(-1);
        Out {
            code,
            text: p.log(),
        }
    }

    /// The subnet file of the node with no weftd.
    fn stopped_env(&self) -> String {
        self.c.nodes[2].dir.join("subnet.env").display().to_string()
    }

    /// The cluster's net-conf.json.
    fn net_conf(&self) -> String {
        self.c.work().join("net-conf.json").display().to_string()
    }

    fn n1_key(&self) -> String {
        let env = std::fs::read_to_string(&self.env).expect("env");
        let sn = env
            .lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
            .expect("subnet");
        sn.replace(".1/", ".0-")
    }
}

fn json(text: &str) -> serde_json::Value {
    let start = text.find('{').unwrap_or(0);
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn ping(c: &Cluster) -> bool {
    (0..5).any(|_| c.pods[0].ns.ping(&c.pods[1].ip, 1))
}

/// One mistake: what is done, and the refusal expected.
struct Row {
    name: &'static str,
    code: i32,
    words: &'static [&'static str],
    run: fn(&Shared) -> Out,
}

fn rows() -> Vec<Row> {
    vec![
        // --- a second weftd (finding 4) ---
        Row {
            name: "a second weftd on node 1's subnet file",
            code: 1,
            words: &["another weftd (pid", "already runs with --subnet-file="],
            run: |s| {
                let store = format!("--store-path={}", s.store);
                s.weftd(
                    0,
                    &[
                        "--store=embedded",
                        &store,
                        &format!("--subnet-file={}", s.env_s),
                    ],
                )
            },
        },
        Row {
            name: "a second weftd with its own subnet file on node 1's devices",
            code: 1,
            words: &["already runs device flannel0", "in this network namespace"],
            run: |s| {
                let other = s.c.work().join("n1/other.env");
                let store = format!("--store-path={}", s.store);
                s.weftd(
                    0,
                    &[
                        "--store=embedded",
                        &store,
                        &format!("--subnet-file={}", other.display()),
                    ],
                )
            },
        },
        // --- weftd flags (on the node with no weftd) ---
        Row {
            name: "weftd --subnet-file= (empty)",
            code: 2,
            words: &["a value is required for '--subnet-file"],
            run: |s| s.weftd(2, &["--subnet-file="]),
        },
        Row {
            name: "weftd --subnet-file naming a directory",
            code: 1,
            words: &["is a directory"],
            run: |s| {
                let d = s.c.nodes[2].dir.display().to_string();
                s.weftd(2, &[&format!("--subnet-file={d}")])
            },
        },
        Row {
            name: "weftd --store=embedded with --etcd-endpoints",
            code: 2,
            words: &[
                "--store=embedded and --etcd-endpoints",
                "select different lease stores",
            ],
            run: |s| {
                s.weftd(
                    2,
                    &["--store=embedded", "--etcd-endpoints=http://127.0.0.1:1"],
                )
            },
        },
        Row {
            name: "weftd --store=etcd with --kube-subnet-mgr",
            code: 2,
            words: &["--store=etcd and --kube-subnet-mgr"],
            run: |s| s.weftd(2, &["--store=etcd", "--kube-subnet-mgr"]),
        },
        Row {
            name: "weftd --store-path on an etcd node",
            code: 2,
            words: &["--store-path applies to the embedded store"],
            run: |s| {
                s.weftd(
                    2,
                    &["--etcd-endpoints=http://127.0.0.1:1", "--store-path=/tmp/x"],
                )
            },
        },
        Row {
            name: "weftd --subnet-file twice",
            code: 2,
            words: &["--subnet-file", "cannot be used multiple times"],
            run: |s| s.weftd(2, &["--subnet-file=/tmp/a.env", "--subnet-file=/tmp/b.env"]),
        },
        Row {
            name: "weftd with an unknown flag",
            code: 2,
            words: &["unexpected argument '--no-such-flag'"],
            run: |s| s.weftd(2, &["--no-such-flag"]),
        },
        Row {
            name: "weftd -ip-masq false (Go stops there, weftd refuses)",
            code: 2,
            words: &["unexpected argument 'false'"],
            run: |s| s.weftd(2, &["-ip-masq", "false"]),
        },
        Row {
            name: "weftd --subnet-lease-renew-margin=0",
            code: 1,
            words: &["Invalid subnet-lease-renew-margin"],
            run: |s| s.weftd(2, &["--subnet-lease-renew-margin=0"]),
        },
        Row {
            name: "weftd --etcd-keyfile without --etcd-certfile",
            code: 2,
            words: &["--etcd-keyfile and --etcd-certfile go together"],
            run: |s| {
                s.weftd(
                    2,
                    &[
                        "--etcd-endpoints=http://127.0.0.1:1",
                        "--etcd-keyfile=/k.pem",
                    ],
                )
            },
        },
        Row {
            name: "weftd --etcd-password without --etcd-username",
            code: 2,
            words: &["--etcd-password without --etcd-username"],
            run: |s| {
                s.weftd(
                    2,
                    &["--etcd-endpoints=http://127.0.0.1:1", "--etcd-password=x"],
                )
            },
        },
        Row {
            name: "weftd --etcd-endpoints that is not an endpoint",
            code: 1,
            words: &["invalid etcd endpoint \"garbage\": no port"],
            run: |s| {
                let env = s.stopped_env();
                s.weftd(
                    2,
                    &["--etcd-endpoints=garbage", &format!("--subnet-file={env}")],
                )
            },
        },
        Row {
            name: "weftd --dataplane=turbo",
            code: 2,
            words: &["invalid value 'turbo'", "--dataplane"],
            run: |s| s.weftd(2, &["--dataplane=turbo"]),
        },
        // --- weft leases (finding 2) ---
        Row {
            name: "weft leases with the store option before rm, naming a wrong directory",
            code: 1,
            words: &["no embedded store in", "never creates a store"],
            run: |s| {
                let wrong = s.c.work().join("no-such-store").display().to_string();
                let out = weft(&["leases", "--store-path", &wrong, "rm", &s.n1_key()]);
                out.unless(
                    Path::new(&wrong).exists(),
                    "the wrong store path was created",
                )
            },
        },
        Row {
            name: "weft leases rm of a key that does not exist",
            code: 1,
            words: &["no lease 10.244.250.0-24 in embedded store"],
            run: |s| weft(&["leases", "--store-path", &s.store, "rm", "10.244.250.0-24"]),
        },
        Row {
            name: "weft leases put of a misaligned key",
            code: 2,
            words: &["10.244.77.0-23 is not aligned", "10.244.76.0-23"],
            run: |s| {
                let net = s.net_conf();
                weft(&[
                    "leases",
                    "put",
                    "10.244.77.0-23",
                    r#"{"PublicIP":"192.0.2.9"}"#,
                    "--store-path",
                    &s.store,
                    "--net-config-path",
                    &net,
                ])
            },
        },
        Row {
            name: "weft leases put of a subnet outside the network",
            code: 2,
            words: &["10.9.0.0/24 lies outside the IPv4 network 10.244.0.0/16"],
            run: |s| {
                let net = s.net_conf();
                weft(&[
                    "leases",
                    "--net-config-path",
                    &net,
                    "put",
                    "10.9.0.0-24",
                    r#"{"PublicIP":"192.0.2.9"}"#,
                    "--store-path",
                    &s.store,
                ])
            },
        },
        Row {
            name: "weft leases put over node 1's lease with another PublicIP",
            code: 1,
            words: &["node 192.0.2.1 holds it", "--overwrite"],
            run: |s| {
                let net = s.net_conf();
                weft(&[
                    "leases",
                    "put",
                    &s.n1_key(),
                    r#"{"PublicIP":"192.0.2.99"}"#,
                    "--store-path",
                    &s.store,
                    "--net-config-path",
                    &net,
                ])
            },
        },
        Row {
            name: "weft leases put of a value without a public IP",
            code: 2,
            words: &["names no PublicIP"],
            run: |s| {
                weft(&[
                    "leases",
                    "put",
                    "10.244.251.0-24",
                    "{}",
                    "--store-path",
                    &s.store,
                ])
            },
        },
        Row {
            name: "weft leases put of a value that is not JSON",
            code: 2,
            words: &["invalid lease value"],
            run: |s| {
                weft(&[
                    "leases",
                    "put",
                    "10.244.251.0-24",
                    "PublicIP=1.2.3.4",
                    "--store-path",
                    &s.store,
                ])
            },
        },
        Row {
            name: "weft leases naming two stores",
            code: 2,
            words: &["--store-path and --etcd-endpoints name two stores"],
            run: |s| {
                weft(&[
                    "leases",
                    "--store-path",
                    &s.store,
                    "rm",
                    "10.244.250.0-24",
                    "--etcd-endpoints",
                    "http://127.0.0.1:1",
                ])
            },
        },
        Row {
            name: "weft leases with --store-path before and after rm",
            code: 2,
            words: &["--store-path is given twice"],
            run: |s| {
                weft(&[
                    "leases",
                    "--store-path",
                    &s.store,
                    "rm",
                    &s.n1_key(),
                    "--store-path",
                    &s.store,
                ])
            },
        },
        Row {
            name: "weft leases --etcd-prefix without --etcd-endpoints",
            code: 2,
            words: &["--etcd-prefix needs --etcd-endpoints"],
            run: |_| weft(&["leases", "--etcd-prefix", "/x"]),
        },
        Row {
            name: "weft leases asking a stopped node's weftd",
            code: 3,
            words: &["cannot ask the weftd of --subnet-file="],
            run: |s| {
                let env = s.stopped_env();
                weft(&["leases", "--subnet-file", &env])
            },
        },
        Row {
            name: "weft leases rm with a key that does not parse",
            code: 2,
            words: &["invalid subnet key"],
            run: |s| weft(&["leases", "rm", "10.244.1.0/24", "--store-path", &s.store]),
        },
        Row {
            name: "weft leases put without a value",
            code: 2,
            words: &["<VALUE>"],
            run: |s| weft(&["leases", "put", "10.244.251.0-24", "--store-path", &s.store]),
        },
        // --- weft dataplane (finding 1) ---
        Row {
            name: "weft dataplane set kernel on a udp node (no kernel udp)",
            code: 1,
            words: &["weftd refused", "has no kernel dataplane"],
            run: |s| {
                let t = Instant::now();
                let out = weft(&["dataplane", "set", "kernel", "--subnet-file", &s.env_s]);
                let slow = t.elapsed() > Duration::from_secs(5);
                let file = s.c.nodes[0].dir.join("weft-dataplane");
                out.unless(slow, "refused only after 5 s")
                    .unless(file.exists(), "a refused switch was persisted")
            },
        },
        Row {
            name: "weft dataplane set turbo",
            code: 2,
            words: &["invalid value 'turbo'", "auto, kernel, userspace"],
            run: |s| weft(&["dataplane", "set", "turbo", "--subnet-file", &s.env_s]),
        },
        Row {
            name: "weft dataplane --subnet-file before and after set",
            code: 2,
            words: &["--subnet-file is given twice"],
            run: |s| {
                weft(&[
                    "dataplane",
                    "--subnet-file",
                    &s.env_s,
                    "set",
                    "userspace",
                    "--subnet-file",
                    &s.env_s,
                ])
            },
        },
        Row {
            name: "weft dataplane set on a stopped node",
            code: 3,
            words: &["cannot reach weftd", "--subnet-file="],
            run: |s| {
                let env = s.stopped_env();
                weft(&["dataplane", "set", "userspace", "--subnet-file", &env])
            },
        },
        Row {
            name: "weft dataplane reset where nothing is kept",
            code: 0,
            words: &["runs in the userspace", "nothing kept"],
            run: |s| weft(&["dataplane", "reset", "--subnet-file", &s.env_s]),
        },
        Row {
            name: "SIGHUP after writing garbage into weft-dataplane",
            code: 0,
            words: &["SIGHUP: ", "\"turbo\" is not auto, kernel or userspace"],
            run: |s| {
                let file = s.c.nodes[0].dir.join("weft-dataplane");
                std::fs::write(&file, "dataplane=turbo\n").expect("write");
                let pid = s.pid.to_string();
                let mut out = run(Command::new("kill").args(["-HUP", &pid]));
                // The unusable file is put back to what runs: none.
                let t = Instant::now();
                while file.exists() && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                out.text.push_str(&s.c.log(0));
                out.unless(file.exists(), "the unusable file was kept")
            },
        },
        // --- weft status ---
        Row {
            name: "weft status of a stopped node",
            code: 3,
            words: &["cannot reach weftd"],
            run: |s| {
                let env = s.stopped_env();
                weft(&["status", "--subnet-file", &env])
            },
        },
        Row {
            name: "weft status --socket with --http",
            code: 2,
            words: &["cannot be used with"],
            run: |s| weft(&["status", "--socket", &s.env_s, "--http", "127.0.0.1:1"]),
        },
        // --- files and sockets of another daemon (the node with no weftd) ---
        Row {
            name: "weftd on another node given node 1's IPAM socket",
            code: 0,
            words: &["ipam API not started", "another process is serving on it"],
            run: |s| {
                let sock = format!("--ipam-socket={}", s.sockets[1].0.display());
                s.spare(&sock)
            },
        },
        Row {
            name: "weftd on another node given node 1's IPAM state file",
            code: 0,
            words: &[
                "ipam API not started",
                "in use by another weftd (",
                "own --ipam-state",
            ],
            run: |s| {
                let state = s.c.nodes[0].dir.join("weft-ipam.json");
                s.spare(&format!("--ipam-state={}", state.display()))
            },
        },
    ]
}

#[test]
fn the_running_node_survives_every_mistake() {
    require_root!();
    let work = tempfile::tempdir().expect("tempdir");
    let s = Shared::start(work.path());
    let mut failures = Vec::new();
    for row in rows() {
        let out = (row.run)(&s);
        let mut bad = Vec::new();
        if out.code != row.code {
            bad.push(format!("exit {} (want {})", out.code, row.code));
        }
        for w in row.words {
            if !out.text.contains(w) {
                bad.push(format!("no {w:?}"));
            }
        }
        bad.extend(s.lost().into_iter().map(|l| format!("lost: {l}")));
        if !bad.is_empty() {
            failures.push(format!("{}: {}\n{}", row.name, bad.join(", "), out.text));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    // No weftd was left running in the spare namespace.
    let left = Command::new("ip")
        .args(["netns", "pids", s.c.nodes[2].ns.name()])
        .output()
        .expect("ip netns pids");
    assert!(left.stdout.is_empty(), "a refused weftd still runs");
}

/// A single node in its own namespace (eth0 on a veth with a default
/// route), for tests that restart weftd with changed flags.
struct Node {
    ns: Netns,
    dir: tempfile::TempDir,
}

impl Node {
    fn new(tag: &str) -> Node {
        let ns = Netns::new(&weft_tests::unique(tag));
        ns.sh(
            "ip link add eth0 type veth peer name eth1; ip addr add 192.0.2.1/24 dev eth0; \
               ip link set eth0 up; ip link set eth1 up; \
               ip route add default via 192.0.2.254 dev eth0 onlink",
        );
        Node {
            ns,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn conf(&self, backend: &str) {
        std::fs::write(
            self.dir.path().join("net-conf.json"),
            format!(r#"{{"Network":"10.244.0.0/16","Backend":{{"Type":"{backend}"}}}}"#),
        )
        .expect("net-conf");
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let d = self.dir.path();
        [
            "--traffic-manager=none".to_string(),
            format!("--store-path={}", d.join("store").display()),
            format!("--net-config-path={}", d.join("net-conf.json").display()),
        ]
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect()
    }

    fn env(&self) -> String {
        self.dir.path().join("n1.env").display().to_string()
    }

    fn status(&self) -> serde_json::Value {
        let out = weft(&["status", "--json", "--subnet-file", &self.env()]);
        assert_eq!(out.code, 0, "{}", out.text);
        json(&out.text)
    }
}

/// Finding 1: a dataplane choice persisted by `weft dataplane set` belongs
/// to the backend and `--dataplane` it was made under; a start never fails
/// because of it, whatever the file holds.
#[test]
fn a_persisted_dataplane_choice_never_stops_a_start() {
    require_root!();
    let n = Node::new("opd");
    n.conf("vxlan");
    let file = n.dir.path().join("n1.weft-dataplane");
    let mut d =
        weft_tests::weftd::Weftd::start("n1", n.dir.path(), Some(n.ns.name()), &n.args(&[]));
    d.wait_ready(Duration::from_secs(60));
    // Auto runs kernel vxlan here; the operator switches to the engine.
    let out = weft(&["dataplane", "set", "userspace", "--subnet-file", &n.env()]);
    assert_eq!(out.code, 0, "{}", out.text);
    assert!(
        out.text.contains("runs in the userspace") && out.text.contains("kept in"),
        "{}",
        out.text
    );
    let text = std::fs::read_to_string(&file).expect("persisted");
    assert!(
        text.contains("dataplane=userspace")
            && text.contains("backend=vxlan")
            && text.contains("flag=auto"),
        "{text}"
    );
    // Started again and serving (its subnet.env is written anew).
    let serving = |d: &mut weft_tests::weftd::Weftd| {
        d.wait_ready(Duration::from_secs(60));
        let pid = u64::from(d.proc.pid());
        wait_for("the new weftd's status", Duration::from_secs(20), || {
            let o = weft(&["status", "--json", "--subnet-file", &n.env()]);
            (o.code == 0 && json(&o.text)["pid"].as_u64() == Some(pid)).then_some(())
        });
    };
    let restart = |d: &mut weft_tests::weftd::Weftd, args: Vec<String>| {
        assert_eq!(d.proc.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
        std::fs::remove_file(&d.subnet_env).expect("rm subnet.env");
        d.set_args(&args);
        d.restart();
        serving(d);
    };
    // Same configuration: the choice is kept.
    restart(&mut d, n.args(&[]));
    assert_eq!(n.status()["backend"]["dataplane"], "userspace");
    // An explicit --dataplane now: the old choice is void, named and removed.
    restart(&mut d, n.args(&["--dataplane=kernel"]));
    assert_eq!(n.status()["backend"]["dataplane"], "kernel");
    assert!(
        !file.exists(),
        "a choice made under --dataplane=auto survived --dataplane=kernel"
    );
    assert!(
        d.proc.log().contains(&format!(
            "{}: ignored the persisted dataplane choice",
            file.display()
        )),
        "{}",
        d.proc.log()
    );
    // Switched once more, then the node is reconfigured to host-gw.
    let out = weft(&["dataplane", "set", "userspace", "--subnet-file", &n.env()]);
    assert_eq!(out.code, 0, "{}", out.text);
    assert!(file.exists());
    n.conf("host-gw");
    restart(&mut d, n.args(&["--dataplane=kernel"]));
    assert_eq!(n.status()["backend"]["name"], "host-gw");
    assert!(
        d.proc.log().contains("made for backend vxlan"),
        "{}",
        d.proc.log()
    );
    // A record this kernel (any kernel) cannot run: udp in the kernel.
    n.conf("udp");
    std::fs::write(&file, "dataplane=kernel\nbackend=udp\nflag=auto\n").expect("write");
    restart(&mut d, n.args(&[]));
    assert_eq!(n.status()["backend"]["dataplane"], "userspace");
    assert!(
        d.proc.log().contains("`kernel` cannot run here"),
        "{}",
        d.proc.log()
    );
    // Garbage, and a hand-written word: ignored at start.
    for text in ["dataplane=turbo\n", "kernel\n"] {
        std::fs::write(&file, text).expect("write");
        restart(&mut d, n.args(&[]));
        assert!(!file.exists(), "{text:?} was kept");
    }
    // A lock file left by a killed weftd (a PID that is gone) is taken over.
    d.proc.stop(libc::SIGKILL, Duration::from_secs(10));
    std::fs::write(n.dir.path().join("n1.weftd.lock"), "999999\n").expect("write");
    std::fs::remove_file(&d.subnet_env).expect("rm subnet.env");
    d.restart();
    serving(&mut d);
    let lock = std::fs::read_to_string(n.dir.path().join("n1.weftd.lock")).expect("lock");
    assert_eq!(lock.trim(), d.proc.pid().to_string());
}

/// Finding 3: routed mode on a node with bridge pods, and back. weftd's
/// IPAM never hands out an address host-local holds, host-local never one
/// weftd holds, and DEL in either mode removes pods made in the other.
#[test]
fn routed_and_bridge_pods_never_share_an_address() {
    require_root!();
    let work = tempfile::tempdir().expect("tempdir");
    let mut c = Cluster::start(spec(weft_tests::unique("opr"), work.path(), "alloc", 1))
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    let host_local = c.nodes[0].dir.join("cni-ipam/cbr0");
    let a = c.add_pod(0, "ba").expect("bridge pod");
    c.set_cni_mode(0, CniMode::Routed);
    let b = c.add_pod(0, "rb").expect("routed pod");
    let (ip_a, ip_b) = (c.pods[a].ip.clone(), c.pods[b].ip.clone());
    assert_ne!(ip_a, ip_b, "routed pod got the bridge pod's address");
    assert_eq!(
        std::fs::read_to_string(host_local.join(&ip_b))
            .ok()
            .as_deref(),
        Some(format!("{}rb\r\neth0", c.pods[b].ns.name().trim_end_matches("-rb")).as_str()),
        "weftd did not record its address for host-local"
    );
    for ip in [&ip_a, &ip_b] {
        assert!(c.nodes[0].ns.ping(ip, 2), "node cannot reach pod {ip}");
    }
    // Back to bridge: host-local skips the routed pod's address.
    c.set_cni_mode(0, CniMode::Bridge);
    let d = c.add_pod(0, "bd").expect("bridge pod after");
    assert!(
        ![&ip_a, &ip_b].contains(&&c.pods[d].ip),
        "host-local handed out {} again",
        c.pods[d].ip
    );
    // DEL of the routed pod with the bridge config: veth and address go.
    let idx = c.pods.iter().position(|p| p.ip == ip_b).expect("pod b");
    c.del_pod_in(idx, CniMode::Bridge)
        .expect("DEL routed pod in bridge mode");
    let links = c.nodes[0].ns.exec(&["ip", "-o", "link"]);
    assert!(!links.contains("weft"), "routed host veth left:\n{links}");
    assert!(
        !host_local.join(&ip_b).exists(),
        "its host-local record left"
    );
    let state = std::fs::read_to_string(c.nodes[0].dir.join("weft-ipam.json")).expect("state");
    assert!(
        !json(&state)["allocations"].to_string().contains(&ip_b),
        "weftd still holds {ip_b}: {state}"
    );
    // DEL of a bridge pod with the routed config: its host-local address goes.
    let idx = c.pods.iter().position(|p| p.ip == ip_a).expect("pod a");
    c.del_pod_in(idx, CniMode::Routed)
        .expect("DEL bridge pod in routed mode");
    assert!(
        !host_local.join(&ip_a).exists(),
        "bridge pod's address not released"
    );
}

/// etcd: credentials against an etcd without auth (flanneld goes on), the
/// password never printed, and `weft leases` with no store flags on an
/// etcd node acting on that node's etcd (it printed an empty table of the
/// default embedded store).
#[test]
fn an_etcd_node_keeps_its_secrets_and_its_store() {
    require_root!();
    weft_tests::require_etcd!();
    let etcd = weft_tests::etcd::Etcd::start();
    let conf = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"alloc"}}"#;
    etcd.etcdctl_ok(&["put", "/coreos.com/network/config", conf]);
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = "s3cret-pa55word";
    let args: Vec<String> = [
        "--iface=lo",
        "--traffic-manager=none",
        "--public-ip=192.0.2.77",
        "--v=10",
        "--etcd-username=root",
        &format!("--etcd-password={secret}"),
        &format!("--etcd-endpoints={}", etcd.endpoint()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut d = weft_tests::weftd::Weftd::start("e1", dir.path(), None, &args);
    let env = d.wait_ready(Duration::from_secs(60));
    let env_s = d.subnet_env.display().to_string();
    assert!(
        d.proc.log().contains("etcd has authentication disabled"),
        "{}",
        d.proc.log()
    );
    let status = weft(&["status", "--json", "--subnet-file", &env_s]);
    for (what, text) in [("log", d.proc.log()), ("status", status.text.clone())] {
        assert!(
            !text.contains(secret),
            "the password is in the {what}:\n{text}"
        );
    }
    assert!(
        d.proc.log().contains("etcd_password: <redacted>"),
        "{}",
        d.proc.log()
    );
    let key = env["FLANNEL_SUBNET"].replace(".1/", ".0-");
    // No store flags: the node's weftd says which store, the password is asked for.
    let out = weft(&["leases", "--subnet-file", &env_s]);
    assert_eq!(out.code, 2, "{}", out.text);
    assert!(out.text.contains("FLANNELD_ETCD_PASSWORD"), "{}", out.text);
    let mut cmd = Command::new(weft_tests::bins::path("weft"));
    cmd.env("FLANNELD_ETCD_PASSWORD", secret)
        .args(["leases", "--json", "--subnet-file", &env_s]);
    let out = run(&mut cmd);
    assert_eq!(out.code, 0, "{}", out.text);
    assert!(
        out.text.contains(&key) && out.text.contains("using the store of the weftd"),
        "{}",
        out.text
    );
    // rm of a missing key on etcd fails; options in any position.
    let ep = etcd.endpoint();
    for args in [
        &["leases", "--etcd-endpoints", &ep, "rm", "10.244.250.0-24"][..],
        &["leases", "rm", "10.244.250.0-24", "--etcd-endpoints", &ep],
    ] {
        let out = weft(args);
        assert_eq!(out.code, 1, "{args:?}: {}", out.text);
        assert!(
            out.text.contains("no lease 10.244.250.0-24 in etcd"),
            "{}",
            out.text
        );
    }
    let out = weft(&["leases", "--etcd-endpoints", &ep, "rm", &key, "--json"]);
    assert_eq!(out.code, 0, "{}", out.text);
    assert_eq!(json(&out.text)["action"], "deleted");
    let got = etcd.etcdctl_ok(&["get", "--prefix", "/coreos.com/network/subnets/"]);
    assert!(!got.contains(&key), "the etcd key stayed: {got}");
}

/// `weft demo`'s edges: not root, no nodes, a weftd that fails. Each is a
/// clear message and a non-zero exit, and nothing is left behind.
#[test]
fn the_demo_refuses_cleanly() {
    require_root!();
    let demos = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("weft-demo-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = demos();
    // Not root: a copy of weft that nobody (uid 65534) may run.
    let tmp = tempfile::tempdir().expect("tempdir");
    let copy = tmp.path().join("weft");
    std::fs::copy(weft_tests::bins::path("weft"), &copy).expect("copy weft");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&copy)
        .args(["demo", "--nodes", "1", "--iperf", "0"]));
    assert_eq!(out.code, 1, "{}", out.text);
    assert!(
        out.text.contains("needs root") && !out.text.contains("panicked"),
        "{}",
        out.text
    );
    let out = weft(&["demo", "--nodes", "0"]);
    assert_eq!(out.code, 2, "{}", out.text);
    assert!(out.text.contains("0 is not in 1..=50"), "{}", out.text);
    // A weftd that cannot start: the node's log in the message, all removed.
    let out = weft(&[
        "demo",
        "--nodes",
        "1",
        "--iperf",
        "0",
        "--weftd-arg=--no-such-flag",
    ]);
    assert_eq!(out.code, 1, "{}", out.text);
    assert!(
        out.text.contains("did not become ready") && out.text.contains("--no-such-flag"),
        "{}",
        out.text
    );
    assert_eq!(demos(), before, "a demo work dir was left behind");
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let prefix = out
        .text
        .lines()
        .find_map(|l| l.split("namespaces ").nth(1))
        .and_then(|r| r.split('-').next())
        .unwrap_or("none")
        .to_string();
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains(&format!("{prefix}-")),
        "demo namespaces {prefix}-* left"
    );
}
