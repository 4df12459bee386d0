//! How far this dispatcher's consumers have got in each lane: the latest
//! `enters_at` of a message received from it. A work queue hands messages
//! out in the order they entered it, so every message that entered the lane
//! before that time has been handed out. Written to the store about once a
//! second (one statement, not one per message), where the sweeper reads it
//! to tell a delivery in no queue from one behind a backlog.

use std::{
    sync::atomic::{AtomicI64, Ordering},
    time::Duration,
};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use webhooks_model::Lane;
use webhooks_store::queue::Outbox;

/// How often the watermarks are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Nothing received yet.
const NONE: i64 = i64::MIN;

/// The watermark of each lane, in milliseconds since the epoch.
#[derive(Debug)]
pub(crate) struct Watermarks {
    default: AtomicI64,
    bulk: AtomicI64,
}

impl Default for Watermarks {
    fn default() -> Self {
        Watermarks { default: AtomicI64::new(NONE), bulk: AtomicI64::new(NONE) }
    }
}

impl Watermarks {
    fn of(&self, lane: Lane) -> &AtomicI64 {
        match lane {
            Lane::Default => &self.default,
            Lane::Bulk => &self.bulk,
        }
    }

    /// A message that entered `lane` at `enters_at` at the earliest was
    /// received. Messages from writers that do not say are no evidence.
    pub(crate) fn received(&self, lane: Lane, enters_at: Option<DateTime<Utc>>) {
        if let Some(at) = enters_at {
            self.of(lane).fetch_max(at.timestamp_millis(), Ordering::Relaxed);
        }
    }

    fn current(&self) -> [(Lane, i64); 2] {
        [Lane::Default, Lane::Bulk].map(|lane| (lane, self.of(lane).load(Ordering::Relaxed)))
    }
}

/// Writes what moved since the last write, every [`FLUSH_EVERY`], until
/// `shutdown`, and once more then.
pub(crate) async fn flush(watermarks: &Watermarks, outbox: &Outbox, shutdown: &CancellationToken) {
    let mut written = [(Lane::Default, NONE), (Lane::Bulk, NONE)];
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            () = tokio::time::sleep(FLUSH_EVERY) => false,
        };
        let current = watermarks.current();
        let moved: Vec<(Lane, DateTime<Utc>)> = current
            .iter()
            .zip(&written)
            .filter(|((_, now), (_, before))| now > before)
            .filter_map(|((lane, ms), _)| Some((*lane, DateTime::from_timestamp_millis(*ms)?)))
            .collect();
        if !moved.is_empty() {
            match outbox.advance_watermarks(&moved).await {
                Ok(()) => written = current,
                Err(error) => tracing::debug!(%error, "cannot write the lane watermarks; trying again"),
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watermark_only_moves_forward_and_messages_that_do_not_say_count_for_nothing() {
        let watermarks = Watermarks::default();
        let at = |s: i64| DateTime::from_timestamp(s, 0);
        watermarks.received(Lane::Default, at(10));
        watermarks.received(Lane::Default, at(5));
        watermarks.received(Lane::Default, None);
        watermarks.received(Lane::Bulk, None);
        assert_eq!(watermarks.current(), [(Lane::Default, 10_000), (Lane::Bulk, NONE)]);
    }
}
