//! `weft demo`: a 3-node weft cluster on this machine, built in network
//! namespaces, with two pods per node created through weft's CNI plugin. It
//! shows the leases, pod-to-pod pings across nodes and an iperf3 figure, then
//! removes everything, also on Ctrl-C or failure. Needs root.

pub mod cluster;
pub mod netns;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use self::cluster::{CNI_PLUGIN_DIR, Cluster, ClusterSpec};

/// `weft demo` options.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Backend type (udp, vxlan, alloc, ...).
    pub backend: String,
    /// Number of nodes.
    pub nodes: u8,
    /// Pods per node.
    pub pods: u8,
    /// iperf3 duration in seconds (0 skips it).
    pub iperf_secs: u32,
    /// Extra weftd arguments.
    pub weftd_args: Vec<String>,
}

/// The `--dataplane` demo nodes run when none was chosen: weft's userspace
/// engine, except for host-gw, which only programs kernel routes.
pub fn default_dataplane(backend: &str) -> &'static str {
    match backend {
        "host-gw" => "auto",
        _ => "userspace",
    }
}

/// Runs the demo; returns whether every pod reached every other node's pods
/// (with alloc, which forwards nothing between nodes: its own node's pods).
pub fn run(opts: &DemoOptions) -> anyhow::Result<bool> {
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("cannot locate the weft binaries"))?;
    for b in ["weftd", "flannel"] {
        anyhow::ensure!(
            bin_dir.join(b).exists(),
            "{} not found next to weft: run `cargo build --workspace --bins`",
            b
        );
    }
    for p in ["bridge", "host-local"] {
        anyhow::ensure!(
            PathBuf::from(CNI_PLUGIN_DIR).join(p).exists(),
            "CNI plugin {p} not found in {CNI_PLUGIN_DIR}: install containernetworking-plugins (scripts/deps.sh)"
        );
    }
    let prefix = format!("wd{}", std::process::id() % 100_000);
    let work = std::env::temp_dir().join(format!("weft-demo-{prefix}"));
    on_signal_cleanup(prefix.clone(), work.clone());
    // A panic (a failed `ip` call) still unwinds through the cluster's Drop;
    // the work dir goes here either way.
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        demo(opts, &prefix, &work, bin_dir)
    }))
    .unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(anyhow::anyhow!("internal error: {what}"))
    });
    let _ = std::fs::remove_dir_all(&work);
    println!("==> cleaned up: namespaces {prefix}-*, {}", work.display());
    res
}

fn demo(
    opts: &DemoOptions,
    prefix: &str,
    work: &std::path::Path,
    bin_dir: PathBuf,
) -> anyhow::Result<bool> {
    let net_conf = format!(
        r#"{{"Network":"10.244.0.0/16","Backend":{{"Type":"{}"}}}}"#,
        opts.backend
    );
    println!("==> net-conf.json: {net_conf}");
    println!(
        "==> starting {} nodes (namespaces {prefix}-n1..), one weftd each, on the embedded store",
        opts.nodes
    );
    let mut weftd_args = ClusterSpec::embedded_store(work);
    weftd_args.extend(opts.weftd_args.iter().cloned());
    let mut c = Cluster::start(ClusterSpec {
        prefix: prefix.to_string(),
        nodes: opts.nodes,
        net_conf,
        weftd_args,
        bin_dir,
        work: work.to_path_buf(),
    })?;
    for i in 0..c.nodes.len() {
        let env = c.subnet_env(i).unwrap_or_default();
        println!(
            "--- node {} ({}): {}",
            i + 1,
            c.nodes[i].addr,
            env.trim().replace('\n', "  ")
        );
        if let Some(line) = c.log(i).lines().find(|l| l.contains("userspace engine on")) {
            println!("    {}", line.split("INFO").last().unwrap_or(line).trim());
        }
    }
    println!(
        "==> creating {} pods per node through the flannel CNI plugin (bridge cni0 + host-local)",
        opts.pods
    );
    for i in 0..c.nodes.len() {
        for p in 1..=opts.pods {
            let idx = c.add_pod(i, &format!("n{}p{p}", i + 1))?;
            println!("    pod {}-n{}p{p}: {}", prefix, i + 1, c.pods[idx].ip);
        }
    }
    // Give every node time to learn every peer (lease events are asynchronous).
    std::thread::sleep(Duration::from_millis(500));
    // alloc hands out subnets and forwards nothing (as flannel's): only pods
    // of one node can reach each other.
    let alloc = opts.backend == "alloc";
    if alloc {
        println!(
            "==> backend alloc forwards nothing between nodes: pings between pods of one node"
        );
    } else {
        println!("==> pod-to-pod pings across nodes");
    }
    let mut all_ok = true;
    for a in 0..c.pods.len() {
        for b in 0..c.pods.len() {
            let same_node = c.pods[a].node == c.pods[b].node;
            if a == b || same_node != alloc {
                continue;
            }
            let ok = c.pods[a].ns.ping(&c.pods[b].ip, 2) || c.pods[a].ns.ping(&c.pods[b].ip, 2);
            all_ok &= ok;
            println!(
                "    {:<15} -> {:<15} {}",
                c.pods[a].ip,
                c.pods[b].ip,
                if ok { "ok" } else { "FAILED" }
            );
        }
    }
    if opts.iperf_secs > 0 && c.nodes.len() >= 2 && !alloc {
        let (a, b) = (0, c.pods.iter().position(|p| p.node == 1).unwrap_or(0));
        println!(
            "==> iperf3 TCP, {} s, pod {} (node 1) -> pod {} (node 2)",
            opts.iperf_secs, c.pods[a].ip, c.pods[b].ip
        );
        match iperf(&c, a, b, opts.iperf_secs) {
            Ok(g) => println!("    {g:.2} Gbit/s"),
            Err(e) => println!("    iperf3 failed: {e}"),
        }
    }
    drop(c);
    Ok(all_ok)
}

fn iperf(c: &Cluster, a: usize, b: usize, secs: u32) -> anyhow::Result<f64> {
    let server = &c.pods[b];
    server
        .ns
        .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip]);
    std::thread::sleep(Duration::from_millis(300));
    let out = c.pods[a]
        .ns
        .try_exec(&["iperf3", "-c", &server.ip, "-t", &secs.to_string(), "-J"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no result: {}", String::from_utf8_lossy(&out.stdout)))?;
    Ok(bps / 1e9)
}

/// On SIGINT/SIGTERM: kill what runs in our namespaces, delete them and the
/// work dir, exit 130. Runs on its own thread with its own small runtime.
fn on_signal_cleanup(prefix: String, work: PathBuf) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
        });
        eprintln!("\n==> interrupted: cleaning up");
        cleanup_prefix(&prefix);
        let _ = std::fs::remove_dir_all(&work);
        std::process::exit(130);
    });
}

/// Deletes every namespace named `<prefix>-*` and kills what runs in it.
pub fn cleanup_prefix(prefix: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if name.starts_with(&format!("{prefix}-")) {
            if let Ok(p) = Command::new("ip").args(["netns", "pids", name]).output() {
                for pid in String::from_utf8_lossy(&p.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn demo_nodes_run_the_engine_unless_the_backend_has_none() {
        assert_eq!(super::default_dataplane("vxlan"), "userspace");
        assert_eq!(super::default_dataplane("wireguard"), "userspace");
        assert_eq!(super::default_dataplane("host-gw"), "auto");
    }
}
