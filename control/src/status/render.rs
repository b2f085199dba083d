//! The human-readable form of a [`Status`] (`weft status` without `--json`),
//! in the spirit of `wg show`: the node, its devices, then one line per peer.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use weft_engine::CounterSet;

use super::model::{Counters, ProbeStatus, Status};

/// Renders `s` for a terminal.
pub fn text(s: &Status) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "weftd {} (pid {})", s.version, s.pid);
    match &s.lease {
        Some(l) => {
            let nets: Vec<&str> = [l.subnet.as_deref(), l.ipv6_subnet.as_deref()]
                .into_iter()
                .flatten()
                .collect();
            let public: Vec<&str> = [Some(l.public_ip.as_str()), l.public_ipv6.as_deref()]
                .into_iter()
                .flatten()
                .collect();
            let exp = match s.lease_expires_in() {
                Some(secs) => format!(", expires in {}", duration(secs)),
                None => String::new(),
            };
            let _ = writeln!(
                o,
                "lease:     {} (public {}){exp}",
                nets.join(" "),
                public.join(" ")
            );
        }
        None => {
            let _ = writeln!(o, "lease:     none yet");
        }
    }
    let _ = write!(
        o,
        "backend:   {} on the {} dataplane",
        s.backend.name, s.backend.dataplane
    );
    let _ = match s.backend.requested.as_str() {
        "" => writeln!(o),
        r => writeln!(o, " (requested: {r})"),
    };
    for d in &s.backend.devices {
        let mut head = format!("device:    {} ({})", d.name, d.kind);
        if let Some(w) = d.workers {
            let _ = write!(head, ", {w} workers");
        }
        if let Some(f) = &d.offloads {
            let on: Vec<&str> = [
                (f.tun_vnet_hdr, "tun-vnet-hdr"),
                (f.tun_tso, "tun-tso"),
                (f.tun_uso, "tun-uso"),
                (f.tun_csum, "tun-csum"),
                (f.udp_gso, "udp-gso"),
                (f.udp_gro, "udp-gro"),
            ]
            .into_iter()
            .filter_map(|(b, n)| b.then_some(n))
            .collect();
            let _ = write!(
                head,
                ", offloads: {}",
                if on.is_empty() {
                    "none".to_string()
                } else {
                    on.join(" ")
                }
            );
        }
        let _ = writeln!(o, "{head}");
        if let Some(w) = &d.poll_window {
            let _ = writeln!(o, "  poll-on window: {w}");
        }
        if let Some(g) = &d.tunnel_gso {
            let _ = match (&g.tap, &g.reason) {
                (Some(tap), _) => writeln!(
                    o,
                    "  tunnel gso: {}, TCP super-packets through {tap}",
                    g.mode
                ),
                (None, _) if g.mode == "off" => writeln!(o, "  tunnel gso: off"),
                (None, why) => writeln!(
                    o,
                    "  tunnel gso: {}, UDP sockets: {}",
                    g.mode,
                    why.as_deref().unwrap_or("?")
                ),
            };
        }
        let _ = writeln!(o, "  {}", counters(&d.counters));
        if let Some(b) = &d.batching {
            let _ = writeln!(
                o,
                "  batching: {} per sendmmsg, {} per recvmmsg; {} tun reads, {} tun writes, {} gso, {} gro merges",
                ratio(d.counters.tx_packets, b.udp_sends),
                ratio(d.counters.rx_packets, b.udp_recvs),
                b.tun_reads,
                b.tun_writes,
                b.gso_super_packets,
                b.gro_coalesced
            );
            let _ = writeln!(
                o,
                "  workers: {} sleeps, {} empty rounds polled, {} poll backoffs",
                b.sleeps, b.poll_rounds, b.poll_backoffs
            );
        }
        if let Some(dr) = &d.drops {
            let nz: Vec<String> = dr
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(c, n)| format!("{} {n}", c.name))
                .collect();
            let _ = writeln!(
                o,
                "  drops: {}",
                if nz.is_empty() {
                    "none".to_string()
                } else {
                    nz.join(", ")
                }
            );
        }
    }
    let _ = writeln!(o, "peers:     {}", s.peers.len());
    // Both families of a dual-stack peer: its subnets and its endpoints.
    let rows: Vec<[String; 6]> = s
        .peers
        .iter()
        .map(|p| {
            let both = |a: Option<&str>, b: Option<&str>| {
                let v: Vec<&str> = [a, b].into_iter().flatten().collect();
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(" ")
                }
            };
            let public = Some(p.public_ip.as_str()).filter(|ip| *ip != "0.0.0.0");
            let mut traffic = p
                .counters
                .as_ref()
                .map_or_else(|| "-".to_string(), counters);
            if let Some(at) = p.last_handshake {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let ago = i64::try_from(now.saturating_sub(at)).unwrap_or(i64::MAX);
                let _ = write!(traffic, ", handshake {} ago", since(ago));
            }
            if let Some(path) = &p.path {
                let _ = write!(traffic, ", path {path}");
            }
            if let (Some(true), Some(at)) = (p.roamed, &p.endpoint) {
                let _ = write!(traffic, ", roamed to {at}");
            }
            [
                both(p.subnet.as_deref(), p.ipv6_subnet.as_deref()),
                both(public, p.public_ipv6.as_deref()),
                if p.backend_type.is_empty() {
                    "-".into()
                } else {
                    p.backend_type.clone()
                },
                p.device.clone().unwrap_or_else(|| "-".into()),
                reach(p.probe.as_ref()),
                traffic,
            ]
        })
        .collect();
    if !rows.is_empty() {
        let head = [
            "SUBNET", "ENDPOINT", "BACKEND", "DEVICE", "REACH", "TRAFFIC",
        ];
        let mut w = [20, 16, 10, 12, 11];
        for r in &rows {
            for (i, width) in w.iter_mut().enumerate() {
                *width = (*width).max(r[i].len());
            }
        }
        let line = |o: &mut String, c: [&str; 6]| {
            let _ = writeln!(
                o,
                "  {:<w0$} {:<w1$} {:<w2$} {:<w3$} {:<w4$} {}",
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                c[5],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
                w4 = w[4]
            );
        };
        line(&mut o, head);
        for r in &rows {
            line(&mut o, [&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
        }
    }
    o
}

/// The probes' verdict on a peer: `ok 0.42ms`, `LOST x3`, `?` (no verdict
/// yet) or `-` (not probed), then the path MTU once searched (`pmtu 1450`).
fn reach(p: Option<&ProbeStatus>) -> String {
    let Some(p) = p else {
        return "-".into();
    };
    let verdict = match (p.reachable, p.rtt_us) {
        (Some(true), Some(us)) => format!("ok {:.2}ms", us as f64 / 1000.0),
        (Some(true), None) => "ok".into(),
        (Some(false), _) => format!("LOST x{}", p.losses),
        (None, _) => "?".into(),
    };
    match p.pmtu {
        Some(m) => format!("{verdict} pmtu {m}"),
        None => verdict,
    }
}

fn counters(c: &Counters) -> String {
    format!(
        "tx {} pkts / {}, rx {} pkts / {}",
        c.tx_packets,
        bytes(c.tx_bytes),
        c.rx_packets,
        bytes(c.rx_bytes)
    )
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.1} pkts", a as f64 / b as f64)
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A past span: like [`duration`], without the "expired" mark.
fn since(secs: i64) -> String {
    if secs <= 0 {
        "0s".into()
    } else {
        duration(secs)
    }
}

fn duration(secs: i64) -> String {
    if secs <= 0 {
        return "0s (expired)".into();
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}
