//! The embedded queue of standalone mode: the deliveries table of the SQLite
//! store is the queue. A delivery is due when it is `pending` or `retrying`
//! and its next attempt time has come; the loop claims due deliveries while
//! it has free slots, and an outcome is carried out by the store alone: the
//! record of an attempt is its retry (its next attempt time), a put-back is
//! a later due time. So retries survive any restart. Claims of a process
//! that died are released at the next start: one process holds the data
//! directory at a time.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, Semaphore, broadcast::error::RecvError};
use tokio_util::sync::CancellationToken;
use webhooks_model::{DeliveryLog, Lane};
use webhooks_store::{AttemptRecord, DeliveryState, queue::DeliveryTable};

use crate::{
    Delivery, DeliveryMessage, Handler, Outcome, PARK_LIMIT, Settings, Ticket, handlers::Handlers, put_back_delay,
    recorder::Recorder,
};

/// The longest the loop sleeps without looking at the table: a safety net
/// for wake-ups it did not get.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// Deliveries claimed per look at most.
const CLAIM_BATCH: usize = 256;

/// The longest pause between tries to put a delivery back while the store
/// fails.
const PUT_BACK_PAUSE: Duration = Duration::from_secs(5);

/// The deliveries table as a queue. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Embedded {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    table: DeliveryTable,
    settings: Settings,
    recorder: Recorder,
    wake: Arc<Notify>,
}

/// A delivery claimed from the table. A ticket dropped unsettled (its handler
/// panicked) puts the delivery back, so no claim outlives its handler.
#[derive(Debug)]
pub struct EmbeddedTicket {
    queue: Embedded,
    delivery_id: i64,
    generation: Option<i32>,
    settled: bool,
}

impl EmbeddedTicket {
    /// Carries `outcome` of `message` out (see [`Delivery::settle`]).
    pub(crate) async fn settle(mut self, message: DeliveryMessage, outcome: Outcome) -> &'static str {
        self.settled = true;
        let queue = &self.queue.inner;
        let (record, why) = match outcome {
            Outcome::Dropped { why } => {
                queue.wake.notify_one();
                return why;
            }
            Outcome::Settled { record, why } => (record, why),
            Outcome::Retry { record, .. } => (record, "retrying"),
            Outcome::PutBack { message, delay, why } => {
                self.put_back(&message, delay).await;
                return why;
            }
            // Nothing carries a message here: the later due time is the
            // set-aside, and the endpoint's next success brings it forward.
            Outcome::SetAside { message, delay } => {
                self.put_back(&message, delay).await;
                return "set_aside";
            }
            Outcome::GiveUp { message, reason } => (given_up(&message, &reason), "dead_lettered"),
        };
        if queue.recorder.record(record).await.is_ok() {
            // The record released the claim; the next attempt time may be
            // sooner than what the loop sleeps towards.
            queue.wake.notify_one();
            return why;
        }
        // The store fails: the delivery stays owed, due again later.
        if message.failures >= PARK_LIMIT {
            let longest = queue.settings.retry_schedule.delays().iter().max().copied();
            self.put_back(&message, longest.unwrap_or(Duration::from_secs(60))).await;
            return "requeued";
        }
        let delay = put_back_delay(&queue.settings.retry_schedule, message.parks);
        self.put_back(&message.put_back(true), delay).await;
        "parked"
    }

    /// Releases the claim, due again after `delay`, keeping `message`'s
    /// counts and pace ticket for the next claim.
    async fn put_back(&self, message: &DeliveryMessage, delay: Duration) {
        let back = PutBack { delay, parks: Some((message.parks, message.failures)), pace_ticket: message.pace_ticket };
        self.queue.put_back(self.delivery_id, self.generation, back).await;
    }
}

impl Drop for EmbeddedTicket {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (queue, delivery_id, generation) = (self.queue.clone(), self.delivery_id, self.generation);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { queue.put_back(delivery_id, generation, PutBack::now()).await });
        }
    }
}

/// The record of a delivery given up on: `failed`, with `reason` as the
/// error of its log entry.
fn given_up(message: &DeliveryMessage, reason: &str) -> AttemptRecord {
    AttemptRecord {
        delivery_id: message.delivery_id,
        event_id: message.event_id.clone(),
        state: DeliveryState::Failed,
        next_attempt_at: None,
        endpoint_id: message.endpoint_id.clone(),
        generation: message.generation,
        log: Some(DeliveryLog {
            id: webhooks_model::ids::new_v7(),
            event_id: message.event_id.clone(),
            event_type: message.event_type(),
            attempt: i32::try_from(message.attempt).unwrap_or(i32::MAX),
            status: None,
            response_body: None,
            error: Some(format!(
                "not sent: parked {} times ({reason}); send or recover it once the cause is fixed",
                message.failures
            )),
            error_detail: Some(format!("not sent: {reason}")),
            duration_ms: 0,
            created_at: webhooks_model::time::now(),
        }),
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

impl Embedded {
    pub(crate) fn new(table: DeliveryTable, settings: Settings, recorder: Recorder) -> Embedded {
        let wake = table.work();
        Embedded { inner: Arc::new(Inner { table, settings, recorder, wake }) }
    }

    /// Releases the claim on a delivery, due again after a delay, without
    /// counting an attempt. While the store fails (a full disk) it tries
    /// again, so the delivery is not left claimed, out of the queue, until a
    /// restart.
    async fn put_back(&self, delivery_id: i64, generation: Option<i32>, back: PutBack) {
        let mut pause = Duration::from_millis(100);
        loop {
            let until = webhooks_model::time::now() + chrono::Duration::from_std(back.delay).unwrap_or_default();
            match self.inner.table.put_back(delivery_id, generation, until, back.parks, back.pace_ticket).await {
                Ok(()) => break,
                Err(error) => {
                    tracing::error!(
                        error = format!("{error:#}"),
                        delivery_id,
                        "cannot put a delivery back; trying again"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(PUT_BACK_PAUSE);
                }
            }
        }
        self.inner.wake.notify_one();
    }

    /// The endpoint answers again: what was put back behind it is due now.
    pub(crate) async fn bring_forward(&self, endpoint_id: &str) {
        match self.inner.table.bring_forward(endpoint_id).await {
            Ok(0) => {}
            Ok(moved) => {
                tracing::info!(moved, endpoint_id, "endpoint answers again; deliveries put back behind it due now")
            }
            Err(error) => tracing::warn!(%error, "cannot bring forward the deliveries put back behind an endpoint"),
        }
    }

    /// Claims and hands out due deliveries until `shutdown`; then finishes
    /// what is in flight within `SHUTDOWN_TIMEOUT` (what is left stays
    /// claimed, and is released and sent again at the next start).
    pub(crate) async fn consume<H: Handler>(&self, handler: Arc<H>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let table = &self.inner.table;
        let released = table.release_claims().await?;
        if released > 0 {
            tracing::info!(released, "deliveries claimed before a stop are due again");
        }
        let wake = self.inner.wake.clone();
        let mut changes = table.changes();
        let concurrency = self.inner.settings.concurrency;
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
            if let Some(mut held) = (free > 0).then(|| slots.clone().try_acquire_many_owned(free as u32).ok()).flatten()
            {
                match table.claim_due(free, bulk_free).await {
                    Ok(due) => {
                        failing = Duration::ZERO;
                        claimed_all = due.len() == free;
                        for due in due {
                            let slot = held.split(1);
                            // Counted in `bulk_free`: one is there for each.
                            let bulk_slot =
                                (due.lane == Lane::Bulk).then(|| bulk_slots.clone().try_acquire_owned().ok()).flatten();
                            let ticket = EmbeddedTicket {
                                queue: self.clone(),
                                delivery_id: due.delivery_id,
                                generation: due.generation,
                                settled: false,
                            };
                            let delivery = Delivery { message: due.into(), ticket: Ticket::Embedded(ticket) };
                            handlers.spawn(&handler, delivery, (slot, bulk_slot));
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
            let until_due = match table.next_due_at(bulk_free > 0).await {
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
                    Ok(change) => handler.endpoint_changed(&change.endpoint_id),
                    Err(RecvError::Lagged(_)) => handler.forget_endpoints(),
                    Err(RecvError::Closed) => {}
                },
            }
        }

        handlers
            .finish(self.inner.settings.shutdown_timeout, "unfinished deliveries are sent again at the next start")
            .await;
        Ok(())
    }
}
