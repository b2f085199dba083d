//! A stand-in for weftd's IPAM API (the same line protocol), for routed-mode
//! tests that are about the plugin, not the daemon.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::World;

/// A stand-in for weftd's IPAM API on `<world>/weft.sock` (the default next
/// to subnet.env): sequential addresses from 10.244.<n>.2, keyed by
/// (containerID, ifname), idempotent.
pub struct FakeIpam {
    path: PathBuf,
    held: Arc<Mutex<BTreeMap<(String, String), String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeIpam {
    /// Serves on `<world>/weft.sock` until dropped.
    pub fn start(w: &World) -> FakeIpam {
        let path = w.path("weft.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        let held = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s, n) = (held.clone(), stop.clone(), w.n);
        let thread = std::thread::spawn(move || {
            let mut next = 2u8;
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() {
                    continue;
                }
                let req: Value = serde_json::from_str(&line).unwrap_or_default();
                let key = || {
                    (
                        req["containerID"].as_str().unwrap_or("").to_string(),
                        req["ifname"].as_str().unwrap_or("").to_string(),
                    )
                };
                let mut held = h.lock().expect("lock");
                let reply = match req["op"].as_str() {
                    Some("allocate") => {
                        let ip = held.entry(key()).or_insert_with(|| {
                            next += 1;
                            format!("10.244.{n}.{}", next - 1)
                        });
                        json!({"ok": true, "allocation": {"containerID": key().0, "ifname": key().1, "ipv4": ip}})
                    }
                    Some("release") => match held.remove(&key()) {
                        Some(ip) => {
                            json!({"ok": true, "allocation": {"containerID": key().0, "ifname": key().1, "ipv4": ip}})
                        }
                        None => json!({"ok": true}),
                    },
                    Some("list") => {
                        let list: Vec<Value> = held
                            .iter()
                            .map(|((id, ifname), ip)| json!({"containerID": id, "ifname": ifname, "ipv4": ip}))
                            .collect();
                        json!({"ok": true, "allocations": list})
                    }
                    Some("status") => json!({"ok": true, "subnet": format!("10.244.{n}.0/24")}),
                    _ => {
                        json!({"ok": false, "error": {"kind": "invalid", "message": "bad request"}})
                    }
                };
                let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
            }
        });
        FakeIpam {
            path,
            held,
            stop,
            thread: Some(thread),
        }
    }

    /// The held allocations: (containerID, address).
    pub fn held(&self) -> Vec<(String, String)> {
        self.held
            .lock()
            .expect("lock")
            .iter()
            .map(|((id, _), ip)| (id.clone(), ip.clone()))
            .collect()
    }
}

impl Drop for FakeIpam {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
