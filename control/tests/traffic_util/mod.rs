//! Shared helpers of the `traffic_*` root tests: network namespaces with Drop guards, running
//! commands inside them, and running Rust code inside them on a helper thread.
#![allow(dead_code)]

use std::{
    fs::File,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use nix::sched::{CloneFlags, setns};
use weft_control::traffic::Runner;

/// A network namespace `wt-<tag>-<pid>`, deleted on drop (also on panic).
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = format!("wt-{tag}-{}", std::process::id());
        // A leftover from a crashed earlier run with the same pid is ours to remove.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        let ns = Self { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A traffic-rule runner that works inside this namespace.
    pub fn runner(&self) -> Runner {
        Runner::in_netns(&self.name)
    }

    /// Runs a command inside the namespace; panics on failure; returns stdout.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Runs a command inside the namespace; returns (success, stdout).
    pub fn try_exec(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("spawn ip netns exec");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// Runs `f` on a new thread that has entered this namespace (sockets it opens live here).
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        thread::spawn(move || {
            let file = File::open(&path).expect("open netns");
            setns(file, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs a host command; panics with its stderr on failure; returns stdout.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `cond` every 100 ms for up to 30 s.
pub fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(100));
    }
    cond()
}

/// Number of lines of `listing` equal to `line`.
pub fn count(listing: &str, line: &str) -> usize {
    listing.lines().filter(|l| l.trim_end() == line).count()
}
