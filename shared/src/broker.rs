//! RabbitMQ: the topology both programs declare, and the versioned messages
//! they exchange.
//!
//! ```text
//! {p}.deliveries      quorum work queue; dead-letters poison messages to {p}.dead
//! {p}.retry.<ms>ms    one quorum queue per retry delay: TTL, then dead-lettered
//!                     (at least once) back to {p}.deliveries
//! {p}.dead            messages that could not be processed, kept for operators
//! {p}.lifecycle       fanout exchange of endpoint changes
//! ```
//! Declarations are idempotent: whichever process starts first creates them.

use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use lapin::{
    Channel, Connection, ConnectionProperties, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::RetrySchedule;

/// Version written into every message; readers accept this and older.
pub const MESSAGE_VERSION: u32 = 1;

/// How many times a delivery message may be handed back (crash, nack) before
/// the broker moves it to the dead-letter queue.
pub const DELIVERY_LIMIT: i64 = 50;

/// How many times a message may be parked for a failure (the store, an
/// unreadable endpoint) before it is dead-lettered: with the doubling waits
/// of a park, long enough to ride out a database restart, short enough that a
/// message nobody can process stops cycling.
pub const PARK_LIMIT: u32 = 10;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Which of the two work queues a delivery waits in (README, "Scheduling"):
/// a developer's events within their fair share go to `default`, the rest,
/// and backlogs by nature (recovery, sweeps, dead-letter replays), to `bulk`,
/// which may hold at most three quarters of a dispatcher's slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    #[default]
    Default,
    Bulk,
}

impl Lane {
    fn is_default(&self) -> bool {
        *self == Lane::Default
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Default => "default",
            Lane::Bulk => "bulk",
        }
    }
}

/// Names of every exchange and queue of one deployment.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    retry_delays: Vec<Duration>,
}

impl Topology {
    /// The topology of `prefix`, with one retry queue per distinct delay.
    pub fn new(prefix: &str, schedule: &RetrySchedule) -> Topology {
        let mut retry_delays = schedule.delays().to_vec();
        retry_delays.sort();
        retry_delays.dedup();
        Topology { prefix: prefix.to_owned(), retry_delays }
    }

    /// The work queue dispatchers consume first.
    pub fn deliveries(&self) -> String {
        format!("{}.deliveries", self.prefix)
    }

    /// The work queue of `lane`: [`Topology::deliveries`], or
    /// `{p}.deliveries.bulk`.
    pub fn work_queue(&self, lane: Lane) -> String {
        match lane {
            Lane::Default => self.deliveries(),
            Lane::Bulk => format!("{}.deliveries.bulk", self.prefix),
        }
    }

    /// Every queue of the topology (not the lifecycle listeners' own).
    pub fn queues(&self) -> Vec<String> {
        let mut queues = vec![self.work_queue(Lane::Default), self.work_queue(Lane::Bulk), self.dead()];
        for delay in &self.retry_delays {
            queues.push(self.retry_in(Lane::Default, *delay));
            queues.push(self.retry_in(Lane::Bulk, *delay));
        }
        queues
    }

    /// Where messages go that cannot be processed.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// The fanout exchange of endpoint changes.
    pub fn lifecycle(&self) -> String {
        format!("{}.lifecycle", self.prefix)
    }

    /// The retry queue that holds a message of the default lane for `delay`.
    pub fn retry(&self, delay: Duration) -> String {
        self.retry_in(Lane::Default, delay)
    }

    /// The retry queue that holds a message of `lane` for `delay`; it
    /// dead-letters back into the lane's work queue.
    pub fn retry_in(&self, lane: Lane, delay: Duration) -> String {
        match lane {
            Lane::Default => format!("{}.retry.{}ms", self.prefix, delay.as_millis()),
            Lane::Bulk => format!("{}.retry.bulk.{}ms", self.prefix, delay.as_millis()),
        }
    }

    /// The retry queue that can hold a message for `delay`, and how long the
    /// message should wait in it: the smallest tier at least as long as
    /// `delay` (the message then carries `delay` as its own expiration), or the
    /// longest tier when none is.
    pub fn retry_route(&self, lane: Lane, delay: Duration) -> Option<(String, Duration)> {
        let tier = self.retry_delays.iter().find(|tier| **tier >= delay).or_else(|| self.retry_delays.last())?;
        Some((self.retry_in(lane, *tier), delay.min(*tier)))
    }

    /// Declares everything; idempotent, and consistent across processes that
    /// share `QUEUE_PREFIX` and `RETRY_SCHEDULE`.
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };

        channel
            .exchange_declare(
                self.lifecycle().as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
                FieldTable::default(),
            )
            .await?;

        let mut dead = FieldTable::default();
        dead.insert("x-queue-type".into(), long_string("quorum"));
        channel.queue_declare(self.dead().as_str().into(), durable, dead).await?;

        for lane in [Lane::Default, Lane::Bulk] {
            let mut work = FieldTable::default();
            work.insert("x-queue-type".into(), long_string("quorum"));
            work.insert("x-dead-letter-exchange".into(), long_string(""));
            work.insert("x-dead-letter-routing-key".into(), long_string(&self.dead()));
            work.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(DELIVERY_LIMIT));
            channel.queue_declare(self.work_queue(lane).as_str().into(), durable, work).await?;
            self.declare_retries(channel, lane).await?;
        }
        Ok(())
    }

    async fn declare_retries(&self, channel: &Channel, lane: Lane) -> lapin::Result<()> {
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        for delay in &self.retry_delays {
            let mut retry = FieldTable::default();
            retry.insert("x-queue-type".into(), long_string("quorum"));
            retry.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            );
            retry.insert("x-dead-letter-exchange".into(), long_string(""));
            retry.insert("x-dead-letter-routing-key".into(), long_string(&self.work_queue(lane)));
            retry.insert("x-dead-letter-strategy".into(), long_string("at-least-once"));
            retry.insert("x-overflow".into(), long_string("reject-publish"));
            channel.queue_declare(self.retry_in(lane, *delay).as_str().into(), durable, retry).await?;
        }
        Ok(())
    }
}

fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// How long opening a connection may take. A broker that accepts the TCP
/// connection but never finishes the AMQP handshake (one still booting, or
/// under a resource alarm) must not hold a process's reconnect loop forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Opens a connection to RabbitMQ within [`CONNECT_TIMEOUT`], named after the
/// process so operators can tell connections apart in the management UI.
pub async fn connect(amqp_url: &str, process: &str) -> anyhow::Result<Connection> {
    let options =
        ConnectionProperties::default().with_client_property("connection_name".into(), LongString::from(process));
    let connected = match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(amqp_url, options)).await {
        Ok(connected) => connected.map_err(anyhow::Error::new),
        Err(_) => Err(anyhow::anyhow!("no AMQP handshake within {CONNECT_TIMEOUT:?}")),
    };
    connected.with_context(|| {
        format!(
            "cannot reach RabbitMQ at {}: start it (or install it), point AMQP_URL at a running broker, \
             or run `webhooks-api standalone`, which needs neither RabbitMQ nor PostgreSQL",
            crate::config::redacted_url(amqp_url)
        )
    })
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

/// A message on the broker: `{"v":1,"type":"…",…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The writer's [`MESSAGE_VERSION`].
    pub v: u32,
    #[serde(flatten)]
    pub message: Message,
}

impl Envelope {
    /// Wraps `message` at the current version.
    pub fn new(message: Message) -> Envelope {
        Envelope { v: MESSAGE_VERSION, message }
    }

    /// The JSON bytes published to the broker.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a message asks of its reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Make one delivery attempt.
    Delivery(DeliveryMessage),
    /// An endpoint changed: drop whatever is cached about it.
    EndpointChanged(EndpointChanged),
}

/// One delivery attempt to make. It carries everything the dispatcher needs
/// besides the endpoint, so the hot path reads nothing per message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub delivery_id: i64,
    pub event_id: String,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    /// The number of this attempt, 1 for the first.
    pub attempt: u32,
    /// Deliver even to a `disabled` endpoint: set by `POST /webhooks/{id}/send`.
    #[serde(default)]
    pub force: bool,
    /// The delivery's generation this message belongs to: 0 from ingest, and
    /// one more for each `send`. A retry of an older generation is dropped,
    /// and its outcome does not change the delivery's state. `None` when the
    /// writer predates generations (or dropped the field on re-publishing):
    /// then only the delivery's state is checked, never the generation, so a
    /// mixed-version deployment may deliver twice but never drops a delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i32>,
    /// How often this attempt was put back without being made (its endpoint
    /// had no free slot, or something failed): each time it waits longer. 0
    /// on every new attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parks: u32,
    /// How many of those parks were for a failure (the store, an unreadable
    /// endpoint): past [`PARK_LIMIT`] the message is given up. A full
    /// endpoint is only slow, and does not count here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// The ticket this attempt took in its endpoint's pace
    /// (`rate_limit_per_second`) before it was put back to wait for its
    /// start: it goes then without taking another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_ticket: Option<i64>,
    /// The work queue it waits in, and its retries too.
    #[serde(default, skip_serializing_if = "Lane::is_default")]
    pub lane: Lane,
    /// The exact event JSON to POST.
    pub body: String,
    /// When the event was accepted, for latency metrics.
    pub event_created_at: DateTime<Utc>,
}

impl DeliveryMessage {
    /// The first attempt of a delivery an ingest just queued: generation 0,
    /// in the event's lane. The relay makes the same message from an outbox
    /// row.
    pub fn first_attempt(
        delivery_id: i64,
        endpoint_id: &str,
        event: &crate::store::NewEvent,
        body: String,
    ) -> DeliveryMessage {
        DeliveryMessage {
            delivery_id,
            event_id: event.id.clone(),
            endpoint_id: endpoint_id.to_owned(),
            developer_id: event.developer_id,
            attempt: 1,
            force: false,
            generation: Some(0),
            parks: 0,
            failures: 0,
            pace_ticket: None,
            lane: event.lane,
            body,
            event_created_at: event.created_at,
        }
    }
}

/// The kinds of endpoint change recorded and published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Activated,
    Disabled,
    UrlChanged,
    CategoriesChanged,
    Deleted,
    /// A fresh key pair of the same scheme; the old key overlaps.
    KeyRotated,
    /// A fresh key pair of another scheme; the old key overlaps.
    SchemeChanged,
    /// The service disabled the endpoint: its deliveries kept failing.
    AutoDisabled,
    /// `rate_limit_per_second` changed.
    RateLimitChanged,
    /// `ordering` changed.
    OrderingChanged,
}

impl ChangeKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Activated => "activated",
            ChangeKind::Disabled => "disabled",
            ChangeKind::UrlChanged => "url_changed",
            ChangeKind::CategoriesChanged => "categories_changed",
            ChangeKind::Deleted => "deleted",
            ChangeKind::KeyRotated => "key_rotated",
            ChangeKind::SchemeChanged => "scheme_changed",
            ChangeKind::AutoDisabled => "auto_disabled",
            ChangeKind::RateLimitChanged => "rate_limit_changed",
            ChangeKind::OrderingChanged => "ordering_changed",
        }
    }
}

/// A lifecycle message on `{p}.lifecycle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointChanged {
    /// The id of the recorded change; grows with every change.
    pub change_id: i64,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub change: ChangeKind,
    /// The key that made the change.
    pub api_key_id: Option<Uuid>,
    pub occurred_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_versioned_and_tagged() {
        let message = Envelope::new(Message::EndpointChanged(EndpointChanged {
            change_id: 7,
            endpoint_id: "wep_00".into(),
            developer_id: Uuid::nil(),
            change: ChangeKind::UrlChanged,
            api_key_id: None,
            occurred_at: DateTime::from_timestamp(0, 0).unwrap(),
        }));
        let json: serde_json::Value = serde_json::from_slice(&message.to_bytes()).unwrap();
        assert_eq!(json["v"], 1);
        assert_eq!(json["type"], "endpoint_changed");
        assert_eq!(json["change"], "url_changed");
        let back: Envelope = serde_json::from_value(json).unwrap();
        assert_eq!(back, message);
    }

    #[test]
    fn delivery_messages_from_older_writers_still_parse() {
        // As written before `force` and `generation` existed.
        let old = r#"{"v":1,"type":"delivery","delivery_id":5,"event_id":"wh_00","endpoint_id":"wep_00",
            "developer_id":"00000000-0000-0000-0000-000000000000","attempt":2,"body":"{}",
            "event_created_at":"2026-01-01T00:00:00Z"}"#;
        let Envelope { message: Message::Delivery(message), .. } = serde_json::from_str(old).unwrap() else {
            panic!("not a delivery")
        };
        assert_eq!((message.attempt, message.force, message.generation), (2, false, None));

        let current = DeliveryMessage { generation: Some(3), ..message };
        let bytes = Envelope::new(Message::Delivery(current.clone())).to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["generation"], 3);
        let back: Envelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.message, Message::Delivery(current));
    }

    #[test]
    fn one_retry_queue_per_distinct_delay() {
        let topology = Topology::new("p", &"5s,5s,1m".parse().unwrap());
        assert_eq!(topology.retry_delays.len(), 2);
        assert_eq!(topology.retry(Duration::from_secs(5)), "p.retry.5000ms");
        assert_eq!(topology.deliveries(), "p.deliveries");
        let (queue, wait) = topology.retry_route(Lane::Default, Duration::from_secs(3)).unwrap();
        assert_eq!((queue.as_str(), wait), ("p.retry.5000ms", Duration::from_secs(3)));
        let (queue, wait) = topology.retry_route(Lane::Bulk, Duration::from_secs(600)).unwrap();
        assert_eq!((queue.as_str(), wait), ("p.retry.bulk.60000ms", Duration::from_secs(60)));
        assert_eq!(topology.work_queue(Lane::Bulk), "p.deliveries.bulk");
        assert_eq!(topology.queues().len(), 7);
    }
}
