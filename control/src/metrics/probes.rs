//! The overlay probes' half of `/metrics` (docs/probes.md): per peer,
//! whether it is reachable, the last round trip and the probe counts, from
//! one [`Status`] snapshot's peers (nothing kept between scrapes).

use prometheus_client::collector::Collector as PromCollector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::view::Status;
use crate::view::model::{PeerStatus, ProbeStatus};

/// The snapshot to encode.
#[derive(Debug)]
pub(super) struct Collector(pub(super) Status);

type Fmt = Result<(), std::fmt::Error>;

fn labels(p: &PeerStatus) -> Vec<(&'static str, String)> {
    vec![
        ("subnet", p.subnet.clone().unwrap_or_default()),
        ("public_ip", p.public_ip.clone()),
    ]
}

impl Collector {
    fn probed(&self) -> impl Iterator<Item = (&PeerStatus, &ProbeStatus)> {
        self.0
            .peers
            .iter()
            .filter_map(|p| Some((p, p.probe.as_ref()?)))
    }
}

impl PromCollector for Collector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        if self.probed().next().is_none() {
            return Ok(());
        }
        let mut m = enc.encode_descriptor(
            "peer_reachable",
            "Whether the peer answers overlay probes (1) or lost the last 3 (0); absent before a verdict",
            None,
            MetricType::Gauge,
        )?;
        for (p, s) in self.probed() {
            if let Some(r) = s.reachable {
                ConstGauge::new(i64::from(r)).encode(m.encode_family(&labels(p))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "peer_rtt_seconds",
            "The last overlay probe round trip to the peer",
            None,
            MetricType::Gauge,
        )?;
        for (p, s) in self.probed() {
            if let Some(us) = s.rtt_us {
                ConstGauge::new(us as f64 / 1e6).encode(m.encode_family(&labels(p))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "peer_path_mtu_bytes",
            "The largest packet the path to the peer carries, as the last path-MTU search found it",
            None,
            MetricType::Gauge,
        )?;
        for (p, s) in self.probed() {
            if let Some(mtu) = s.pmtu {
                ConstGauge::new(i64::from(mtu)).encode(m.encode_family(&labels(p))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "peer_probe_losses",
            "Consecutive overlay probes to the peer that got no answer",
            None,
            MetricType::Gauge,
        )?;
        for (p, s) in self.probed() {
            ConstGauge::new(i64::from(s.losses)).encode(m.encode_family(&labels(p))?)?;
        }
        let mut m = enc.encode_descriptor(
            "peer_probes_sent",
            "Overlay probes sent to the peer",
            None,
            MetricType::Counter,
        )?;
        for (p, s) in self.probed() {
            ConstCounter::new(s.sent).encode(m.encode_family(&labels(p))?)?;
        }
        let mut m = enc.encode_descriptor(
            "peer_probes_received",
            "Overlay probe acks received from the peer",
            None,
            MetricType::Counter,
        )?;
        for (p, s) in self.probed() {
            ConstCounter::new(s.received).encode(m.encode_family(&labels(p))?)?;
        }
        Ok(())
    }
}
