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
    pub clock: Arc<ClockMetrics>,
}

impl QueueMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        self.relay.register(registry);
        self.sweep.register(registry);
        self.clock.register(registry);
    }
}

/// The process's clock against the database's (DESIGN.md, "One clock"),
/// in both programs of the distributed mode.
#[derive(Debug, Default)]
pub struct ClockMetrics {
    /// How far the host's clock is ahead of the database's (negative:
    /// behind), as last measured.
    pub offset: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// When it was last measured, in seconds since the epoch.
    pub measured: Gauge<f64, std::sync::atomic::AtomicU64>,
    stamps_ahead: Counter,
    /// When a stamp ahead was last logged (seconds since the epoch).
    logged: std::sync::atomic::AtomicI64,
}

impl ClockMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "clock_offset_seconds",
            "How far this host's clock is ahead of the database's (negative: behind); the process stamps the database's time",
            self.offset.clone(),
        );
        registry.register(
            "clock_measured_timestamp_seconds",
            "When the clock offset was last measured",
            self.measured.clone(),
        );
        registry.register(
            "clock_stamps_ahead",
            "Times stamped by another process received more than 5 s ahead of this one's clock",
            self.stamps_ahead.clone(),
        );
    }

    /// A time another process stamped (`what`), received now: counted and
    /// logged (at most once a minute) when it is ahead of this process's
    /// clock by more than processes on one clock can be apart.
    pub fn stamp(&self, at: chrono::DateTime<chrono::Utc>, what: &'static str) {
        let now = webhooks_model::time::now();
        if at - now <= crate::amqp::AHEAD_ALLOWED {
            return;
        }
        self.stamps_ahead.inc();
        let minute = now.timestamp() / 60;
        if self.logged.swap(minute, std::sync::atomic::Ordering::Relaxed) != minute {
            tracing::warn!(
                what,
                ahead_ms = (at - now).num_milliseconds(),
                "a time stamped by another process is ahead of this one's clock; is a process's clock wrong?"
            );
        }
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

/// What the sweeper sees and does (distributed mode).
#[derive(Debug, Default)]
pub struct SweepMetrics {
    stranded: Family<LaneLabels, Gauge>,
    watermarks: Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
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

    /// How far the watermark of a work queue (`default`, `bulk`, `swept`)
    /// is from the database's now, in seconds (at most 0: a queue with a
    /// backlog lags).
    pub fn watermark_offset(&self, queue: &'static str) -> Gauge<f64, std::sync::atomic::AtomicU64> {
        self.watermarks.get_or_create(&QueueLabels { queue }).clone()
    }

    /// Deliveries the sweeper handled, by `kind`: `stranded` (queued
    /// again), `lost_process` (first attempts a process lost when it died,
    /// queued again), `set_aside` (queued again once due), `failed` (queued
    /// again too often in vain), `turn_released`.
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
        registry.register(
            "watermark_offset_seconds",
            "How far each work queue's watermark is from the database's now (negative: behind), at the last observation",
            self.watermarks.clone(),
        );
        registry.register("sweeper_deliveries", "Deliveries the sweeper handled, by kind", self.swept.clone());
        registry.register("dead_letters", "Messages in the dead-letter queue", self.dead_letters.clone());
        registry.register("outbox_rows", "Outbox rows waiting to be published", self.outbox_rows.clone());
        registry.register("sweeper_rounds", "Sweep rounds done", self.rounds.clone());
        registry.register("sweeper_errors", "Sweep statements that failed", self.round_errors.clone());
    }
}
