//! RabbitMQ, the queue of the distributed mode: the relay publishes what the
//! API committed ([`relay`]), dispatchers consume the lanes and settle each
//! outcome ([`consumer`]), the sweeper queues again what no queue holds
//! ([`sweeper`]), and operators list and replay dead letters
//! ([`dead_letters`]). Here: the topology, connections, and the properties
//! every message is published with.
//!
//! ```text
//! {p}.deliveries, {p}.deliveries.bulk   quorum work queues; dead-letter poison messages to {p}.dead
//! {p}.retry[.bulk].<ms>ms             one quorum queue per retry delay and lane: TTL, then
//!                                     dead-lettered (at least once) back to its work queue
//! {p}.dead                            messages that could not be processed, kept for operators
//! {p}.lifecycle                       fanout exchange of endpoint changes
//! ```
//! Declarations are idempotent: whichever process starts first creates them.

use std::time::Duration;

use anyhow::Context as _;
use lapin::{
    Channel, Connection, ConnectionProperties, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use webhooks_model::{Lane, Topology};
use webhooks_store::queue::Outbox;

pub mod consumer;
pub mod dead_letters;
mod inflight;
mod marks;
mod parked;
mod presence;
pub mod relay;
mod settle;
pub mod sweeper;

pub use inflight::Pending;

use std::sync::Arc;

use tokio::sync::{Notify, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{Handler, Settings, metrics::QueueMetrics, recorder::Recorder};

/// Where the broker is and what its queues are named: what the producer
/// side needs.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    pub topology: Topology,
    pub brokers: Brokers,
    pub faults: crate::Faults,
}

/// How long after its due time a delivery's message may still enter its
/// lane, which the sweeper allows for before it calls the delivery stranded.
/// A first attempt published straight after its ingest enters within it (one
/// the broker does not confirm gets an outbox row, which the sweep leaves
/// alone); a row the relay publishes later than this moves its delivery's due
/// time up to the publish. A message later still is queued again, and the
/// late copy is dropped unsent.
pub(crate) const PUBLISH_ALLOWANCE: Duration = Duration::from_secs(5);

/// How far ahead of this process's clock a time another process stamped may
/// be before it is counted and logged: more than stamps of processes on one
/// clock can be apart (DESIGN.md, "One clock").
pub(crate) const AHEAD_ALLOWED: chrono::Duration = chrono::Duration::seconds(5);

/// Deliveries released per statement when an endpoint recovers.
const RELEASE_BATCH: i64 = 1000;

/// RabbitMQ beside PostgreSQL's outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    outbox: Outbox,
    settings: Settings,
    recorder: Recorder,
    parked: parked::ParkedWrites,
    marks: Arc<marks::Marks>,
}

impl Broker {
    pub(crate) fn new(outbox: Outbox, settings: Settings, recorder: Recorder, writers: &TaskTracker) -> Broker {
        let parked = parked::ParkedWrites::spawn(outbox.clone(), writers);
        let marks = Arc::default();
        Broker { inner: Arc::new(Inner { outbox, settings, recorder, parked, marks }) }
    }

    /// Broker sessions, one after the other, until `shutdown`; the
    /// dispatcher's heartbeat beside them.
    pub(crate) async fn consume<H: Handler>(
        &self,
        handler: Arc<H>,
        ready: watch::Sender<bool>,
        shutdown: CancellationToken,
    ) {
        let heartbeat = presence::Heartbeat {
            outbox: self.inner.outbox.clone(),
            id: uuid::Uuid::new_v4(),
            reports: presence::Reports::Dispatcher(self.inner.marks.clone()),
            clock: self.inner.settings.clock.clone(),
        };
        let beating = heartbeat.run(shutdown.clone());
        let consuming = reconnecting("dispatcher", &shutdown, || consumer::session(self, &handler, &ready, &shutdown));
        tokio::join!(beating, consuming);
    }

    /// Queues again what was set aside behind `endpoint_id`: the endpoint
    /// answered. Should this fail, the sweeper queues them once due.
    pub(crate) async fn release_set_aside(&self, endpoint_id: &str) {
        let mut released = 0;
        loop {
            match self.inner.outbox.release_set_aside(endpoint_id, RELEASE_BATCH).await {
                Ok(n) => {
                    released += n;
                    if n < RELEASE_BATCH.unsigned_abs() {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot release the deliveries set aside; the sweeper will");
                    break;
                }
            }
        }
        if released > 0 {
            tracing::info!(
                released,
                endpoint_id,
                "endpoint answers again; deliveries set aside behind it queued again"
            );
        }
    }
}

/// Says the process is alive, starts the relay (and its listener), the
/// heartbeat and the sweeper on `tasks`, and returns the handle ingest
/// hands first attempts to.
pub(crate) async fn produce(
    outbox: Outbox,
    settings: BrokerSettings,
    metrics: &QueueMetrics,
    sweep: sweeper::SweepSettings,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> relay::Publisher {
    let wake = Arc::new(Notify::new());
    let inflight = Arc::new(inflight::Inflight::default());
    let (relay, publisher) = relay::Relay::new(
        outbox.clone(),
        settings.brokers.clone(),
        settings.topology.clone(),
        wake.clone(),
        metrics.relay.clone(),
        (settings.faults, inflight.clone()),
    );
    let heartbeat = presence::Heartbeat {
        outbox: outbox.clone(),
        id: uuid::Uuid::new_v4(),
        reports: presence::Reports::Api(inflight),
        clock: metrics.clock.clone(),
    };
    let sweeper = sweeper::Sweeper {
        outbox,
        brokers: settings.brokers,
        topology: settings.topology,
        settings: sweep,
        relay_wake: wake,
        metrics: metrics.sweep.clone(),
    };
    heartbeat.first().await;
    tasks.spawn(relay.run(shutdown.clone()));
    tasks.spawn(heartbeat.run(shutdown.clone()));
    tasks.spawn(sweeper.run(shutdown));
    publisher
}

/// How many times a delivery message may be handed back (crash, nack) before
/// the broker moves it to the dead-letter queue.
pub const DELIVERY_LIMIT: i64 = 50;

/// Declares everything of `topology`; idempotent, and consistent across
/// processes that share `QUEUE_PREFIX` and `RETRY_SCHEDULE`.
pub async fn declare(topology: &Topology, channel: &Channel) -> lapin::Result<()> {
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };

    channel
        .exchange_declare(
            topology.lifecycle().as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
            FieldTable::default(),
        )
        .await?;

    let mut dead = FieldTable::default();
    dead.insert("x-queue-type".into(), long_string("quorum"));
    channel.queue_declare(topology.dead().as_str().into(), durable, dead).await?;

    for queue in WorkQueue::ALL {
        let mut work = FieldTable::default();
        work.insert("x-queue-type".into(), long_string("quorum"));
        work.insert("x-dead-letter-exchange".into(), long_string(""));
        work.insert("x-dead-letter-routing-key".into(), long_string(&topology.dead()));
        work.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(DELIVERY_LIMIT));
        channel.queue_declare(queue.name(topology).as_str().into(), durable, work).await?;
        if let Some(lane) = queue.lane() {
            declare_retries(topology, channel, lane).await?;
        }
    }
    Ok(())
}

/// A work queue dispatchers take delivery messages from: a lane's, or the
/// swept queue, which they take first (DESIGN.md, "Knowing what is
/// stranded").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    Swept,
    Lane(Lane),
}

impl WorkQueue {
    /// Every work queue, in the order dispatchers prefer them.
    pub const ALL: [WorkQueue; 3] = [WorkQueue::Swept, WorkQueue::Lane(Lane::Default), WorkQueue::Lane(Lane::Bulk)];

    /// Its broker name in `topology`.
    pub fn name(self, topology: &Topology) -> String {
        match self {
            WorkQueue::Swept => topology.swept(),
            WorkQueue::Lane(lane) => topology.work_queue(lane),
        }
    }

    /// The lane it is the work queue of, if any.
    pub fn lane(self) -> Option<Lane> {
        match self {
            WorkQueue::Swept => None,
            WorkQueue::Lane(lane) => Some(lane),
        }
    }

    /// The name the store knows it by (`queue_marks.queue`).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkQueue::Swept => "swept",
            WorkQueue::Lane(lane) => lane.as_str(),
        }
    }

    /// The work queue of a delivery: the swept queue when the sweeper
    /// queued it again, else its lane's.
    pub fn of(lane: Lane, swept: bool) -> WorkQueue {
        if swept { WorkQueue::Swept } else { WorkQueue::Lane(lane) }
    }
}

async fn declare_retries(topology: &Topology, channel: &Channel, lane: Lane) -> lapin::Result<()> {
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    for delay in topology.retry_delays() {
        let mut retry = FieldTable::default();
        retry.insert("x-queue-type".into(), long_string("quorum"));
        retry.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
        );
        retry.insert("x-dead-letter-exchange".into(), long_string(""));
        retry.insert("x-dead-letter-routing-key".into(), long_string(&topology.work_queue(lane)));
        retry.insert("x-dead-letter-strategy".into(), long_string("at-least-once"));
        retry.insert("x-overflow".into(), long_string("reject-publish"));
        channel.queue_declare(topology.retry_in(lane, *delay).as_str().into(), durable, retry).await?;
    }
    Ok(())
}

fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// How long opening a connection may take when there is one address. A
/// broker that accepts the TCP connection but never finishes the AMQP
/// handshake (one still booting, or under a resource alarm) must not hold a
/// process's reconnect loop forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long opening a connection to one address may take when there are
/// others to try: short, so that a node that hangs (rather than refuses)
/// leaves time to reach another within the 10 s delivery may stop.
pub const FAILOVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The broker addresses of a process (`AMQP_URL`) and which one to try next:
/// the one place a RabbitMQ connection is opened. Cheap to clone; clones
/// share the choice. `Debug` shows the addresses redacted.
#[derive(Clone)]
pub struct Brokers {
    addresses: webhooks_config::BrokerAddresses,
    next: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Brokers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Brokers").field(&self.addresses).finish()
    }
}

impl Brokers {
    /// The addresses, first tried from a random one, so that the processes
    /// of a deployment spread over the cluster's nodes.
    pub fn new(addresses: webhooks_config::BrokerAddresses) -> Brokers {
        let first = rand::random_range(0..addresses.len());
        Brokers { addresses, next: Arc::new(first.into()) }
    }

    /// One address, for tests and tools.
    pub fn parse(raw: &str) -> anyhow::Result<Brokers> {
        Ok(Brokers::new(raw.parse().map_err(anyhow::Error::msg)?))
    }

    /// The addresses, in the order given.
    pub fn addresses(&self) -> &webhooks_config::BrokerAddresses {
        &self.addresses
    }

    /// Opens a connection to the first address that answers, trying each in
    /// turn from the next one, each within its timeout; named after the
    /// process so operators can tell connections apart. The next connection
    /// (this one lost) starts with the address after the one that answered,
    /// so a process moves off a node that died. Errors and logs show the
    /// addresses redacted.
    pub async fn connect(&self, process: &str) -> anyhow::Result<Connection> {
        use std::sync::atomic::Ordering::Relaxed;
        let count = self.addresses.len();
        let timeout = if count == 1 { CONNECT_TIMEOUT } else { FAILOVER_CONNECT_TIMEOUT };
        let start = self.next.load(Relaxed);
        let mut failures = Vec::with_capacity(count);
        for step in 0..count {
            let index = (start + step) % count;
            let address = self.addresses.get(index);
            match open(address, process, timeout).await {
                Ok(connection) => {
                    self.next.store((index + 1) % count, Relaxed);
                    if count > 1 {
                        tracing::info!(broker = %address.host_port(), "{process}: connected to RabbitMQ");
                    }
                    return Ok(connection);
                }
                Err(error) => {
                    tracing::debug!(broker = %address.host_port(), %error, "{process}: broker address does not answer");
                    failures.push(format!("{address}: {error}"));
                }
            }
        }
        Err(anyhow::anyhow!(
            "cannot reach RabbitMQ at {}: start it (or install it), point AMQP_URL at a running broker, \
             or run `webhooks-api standalone`, which needs neither RabbitMQ nor PostgreSQL",
            failures.join("; ")
        ))
    }
}

/// Opens a connection to the broker at `amqp_url` (one address or a list),
/// through [`Brokers::connect`]: for tools and tests that connect once.
pub async fn connect(amqp_url: &str, process: &str) -> anyhow::Result<Connection> {
    Brokers::parse(amqp_url)?.connect(process).await
}

/// A connection to `address` within `timeout`. The URI handed to lapin is
/// built from the checked address, with the host set from it (lapin's own
/// parsing would take an IP address for `localhost`); no lapin error here
/// carries the URI.
async fn open(
    address: &webhooks_config::BrokerAddress,
    process: &str,
    timeout: Duration,
) -> anyhow::Result<Connection> {
    let mut uri: lapin::uri::AMQPUri =
        address.expose().parse().map_err(|_| anyhow::anyhow!("not an AMQP URI lapin can read"))?;
    uri.authority.host = address.host();
    let options =
        ConnectionProperties::default().with_client_property("connection_name".into(), LongString::from(process));
    match tokio::time::timeout(timeout, Connection::connect_uri(uri, options)).await {
        Ok(connected) => connected.context("connect"),
        Err(_) => Err(anyhow::anyhow!("no AMQP handshake within {timeout:?}")),
    }
}

/// Runs broker sessions until `shutdown`: each time `session` fails (the broker
/// went away, a channel closed), waits under capped exponential backoff with
/// jitter and starts a new one. A session that returns `Ok` ends the loop; one
/// that lasted over 30 s resets the backoff.
pub async fn reconnecting<F, Fut>(what: &str, shutdown: &tokio_util::sync::CancellationToken, mut session: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use backon::BackoffBuilder;
    let backoff = || {
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(10))
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut delays = backoff();
    while !shutdown.is_cancelled() {
        let started = tokio::time::Instant::now();
        match session().await {
            Ok(()) => return,
            Err(error) => tracing::warn!(error = format!("{error:#}"), "{what}: broker session ended; reconnecting"),
        }
        if started.elapsed() > Duration::from_secs(30) {
            delays = backoff();
        }
        tokio::select! {
            () = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(10))) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// The persistent-delivery properties every message is published with.
pub fn persistent_json() -> lapin::BasicProperties {
    lapin::BasicProperties::default().with_delivery_mode(2).with_content_type(ShortString::from("application/json"))
}
