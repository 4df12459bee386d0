//! What the queue's producer side counts, registered by the process that
//! runs it (the API) in its own registry.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// The relay's counters.
#[derive(Debug, Default)]
pub struct RelayMetrics {
    /// Broker messages published from the outbox and confirmed.
    pub outbox_published: Counter,
    /// Outbox rows claimed in the last round.
    pub outbox_backlog: Gauge,
    /// First attempts published and confirmed straight after their ingest,
    /// without an outbox row.
    pub first_attempts_published: Counter,
}

impl RelayMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("outbox_published", "Broker messages published and confirmed", self.outbox_published.clone());
        registry.register(
            "outbox_backlog",
            "Messages waiting in the outbox at the last scan",
            self.outbox_backlog.clone(),
        );
        registry.register(
            "first_attempts_published",
            "First attempts published and confirmed straight after their ingest, without an outbox row",
            self.first_attempts_published.clone(),
        );
    }
}
