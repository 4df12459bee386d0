//! The RabbitMQ consumer: the two work queues (`{p}.deliveries`, and
//! `{p}.deliveries.bulk` with at most three quarters of the slots), each
//! with manual acks and a prefetch window on a channel of its own; endpoint
//! changes from the lifecycle exchange; and how each outcome is carried out:
//! the record committed first, then the ack, the retry or put-back published
//! (confirmed) to the retry queue of its delay, or the dead letter.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use lapin::{
    BasicProperties, Channel, Confirmation, Consumer,
    options::{
        BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_model::{Lane, RetryRoute};
use webhooks_store::Parked;

use super::{
    Broker, WorkQueue,
    marks::Marks,
    settle::{Fate, Settler},
};
use crate::{
    Delivery, DeliveryMessage, Handler, Message, Outcome, PARK_LIMIT, Ticket, handlers::Handlers, message,
    metrics::ClockMetrics, put_back_delay,
};

/// Longest wait for one broker reply (a confirm, a cancel, a close): a broker
/// that stops answering must not stall a dispatcher or its shutdown.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stopping session may take to send its last acks, and then to
/// close its channels; what it could not ack comes back to the queue.
const LAST_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a message waits before it goes back to the queue when even a
/// put-back failed, so a failing dependency is not hammered.
const REQUEUE_PAUSE: Duration = Duration::from_millis(500);

/// The header of a message this service dead-lettered itself: why.
pub const DEAD_REASON_HEADER: &str = "x-webhooks-dead-reason";

/// What the handlers of one lane's consumer share.
#[derive(Debug)]
struct Session {
    broker: Broker,
    /// The confirm-mode channel retries, put-backs and dead letters are
    /// published on.
    publisher: Channel,
    settler: Settler,
}

/// A message received in a broker session.
#[derive(Debug)]
pub struct AmqpTicket {
    tag: u64,
    session: Arc<Session>,
    settled: bool,
    /// The broker handed the message out before.
    pub(crate) redelivered: bool,
}

impl AmqpTicket {
    fn new(delivery: &lapin::message::Delivery, session: Arc<Session>) -> AmqpTicket {
        session.settler.received(delivery.delivery_tag);
        AmqpTicket { tag: delivery.delivery_tag, session, settled: false, redelivered: delivery.redelivered }
    }

    fn fate(mut self, fate: Fate) {
        self.settled = true;
        self.session.settler.settle(self.tag, fate);
    }

    /// Carries `outcome` of `message` out (see [`Delivery::settle`]).
    pub(crate) async fn settle(self, message: DeliveryMessage, outcome: Outcome) -> &'static str {
        match outcome {
            Outcome::Dropped { why } => {
                self.fate(Fate::Ack);
                why
            }
            Outcome::Settled { record, why } => self.record(message, record, why).await,
            Outcome::Retry { mut record, next, delay } => match publish(&self.session, &next, delay).await {
                Ok(back_by) => {
                    record.next_attempt_at = Some(back_by);
                    self.record(message, record, "retrying").await
                }
                Err(error) => {
                    // The attempt was made: it is recorded, and its delivery,
                    // due with no message, is queued again by the sweeper.
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "cannot publish the retry; the attempt is recorded and the sweeper queues it again"
                    );
                    self.record(message, record, "retry_unpublished").await
                }
            },
            Outcome::PutBack { message, delay, why } => self.put_back(&message, delay, why).await,
            Outcome::SetAside { message, delay } => {
                let until = webhooks_model::time::now() + chrono::Duration::from_std(delay).unwrap_or_default();
                let aside = Parked {
                    delivery_id: message.delivery_id,
                    event_id: message.event_id.clone(),
                    generation: message.generation,
                    until,
                    set_aside: true,
                };
                if self.session.broker.inner.parked.write(aside).await {
                    self.fate(Fate::Ack);
                    return "set_aside";
                }
                self.put_back(&message, delay, "deferred").await
            }
            Outcome::GiveUp { message, reason } => {
                tracing::error!(failures = message.failures, reason, "message put back too often; dead-lettered");
                self.dead_letter(&message::encode_delivery(&message), &reason).await
            }
        }
    }

    /// Commits `record`, then acks. If the commit fails the message is put
    /// back for another try: a duplicate attempt is possible, a lost one is
    /// not.
    async fn record(
        self,
        message: DeliveryMessage,
        record: webhooks_store::AttemptRecord,
        why: &'static str,
    ) -> &'static str {
        if self.session.broker.inner.recorder.record(record).await.is_ok() {
            self.fate(Fate::Ack);
            return why;
        }
        self.failed(message, "cannot record the outcome").await
    }

    /// Something failed (`reason`): the message goes back as a failure, or
    /// to the dead letters past [`PARK_LIMIT`] such put-backs.
    async fn failed(self, message: DeliveryMessage, reason: &str) -> &'static str {
        if message.failures >= PARK_LIMIT {
            return self.dead_letter(&message::encode_delivery(&message), reason).await;
        }
        let delay = put_back_delay(&self.session.broker.inner.settings.retry_schedule, message.parks);
        self.put_back(&message.put_back(true), delay, "parked").await
    }

    /// Parks `message` in the retry queue for `delay` as a fresh message (so
    /// put-backs never run up the work queue's delivery limit), moves the
    /// delivery's due time with it (so the sweeper does not take a parked
    /// delivery for a stranded one), then acks.
    async fn put_back(self, message: &DeliveryMessage, delay: Duration, why: &'static str) -> &'static str {
        match publish(&self.session, message, delay).await {
            Ok(until) => {
                let parked = Parked {
                    delivery_id: message.delivery_id,
                    event_id: message.event_id.clone(),
                    generation: message.generation,
                    until,
                    set_aside: false,
                };
                self.session.broker.inner.parked.write(parked).await;
                self.fate(Fate::Ack);
                why
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot put the message back; it goes back to the queue");
                tokio::time::sleep(REQUEUE_PAUSE).await;
                self.fate(Fate::Requeue);
                "requeued"
            }
        }
    }

    /// Publishes `payload` to `{p}.dead` with `reason`, then acks; should
    /// that fail, rejects it, and the work queue dead-letters it itself.
    async fn dead_letter(self, payload: &[u8], reason: &str) -> &'static str {
        match publish_dead(&self.session, payload, reason).await {
            Ok(()) => self.fate(Fate::Ack),
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot publish the dead letter; rejecting it instead");
                self.fate(Fate::Reject);
            }
        }
        "dead_lettered"
    }
}

impl Drop for AmqpTicket {
    /// A handler that ended without settling its message (it panicked, or
    /// was abandoned at shutdown) hands it back to the queue at once: left
    /// in flight, it would keep its place in the prefetch window and send
    /// every later ack of the session on its own.
    fn drop(&mut self) {
        if !self.settled {
            self.session.settler.settle(self.tag, Fate::Requeue);
        }
    }
}

/// One broker session: consume until `shutdown` or until the connection
/// fails. On shutdown, stop taking messages, finish what is held within the
/// deadline, and return; unfinished messages go back to the queue when the
/// channel closes.
pub(super) async fn session<H: Handler>(
    broker: &Broker,
    handler: &Arc<H>,
    broker_up: &watch::Sender<bool>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let settings = &broker.inner.settings;
    let topology = &settings.topology;
    let connection = settings.brokers.connect("webhooks-dispatcher").await.context("connect")?;
    let channel = connection.create_channel().await.context("open channel")?;
    super::declare(topology, &channel).await.context("declare topology")?;
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
            topology.lifecycle().as_str().into(),
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
    handler.forget_endpoints();

    let mut consumers = Vec::with_capacity(WorkQueue::ALL.len());
    for queue in WorkQueue::ALL {
        consumers.push(QueueConsumer::start(&connection, broker, &publisher, queue).await?);
    }
    broker_up.send_replace(true);
    tracing::info!(queue = %topology.deliveries(), bulk = %topology.work_queue(Lane::Bulk), swept = %topology.swept(), "dispatcher consuming");

    let concurrency = settings.concurrency;
    let slots = Arc::new(Semaphore::new(concurrency));
    // The bulk lane may hold at most three quarters of the slots: the rest
    // are always there for the default lane.
    let bulk_slots = Arc::new(Semaphore::new((concurrency * 3 / 4).max(1)));
    let handlers = Handlers::default();
    let marks = &broker.inner.marks;
    let clock = &settings.clock;
    let result = loop {
        // What the broker pushes is taken at once into each queue's buffer
        // (the prefetch window bounds it), so the dispatcher knows what
        // waits unstarted; a message starts when a slot is free: the swept
        // queue's first, then the default lane's, then the bulk lane's when
        // it has a slot of its own. Lifecycle messages are taken meanwhile.
        let urgent = consumers.iter().any(|c| c.queue != WorkQueue::Lane(Lane::Bulk) && !c.waiting.is_empty());
        let bulk_waits = consumers.iter().any(|c| c.queue == WorkQueue::Lane(Lane::Bulk) && !c.waiting.is_empty());
        let [swept, default, bulk] = &mut consumers[..] else { unreachable!("three work queues") };
        let (slot, bulk_slot) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break Ok(()),
            change = lifecycle.next() => match change {
                Some(Ok(message)) => { changed(handler.as_ref(), &message.data); continue }
                Some(Err(error)) => break Err(anyhow::Error::new(error).context("lifecycle consumer")),
                None => break Err(anyhow::anyhow!("lifecycle consumer closed")),
            },
            next = swept.consumer.next() => match swept.take(next, marks, clock) {
                Ok(()) => continue,
                Err(error) => break Err(error),
            },
            next = default.consumer.next() => match default.take(next, marks, clock) {
                Ok(()) => continue,
                Err(error) => break Err(error),
            },
            next = bulk.consumer.next() => match bulk.take(next, marks, clock) {
                Ok(()) => continue,
                Err(error) => break Err(error),
            },
            slot = slots.clone().acquire_owned(), if urgent => match slot {
                Ok(slot) => (slot, None),
                Err(_) => break Ok(()),
            },
            (slot, bulk_slot) = async { (slots.clone().acquire_owned().await, bulk_slots.clone().acquire_owned().await) },
                if !urgent && bulk_waits => match (slot, bulk_slot) {
                (Ok(slot), Ok(bulk_slot)) => (slot, Some(bulk_slot)),
                _ => break Ok(()),
            },
        };
        let Some(next) = consumers
            .iter_mut()
            .find(|c| !c.waiting.is_empty() && (bulk_slot.is_some() || c.queue != WorkQueue::Lane(Lane::Bulk)))
        else {
            continue;
        };
        let Some(waiting) = next.waiting.pop_front() else { continue };
        let ticket = AmqpTicket::new(&waiting.delivery, next.session.clone());
        match waiting.decoded {
            Ok(Message::Delivery(message)) => {
                marks.started(next.queue, message.enters_at);
                let delivery = Delivery { message, ticket: Ticket::Broker(ticket) };
                handlers.spawn(handler, delivery, (slot, bulk_slot));
            }
            Ok(Message::EndpointChanged(_)) => {
                tracing::error!("an endpoint change on a work queue; dead-lettered");
                handler.refused();
                ticket.dead_letter(&waiting.delivery.data, "an endpoint change on a work queue").await;
            }
            Err(error) => {
                tracing::error!(%error, bytes = waiting.delivery.data.len(), "message refused; dead-lettered");
                handler.refused();
                ticket.dead_letter(&waiting.delivery.data, &error.to_string()).await;
            }
        }
    };
    // What waits unstarted goes back to the broker with the channel.
    for consumer in &mut consumers {
        for waiting in consumer.waiting.drain(..) {
            if let Ok(Message::Delivery(message)) = waiting.decoded {
                marks.returned(consumer.queue, message.enters_at);
            }
        }
    }

    if result.is_ok() {
        for consumer in &consumers {
            let cancel = consumer.channel.basic_cancel(consumer.tag.clone(), BasicCancelOptions::default());
            let _ = tokio::time::timeout(BROKER_CALL_TIMEOUT, cancel).await;
        }
    }
    handlers.finish(settings.shutdown_timeout, "their messages go back to the queue").await;
    // Send the acks of what finished, then close each channel before the
    // connection: a channel dropped open is closed in the background, which
    // fails (and is logged as a connection error) once the connection closes.
    // Both lanes at once, each step within its bound, however the broker
    // answers.
    let (mut last_acks, mut open) = (Vec::new(), Vec::new());
    for consumer in consumers {
        drop(consumer.session);
        last_acks.push(consumer.settling);
        open.push((consumer.channel, consumer.consumer));
    }
    let _ = tokio::time::timeout(LAST_SETTLE_TIMEOUT, futures::future::join_all(last_acks)).await;
    let closes = open.iter().map(|(channel, _)| channel.close(200, "bye".into()));
    let _ = tokio::time::timeout(LAST_SETTLE_TIMEOUT, futures::future::join_all(closes)).await;
    drop(open);
    broker_up.send_replace(false);
    let _ = tokio::time::timeout(BROKER_CALL_TIMEOUT, connection.close(200, "bye".into())).await;
    result
}

/// One work queue's consumer, on a channel of its own with its own settler.
/// Delivery tags are numbered per channel, and a `multiple` ack covers every
/// tag below it: with one consumer per channel, and its buffer started in
/// the order the broker pushed it, those are messages this consumer has
/// handed over, in order, and never one still waiting in its buffer or in
/// another queue's.
struct QueueConsumer {
    queue: WorkQueue,
    channel: Channel,
    consumer: Consumer,
    tag: ShortString,
    session: Arc<Session>,
    settling: tokio::task::JoinHandle<()>,
    /// What the broker pushed that no worker started yet, oldest first.
    waiting: VecDeque<Waiting>,
}

/// A message in a consumer's buffer.
struct Waiting {
    delivery: lapin::message::Delivery,
    decoded: Result<Message, message::DecodeError>,
}

impl QueueConsumer {
    async fn start(
        connection: &lapin::Connection,
        broker: &Broker,
        publisher: &Channel,
        queue: WorkQueue,
    ) -> anyhow::Result<QueueConsumer> {
        let prefetch = broker.inner.settings.prefetch;
        let channel =
            connection.create_channel().await.with_context(|| format!("open the {} channel", queue.as_str()))?;
        channel.basic_qos(prefetch, Default::default()).await.context("qos")?;
        let tag: ShortString = format!("dispatcher-{}-{}", queue.as_str(), Uuid::new_v4()).into();
        let consumer = channel
            .basic_consume(
                queue.name(&broker.inner.settings.topology).as_str().into(),
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consume the {} queue", queue.as_str()))?;
        let (settler, settling) = Settler::start(channel.clone(), prefetch);
        let session = Arc::new(Session { broker: broker.clone(), publisher: publisher.clone(), settler });
        Ok(QueueConsumer { queue, channel, consumer, tag, session, settling, waiting: VecDeque::new() })
    }

    /// Takes what the broker pushed into the buffer; the consumer's end or
    /// error ends the session.
    fn take(
        &mut self,
        next: Option<lapin::Result<lapin::message::Delivery>>,
        marks: &Marks,
        clock: &ClockMetrics,
    ) -> anyhow::Result<()> {
        match next {
            Some(Ok(delivery)) => {
                let decoded = message::decode(&delivery.data);
                if let Ok(Message::Delivery(message)) = &decoded {
                    marks.held(self.queue, message.enters_at, clock);
                }
                self.waiting.push_back(Waiting { delivery, decoded });
                Ok(())
            }
            Some(Err(error)) => Err(anyhow::Error::new(error).context(format!("{} consumer", self.queue.as_str()))),
            None => Err(anyhow::anyhow!("{} consumer closed", self.queue.as_str())),
        }
    }
}

/// Tells `handler` of the endpoint change in `data`.
fn changed<H: Handler>(handler: &H, data: &[u8]) {
    match message::decode(data) {
        Ok(Message::EndpointChanged(change)) => {
            tracing::debug!(endpoint_id = %change.endpoint_id, change = ?change.change, "endpoint changed");
            handler.endpoint_changed(&change.endpoint_id);
        }
        Ok(Message::Delivery(_)) => {}
        Err(error) => {
            tracing::warn!(%error, "unreadable lifecycle message; forgetting every endpoint");
            handler.forget_endpoints();
        }
    }
}

/// Publishes `message` to the retry queue that holds it for `delay`, and
/// returns when it is back in its work queue at the latest (its due time in
/// the store). When the queue is gone (deleted by hand, lost by the broker),
/// declares the topology again and publishes once more, so one lost queue
/// does not turn every retry into a requeue until the next reconnect.
async fn publish(session: &Session, message: &DeliveryMessage, delay: Duration) -> anyhow::Result<DateTime<Utc>> {
    match publish_once(session, message, delay).await {
        Err(error) if error.is::<RetryQueueMissing>() => {
            tracing::warn!(error = format!("{error:#}"), "declaring the queues again");
            super::declare(&session.broker.inner.settings.topology, &session.publisher)
                .await
                .context("declare topology")?;
            publish_once(session, message, delay).await
        }
        result => result,
    }
}

async fn publish_once(session: &Session, message: &DeliveryMessage, delay: Duration) -> anyhow::Result<DateTime<Utc>> {
    let topology = &session.broker.inner.settings.topology;
    let RetryRoute { queue, wait, ttl } =
        topology.retry_route(message.lane, delay).context("RETRY_SCHEDULE has no delays")?;
    let now = webhooks_model::time::now();
    let later = |wait: Duration| now + chrono::Duration::from_std(wait).unwrap_or_default();
    let payload = message::encode_delivery(&message.published_again(later(wait)));
    let properties = super::persistent_json().with_expiration(wait.as_millis().to_string().into());
    let confirm = session
        .publisher
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
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(later(ttl)),
        Confirmation::Ack(Some(_)) => Err(RetryQueueMissing(queue).into()),
        Confirmation::Nack(_) => anyhow::bail!("broker refused the retry"),
    }
}

/// The broker returned a retry: the queue it was published to is gone.
#[derive(Debug, thiserror::Error)]
#[error("retry queue {0} is missing")]
struct RetryQueueMissing(String);

/// Publishes `payload` to `{p}.dead` with `reason` in a header, confirmed.
async fn publish_dead(session: &Session, payload: &[u8], reason: &str) -> anyhow::Result<()> {
    let mut headers = FieldTable::default();
    headers.insert(DEAD_REASON_HEADER.into(), AMQPValue::LongString(LongString::from(reason)));
    let properties: BasicProperties = super::persistent_json().with_headers(headers);
    let dead = session.broker.inner.settings.topology.dead();
    let confirm = session
        .publisher
        .basic_publish("".into(), dead.as_str().into(), BasicPublishOptions::default(), payload, properties)
        .await
        .context("publish dead letter")?;
    match tokio::time::timeout(BROKER_CALL_TIMEOUT, confirm).await.context("no confirm")?.context("confirm")? {
        Confirmation::Ack(_) | Confirmation::NotRequested => Ok(()),
        Confirmation::Nack(_) => anyhow::bail!("broker refused the dead letter"),
    }
}
