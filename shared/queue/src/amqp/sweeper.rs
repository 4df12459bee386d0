//! The sweeper of the distributed mode: every `SWEEP_INTERVAL`, deliveries
//! that are owed, due for longer than `SWEEP_INTERVAL` and named by no outbox
//! row are queued again under a new generation (see the README, "Nothing
//! stranded, nothing looping"). Each batch is one statement with `SKIP
//! LOCKED`, so any number of API processes sweep side by side.

use std::{sync::Arc, time::Duration};

use lapin::options::QueueDeclareOptions;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use webhooks_model::{Lane, Topology};
use webhooks_store::queue::{Outbox, Swept};

/// Deliveries swept per statement.
const BATCH: i64 = 500;
/// Batches per round at most; the rest waits for the next round.
const ROUND: usize = 40;
/// Sweeps without an attempt in between after which a delivery is failed.
pub const SWEEP_LIMIT: i32 = 5;

/// How the sweeper runs.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// `SWEEP_INTERVAL`: how often it looks.
    pub interval: Duration,
}

/// What the sweeper needs.
pub(crate) struct Sweeper {
    pub(crate) outbox: Outbox,
    pub(crate) amqp_url: String,
    pub(crate) topology: Topology,
    pub(crate) settings: SweepSettings,
    /// Wakes the relay once something was queued.
    pub(crate) relay_wake: Arc<Notify>,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Sweeper {
    /// Sweeps every `interval` until `shutdown`, the first time one interval
    /// after the start (a process that just started has no view of the queue).
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.interval) => {}
            }
            // Whatever the queues hold: a turn no settling handed on is
            // stranded however long the queues are.
            self.release_turns().await;
            // Deliveries set aside behind a hung endpoint have no message
            // anywhere: they are queued again once due, whatever the queues
            // hold.
            let stranded = match self.work_queue_depth().await {
                Ok(0) => true,
                Ok(ready) => {
                    tracing::debug!(ready, "work queue has a backlog; sweeping stranded deliveries next round");
                    false
                }
                Err(error) => {
                    tracing::debug!(error = format!("{error:#}"), "cannot see the work queue; sweeping next round");
                    false
                }
            };
            self.round(stranded).await;
        }
    }

    /// Messages ready in the two work queues. A backlog there may hold the
    /// deliveries that look stranded, so a round sweeps only when both are
    /// empty.
    async fn work_queue_depth(&self) -> anyhow::Result<u32> {
        let connection = super::connect(&self.amqp_url, "webhooks-api sweeper").await?;
        let channel = connection.create_channel().await?;
        let mut depth = 0;
        for lane in [Lane::Default, Lane::Bulk] {
            let queue = channel
                .queue_declare(
                    self.topology.work_queue(lane).as_str().into(),
                    QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() },
                    Default::default(),
                )
                .await;
            match queue {
                Ok(queue) => depth += queue.message_count(),
                Err(error) => {
                    let _ = connection.close(200, "bye".into()).await;
                    return Err(error.into());
                }
            }
        }
        let _ = connection.close(200, "bye".into()).await;
        Ok(depth)
    }

    /// One round: set-aside deliveries that are due and, with `stranded`,
    /// stranded ones.
    async fn round(&self, stranded: bool) {
        let mut total = Swept::default();
        for _ in 0..ROUND {
            match self.outbox.sweep_stranded(self.settings.interval, BATCH, SWEEP_LIMIT, stranded).await {
                Ok(swept) => {
                    total.queued += swept.queued;
                    total.returned += swept.returned;
                    total.failed += swept.failed;
                    if swept.queued + swept.returned > 0 {
                        self.relay_wake.notify_one();
                    }
                    if swept.queued + swept.returned + swept.failed < u64::try_from(BATCH).unwrap_or(u64::MAX) {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = format!("{error:#}"), "sweep failed; trying next round");
                    break;
                }
            }
        }
        if total.queued > 0 {
            tracing::warn!(queued = total.queued, "stranded deliveries queued again");
        }
        if total.returned > 0 {
            tracing::info!(returned = total.returned, "deliveries set aside behind hanging endpoints queued again");
        }
        if total.failed > 0 {
            tracing::error!(failed = total.failed, "deliveries queued again {SWEEP_LIMIT} times in vain; failed");
        }
    }

    /// Releases the turns of ordered endpoints that no settling handed on (a
    /// delivery the sweeper failed, one cancelled by narrowed categories, an
    /// endpoint switched to ordered while a delivery was in flight).
    async fn release_turns(&self) {
        match self.outbox.release_stalled_turns(BATCH).await {
            Ok(0) => {}
            Ok(released) => {
                self.relay_wake.notify_one();
                tracing::info!(released, "waiting deliveries of ordered endpoints released");
            }
            Err(error) => tracing::warn!(error = format!("{error:#}"), "cannot release waiting deliveries"),
        }
    }
}
