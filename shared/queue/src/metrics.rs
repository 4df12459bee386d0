//! What the queue's producer side counts, registered by the process that
//! runs it (the API) in its own registry.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use std::sync::Arc;

use webhooks_model::Lane;

/// Everything the producer side counts.
#[derive(Debug, Default)]
pub struct QueueMetrics {
    pub relay: Arc<RelayMetrics>,
    pub sweep: Arc<SweepMetrics>,
}

impl QueueMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        self.relay.register(registry);
        self.sweep.register(registry);
    }
}

/// The relay's counters.
#[derive(Debug, Default)]
pub struct RelayMetrics {
    /// Broker messages published from the outbox and confirmed.
    pub outbox_published: Counter,
    /// First attempts published and confirmed straight after their ingest,
    /// without an outbox row.
    pub first_attempts_published: Counter,
}

impl RelayMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("outbox_published", "Broker messages published and confirmed", self.outbox_published.clone());
        registry.register(
            "first_attempts_published",
            "First attempts published and confirmed straight after their ingest, without an outbox row",
            self.first_attempts_published.clone(),
        );
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
/// Labels of a gauge per lane.
pub struct LaneLabels {
    pub lane: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// What the sweeper sees and does (distributed mode).
#[derive(Debug, Default)]
pub struct SweepMetrics {
    stranded: Family<LaneLabels, Gauge>,
    swept: Family<KindLabels, Counter>,
    /// Messages in `{p}.dead`.
    pub dead_letters: Gauge,
    /// Outbox rows waiting to be published.
    pub outbox_rows: Gauge,
    /// Sweep rounds done.
    pub rounds: Counter,
    /// Sweep statements that failed.
    pub round_errors: Counter,
}

impl SweepMetrics {
    /// Deliveries of `lane` due in no queue, at the last round.
    pub fn stranded(&self, lane: Lane) -> Gauge {
        self.stranded.get_or_create(&LaneLabels { lane: lane.as_str() }).clone()
    }

    /// Deliveries the sweeper handled, by `kind`: `stranded` (queued
    /// again), `set_aside` (queued again once due), `failed` (queued again
    /// too often in vain), `turn_released`.
    pub fn swept(&self, kind: &'static str) -> Counter {
        self.swept.get_or_create(&KindLabels { kind }).clone()
    }

    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        // Both lanes read 0 from the start, not absent until the first round.
        for lane in [Lane::Default, Lane::Bulk] {
            self.stranded(lane);
        }
        registry.register(
            "deliveries_stranded",
            "Deliveries due that no queue holds, by lane, at the last sweep",
            self.stranded.clone(),
        );
        registry.register("sweeper_deliveries", "Deliveries the sweeper handled, by kind", self.swept.clone());
        registry.register("dead_letters", "Messages in the dead-letter queue", self.dead_letters.clone());
        registry.register("outbox_rows", "Outbox rows waiting to be published", self.outbox_rows.clone());
        registry.register("sweeper_rounds", "Sweep rounds done", self.rounds.clone());
        registry.register("sweeper_errors", "Sweep statements that failed", self.round_errors.clone());
    }
}
