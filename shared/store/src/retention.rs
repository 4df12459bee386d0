//! Retention (`RETENTION`): what is older than a cutoff is deleted, one small
//! batch per call, so that no sweep holds locks (or, in standalone mode, the
//! one writer) long enough to stall ingest or delivery.
//!
//! A batch deletes, each part bounded by its `limit`:
//!
//! - delivery log entries (`delivery_attempts`) older than the cutoff, by
//!   their own time;
//! - events older than the cutoff, each with all of its deliveries and their
//!   log entries (a delivery cannot outlive its event, so a delivery is
//!   deleted with its event, never on its own). An event with a delivery
//!   still `pending` or `retrying` is kept until it settles: an attempt may
//!   be in flight, and its record names the delivery.
//!
//! Endpoints, their lifecycle record (`endpoint_changes`), API keys and
//! developers are never deleted here. Outbox rows that name a deleted
//! delivery (only possible for one cancelled before its message was
//! published) are dropped by the relay.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Rows per part of one batch: small enough that a batch commits in
/// milliseconds.
pub const RETENTION_BATCH: u32 = 500;

/// The cutoff of a sweep that starts now and keeps `retention`: what is
/// older goes. Fixed for the whole sweep, so a sweep ends however fast new
/// rows come in. `None` when that is before any time there can be (nothing
/// is that old).
pub fn retention_cutoff(retention: Duration) -> Option<DateTime<Utc>> {
    webhooks_model::time::now().checked_sub_signed(chrono::Duration::from_std(retention).ok()?)
}

/// What one batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Log entries deleted for their own age.
    pub logs: u64,
    /// Events deleted for their age.
    pub events: u64,
    /// Deliveries deleted with those events.
    pub deliveries: u64,
    /// Log entries of those deliveries (younger than the cutoff; the older
    /// ones are counted in `logs`).
    pub delivery_logs: u64,
}

impl Purged {
    /// Whether either part came back full at `limit`: there may be more, so
    /// the sweep goes on with another batch.
    pub fn full(&self, limit: u32) -> bool {
        self.logs >= u64::from(limit) || self.events >= u64::from(limit)
    }

    /// Adds another batch's counts.
    pub fn add(&mut self, other: Purged) {
        self.logs += other.logs;
        self.events += other.events;
        self.deliveries += other.deliveries;
        self.delivery_logs += other.delivery_logs;
    }

    /// Whether nothing was deleted.
    pub fn is_empty(&self) -> bool {
        *self == Purged::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_full_when_either_part_is() {
        let limit = 3;
        assert!(!Purged::default().full(limit));
        assert!(Purged { logs: 3, ..Purged::default() }.full(limit));
        assert!(Purged { events: 3, ..Purged::default() }.full(limit));
        // Deliveries and their logs come with the events and are not bounded
        // by the limit themselves.
        assert!(!Purged { events: 2, deliveries: 10, delivery_logs: 30, logs: 2 }.full(limit));
        let mut total = Purged::default();
        total.add(Purged { logs: 1, events: 2, deliveries: 3, delivery_logs: 4 });
        total.add(Purged { logs: 1, events: 2, deliveries: 3, delivery_logs: 4 });
        assert_eq!(total, Purged { logs: 2, events: 4, deliveries: 6, delivery_logs: 8 });
        assert!(!total.is_empty());
    }

    #[test]
    fn the_cutoff_is_the_retention_before_now() {
        let before = webhooks_model::time::now();
        let cutoff = retention_cutoff(Duration::from_secs(3600)).unwrap();
        let after = webhooks_model::time::now();
        let hour = chrono::Duration::hours(1);
        assert!(before - hour <= cutoff && cutoff <= after - hour, "{cutoff}");
        assert_eq!(retention_cutoff(Duration::from_secs(u64::MAX)), None, "older than time itself");
    }
}
