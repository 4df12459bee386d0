//! The consume loop: takes delivery messages with manual acks, re-checks each
//! endpoint, makes the attempt, records it, schedules a retry when due, and
//! acks only after the record is committed.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use chrono::Utc;
use futures::StreamExt;
use lapin::{
    Channel, Confirmation,
    message::Delivery,
    options::{
        BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
        QueueBindOptions, QueueDeclareOptions,
    },
    types::{FieldTable, ShortString},
};
use rand::Rng;
use shared::{
    broker::{self, DeliveryMessage, Envelope, Message, Topology},
    model::{DeliveryLog, EndpointStatus},
    store::{AttemptRecord, DeliveryState, RetryStanding, Store},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    cache::EndpointCache,
    config::Config,
    deliver,
    metrics::Metrics,
    recorder::Recorder,
    settle::{Fate, Settler},
};

/// What every message handler shares.
#[derive(Debug)]
pub struct Context {
    pub config: Config,
    pub topology: Topology,
    pub client: reqwest::Client,
    pub cache: EndpointCache,
    pub recorder: Recorder,
    /// For the few reads outside the cache (whether a retry still stands).
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Attempts in flight per endpoint.
    pub per_endpoint: Mutex<HashMap<String, Arc<EndpointSlots>>>,
}

/// One endpoint's share of the attempts in flight.
#[derive(Debug)]
pub struct EndpointSlots {
    slots: Arc<Semaphore>,
    /// Until when the endpoint counts as saturated: a message that waited the
    /// whole `ENDPOINT_SLOT_WAIT` in vain marks it, and while it is marked and
    /// full, its messages are parked at once instead of holding a slot.
    saturated_until: Mutex<Option<tokio::time::Instant>>,
}

/// Longest wait for one broker reply (a confirm, a cancel, a close): a broker
/// that stops answering must not stall a dispatcher or its shutdown.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an endpoint stays marked saturated after a wait in vain.
const SATURATED_FOR: Duration = Duration::from_secs(5);

impl Context {
    /// A slot at the endpoint, waiting up to `ENDPOINT_SLOT_WAIT` for one.
    /// `None` means the endpoint stayed saturated (slow or hanging): the
    /// message is better parked than left holding a prefetch slot.
    async fn endpoint_slot(&self, endpoint_id: &str) -> Option<OwnedSemaphorePermit> {
        let limit = self.config.dispatcher_endpoint_concurrency;
        let endpoint = {
            let mut all = self.per_endpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if all.len() > 10_000 {
                all.retain(|_, e| Arc::strong_count(e) > 1 || e.slots.available_permits() < limit);
            }
            all.entry(endpoint_id.to_owned())
                .or_insert_with(|| {
                    Arc::new(EndpointSlots {
                        slots: Arc::new(Semaphore::new(limit)),
                        saturated_until: Mutex::new(None),
                    })
                })
                .clone()
        };
        if let Ok(permit) = endpoint.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let marked = *endpoint.saturated_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if marked.is_some_and(|until| until > tokio::time::Instant::now()) {
            return None;
        }
        match tokio::time::timeout(self.config.endpoint_slot_wait, endpoint.slots.clone().acquire_owned()).await {
            Ok(permit) => permit.ok(),
            Err(_) => {
                *endpoint.saturated_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(tokio::time::Instant::now() + SATURATED_FOR);
                None
            }
        }
    }
}

/// One broker session: consume until `shutdown` or until the connection
/// fails. On shutdown, stop taking messages, finish what is held within the
/// deadline, and return; unfinished messages go back to the queue when the
/// channel closes.
pub async fn session(
    context: Arc<Context>,
    broker_up: &watch::Sender<bool>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let connection =
        broker::connect(&context.config.common.amqp_url, "webhooks-dispatcher").await.context("connect")?;
    let channel = connection.create_channel().await.context("open channel")?;
    context.topology.declare(&channel).await.context("declare topology")?;
    channel.basic_qos(context.config.dispatcher_prefetch, BasicQosOptions::default()).await.context("qos")?;
    let publisher = connection.create_channel().await.context("open publish channel")?;
    publisher.confirm_select(ConfirmSelectOptions::default()).await.context("enable confirms")?;

    let lifecycle_queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() },
            FieldTable::default(),
        )
        .await
        .context("declare lifecycle queue")?;
    channel
        .queue_bind(
            lifecycle_queue.name().clone(),
            context.topology.lifecycle().as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .context("bind lifecycle queue")?;
    let mut lifecycle = channel
        .basic_consume(
            lifecycle_queue.name().clone(),
            "".into(),
            BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() },
            FieldTable::default(),
        )
        .await
        .context("consume lifecycle")?;
    // Changes may have been missed while disconnected.
    context.cache.clear();

    let tag: ShortString = format!("dispatcher-{}", Uuid::new_v4()).into();
    let mut deliveries = channel
        .basic_consume(
            context.topology.deliveries().as_str().into(),
            tag.clone(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .context("consume deliveries")?;
    broker_up.send_replace(true);
    tracing::info!(queue = %context.topology.deliveries(), "dispatcher consuming");

    let slots = Arc::new(Semaphore::new(context.config.dispatcher_concurrency));
    let tasks = TaskTracker::new();
    let (settler, settling) = Settler::start(channel.clone());
    let session = Arc::new(Session { publisher, settler });
    let result = loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break Ok(()),
            change = lifecycle.next() => match change {
                Some(Ok(message)) => invalidate(&context, &message.data),
                Some(Err(error)) => break Err(anyhow::Error::new(error).context("lifecycle consumer")),
                None => break Err(anyhow::anyhow!("lifecycle consumer closed")),
            },
            slot = slots.clone().acquire_owned() => {
                let Ok(slot) = slot else { break Ok(()) };
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break Ok(()),
                    next = deliveries.next() => match next {
                        Some(Ok(delivery)) => {
                            session.settler.received(delivery.delivery_tag);
                            let context = context.clone();
                            let session = session.clone();
                            tasks.spawn(async move {
                                handle(&context, &session, delivery).await;
                                drop(slot);
                            });
                        }
                        Some(Err(error)) => break Err(anyhow::Error::new(error).context("delivery consumer")),
                        None => break Err(anyhow::anyhow!("delivery consumer closed")),
                    },
                }
            }
        }
    };

    if result.is_ok() {
        let cancel = channel.basic_cancel(tag, BasicCancelOptions::default());
        let _ = tokio::time::timeout(BROKER_CALL_TIMEOUT, cancel).await;
    }
    tasks.close();
    let in_flight = tasks.len();
    if in_flight > 0 {
        tracing::info!(in_flight, "finishing deliveries in flight");
    }
    if tokio::time::timeout(context.config.shutdown_timeout, tasks.wait()).await.is_err() {
        tracing::warn!(unfinished = tasks.len(), "shutdown deadline passed; unfinished messages go back to the queue");
    }
    // Send the acks of what finished before the channel closes.
    drop(session);
    let _ = tokio::time::timeout(Duration::from_secs(5), settling).await;
    broker_up.send_replace(false);
    let _ = tokio::time::timeout(BROKER_CALL_TIMEOUT, connection.close(200, "bye".into())).await;
    result
}

fn invalidate(context: &Context, data: &[u8]) {
    match serde_json::from_slice::<Envelope>(data) {
        Ok(Envelope { message: Message::EndpointChanged(change), .. }) => {
            tracing::debug!(endpoint_id = %change.endpoint_id, change = ?change.change, "endpoint changed");
            context.cache.invalidate(&change.endpoint_id);
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "unreadable lifecycle message; dropping the whole endpoint cache");
            context.cache.clear();
        }
    }
}

/// What the handlers of one broker session share.
#[derive(Debug)]
struct Session {
    /// The confirm-mode channel retries are published on.
    publisher: Channel,
    settler: Settler,
}

fn ack(session: &Session, delivery: &Delivery) {
    session.settler.settle(delivery.delivery_tag, Fate::Ack);
}

/// Hands a message back after a pause, so a failing dependency is not hammered.
/// Used only when even parking it failed (the broker is in trouble too).
async fn requeue(context: &Context, session: &Session, delivery: &Delivery) {
    context.metrics.outcome("requeued");
    tokio::time::sleep(Duration::from_millis(500)).await;
    session.settler.settle(delivery.delivery_tag, Fate::Requeue);
}

/// The store failed: park the message in the shortest retry queue (a fresh
/// message, so a long database outage cannot run up the work queue's delivery
/// limit and dead-letter it), then ack.
async fn park(context: &Context, session: &Session, delivery: &Delivery, message: &DeliveryMessage) {
    defer(context, session, delivery, message, "parked").await;
}

async fn handle(context: &Context, session: &Session, delivery: Delivery) {
    let message = match serde_json::from_slice::<Envelope>(&delivery.data) {
        Ok(Envelope { message: Message::Delivery(message), .. }) => message,
        Ok(_) | Err(_) => {
            tracing::error!(bytes = delivery.data.len(), "unprocessable message; moved to the dead-letter queue");
            context.metrics.outcome("dead_lettered");
            session.settler.settle(delivery.delivery_tag, Fate::Reject);
            return;
        }
    };
    let span = tracing::info_span!("delivery", event_id = %message.event_id, endpoint_id = %message.endpoint_id, attempt = message.attempt);
    process(context, session, &delivery, message).instrument(span).await;
}

async fn process(context: &Context, session: &Session, delivery: &Delivery, message: DeliveryMessage) {
    // A retry may have been overtaken by `send` (which re-arms the delivery
    // with a new generation and its own message) or by success: then it goes
    // no further. First attempts skip this read; theirs is the hot path.
    if message.attempt > 1 {
        match context.store.retry_standing(message.delivery_id, message.generation).await {
            Ok(RetryStanding::Current) => {}
            Ok(RetryStanding::Superseded) => {
                tracing::debug!("retry superseded; dropped");
                context.metrics.outcome("superseded");
                return ack(session, delivery);
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot load the delivery");
                return park(context, session, delivery, &message).await;
            }
        }
    }
    let endpoint = match context.cache.get(&message.endpoint_id).await {
        Ok(endpoint) => endpoint,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot load the endpoint");
            return park(context, session, delivery, &message).await;
        }
    };
    let settle = |state| AttemptRecord {
        delivery_id: message.delivery_id,
        state,
        next_attempt_at: None,
        log: None,
        endpoint_id: message.endpoint_id.clone(),
        generation: message.generation,
    };
    let endpoint = match endpoint {
        Some(endpoint) if endpoint.status == EndpointStatus::Active => endpoint,
        Some(endpoint) if endpoint.status == EndpointStatus::Disabled && message.force => endpoint,
        // Holding or cancelling is final, so check the database itself
        // rather than a cache entry a lifecycle message may not have reached.
        _ => match context.cache.reload(&message.endpoint_id).await {
            Ok(Some(endpoint)) if endpoint.status == EndpointStatus::Active => endpoint,
            Ok(Some(endpoint)) if endpoint.status == EndpointStatus::Disabled && message.force => endpoint,
            Ok(Some(endpoint)) if endpoint.status == EndpointStatus::Disabled => {
                return finish(context, session, delivery, &message, settle(DeliveryState::Held), "held").await;
            }
            Ok(_) => {
                return finish(context, session, delivery, &message, settle(DeliveryState::Cancelled), "cancelled")
                    .await;
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot load the endpoint");
                return park(context, session, delivery, &message).await;
            }
        },
    };

    let Some(_slot) = context.endpoint_slot(&endpoint.id).await else {
        return defer(context, session, delivery, &message, "deferred").await;
    };

    if message.attempt == 1 {
        let lag = (Utc::now() - message.event_created_at).to_std().unwrap_or_default();
        context.metrics.queue_lag.observe(lag.as_secs_f64());
    }
    context.metrics.in_flight.inc();
    let allow_private = context.config.common.target_allow_private;
    let mut attempt =
        deliver::attempt(&context.client, &endpoint, &message.event_id, &message.body, allow_private).await;
    context.metrics.in_flight.dec();
    context.metrics.attempt_duration.observe(attempt.duration.as_secs_f64());

    let log = DeliveryLog {
        id: Uuid::now_v7(),
        event_id: message.event_id.clone(),
        attempt: i32::try_from(message.attempt).unwrap_or(i32::MAX),
        status: attempt.status.map(i32::from),
        response_body: attempt.response_body.take(),
        error: attempt.error.map(str::to_owned),
        duration_ms: i64::try_from(attempt.duration.as_millis()).unwrap_or(i64::MAX),
        created_at: shared::time::now(),
    };
    let mut record = AttemptRecord { log: Some(log), ..settle(DeliveryState::Succeeded) };
    let outcome = if attempt.succeeded() {
        "succeeded"
    } else if let Some(delay) = context.config.common.retry_schedule.delay_after(message.attempt) {
        let delay = retry_delay(delay, attempt.retry_after, context.config.max_retry_after);
        let next = DeliveryMessage { attempt: message.attempt + 1, ..message.clone() };
        if let Err(error) = publish_retry(context, &session.publisher, &next, delay).await {
            tracing::error!(error = format!("{error:#}"), "cannot schedule the retry; message goes back to the queue");
            return requeue(context, session, delivery).await;
        }
        record.state = DeliveryState::Retrying;
        record.next_attempt_at = chrono::Duration::from_std(delay).ok().map(|d| Utc::now() + d);
        "retrying"
    } else {
        record.state = DeliveryState::Failed;
        "failed"
    };
    tracing::debug!(status = ?attempt.status, error = ?attempt.error, outcome, "attempt made");
    finish(context, session, delivery, &message, record, outcome).await;
}

/// Commits the record, then acks. If the commit fails the message is parked
/// for another try: a duplicate attempt is possible, a lost one is not.
async fn finish(
    context: &Context,
    session: &Session,
    delivery: &Delivery,
    message: &DeliveryMessage,
    record: AttemptRecord,
    outcome: &'static str,
) {
    if context.recorder.record(record).await.is_err() {
        return park(context, session, delivery, message).await;
    }
    context.metrics.outcome(outcome);
    ack(session, delivery);
}

/// The wait before the next attempt: the schedule's delay less up to 10%
/// jitter, or the receiver's `Retry-After` when that is longer (capped).
fn retry_delay(scheduled: Duration, retry_after: Option<Duration>, max_retry_after: Duration) -> Duration {
    if let Some(asked) = retry_after.filter(|asked| *asked > scheduled) {
        return asked.min(max_retry_after.max(scheduled));
    }
    let jitter = rand::rng().random_range(0.0..0.1);
    scheduled.mul_f64(1.0 - jitter)
}

async fn publish_retry(
    context: &Context,
    publisher: &Channel,
    message: &DeliveryMessage,
    delay: Duration,
) -> anyhow::Result<()> {
    let (queue, wait) = context.topology.retry_route(delay).context("RETRY_SCHEDULE has no delays")?;
    let payload = Envelope::new(Message::Delivery(message.clone())).to_bytes();
    let properties = broker::persistent_json().with_expiration(wait.as_millis().to_string().into());
    let confirm = publisher
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
            &payload,
            properties,
        )
        .await
        .context("publish retry")?;
    let confirmation = tokio::time::timeout(BROKER_CALL_TIMEOUT, confirm)
        .await
        .context("no confirm for the retry")?
        .context("confirm retry")?;
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => anyhow::bail!("retry queue {queue} is missing"),
        Confirmation::Nack(_) => anyhow::bail!("broker refused the retry"),
    }
}

/// The endpoint already has its share of slots: park the message in the
/// shortest retry tier without counting an attempt.
async fn defer(
    context: &Context,
    session: &Session,
    delivery: &Delivery,
    message: &DeliveryMessage,
    outcome: &'static str,
) {
    let Some(delay) = context.topology.shortest_retry() else {
        return requeue(context, session, delivery).await;
    };
    match publish_retry(context, &session.publisher, message, delay).await {
        Ok(()) => {
            context.metrics.outcome(outcome);
            ack(session, delivery);
        }
        Err(error) => {
            tracing::warn!(error = format!("{error:#}"), "cannot defer; message goes back to the queue");
            requeue(context, session, delivery).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_jitters_down_and_honours_longer_retry_after_within_bounds() {
        let scheduled = Duration::from_secs(100);
        for _ in 0..100 {
            let delay = retry_delay(scheduled, None, Duration::from_secs(3600));
            assert!(delay <= scheduled && delay >= Duration::from_secs(90), "{delay:?}");
        }
        let cap = Duration::from_secs(3600);
        assert_eq!(retry_delay(scheduled, Some(Duration::from_secs(300)), cap), Duration::from_secs(300));
        assert_eq!(retry_delay(scheduled, Some(Duration::from_secs(86_400)), cap), cap);
        assert!(retry_delay(scheduled, Some(Duration::from_secs(1)), cap) <= scheduled);
    }
}
