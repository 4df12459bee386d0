//! Delivery state and the delivery log. Dispatchers write both in batches:
//! one transaction for many attempts.

use chrono::{DateTime, Utc};
use uuid::Uuid;
use webhooks_model::Lane;

use webhooks_model::DeliveryLog;

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum DeliveryState {
    /// Kept for a disabled endpoint; delivered only by `send`.
    Held,
    /// Queued for its first attempt.
    Pending,
    /// Failed at least once; another attempt is scheduled.
    Retrying,
    /// An ordered endpoint's delivery whose turn has not come: an earlier
    /// one is unsettled. Its settling releases this one.
    Waiting,
    Succeeded,
    /// Every attempt failed; `send` can still deliver it.
    Failed,
    /// Its endpoint was deleted.
    Cancelled,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Which entries of an endpoint's delivery log to list (`GET
/// /v0/webhooks/{id}/logs`); the filters combine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFilter {
    /// `Some(true)`: only attempts that succeeded (a 2xx and no error);
    /// `Some(false)`: only those that did not.
    pub succeeded: Option<bool>,
    /// Only attempts at events of this `event_type`.
    pub event_type: Option<String>,
    /// Only attempts at this event.
    pub event_id: Option<String>,
    /// Only attempts made at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only attempts made before this time.
    pub until: Option<DateTime<Utc>>,
}

/// The outcome of one message: an attempt to log (if one was made) and the
/// delivery's new state.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub delivery_id: i64,
    /// The delivery's event: on PostgreSQL it says which partition holds
    /// the delivery.
    pub event_id: String,
    pub state: DeliveryState,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// `None` when nothing was sent (endpoint disabled or deleted).
    pub log: Option<DeliveryLog>,
    pub endpoint_id: String,
    /// The generation of the message; the state is written only if the
    /// delivery is still at it (any state when unknown).
    pub generation: Option<i32>,
}

/// Whether an ordered endpoint's delivery may be attempted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// No earlier delivery of the endpoint is unsettled (or the endpoint is
    /// not ordered).
    Go,
    /// An earlier one is: the delivery now waits (`waiting`) until that one
    /// settles, which queues it again.
    Wait,
}

/// Whether a message still stands for its delivery, as the store has it at
/// the attempt. (Answers a [`StandingQuestion`].)
///
/// An attempt no newer than the last one recorded is `Superseded` too: a
/// duplicate message (a broker redelivery, a retry published before a commit
/// that failed) would otherwise fork a second retry chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The delivery is still at the message's generation and not settled.
    /// `ordered`: its endpoint is ordered now, whatever a cache says, so the
    /// attempt takes its turn first.
    Go { ordered: bool },
    /// `send` re-armed the delivery since, or it succeeded or was cancelled
    /// (or is gone): the message is dropped without an attempt.
    Superseded,
}

/// A delivery whose message was parked until `until`, in `generation`
/// (unknown: `None`): see [`crate::Store::defer_parked`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub delivery_id: i64,
    /// The delivery's event (see [`AttemptRecord::event_id`]).
    pub event_id: String,
    pub generation: Option<i32>,
    pub until: chrono::DateTime<chrono::Utc>,
    /// No message waits for it: it was acked, and the delivery waits in the
    /// store behind its hanging endpoint until released or due (see
    /// [`crate::Store::release_set_aside`]). False when a retry queue
    /// holds its message.
    pub set_aside: bool,
}

/// Whether attempt `attempt` of `delivery_id`, in `generation` (unknown:
/// `None`), should still be made: see [`RetryStanding`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandingQuestion {
    pub delivery_id: i64,
    /// The delivery's event (see [`AttemptRecord::event_id`]).
    pub event_id: String,
    pub generation: Option<i32>,
    pub attempt: i32,
}

/// A delivery's next attempt as the store has it: what its message is made
/// of. The queue makes the message; no SQL does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDelivery {
    pub delivery_id: i64,
    pub event_id: String,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    /// The attempt to make, 1 for the first.
    pub attempt: u32,
    /// Forced by `send`: made even to a disabled endpoint.
    pub force: bool,
    pub generation: Option<i32>,
    /// How often this attempt was put back, and how many of those for a
    /// failure (kept by the embedded queue; 0 on the broker's rows).
    pub parks: u32,
    pub failures: u32,
    /// The ticket it took in its endpoint's pace, if it did.
    pub pace_ticket: Option<i64>,
    pub lane: Lane,
    /// The exact event JSON to POST.
    pub body: String,
    pub event_created_at: DateTime<Utc>,
}

/// What waits, for the gauges an operator alerts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// The due time of the oldest delivery due in each lane (set-aside ones
    /// apart), if any is due.
    pub oldest_due: Vec<(Lane, DateTime<Utc>)>,
    /// Deliveries of ordered endpoints waiting for their turn.
    pub waiting: i64,
    /// Deliveries set aside behind a hanging endpoint.
    pub set_aside: i64,
    /// Recoveries running.
    pub recoveries: i64,
}
