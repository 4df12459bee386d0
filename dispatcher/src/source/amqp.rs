//! The RabbitMQ source: consumes the two work queues (`{p}.deliveries`, and
//! `{p}.deliveries.bulk` with at most three quarters of the slots) with
//! manual acks and a prefetch window each, each on a channel of its own,
//! drops cached endpoints on lifecycle messages, publishes
//! retries (confirmed) to the retry queue of their delay, and acks only after
//! the handler recorded the outcome.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::StreamExt;
use lapin::{
    Channel, Confirmation, Consumer,
    options::{
        BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::{FieldTable, ShortString},
};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_model::{Lane, Topology};
use webhooks_queue::amqp as broker;
use webhooks_queue::{DeliveryMessage, Message, message};
use webhooks_store::Parked;

use super::{Handlers, Ticket};
use crate::{
    settle::{Fate, Settler},
    worker::Context,
};

/// Longest wait for one broker reply (a confirm, a cancel, a close): a broker
/// that stops answering must not stall a dispatcher or its shutdown.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stopping session may take to send its last acks, and then to
/// close its channels; what it could not ack comes back to the queue.
const LAST_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handlers of one lane's consumer share.
#[derive(Debug)]
struct Session {
    topology: Topology,
    /// The confirm-mode channel retries are published on.
    publisher: Channel,
    settler: Settler,
}

/// A message received in a broker session.
#[derive(Debug)]
pub struct AmqpTicket {
    tag: u64,
    session: Arc<Session>,
    /// Handed out before and not acked: its consumer stopped, lost its
    /// connection or requeued it.
    pub(super) redelivered: bool,
    settled: bool,
}

impl AmqpTicket {
    fn new(delivery: &lapin::message::Delivery, session: Arc<Session>) -> AmqpTicket {
        session.settler.received(delivery.delivery_tag);
        AmqpTicket { tag: delivery.delivery_tag, session, redelivered: delivery.redelivered, settled: false }
    }

    fn settle(mut self, fate: Fate) {
        self.settled = true;
        self.session.settler.settle(self.tag, fate);
    }

    pub(super) fn ack(self) {
        self.settle(Fate::Ack);
    }

    pub(super) fn requeue(self) {
        self.settle(Fate::Requeue);
    }

    pub(super) async fn publish_retry(&self, message: &DeliveryMessage, delay: Duration) -> anyhow::Result<()> {
        publish_retry(&self.session, message, delay).await
    }

    /// Parks the message in the retry queue for `delay` as a fresh message
    /// (so deferrals never run up the work queue's delivery limit), moves the
    /// delivery's due time with it (so the sweeper does not take a parked
    /// delivery for a stranded one), then acks. `message` is the one to
    /// publish: it already counts this park.
    pub(super) async fn defer(
        self,
        context: &Context,
        message: &DeliveryMessage,
        delay: Duration,
        outcome: &'static str,
    ) {
        match publish_retry(&self.session, message, delay).await {
            Ok(()) => {
                let until = chrono::Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
                let parked = Parked {
                    delivery_id: message.delivery_id,
                    generation: message.generation,
                    until,
                    set_aside: false,
                };
                context.parked.write(parked).await;
                context.metrics.outcome(outcome);
                self.ack();
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "cannot defer; the message goes back to the queue");
                Ticket::Amqp(self).requeue(context).await;
            }
        }
    }

    /// Sets the message's delivery aside in the store until `delay` from
    /// now (its endpoint hangs), then acks: nothing carries it until the
    /// endpoint's next success releases it, or the sweeper finds it due.
    /// When that cannot be written, it is parked in a retry queue instead.
    pub(super) async fn set_aside(self, context: &Context, message: &DeliveryMessage, delay: Duration) {
        let until = chrono::Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
        let aside = Parked { delivery_id: message.delivery_id, generation: message.generation, until, set_aside: true };
        if context.parked.write(aside).await {
            context.metrics.outcome("set_aside");
            return self.ack();
        }
        self.defer(context, message, delay, "deferred").await;
    }

    /// Rejects the message, which the work queue dead-letters to `{p}.dead`.
    pub(super) fn dead_letter(self) {
        self.settle(Fate::Reject);
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
pub async fn session(
    context: Arc<Context>,
    topology: &Topology,
    broker_up: &watch::Sender<bool>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let connection = broker::connect(&context.common.amqp_url, "webhooks-dispatcher").await.context("connect")?;
    let channel = connection.create_channel().await.context("open channel")?;
    broker::declare(topology, &channel).await.context("declare topology")?;
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
    context.cache.clear();

    let mut default = LaneConsumer::start(&connection, &context, topology, &publisher, Lane::Default).await?;
    let mut bulk = LaneConsumer::start(&connection, &context, topology, &publisher, Lane::Bulk).await?;
    broker_up.send_replace(true);
    tracing::info!(queue = %topology.deliveries(), bulk = %topology.work_queue(Lane::Bulk), "dispatcher consuming");

    let concurrency = context.delivery.dispatcher_concurrency;
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
                Some(Ok(message)) => { invalidate(&context, &message.data); continue }
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
                    Some(Ok(message)) => invalidate(&context, &message.data),
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
                let Some(message) = parse(&context, &delivery.data) else {
                    ticket.dead_letter();
                    continue;
                };
                handlers.spawn(context.clone(), message, Ticket::Amqp(ticket), (slot, bulk_slot));
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
    handlers.finish(context.delivery.shutdown_timeout, "their messages go back to the queue").await;
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
        context: &Context,
        topology: &Topology,
        publisher: &Channel,
        lane: Lane,
    ) -> anyhow::Result<LaneConsumer> {
        let channel =
            connection.create_channel().await.with_context(|| format!("open the {} channel", lane.as_str()))?;
        channel.basic_qos(context.delivery.dispatcher_prefetch, Default::default()).await.context("qos")?;
        let tag: ShortString = format!("dispatcher-{}-{}", lane.as_str(), Uuid::new_v4()).into();
        let consumer = channel
            .basic_consume(
                topology.work_queue(lane).as_str().into(),
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consume the {} lane", lane.as_str()))?;
        let (settler, settling) = Settler::start(channel.clone(), context.delivery.dispatcher_prefetch);
        let session = Arc::new(Session { topology: topology.clone(), publisher: publisher.clone(), settler });
        Ok(LaneConsumer { channel, consumer, tag, session, settling })
    }
}

/// The delivery a message asks for; a message that is not one goes to the
/// dead-letter queue.
fn parse(context: &Context, data: &[u8]) -> Option<DeliveryMessage> {
    match message::decode(data) {
        Ok(Message::Delivery(message)) => Some(message),
        Ok(Message::EndpointChanged(_)) => {
            tracing::error!("an endpoint change on a work queue; moved to the dead-letter queue");
            context.metrics.outcome("dead_lettered");
            None
        }
        Err(error) => {
            tracing::error!(%error, bytes = data.len(), "unprocessable message; moved to the dead-letter queue");
            context.metrics.outcome("dead_lettered");
            None
        }
    }
}

fn invalidate(context: &Context, data: &[u8]) {
    match message::decode(data) {
        Ok(Message::EndpointChanged(change)) => {
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

/// Publishes a retry; when its queue is gone (deleted by hand, lost by the
/// broker), declares the topology again and publishes once more, so one lost
/// queue does not turn every retry into a requeue until the next reconnect.
async fn publish_retry(session: &Session, message: &DeliveryMessage, delay: Duration) -> anyhow::Result<()> {
    match publish_retry_once(session, message, delay).await {
        Err(error) if error.is::<RetryQueueMissing>() => {
            tracing::warn!(error = format!("{error:#}"), "declaring the queues again");
            broker::declare(&session.topology, &session.publisher).await.context("declare topology")?;
            publish_retry_once(session, message, delay).await
        }
        result => result,
    }
}

async fn publish_retry_once(session: &Session, message: &DeliveryMessage, delay: Duration) -> anyhow::Result<()> {
    let (queue, wait) = session.topology.retry_route(message.lane, delay).context("RETRY_SCHEDULE has no delays")?;
    let payload = message::encode_delivery(message);
    let properties = broker::persistent_json().with_expiration(wait.as_millis().to_string().into());
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
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(RetryQueueMissing(queue).into()),
        Confirmation::Nack(_) => anyhow::bail!("broker refused the retry"),
    }
}

/// The broker returned a retry: the queue it was published to is gone.
#[derive(Debug, thiserror::Error)]
#[error("retry queue {0} is missing")]
struct RetryQueueMissing(String);
