//! The process's presence (DESIGN.md, "One clock" and "Knowing what is
//! stranded"): once a second it tells the store that it is alive, how far
//! its host clock is off, and what the sweeper needs of it (an API: how far
//! its first attempts are confirmed; a dispatcher: how far its workers have
//! got in each work queue). The store answers with the database's clock,
//! which the process takes as its own from then on.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_store::queue::{Outbox, Presence};

use super::{inflight::Inflight, marks::Marks};
use crate::metrics::ClockMetrics;

/// How often a process says it is alive.
pub(crate) const EVERY: Duration = Duration::from_secs(1);

/// The longest round trip of a heartbeat whose answer sets the clock.
const SHARP_ROUND_TRIP: Duration = Duration::from_millis(100);

/// Every how many heartbeats a process looks at the history's partitions.
const PARTITIONS_EVERY: u64 = 60;

/// What a process reports besides being alive.
#[derive(Debug, Clone)]
pub(crate) enum Reports {
    /// An API: its first attempts on their way.
    Api(Arc<Inflight>),
    /// A dispatcher: how far its workers have got.
    Dispatcher(Arc<Marks>),
}

/// One process's heartbeat.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    pub(crate) outbox: Outbox,
    pub(crate) id: Uuid,
    pub(crate) reports: Reports,
    pub(crate) clock: Arc<ClockMetrics>,
}

impl Heartbeat {
    /// Says so for the first time, before the process takes any work: a
    /// process the store never heard of cannot be found lost.
    pub(crate) async fn first(&self) {
        if self.once(chrono::Duration::zero()).await.is_none() {
            tracing::warn!("cannot tell the store this process is alive yet; it will keep trying");
        }
    }

    /// Says so at once and every [`EVERY`] until `shutdown`, and once more
    /// then.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut ahead = self.once(chrono::Duration::zero()).await.unwrap_or_default();
        for beat in 1u64.. {
            let stopping = tokio::select! {
                () = shutdown.cancelled() => true,
                () = tokio::time::sleep(EVERY) => false,
            };
            if let Some(measured) = self.once(ahead).await {
                ahead = measured;
            }
            if stopping {
                return;
            }
            // The history's partitions: a new day's, a conversion.
            if beat % PARTITIONS_EVERY == 0
                && let Err(error) = self.outbox.keep_partitions().await
            {
                tracing::warn!(%error, "cannot keep the history's partitions; trying again later");
            }
        }
    }

    /// Says so once; returns how far the host's clock is ahead of the
    /// database's (measured again, or `ahead` when the answer was too slow
    /// to measure by), when the store answered.
    async fn once(&self, ahead: chrono::Duration) -> Option<chrono::Duration> {
        let now = webhooks_model::time::now();
        let (kind, confirmed_through, queues) = match &self.reports {
            Reports::Api(inflight) => ("api", Some(inflight.confirmed_through(now)), Vec::new()),
            Reports::Dispatcher(marks) => ("dispatcher", None, marks.current()),
        };
        let presence = Presence { id: self.id, kind, host_clock_ahead: ahead, confirmed_through, queues };
        let sent = Instant::now();
        match self.outbox.seen(&presence).await {
            Ok(database_now) => {
                // The database read its clock about halfway through the
                // round trip; one that waited (for a connection, a lock) is
                // too blurred to set the clock by.
                let round_trip = sent.elapsed();
                if round_trip > SHARP_ROUND_TRIP {
                    return Some(ahead);
                }
                let at = sent + round_trip / 2;
                let ahead = webhooks_model::time::set_reference(database_now, at.into_std());
                self.clock.offset.set(ahead.num_microseconds().unwrap_or(0) as f64 / 1e6);
                self.clock.measured.set(database_now.timestamp_micros() as f64 / 1e6);
                Some(ahead)
            }
            Err(error) => {
                tracing::debug!(%error, "cannot tell the store this process is alive; trying again");
                None
            }
        }
    }
}
