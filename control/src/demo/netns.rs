//! Network namespaces and links made by the demo (and the integration tests)
//! and removed when dropped. Orchestration only: this shells out to `ip`,
//! unlike the backends, which program the kernel through [`crate::netlink`].

use std::process::{Command, Output};

/// Runs `cmd args...` on the host and panics with its stderr on failure.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "`{cmd} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a shell snippet on the host; panics on failure.
pub fn sh(script: &str) -> String {
    let out = run("sh", &["-ec", script]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace, deleted (with every process still in it and
/// every link it holds) when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with `lo` up.
    pub fn new(name: &str) -> Netns {
        // A leftover from a crashed earlier run with the same name goes first.
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run("ip", &["netns", "add", name]);
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's path, for `setns` / CNI_NETNS.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace; panics on failure.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["netns", "exec", &self.name];
        full.extend_from_slice(args);
        let out = run("ip", &full);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command inside the namespace and returns its output, success or not.
    pub fn try_exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("spawn ip netns exec")
    }

    /// Runs a shell snippet inside the namespace; panics on failure.
    pub fn sh(&self, script: &str) -> String {
        self.exec(&["sh", "-ec", script])
    }

    /// A `Command` that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Whether `ping -c1` from this namespace reaches `dst` (waits up to `wait_s`).
    pub fn ping(&self, dst: &str, wait_s: u32) -> bool {
        let w = wait_s.to_string();
        self.try_exec(&["ping", "-c", "1", "-W", &w, dst])
            .status
            .success()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill what still runs inside, then delete the namespace (its links go with it).
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Connects `a` and `b` with a veth pair named `an`/`bn`, each end given an
/// address (CIDR) and set up.
pub fn veth(a: &Netns, an: &str, a_addr: &str, b: &Netns, bn: &str, b_addr: &str) {
    run(
        "ip",
        &[
            "link",
            "add",
            an,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            bn,
            "netns",
            b.name(),
        ],
    );
    a.exec(&["ip", "addr", "add", a_addr, "dev", an]);
    a.exec(&["ip", "link", "set", an, "up"]);
    b.exec(&["ip", "addr", "add", b_addr, "dev", bn]);
    b.exec(&["ip", "link", "set", bn, "up"]);
}

/// An underlay: a namespace holding a bridge that node namespaces attach to
/// with veth pairs, like hosts on one L2 segment.
#[derive(Debug)]
pub struct Underlay {
    /// The namespace holding the bridge.
    pub ns: Netns,
    n: u32,
}

impl Underlay {
    /// Creates the underlay namespace `name` with bridge `br0` up.
    pub fn new(name: &str) -> Underlay {
        let ns = Netns::new(name);
        ns.exec(&["ip", "link", "add", "br0", "type", "bridge"]);
        ns.exec(&["ip", "link", "set", "br0", "up"]);
        Underlay { ns, n: 0 }
    }

    /// Attaches `node` with interface `eth0` carrying `addr` (CIDR) and a
    /// default route via `gw` if given (the gateway need not exist).
    pub fn attach(&mut self, node: &Netns, addr: &str) {
        self.n += 1;
        let port = format!("p{}", self.n);
        let tmp = format!("{}-{}", &node.name()[..node.name().len().min(9)], self.n);
        run(
            "ip",
            &[
                "link",
                "add",
                &tmp,
                "netns",
                node.name(),
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                self.ns.name(),
            ],
        );
        node.exec(&["ip", "link", "set", &tmp, "name", "eth0"]);
        node.exec(&["ip", "addr", "add", addr, "dev", "eth0"]);
        node.exec(&["ip", "link", "set", "eth0", "up"]);
        self.ns.exec(&["ip", "link", "set", &port, "master", "br0"]);
        self.ns.exec(&["ip", "link", "set", &port, "up"]);
    }
}
