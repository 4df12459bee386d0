//! Prometheus metrics of a dispatcher.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The outcome label of `deliveries_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// The dispatcher's metrics, in its own registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Messages handled, by outcome: succeeded, retrying, failed, held,
    /// cancelled, deferred, requeued, dead_lettered.
    pub deliveries: Family<OutcomeLabels, Counter>,
    /// Duration of each HTTP attempt.
    pub attempt_duration: Histogram,
    /// Attempts in flight now.
    pub in_flight: Gauge,
    /// Time from event acceptance to the start of its first attempt.
    pub queue_lag: Histogram,
    /// The process's clock against the database's (distributed mode).
    pub clock: std::sync::Arc<webhooks_queue::metrics::ClockMetrics>,
}

impl Metrics {
    /// Fresh, registered metrics.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("webhooks_dispatcher");
        let buckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        let metrics = Metrics {
            deliveries: Family::default(),
            attempt_duration: Histogram::new(buckets),
            in_flight: Gauge::default(),
            queue_lag: Histogram::new(buckets),
            clock: std::sync::Arc::default(),
            registry: Registry::default(),
        };
        registry.register("deliveries", "Delivery messages handled, by outcome", metrics.deliveries.clone());
        registry.register(
            "attempt_duration_seconds",
            "Duration of HTTP delivery attempts",
            metrics.attempt_duration.clone(),
        );
        registry.register("in_flight", "Delivery attempts in flight", metrics.in_flight.clone());
        registry.register(
            "queue_lag_seconds",
            "Time from event acceptance to its first attempt",
            metrics.queue_lag.clone(),
        );
        metrics.clock.register(&mut registry);
        Metrics { registry, ..metrics }
    }

    /// Counts one handled message.
    pub fn outcome(&self, outcome: &'static str) {
        self.deliveries.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The registry, for a process that serves these metrics beside its own
    /// (standalone mode).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
