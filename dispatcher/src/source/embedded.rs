//! The embedded source of standalone mode: the deliveries table of the SQLite
//! store is the queue. A delivery is due when it is `pending` or `retrying`
//! and its next attempt time has come; this loop claims due deliveries while
//! it has free slots, and the handler's record settles them (a retry is the
//! recorded next attempt time, so retries survive any restart). Claims of a
//! process that died are released at the next start: one process holds the
//! data directory at a time.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, Semaphore, broadcast::error::RecvError};
use tokio_util::sync::CancellationToken;
use webhooks_model::Lane;
use webhooks_queue::DeliveryMessage;
use webhooks_store::sqlite::SqliteStore;

use super::{Handlers, Ticket};
use crate::worker::{self, Context};

/// The longest the loop sleeps without looking at the table: a safety net
/// for wake-ups it did not get.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// Deliveries claimed per look at most.
const CLAIM_BATCH: usize = 256;

/// The longest pause between tries to put a delivery back while the store
/// fails.
const PUT_BACK_PAUSE: Duration = Duration::from_secs(5);

/// A delivery claimed from the table. A ticket dropped unsettled (its handler
/// panicked) puts the delivery back, so no claim outlives its handler.
#[derive(Debug)]
pub struct EmbeddedTicket {
    store: SqliteStore,
    wake: Arc<Notify>,
    delivery_id: i64,
    generation: Option<i32>,
    settled: bool,
}

impl EmbeddedTicket {
    pub(super) fn done(mut self) {
        self.settled = true;
        // The record released the claim; the next attempt time may be sooner
        // than what the loop sleeps towards.
        self.wake.notify_one();
    }

    pub(super) async fn defer(
        mut self,
        context: &Context,
        message: &DeliveryMessage,
        delay: Duration,
        outcome: &'static str,
    ) {
        context.metrics.outcome(outcome);
        self.settled = true;
        let parks = Some((message.parks, message.failures));
        let back = PutBack { delay, parks, pace_ticket: message.pace_ticket };
        put_back(&self.store, &self.wake, self.delivery_id, self.generation, back).await;
    }

    pub(super) async fn requeue(mut self) {
        self.settled = true;
        put_back(&self.store, &self.wake, self.delivery_id, self.generation, PutBack::now()).await;
    }

    /// Records the delivery `failed`, with `reason` in its log. While the
    /// store fails, the delivery stays owed instead, due again after the
    /// longest retry delay.
    pub(super) async fn give_up(mut self, context: &Context, message: &DeliveryMessage, reason: &str) {
        self.settled = true;
        if context.recorder.record(worker::given_up(message, reason)).await.is_ok() {
            self.wake.notify_one();
            return;
        }
        let longest = context.common.retry_schedule.delays().iter().max().copied().unwrap_or(Duration::from_secs(60));
        let back = PutBack { delay: longest, ..PutBack::now() };
        put_back(&self.store, &self.wake, self.delivery_id, self.generation, back).await;
    }
}

impl Drop for EmbeddedTicket {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (store, wake, delivery_id, generation) =
            (self.store.clone(), self.wake.clone(), self.delivery_id, self.generation);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { put_back(&store, &wake, delivery_id, generation, PutBack::now()).await });
        }
    }
}

/// How a delivery goes back to the queue.
#[derive(Debug, Clone, Copy)]
struct PutBack {
    /// Due again after this long.
    delay: Duration,
    /// The message's park counts to keep (`None`: the stored ones).
    parks: Option<(u32, u32)>,
    /// The ticket it took in its endpoint's pace, if it did.
    pace_ticket: Option<i64>,
}

impl PutBack {
    /// Due again at once, nothing else changed.
    fn now() -> PutBack {
        PutBack { delay: Duration::ZERO, parks: None, pace_ticket: None }
    }
}

/// Releases the claim on a delivery, due again after a delay, without
/// counting an attempt. While the store fails (a full disk) it tries again,
/// so the delivery is not left claimed, out of the queue, until a restart.
async fn put_back(store: &SqliteStore, wake: &Notify, delivery_id: i64, generation: Option<i32>, back: PutBack) {
    let mut pause = Duration::from_millis(100);
    loop {
        let until = webhooks_model::time::now() + chrono::Duration::from_std(back.delay).unwrap_or_default();
        match store.defer(delivery_id, generation, until, back.parks, back.pace_ticket).await {
            Ok(()) => break,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), delivery_id, "cannot put a delivery back; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(PUT_BACK_PAUSE);
            }
        }
    }
    wake.notify_one();
}

/// Claims and hands out due deliveries until `shutdown`; then finishes what
/// is in flight within `SHUTDOWN_TIMEOUT` (what is left stays claimed, and is
/// released and sent again at the next start).
pub async fn run(context: Arc<Context>, store: SqliteStore, shutdown: CancellationToken) -> anyhow::Result<()> {
    let released = store.release_claims().await?;
    if released > 0 {
        tracing::info!(released, "deliveries claimed before a stop are due again");
    }
    let wake = store.work();
    let mut changes = store.changes();
    let concurrency = context.delivery.dispatcher_concurrency;
    let slots = Arc::new(Semaphore::new(concurrency));
    // The bulk lane may hold at most three quarters of the slots: the rest
    // are always there for the default lane.
    let bulk_slots = Arc::new(Semaphore::new((concurrency * 3 / 4).max(1)));
    let handlers = Handlers::default();
    tracing::info!("delivering from the embedded queue");

    let mut failing = Duration::ZERO;
    while !shutdown.is_cancelled() {
        let free = slots.available_permits().min(CLAIM_BATCH);
        let bulk_free = bulk_slots.available_permits();
        let mut claimed_all = false;
        // The slots are taken before the claim, so every claimed delivery has one.
        if let Some(mut held) = (free > 0).then(|| slots.clone().try_acquire_many_owned(free as u32).ok()).flatten() {
            match store.claim_due(free, bulk_free).await {
                Ok(messages) => {
                    failing = Duration::ZERO;
                    claimed_all = messages.len() == free;
                    for message in messages {
                        let slot = held.split(1);
                        // Counted in `bulk_free`: one is there for each.
                        let bulk_slot =
                            (message.lane == Lane::Bulk).then(|| bulk_slots.clone().try_acquire_owned().ok()).flatten();
                        let ticket = EmbeddedTicket {
                            store: store.clone(),
                            wake: wake.clone(),
                            delivery_id: message.delivery_id,
                            generation: message.generation,
                            settled: false,
                        };
                        handlers.spawn(context.clone(), message.into(), Ticket::Embedded(ticket), (slot, bulk_slot));
                    }
                }
                Err(error) => {
                    // Back off while the store fails, rather than spin.
                    failing = (failing * 2).clamp(Duration::from_millis(100), IDLE_LOOK);
                    tracing::error!(error = format!("{error:#}"), "cannot claim due deliveries");
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(failing) => {}
                    }
                    continue;
                }
            }
        }
        if claimed_all {
            continue;
        }
        let until_due = match store.next_due_at(bulk_free > 0).await {
            Ok(Some(at)) => (at - webhooks_model::time::now()).to_std().unwrap_or_default().min(IDLE_LOOK),
            Ok(None) => IDLE_LOOK,
            Err(error) => {
                tracing::error!(%error, "cannot read the next due time");
                IDLE_LOOK
            }
        };
        if free > 0 && until_due.is_zero() {
            continue;
        }
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = wake.notified() => {}
            () = tokio::time::sleep(until_due), if free > 0 => {}
            slot = slots.clone().acquire_owned(), if free == 0 => drop(slot),
            slot = bulk_slots.clone().acquire_owned(), if bulk_free == 0 => drop(slot),
            change = changes.recv() => match change {
                Ok(change) => context.cache.invalidate(&change.endpoint_id),
                Err(RecvError::Lagged(_)) => context.cache.clear(),
                Err(RecvError::Closed) => {}
            },
        }
    }

    handlers.finish(context.delivery.shutdown_timeout, "unfinished deliveries are sent again at the next start").await;
    Ok(())
}
