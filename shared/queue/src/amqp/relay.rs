//! The relay: publishes to RabbitMQ, with publisher confirms, what the API
//! committed. Two inputs:
//!
//! - first attempts handed over in-process by the ingest writer right after
//!   its commit ([`Publisher`]): published at once, with no outbox row; one
//!   the broker does not confirm is written to the outbox then;
//! - the outbox: rows written with the change they announce (lifecycle
//!   messages, `send`, recoveries, sweeps, released turns, and first attempts
//!   made while the broker was down), each deleted only once the broker
//!   confirmed it. A commit wakes the relay at once; a scan every second is
//!   the safety net.
//!
//! While the broker is down the ingest writer writes outbox rows itself and
//! the API keeps accepting work; the relay reconnects with capped exponential
//! backoff and drains them. What a crash loses between a commit and a
//! confirm is a delivery due and named by no outbox row, which the sweeper
//! queues again.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use anyhow::Context;
use futures::{StreamExt, stream::FuturesUnordered};
use lapin::{
    Confirmation, Connection, PublisherConfirm,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use tokio::sync::{Mutex, Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;
use webhooks_model::{Lane, Topology};
use webhooks_store::queue::{Outbox, OutboxItem};

use super::inflight::{Inflight, Pending};
use crate::{DeliveryMessage, Message, message, metrics::RelayMetrics};

/// Rows published per round.
const BATCH: i64 = 500;
/// How long one round may wait for the broker's confirms.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a relay holds the outbox rows it claimed; a relay that stops
/// meanwhile leaves them to the next one once this has passed.
const CLAIM_FOR: Duration = Duration::from_secs(60);
/// The safety-net scan interval.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Batches of handed-over messages the relay holds before it refuses more
/// (the writer then puts them in the outbox).
const HANDED_OVER_BATCHES: usize = 1024;

/// A committed delivery's first message, handed to the relay to publish.
#[derive(Debug, Clone)]
struct Ready {
    delivery_id: i64,
    lane: Lane,
    /// The message, serialised.
    payload: Vec<u8>,
    /// Its event, on its way until every first attempt of it is confirmed
    /// or in the outbox.
    _pending: Arc<Pending>,
}

/// The ingest writer's handle on the relay.
#[derive(Debug, Clone)]
pub struct Publisher {
    ready: mpsc::Sender<Vec<Ready>>,
    faults: crate::Faults,
    broker_up: watch::Receiver<bool>,
    /// The events whose first attempts are on their way.
    inflight: Arc<Inflight>,
    /// Where what the relay cannot take goes.
    unpublished: Unpublished,
}

/// The outbox, for first attempts that were not published: the relay's
/// usual path takes them from there.
#[derive(Debug, Clone)]
struct Unpublished {
    outbox: Outbox,
    wake: Arc<Notify>,
    /// First attempts that could not be written to the outbox either: their
    /// events stay on their way (this process's `confirmed_through` stays
    /// before them) until a later try writes them there, so should the
    /// process die first, the sweeper queues them again ahead of any
    /// backlog.
    lost: Arc<std::sync::Mutex<Vec<Ready>>>,
    /// First attempts dropped by the `FAULT_LOSE_FIRST_ATTEMPTS` fault, as a
    /// process killed at that moment would: never written anywhere.
    faulted: Arc<std::sync::Mutex<Vec<Ready>>>,
}

impl Unpublished {
    /// Writes `unpublished` to the outbox and wakes the relay. Should that
    /// fail too (the database is down), the sweeper queues their deliveries
    /// again later.
    async fn write(&self, unpublished: Vec<Ready>) {
        if unpublished.is_empty() {
            return;
        }
        let deliveries: Vec<(i64, Lane)> = unpublished.iter().map(|m| (m.delivery_id, m.lane)).collect();
        match self.outbox.first_attempts(&deliveries).await {
            Ok(()) => {
                tracing::info!(count = deliveries.len(), "unpublished first attempts written to the outbox");
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    count = deliveries.len(),
                    "unpublished first attempts not written to the outbox; the sweeper will queue them again"
                );
                let mut lost = self.lost.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                lost.extend(unpublished.into_iter().map(|m| Ready { payload: Vec::new(), ..m }));
            }
        }
    }

    /// Tries again to write the first attempts it could not write before.
    async fn write_lost(&self) {
        let lost = std::mem::take(&mut *self.lost.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        self.write(lost).await;
    }
}

impl Publisher {
    /// Whether the relay holds a working broker channel.
    pub fn broker_up(&self) -> bool {
        *self.broker_up.borrow()
    }

    /// Wakes the relay: rows were written to the outbox.
    pub fn wake(&self) {
        self.unpublished.wake.notify_one();
    }

    /// An event stamped `created_at` is about to be stored: its first
    /// attempts are on their way until the returned token, handed over with
    /// them, is dropped.
    pub(crate) fn pending(&self, created_at: chrono::DateTime<chrono::Utc>) -> Arc<Pending> {
        Arc::new(self.inflight.enter(created_at))
    }

    /// Hands committed first attempts over, each with its event's token;
    /// when the relay cannot take them (the broker is down, the relay is
    /// stopping or holds too many already), writes them to the outbox.
    pub(crate) async fn hand_over(&self, first_attempts: Vec<(DeliveryMessage, Arc<Pending>)>) {
        if first_attempts.is_empty() {
            return;
        }
        if self.faults.losing_first_attempts() {
            // As a process killed now: what it had on its way stays so.
            let lost = first_attempts.into_iter().map(|(m, pending)| Ready {
                delivery_id: m.delivery_id,
                lane: m.lane,
                payload: Vec::new(),
                _pending: pending,
            });
            self.unpublished.faulted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(lost);
            return;
        }
        // Published from now on: they enter their lanes now at the earliest.
        let now = webhooks_model::time::now();
        let batch: Vec<Ready> = first_attempts
            .into_iter()
            .map(|(m, pending)| Ready {
                delivery_id: m.delivery_id,
                lane: m.lane,
                payload: message::encode_delivery(&m.entering_at(now)),
                _pending: pending,
            })
            .collect();
        if !self.broker_up() {
            return self.unpublished.write(batch).await;
        }
        if let Err(mpsc::error::TrySendError::Full(batch) | mpsc::error::TrySendError::Closed(batch)) =
            self.ready.try_send(batch)
        {
            self.unpublished.write(batch).await;
        }
    }
}

/// What the relay needs.
pub(crate) struct Relay {
    outbox: Outbox,
    brokers: super::Brokers,
    topology: Topology,
    wake: Arc<Notify>,
    broker_up: watch::Sender<bool>,
    metrics: Arc<RelayMetrics>,
    /// Messages handed over by the ingest writer.
    ready: Mutex<mpsc::Receiver<Vec<Ready>>>,
    unpublished: Unpublished,
}

/// The confirms of one handed-over batch: resolves to the messages the broker
/// did not confirm.
type Confirming = Pin<Box<dyn Future<Output = Vec<Ready>> + Send>>;

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox)
            .field("brokers", &self.brokers)
            .field("topology", &self.topology)
            .field("broker_up", &self.broker_up)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay, and the handle the ingest writer hands it messages with.
    pub(crate) fn new(
        outbox: Outbox,
        brokers: super::Brokers,
        topology: Topology,
        wake: Arc<Notify>,
        metrics: Arc<RelayMetrics>,
        (faults, inflight): (crate::Faults, Arc<Inflight>),
    ) -> (Relay, Publisher) {
        let (broker_up, broker_up_rx) = watch::channel(false);
        let (ready_tx, ready) = mpsc::channel(HANDED_OVER_BATCHES);
        let unpublished =
            Unpublished { outbox: outbox.clone(), wake: wake.clone(), lost: Arc::default(), faulted: Arc::default() };
        let relay = Relay {
            outbox,
            brokers,
            topology,
            wake,
            broker_up,
            metrics,
            ready: Mutex::new(ready),
            unpublished: unpublished.clone(),
        };
        (relay, Publisher { ready: ready_tx, faults, broker_up: broker_up_rx, inflight, unpublished })
    }

    /// Runs until `shutdown`; then publishes what is already committed, within
    /// a short deadline, so a clean stop leaves nothing behind needlessly.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let listening = {
            let (outbox, wake, shutdown) = (self.outbox.clone(), self.wake.clone(), shutdown.clone());
            tokio::spawn(async move { outbox.notify_writes(wake, shutdown).await })
        };
        super::reconnecting("outbox relay", &shutdown, || async {
            let result = self.session(&shutdown).await;
            self.broker_up.send_replace(false);
            result
        })
        .await;
        // What was handed over and not published goes to the outbox, for the
        // next relay; later hand-overs find the relay gone and do the same.
        let mut ready = self.ready.lock().await;
        ready.close();
        let mut left = Vec::new();
        while let Ok(batch) = ready.try_recv() {
            left.extend(batch);
        }
        self.unpublished.write(left).await;
        self.unpublished.write_lost().await;
        let _ = listening.await;
    }

    async fn session(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let connection = self.brokers.connect("webhooks-api outbox relay").await.context("connect")?;
        let channel = connection.create_channel().await.context("open channel")?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.context("enable confirms")?;
        super::declare(&self.topology, &channel).await.context("declare topology")?;
        self.broker_up.send_replace(true);
        tracing::info!("outbox relay connected to the broker");

        let mut ready = self.ready.lock().await;
        let mut confirming = FuturesUnordered::new();
        let result = self.publish_loop(&connection, &channel, shutdown, &mut ready, &mut confirming).await;
        // Whatever way the session ends, the confirms under way come in (or
        // fail with the channel) and what was not confirmed goes to the outbox.
        while let Some(unconfirmed) = confirming.next().await {
            self.unpublished.write(unconfirmed).await;
        }
        if result.is_ok() {
            let _ = tokio::time::timeout(CONFIRM_TIMEOUT, connection.close(200, "shutdown".into())).await;
        }
        result
    }

    async fn publish_loop(
        &self,
        connection: &Connection,
        channel: &lapin::Channel,
        shutdown: &CancellationToken,
        ready: &mut mpsc::Receiver<Vec<Ready>>,
        confirming: &mut FuturesUnordered<Confirming>,
    ) -> anyhow::Result<()> {
        let mut scan = tokio::time::interval(SCAN_EVERY);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut read_outbox = true;
        loop {
            if read_outbox {
                // A stalled broker (memory or disk alarm) must not hold the
                // outbox rows locked for ever: give up the round and reconnect.
                let deadline = tokio::time::Instant::now() + CONFIRM_TIMEOUT;
                let stalled = || anyhow::anyhow!("no confirms within {CONFIRM_TIMEOUT:?}");
                let round = tokio::time::timeout_at(deadline, self.publish_batch(channel));
                tokio::pin!(round);
                // A round of a long outbox (a recovery, a sweep) waits for
                // the database and the broker's confirms; first attempts
                // handed over meanwhile go out at once, not after it. The
                // round comes first whenever it can move, and what is
                // published beside it is bound by the same deadline.
                let published = loop {
                    tokio::select! {
                        biased;
                        round = &mut round => break round.map_err(|_| stalled())??,
                        Some(batch) = ready.recv() => {
                            tokio::time::timeout_at(deadline, self.publish_ready(channel, batch, confirming))
                                .await
                                .map_err(|_| stalled())??;
                        }
                        Some(unconfirmed) = confirming.next() => self.unpublished.write(unconfirmed).await,
                    }
                };
                read_outbox = published == BATCH as usize;
            }
            if shutdown.is_cancelled() {
                while let Ok(batch) = ready.try_recv() {
                    self.publish_ready(channel, batch, confirming).await?;
                }
                return Ok(());
            }
            if read_outbox {
                continue;
            }
            tokio::select! {
                Some(batch) = ready.recv() => self.publish_ready(channel, batch, confirming).await?,
                Some(unconfirmed) = confirming.next() => self.unpublished.write(unconfirmed).await,
                () = self.wake.notified() => read_outbox = true,
                _ = scan.tick() => {
                    anyhow::ensure!(connection.status().connected(), "connection closed");
                    self.unpublished.write_lost().await;
                    read_outbox = true;
                }
                () = shutdown.cancelled() => {}
            }
        }
    }

    /// Publishes handed-over messages at once, and adds to `confirming` the
    /// future that resolves to those the broker did not confirm. A publish
    /// that fails ends the session; the batch's messages not yet confirmed
    /// then go to the outbox.
    async fn publish_ready(
        &self,
        channel: &lapin::Channel,
        batch: Vec<Ready>,
        confirming: &mut FuturesUnordered<Confirming>,
    ) -> anyhow::Result<()> {
        let mut confirms: Vec<(Ready, Option<PublisherConfirm>)> = Vec::with_capacity(batch.len());
        let mut failure = None;
        for message in batch {
            if failure.is_some() {
                confirms.push((message, None));
                continue;
            }
            let queue = self.topology.work_queue(message.lane);
            let published = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                    &message.payload,
                    super::persistent_json(),
                )
                .await;
            match published {
                Ok(confirm) => confirms.push((message, Some(confirm))),
                Err(error) => {
                    failure = Some(error);
                    confirms.push((message, None));
                }
            }
        }
        let metrics = self.metrics.clone();
        let confirmed: Confirming = Box::pin(async move {
            let deadline = tokio::time::Instant::now() + CONFIRM_TIMEOUT;
            let mut unconfirmed = Vec::new();
            let mut published = 0;
            for (message, confirm) in confirms {
                let confirmation = match confirm {
                    Some(confirm) => tokio::time::timeout_at(deadline, confirm).await.ok().and_then(Result::ok),
                    None => None,
                };
                match confirmation {
                    Some(Confirmation::Ack(None)) => published += 1,
                    _ => unconfirmed.push(message),
                }
            }
            metrics.first_attempts_published.inc_by(published);
            unconfirmed
        });
        match failure {
            None => {
                confirming.push(confirmed);
                Ok(())
            }
            Some(error) => {
                // The future still settles what was published before.
                let unconfirmed = confirmed.await;
                self.unpublished.write(unconfirmed).await;
                Err(anyhow::Error::new(error).context("publish"))
            }
        }
    }

    /// Publishes one batch; returns how many rows it claimed (rows the
    /// broker refused are given back, and tried again at the next wake or
    /// scan).
    async fn publish_batch(&self, channel: &lapin::Channel) -> anyhow::Result<usize> {
        let rows = self.outbox.claim(BATCH, CLAIM_FOR).await.context("read outbox")?;
        if rows.is_empty() {
            return Ok(0);
        }
        let claimed = rows.len();
        let claimed_at = webhooks_model::time::now();
        let mut done = Vec::with_capacity(rows.len());
        let mut confirms = Vec::with_capacity(rows.len());
        for row in rows {
            let (exchange, routing_key, payload) = match row.item {
                OutboxItem::Delivery(due, swept) => {
                    let message = DeliveryMessage::from(due).entering_at(claimed_at);
                    let queue = super::WorkQueue::of(message.lane, swept).name(&self.topology);
                    (String::new(), queue, message::encode_delivery(&message))
                }
                OutboxItem::Change(change) => {
                    (self.topology.lifecycle(), String::new(), message::encode(&Message::EndpointChanged(change)))
                }
                OutboxItem::Stored { exchange, routing_key, payload } => (exchange, routing_key, payload),
                OutboxItem::Gone => {
                    tracing::warn!(outbox_id = row.id, "outbox row names what is gone; dropping it");
                    done.push(row.id);
                    continue;
                }
            };
            let options = BasicPublishOptions {
                // A delivery must reach its queue; a lifecycle message with no
                // dispatcher listening has nobody to tell, which is fine.
                mandatory: exchange.is_empty(),
                ..BasicPublishOptions::default()
            };
            let confirm = channel
                .basic_publish(
                    exchange.as_str().into(),
                    routing_key.as_str().into(),
                    options,
                    &payload,
                    super::persistent_json(),
                )
                .await
                .context("publish")?;
            confirms.push((row.id, exchange, routing_key, confirm));
        }
        let dropped = done.len();
        let mut refused = Vec::new();
        for (id, exchange, routing_key, confirm) in confirms {
            match confirm.await.context("await confirm")? {
                Confirmation::Ack(None) | Confirmation::NotRequested => done.push(id),
                Confirmation::Ack(Some(_)) if !exchange.is_empty() => done.push(id),
                Confirmation::Ack(Some(_)) => {
                    tracing::warn!(outbox_id = id, queue = %routing_key, "message unroutable; will retry");
                    refused.push(id);
                }
                Confirmation::Nack(_) => {
                    tracing::warn!(outbox_id = id, "broker refused a message; will retry");
                    refused.push(id);
                }
            }
        }
        self.outbox.delete(&done, claimed_at, super::PUBLISH_ALLOWANCE).await.context("delete outbox rows")?;
        self.outbox.release(&refused).await.context("release outbox rows")?;
        let published = done.len() - dropped;
        self.metrics.outbox_published.inc_by(u64::try_from(published).unwrap_or(0));
        Ok(claimed)
    }
}
