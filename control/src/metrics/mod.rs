//! weftd's Prometheus metrics, served as Prometheus text (format 0.0.4) on
//! `GET /metrics` of the healthz listener (`--healthz-port`).
//!
//! Shape (every name has the `weft_` prefix; counters end in `_total`):
//!
//! ```text
//! # daemon (updated by the main loop, never by the dataplane)
//! weft_lease_acquisitions_total                       counter
//! weft_lease_renewals_total{result="ok|error"}        counter
//! weft_lease_renew_delay_seconds                      histogram   renewal started this long after it was due
//! weft_lease_events_total{kind="snapshot|added|removed"} counter
//! weft_peer_apply_seconds{op="add|remove"}            histogram   lease event -> route/peer in place
//! # dataplane (read from the backend on each scrape, see crate::view)
//! weft_backend_info{backend,dataplane}                gauge 1
//! weft_peers{backend}                                 gauge
//! weft_lease_expiry_timestamp_seconds                 gauge
//! weft_{tx,rx}_{packets,bytes}_total{backend,dataplane,device}     counter
//! weft_drops_total{backend,device,reason}             counter  reason = unknown_peer, spoofed_source,
//!                                                       bad_vni, wrong_dst_mac, decrypt_failure, no_route, mtu, ...
//!                                                       (every weft_engine::DropReason, by its name)
//! weft_udp_send_calls_total / weft_udp_recv_calls_total /
//! weft_tun_reads_total / weft_tun_writes_total /
//! weft_gso_super_packets_total / weft_gro_coalesced_total /
//! weft_handoffs_total / weft_icmp_sent_total /
//! weft_worker_sleeps_total / weft_poll_rounds_total /
//! weft_poll_backoffs_total{backend,device}            counter
//!                                                       (every weft_engine::Batching counter, by its
//!                                                       metric name; packets per syscall = packets / calls)
//! weft_offload_enabled{backend,device,offload="tun_vnet_hdr|tun_tso|tun_uso|tun_csum|udp_gso|udp_gro"} gauge 0|1
//!                                                       (and offload="tunnel_gso" on the userspace
//!                                                       IPv4 vxlan device: the tunnel TAP in use, --tunnel-gso)
//! weft_engine_workers{backend,device}                 gauge
//! weft_peer_{tx,rx}_{packets,bytes}_total{backend,device,subnet,endpoint}  counter
//!                                                       (only where the dataplane keeps per-peer counters)
//! ```
//!
//! Contract: a scrape reads the latest published snapshots
//! ([`crate::view::Observer::status`], which sums the engine's per-worker
//! counters once) and never asks the main loop; it costs no work at all on
//! the packet path. Before the backend is set up only the daemon metrics
//! are served.

mod dataplane;
mod probes;

use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::view::Status;

/// The `Content-Type` of [`DaemonMetrics::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = Vec<(&'static str, &'static str)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// The daemon's own metrics (see the module docs).
#[derive(Debug)]
pub struct DaemonMetrics {
    registry: Registry,
    acquisitions: Counter,
    renewals: Family<Labels, Counter>,
    events: Family<Labels, Counter>,
    apply: HistogramFamily,
    renew_delay: Histogram,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        DaemonMetrics::new()
    }
}

fn apply_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

// === impl DaemonMetrics ===

impl DaemonMetrics {
    /// Registers every daemon metric at zero.
    pub fn new() -> DaemonMetrics {
        let mut registry = Registry::with_prefix("weft");
        let acquisitions = Counter::default();
        let renewals = Family::<Labels, Counter>::default();
        let events = Family::<Labels, Counter>::default();
        let apply: HistogramFamily = Family::new_with_constructor(apply_histogram);
        let renew_delay = apply_histogram();
        registry.register(
            "lease_acquisitions",
            "Leases acquired by this node",
            acquisitions.clone(),
        );
        registry.register(
            "lease_renewals",
            "Lease renewals by result",
            renewals.clone(),
        );
        registry.register(
            "lease_events",
            "Lease events received from the store, by kind",
            events.clone(),
        );
        registry.register(
            "peer_apply_seconds",
            "Time from a lease event to the peer's routes and dataplane entry being in place",
            apply.clone(),
        );
        registry.register(
            "lease_renew_delay_seconds",
            "How long after it was due each lease renewal started",
            renew_delay.clone(),
        );
        // Zero series, so that dashboards see them before the first event.
        for r in ["ok", "error"] {
            let _ = renewals.get_or_create(&vec![("result", r)]);
        }
        for k in ["snapshot", "added", "removed"] {
            let _ = events.get_or_create(&vec![("kind", k)]);
        }
        for op in ["add", "remove"] {
            let _ = apply.get_or_create(&vec![("op", op)]);
        }
        DaemonMetrics {
            registry,
            acquisitions,
            renewals,
            events,
            apply,
            renew_delay,
        }
    }

    /// A lease was acquired.
    pub fn lease_acquired(&self) {
        self.acquisitions.inc();
    }

    /// A renewal finished.
    pub fn lease_renewed(&self, ok: bool) {
        self.renewals
            .get_or_create(&vec![("result", if ok { "ok" } else { "error" })])
            .inc();
    }

    /// A renewal started `late` after it was due.
    pub fn lease_renew_started(&self, late: Duration) {
        self.renew_delay.observe(late.as_secs_f64());
    }

    /// A lease event of `kind` (`snapshot`, `added`, `removed`) arrived.
    pub fn lease_event(&self, kind: &'static str) {
        self.events.get_or_create(&vec![("kind", kind)]).inc();
    }

    /// A peer change (`add` or `remove`) was in place `took` after its lease event.
    pub fn peer_applied(&self, add: bool, took: Duration) {
        self.apply
            .get_or_create(&vec![("op", if add { "add" } else { "remove" })])
            .observe(took.as_secs_f64());
    }

    /// The exposition: daemon metrics, then the dataplane's from `status`.
    pub fn encode(&self, status: Option<&Status>) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!("metrics: encoding failed: {e}");
        }
        if let Some(s) = status {
            let mut reg = Registry::with_prefix("weft");
            reg.register_collector(Box::new(dataplane::Collector(s.clone())));
            reg.register_collector(Box::new(probes::Collector(s.clone())));
            if let Err(e) = prometheus_text::encode(&mut out, &reg) {
                tracing::warn!("metrics: encoding failed: {e}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
