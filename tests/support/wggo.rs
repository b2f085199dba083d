//! wireguard-go as flannel's wireguard backend runs it (the independent
//! WireGuard implementation the interop tests put beside weft): a device
//! `flannel-wg` in a namespace, with a new private key, stopped on drop.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::netns::Netns;
use crate::proc::wait_for;

/// A running wireguard-go (killed and reaped on drop) and its public key.
#[derive(Debug)]
pub struct WireguardGo {
    child: Child,
    /// The device's public key (base64, as `wg pubkey` prints it).
    pub public_key: String,
}

impl WireguardGo {
    /// Generates a private key into `key_file` (mode 0600) and starts
    /// wireguard-go in `ns` with the device `flannel-wg`; returns once the
    /// device exists. The caller configures it with `wg set` (key file
    /// included) and addresses.
    pub fn start(ns: &Netns, key_file: &Path) -> WireguardGo {
        ns.sh(&format!("umask 077; wg genkey > {}", key_file.display()));
        let public_key = ns
            .sh(&format!("wg pubkey < {}", key_file.display()))
            .trim()
            .to_string();
        let child = ns
            .command("wireguard-go")
            .args(["-f", "flannel-wg"])
            .env("WG_PROCESS_FOREGROUND", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wireguard-go");
        let go = WireguardGo { child, public_key };
        wait_for("wireguard-go device", Duration::from_secs(10), || {
            ns.try_exec(&["ip", "link", "show", "flannel-wg"])
                .status
                .success()
                .then_some(())
        });
        go
    }
}

impl Drop for WireguardGo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
