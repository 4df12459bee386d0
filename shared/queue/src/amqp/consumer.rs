//! The RabbitMQ consumer: the two work queues (`{p}.deliveries`, and
//! `{p}.deliveries.bulk` with at most three quarters of the slots), each
//! with manual acks and a prefetch window on a channel of its own; endpoint
//! changes from the lifecycle exchange; and how each outcome is carried out:
//! the record committed first, then the ack, the retry or put-back published
//! (confirmed) to the retry queue of its delay, or the dead letter.

use std::{sync::Arc, time::Duration};

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
    Broker,
    settle::{Fate, Settler},
};
use crate::{
    Delivery, DeliveryMessage, Handler, Message, Outcome, PARK_LIMIT, Ticket, handlers::Handlers, message,
    put_back_delay,
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
                let aside =
                    Parked { delivery_id: message.delivery_id, generation: message.generation, until, set_aside: true };
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

    let mut default = LaneConsumer::start(&connection, broker, &publisher, Lane::Default).await?;
    let mut bulk = LaneConsumer::start(&connection, broker, &publisher, Lane::Bulk).await?;
    broker_up.send_replace(true);
    tracing::info!(queue = %topology.deliveries(), bulk = %topology.work_queue(Lane::Bulk), "dispatcher consuming");

    let concurrency = settings.concurrency;
    let slots = Arc::new(Semaphore::new(concurrency));
    // The bulk lane may hold at most three quarters of the slots: the rest
    // are always there for the default lane.
    let bulk_slots = Arc::new(Semaphore::new((concurrency * 3 / 4).max(1)));
    let handlers = Handlers::default();
    let result = 'session: loop {
        // A slot first, so a message is received only when it can run;
        // lifecycle messages are taken meanwhile, whatever the deliveries do.
        let slot = tokio::select! {
            biased;
            () = shutdown.cancelled() => break Ok(()),
            change = lifecycle.next() => match change {
                Some(Ok(message)) => { changed(handler.as_ref(), &message.data); continue }
                Some(Err(error)) => break Err(anyhow::Error::new(error).context("lifecycle consumer")),
                None => break Err(anyhow::anyhow!("lifecycle consumer closed")),
            },
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break Ok(()),
            },
        };
        // The default lane first; the bulk lane when it has a slot of its own.
        let (next, bulk_slot, lane) = loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break 'session Ok(()),
                change = lifecycle.next() => match change {
                    Some(Ok(message)) => changed(handler.as_ref(), &message.data),
                    Some(Err(error)) => break 'session Err(anyhow::Error::new(error).context("lifecycle consumer")),
                    None => break 'session Err(anyhow::anyhow!("lifecycle consumer closed")),
                },
                next = default.consumer.next() => break (next, None, Lane::Default),
                (bulk_slot, next) = async { (bulk_slots.clone().acquire_owned().await, bulk.consumer.next().await) } => {
                    break (next, bulk_slot.ok(), Lane::Bulk)
                }
            }
        };
        let session = match lane {
            Lane::Default => &default.session,
            Lane::Bulk => &bulk.session,
        };
        match next {
            Some(Ok(delivery)) => {
                let ticket = AmqpTicket::new(&delivery, session.clone());
                match message::decode(&delivery.data) {
                    Ok(Message::Delivery(message)) => {
                        broker.inner.watermarks.received(lane, message.enters_at);
                        let delivery = Delivery { message, ticket: Ticket::Broker(ticket) };
                        handlers.spawn(handler, delivery, (slot, bulk_slot));
                    }
                    Ok(Message::EndpointChanged(_)) => {
                        tracing::error!("an endpoint change on a work queue; dead-lettered");
                        handler.refused();
                        ticket.dead_letter(&delivery.data, "an endpoint change on a work queue").await;
                    }
                    Err(error) => {
                        tracing::error!(%error, bytes = delivery.data.len(), "message refused; dead-lettered");
                        handler.refused();
                        ticket.dead_letter(&delivery.data, &error.to_string()).await;
                    }
                }
            }
            Some(Err(error)) => break Err(anyhow::Error::new(error).context(format!("{} consumer", lane.as_str()))),
            None => break Err(anyhow::anyhow!("{} consumer closed", lane.as_str())),
        }
    };

    if result.is_ok() {
        for lane in [&default, &bulk] {
            let cancel = lane.channel.basic_cancel(lane.tag.clone(), BasicCancelOptions::default());
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
    for lane in [default, bulk] {
        drop(lane.session);
        last_acks.push(lane.settling);
        open.push((lane.channel, lane.consumer));
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
/// tag below it: with one consumer per channel, those are messages this
/// consumer has handed over, in order, and never another lane's messages
/// still waiting in the client's buffer for a slot.
struct LaneConsumer {
    channel: Channel,
    consumer: Consumer,
    tag: ShortString,
    session: Arc<Session>,
    settling: tokio::task::JoinHandle<()>,
}

impl LaneConsumer {
    async fn start(
        connection: &lapin::Connection,
        broker: &Broker,
        publisher: &Channel,
        lane: Lane,
    ) -> anyhow::Result<LaneConsumer> {
        let prefetch = broker.inner.settings.prefetch;
        let channel =
            connection.create_channel().await.with_context(|| format!("open the {} channel", lane.as_str()))?;
        channel.basic_qos(prefetch, Default::default()).await.context("qos")?;
        let tag: ShortString = format!("dispatcher-{}-{}", lane.as_str(), Uuid::new_v4()).into();
        let consumer = channel
            .basic_consume(
                broker.inner.settings.topology.work_queue(lane).as_str().into(),
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consume the {} lane", lane.as_str()))?;
        let (settler, settling) = Settler::start(channel.clone(), prefetch);
        let session = Arc::new(Session { broker: broker.clone(), publisher: publisher.clone(), settler });
        Ok(LaneConsumer { channel, consumer, tag, session, settling })
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
