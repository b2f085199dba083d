//! Phantom-lease churn: leases of nodes that do not exist, added and
//! removed through the store every 1.5-4.5 s (2-6 per cluster), so that
//! every node's routes and peers keep following a changing lease set.

use super::Scheduler;
use crate::chaos_kit::now;
use crate::chaos_kit::rig::{ChaosCluster, Rig};
use std::time::Duration;

impl Scheduler {
    pub(super) fn churn_phantom(&mut self, rig: &mut Rig) {
        let ci = self.rng.below(rig.clusters.len());
        let cc = &rig.clusters[ci];
        let mine: Vec<usize> = (0..self.phantoms.len())
            .filter(|&k| self.phantoms[k].0 == ci)
            .collect();
        let add = mine.len() < 2 || (mine.len() < 6 && self.rng.below(2) == 0);
        let t = now();
        self.churn.0 += 1;
        if add {
            let k = 64 + self.rng.below(100);
            let key = format!("10.244.{k}.0-24");
            if self.phantoms.iter().any(|p| p.0 == ci && p.1 == key) {
                return;
            }
            match cc.put_lease(&key, &phantom_value(cc, k)) {
                Ok(()) => {
                    self.phantoms.push((ci, key.clone(), t));
                    self.phantom_changed.insert((ci, key), now());
                }
                Err(_) => self.churn.1 += 1,
            }
        } else {
            let k = mine[self.rng.below(mine.len())];
            let key = self.phantoms[k].1.clone();
            match cc.rm_lease(&key) {
                Ok(()) => {
                    self.phantoms.remove(k);
                    self.phantom_changed.insert((ci, key), now());
                }
                Err(_) => self.churn.1 += 1,
            }
        }
    }

    /// Removes every phantom lease (end of run), retrying while the store refuses.
    pub fn clear_phantoms(&mut self, rig: &mut Rig) {
        for _ in 0..50 {
            let mut left = Vec::new();
            for (ci, key, t) in std::mem::take(&mut self.phantoms) {
                match rig.clusters[ci].rm_lease(&key) {
                    Ok(()) => {
                        self.phantom_changed.insert((ci, key), now());
                    }
                    Err(_) => left.push((ci, key, t)),
                }
            }
            self.phantoms = left;
            if self.phantoms.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn phantom_value(cc: &ChaosCluster, k: usize) -> String {
    let ip = format!("192.0.2.{}", 100 + k % 150);
    match cc.backend {
        // flannel's udp lease has no BackendType and no BackendData.
        "udp" => format!(r#"{{"PublicIP":"{ip}","PublicIPv6":null}}"#),
        "wireguard" => format!(
            r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"wireguard","BackendData":{{"PublicKey":"{k:0>42}A=","Port":51820}}}}"#
        ),
        _ => format!(
            r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:{:02x}:{:02x}"}}}}"#,
            k / 256,
            k % 256
        ),
    }
}
