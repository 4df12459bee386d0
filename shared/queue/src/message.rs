//! The messages of the queues, their one codec and the only constructors of
//! a delivery message.
//!
//! On the wire a message is JSON: `{"v":1,"type":"delivery",…}` or
//! `{"v":1,"type":"endpoint_changed",…}`. Each kind's current version is a
//! type of its own ([`DeliveryV1`]); a reader refuses a version it does not
//! know rather than guess ([`DecodeError::UnknownVersion`]), and ignores
//! fields it does not know, so a writer may add optional fields within a
//! version. Nothing outside this module builds a [`DeliveryMessage`]: it is
//! `#[non_exhaustive]`, and made from a [`DueDelivery`], an ingested event,
//! or an earlier message.

use std::{borrow::Cow, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use webhooks_model::{EndpointChanged, Lane};
use webhooks_store::{DueDelivery, NewEvent, QueuedDelivery};

/// The version this build writes, and the newest it reads.
pub const VERSION: u32 = 1;

/// How many times a message may be parked for a failure (the store, an
/// unreadable endpoint) before it is given up: with the doubling waits of a
/// park, long enough to ride out a database restart, short enough that a
/// message nobody can process stops cycling.
pub const PARK_LIMIT: u32 = 10;

/// The delivery message this build makes and handles.
pub type DeliveryMessage = DeliveryV1;

/// A message of either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Make one delivery attempt.
    Delivery(DeliveryMessage),
    /// An endpoint changed: drop whatever is cached about it.
    EndpointChanged(EndpointChanged),
}

/// One delivery attempt to make, version 1. It carries everything the
/// dispatcher needs besides the endpoint, so the hot path reads nothing per
/// message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeliveryV1 {
    pub delivery_id: i64,
    pub event_id: String,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    /// The number of this attempt, 1 for the first.
    pub attempt: u32,
    /// Deliver even to a `disabled` endpoint: set by `send` and recoveries,
    /// for one attempt.
    #[serde(default)]
    pub force: bool,
    /// The delivery's generation this message belongs to: 0 from ingest, one
    /// more each time the delivery is queued again (`send`, a recovery, a
    /// sweep). A message of an older generation is dropped unsent. `None`
    /// from writers that predate generations: then only the delivery's state
    /// is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i32>,
    /// How often this attempt was put back without being made: each time it
    /// waits longer. 0 on every new attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parks: u32,
    /// How many of those parks were for a failure (the store, an unreadable
    /// endpoint): past [`PARK_LIMIT`] the message is given up. A full
    /// endpoint is only slow, and does not count here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// The ticket this attempt took in its endpoint's pace before it was put
    /// back to wait for its start: it goes then without taking another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_ticket: Option<i64>,
    /// The lane it waits in, and its retries too.
    #[serde(default, skip_serializing_if = "Lane::is_default")]
    pub lane: Lane,
    /// The earliest time it can have entered its lane's work queue: when it
    /// was published there, or when its wait in a retry queue ended. A
    /// dispatcher that receives it knows every message that entered the
    /// lane before then was handed out (the lane's watermark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enters_at: Option<DateTime<Utc>>,
    /// Set by the ingest on a first attempt it hands over right after its
    /// commit, when the endpoint was not ordered in that transaction: the
    /// delivery was made and admitted in the same breath. While the message
    /// is fresh the dispatcher takes it at its word
    /// ([`DeliveryV1::stands_unasked`]); any other copy asks the store.
    #[serde(default, skip_serializing_if = "is_false")]
    pub admitted: bool,
    /// The exact event JSON to POST.
    pub body: String,
    /// When the event was accepted, for latency metrics.
    pub event_created_at: DateTime<Utc>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How long after its event was accepted a first attempt the ingest
/// admitted stands without asking the store. Far longer than an event takes
/// to reach a dispatcher that keeps up, and far shorter than anything that
/// queues a delivery again on its own waits (a sweep waits at least
/// `DELIVERY_TIMEOUT` past a watermark): an older message may have been
/// overtaken, so it asks.
pub const ADMITTED_FOR: Duration = Duration::from_secs(1);

impl From<DueDelivery> for DeliveryV1 {
    /// The message of a delivery's next attempt, as the store has it.
    fn from(due: DueDelivery) -> DeliveryV1 {
        DeliveryV1 {
            delivery_id: due.delivery_id,
            event_id: due.event_id,
            endpoint_id: due.endpoint_id,
            developer_id: due.developer_id,
            attempt: due.attempt,
            force: due.force,
            generation: due.generation,
            parks: due.parks,
            failures: due.failures,
            pace_ticket: due.pace_ticket,
            lane: due.lane,
            enters_at: None,
            admitted: false,
            body: due.body,
            event_created_at: due.event_created_at,
        }
    }
}

impl DeliveryV1 {
    /// The first attempt of a delivery an ingest just queued: generation 0,
    /// in the event's lane, admitted unless its endpoint is ordered.
    pub fn first_attempt(queued: &QueuedDelivery, event: &NewEvent, body: String) -> DeliveryV1 {
        DeliveryV1 {
            delivery_id: queued.delivery_id,
            event_id: event.id.clone(),
            endpoint_id: queued.endpoint_id.clone(),
            developer_id: event.developer_id,
            attempt: 1,
            force: false,
            generation: Some(0),
            parks: 0,
            failures: 0,
            pace_ticket: None,
            lane: event.lane,
            enters_at: None,
            admitted: !queued.ordered,
            body,
            event_created_at: event.created_at,
        }
    }

    /// Whether this message may be sent without asking the store whether it
    /// stands: a first attempt the ingest admitted, handed out for the first
    /// time (not `redelivered`: a dispatcher that had it may have made it),
    /// `received` within [`ADMITTED_FOR`] of its event (either way, for
    /// clocks a little apart). Only the copy the ingest handed over is
    /// marked: every message made from the store, and every one a
    /// dispatcher publishes again, is not, so each delivery is sent unasked
    /// at most once.
    pub fn stands_unasked(&self, redelivered: bool, received: DateTime<Utc>) -> bool {
        let age = (received - self.event_created_at).abs().to_std().unwrap_or(Duration::MAX);
        self.admitted
            && !redelivered
            && self.attempt == 1
            && self.generation == Some(0)
            && self.parks == 0
            && !self.force
            && age < ADMITTED_FOR
    }

    /// The message of the attempt after this one: a fresh attempt under the
    /// endpoint's rules (`force` covers one attempt only), not yet put back.
    pub fn next_attempt(&self) -> DeliveryV1 {
        DeliveryV1 {
            attempt: self.attempt + 1,
            force: false,
            parks: 0,
            failures: 0,
            pace_ticket: None,
            admitted: false,
            ..self.clone()
        }
    }

    /// This message put back once more without an attempt; `failure` when
    /// something failed (which counts towards [`PARK_LIMIT`]), not when its
    /// endpoint was only busy.
    pub fn put_back(&self, failure: bool) -> DeliveryV1 {
        DeliveryV1 {
            parks: self.parks.saturating_add(1),
            failures: self.failures.saturating_add(u32::from(failure)),
            admitted: false,
            ..self.clone()
        }
    }

    /// This message replayed from the dead-letter queue by an operator: its
    /// counts start over, and it waits in the bulk lane (a backlog by nature).
    pub fn replayed(&self) -> DeliveryV1 {
        DeliveryV1 { parks: 0, failures: 0, lane: Lane::Bulk, admitted: false, ..self.clone() }
    }

    /// This message as published at a time it enters its lane's work queue
    /// at the earliest.
    pub fn entering_at(&self, at: DateTime<Utc>) -> DeliveryV1 {
        DeliveryV1 { enters_at: Some(at), ..self.clone() }
    }

    /// This message as a dispatcher publishes it again, to wait in a retry
    /// queue, entering its lane's work queue at `at`: no longer admitted,
    /// since only the copy the ingest handed over is.
    pub fn published_again(&self, at: DateTime<Utc>) -> DeliveryV1 {
        DeliveryV1 { enters_at: Some(at), admitted: false, ..self.clone() }
    }

    /// The type of the event it carries, read from the body (the delivery
    /// log keeps it with each attempt).
    pub fn event_type(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct Typed<'a> {
            #[serde(borrow)]
            event_type: Cow<'a, str>,
        }
        serde_json::from_str::<Typed<'_>>(&self.body).ok().map(|typed| typed.event_type.into_owned())
    }

    /// This message holding `ticket` in its endpoint's pace, to be put back
    /// until its start.
    pub fn with_pace_ticket(&self, ticket: i64) -> DeliveryV1 {
        DeliveryV1 { pace_ticket: Some(ticket), admitted: false, ..self.clone() }
    }
}

/// Why bytes are not a message this build can handle.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not a JSON object with a numeric `v` and a `type`.
    #[error("not a message: {0}")]
    Malformed(#[source] serde_json::Error),
    /// A version newer than this build reads: an operator upgrades the
    /// readers first.
    #[error("message version {0} is unknown to this build (it reads up to {VERSION})")]
    UnknownVersion(u64),
    /// A kind of message this build does not know.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    /// A known kind and version whose fields do not parse.
    #[error("unreadable {kind} message: {source}")]
    Unreadable {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Deserialize)]
struct Head<'a> {
    v: u64,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Serialize)]
struct Out<'a, T> {
    v: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

/// The bytes of `message`, at [`VERSION`].
pub fn encode(message: &Message) -> Vec<u8> {
    let written = match message {
        Message::Delivery(body) => serde_json::to_vec(&Out { v: VERSION, kind: "delivery", body }),
        Message::EndpointChanged(body) => serde_json::to_vec(&Out { v: VERSION, kind: "endpoint_changed", body }),
    };
    // Serializing these plain structs to a Vec cannot fail.
    written.unwrap_or_default()
}

/// The bytes of a delivery message.
pub fn encode_delivery(message: &DeliveryMessage) -> Vec<u8> {
    serde_json::to_vec(&Out { v: VERSION, kind: "delivery", body: message }).unwrap_or_default()
}

/// The message in `bytes`, if this build knows its kind and version.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let head: Head = serde_json::from_slice(bytes).map_err(DecodeError::Malformed)?;
    if head.v == 0 || head.v > u64::from(VERSION) {
        return Err(DecodeError::UnknownVersion(head.v));
    }
    match head.kind.as_ref() {
        "delivery" => serde_json::from_slice(bytes)
            .map(Message::Delivery)
            .map_err(|source| DecodeError::Unreadable { kind: "delivery", source }),
        "endpoint_changed" => serde_json::from_slice(bytes)
            .map(Message::EndpointChanged)
            .map_err(|source| DecodeError::Unreadable { kind: "endpoint_changed", source }),
        other => Err(DecodeError::UnknownType(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use webhooks_model::ChangeKind;

    pub(crate) fn due(attempt: u32) -> DueDelivery {
        DueDelivery {
            delivery_id: 5,
            event_id: "wh_00".into(),
            endpoint_id: "wep_00".into(),
            developer_id: Uuid::nil(),
            attempt,
            force: true,
            generation: Some(3),
            parks: 2,
            failures: 1,
            pace_ticket: Some(9),
            lane: Lane::Bulk,
            body: "{}".into(),
            event_created_at: DateTime::from_timestamp(0, 0).unwrap(),
        }
    }

    #[test]
    fn messages_are_versioned_and_tagged() {
        let change = Message::EndpointChanged(EndpointChanged {
            change_id: 7,
            endpoint_id: "wep_00".into(),
            developer_id: Uuid::nil(),
            change: ChangeKind::UrlChanged,
            api_key_id: None,
            occurred_at: DateTime::from_timestamp(0, 0).unwrap(),
        });
        let json: serde_json::Value = serde_json::from_slice(&encode(&change)).unwrap();
        assert_eq!((json["v"].as_u64(), json["type"].as_str()), (Some(1), Some("endpoint_changed")));
        assert_eq!(json["change"], "url_changed");
        assert_eq!(decode(&encode(&change)).unwrap(), change);

        let delivery = DeliveryMessage::from(due(2));
        let bytes = encode_delivery(&delivery);
        assert_eq!(bytes, encode(&Message::Delivery(delivery.clone())));
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((json["v"].as_u64(), json["type"].as_str()), (Some(1), Some("delivery")));
        assert_eq!((json["generation"].as_i64(), json["lane"].as_str()), (Some(3), Some("bulk")));
        assert_eq!(decode(&bytes).unwrap(), Message::Delivery(delivery));
    }

    #[test]
    fn delivery_messages_from_older_writers_still_parse() {
        // As written before `force` and `generation` existed.
        let old = br#"{"v":1,"type":"delivery","delivery_id":5,"event_id":"wh_00","endpoint_id":"wep_00",
            "developer_id":"00000000-0000-0000-0000-000000000000","attempt":2,"body":"{}",
            "event_created_at":"2026-01-01T00:00:00Z","a_field_from_a_newer_writer":true}"#;
        let Message::Delivery(message) = decode(old).unwrap() else { panic!("not a delivery") };
        assert_eq!((message.attempt, message.force, message.generation, message.lane), (2, false, None, Lane::Default));
    }

    #[test]
    fn a_reader_refuses_what_it_does_not_know() {
        let newer = br#"{"v":2,"type":"delivery","delivery_id":5}"#;
        assert!(matches!(decode(newer), Err(DecodeError::UnknownVersion(2))));
        assert!(matches!(decode(br#"{"v":1,"type":"teleport"}"#), Err(DecodeError::UnknownType(t)) if t == "teleport"));
        assert!(matches!(decode(b"not json"), Err(DecodeError::Malformed(_))));
        assert!(matches!(decode(br#"{"type":"delivery"}"#), Err(DecodeError::Malformed(_))));
        assert!(matches!(decode(br#"{"v":1,"type":"delivery"}"#), Err(DecodeError::Unreadable { .. })));
    }

    fn new_event(created_at: DateTime<Utc>) -> NewEvent {
        NewEvent {
            id: "wh_00".into(),
            developer_id: Uuid::nil(),
            category: webhooks_model::Category::Transfer,
            event_type: "transfer.created".into(),
            created_at,
            idempotency_key: None,
            request_hash: None,
            body_head: "{".into(),
            body_tail: "}".into(),
            lane: Lane::Default,
        }
    }

    #[test]
    fn only_a_fresh_first_handout_of_an_admitted_first_attempt_stands_unasked() {
        let accepted = DateTime::from_timestamp(1_000, 0).unwrap();
        let queued = |ordered| QueuedDelivery { delivery_id: 5, endpoint_id: "wep_00".into(), ordered };
        let first = DeliveryMessage::first_attempt(&queued(false), &new_event(accepted), "{}".into());
        let soon = accepted + chrono::Duration::milliseconds(3);
        assert!(first.stands_unasked(false, soon));
        assert!(decode(&encode_delivery(&first)).is_ok_and(|m| m == Message::Delivery(first.clone())));
        // A clock a little behind the API's.
        assert!(first.stands_unasked(false, accepted - chrono::Duration::milliseconds(3)));

        let later = accepted + chrono::Duration::from_std(ADMITTED_FOR).unwrap();
        let ordered = DeliveryMessage::first_attempt(&queued(true), &new_event(accepted), "{}".into());
        // The same first attempt as the outbox or a sweep makes it.
        let stored = DueDelivery {
            attempt: 1,
            force: false,
            generation: Some(0),
            parks: 0,
            failures: 0,
            pace_ticket: None,
            lane: Lane::Default,
            event_created_at: accepted,
            ..due(1)
        };
        let asks = [
            (first.clone(), true, soon, "handed out before"),
            (first.clone(), false, later, "stale"),
            (first.clone(), false, accepted - chrono::Duration::from_std(ADMITTED_FOR).unwrap(), "from far ahead"),
            (ordered, false, soon, "to an ordered endpoint"),
            (DeliveryMessage::from(stored), false, soon, "made from the store"),
            (first.replayed(), false, soon, "replayed"),
            (first.published_again(soon), false, soon, "published again by a dispatcher"),
            (first.with_pace_ticket(3), false, soon, "booked in its pace"),
        ];
        for (message, redelivered, received, what) in asks {
            assert!(!message.stands_unasked(redelivered, received), "{what}");
        }
        // Every later message of the delivery is unmarked; the relay's
        // timestamp keeps the mark.
        assert!(!first.next_attempt().admitted && !first.put_back(false).admitted);
        assert!(first.entering_at(soon).stands_unasked(false, soon));
        // Not admitted is not written at all.
        let json: serde_json::Value = serde_json::from_slice(&encode_delivery(&first.next_attempt())).unwrap();
        assert!(json.get("admitted").is_none(), "{json}");
    }

    #[test]
    fn the_next_attempt_is_fresh_and_a_put_back_counts() {
        let message = DeliveryMessage::from(due(2));
        let next = message.next_attempt();
        assert_eq!((next.attempt, next.force, next.parks, next.failures, next.pace_ticket), (3, false, 0, 0, None));
        assert_eq!((next.generation, next.lane), (Some(3), Lane::Bulk));
        let busy = message.put_back(false);
        assert_eq!((busy.parks, busy.failures), (3, 1));
        let failed = message.put_back(true);
        assert_eq!((failed.parks, failed.failures), (3, 2));
        assert_eq!(message.with_pace_ticket(11).pace_ticket, Some(11));
    }
}
