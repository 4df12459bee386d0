//! Events and their deliveries: ingest in one transaction, the upcoming list of
//! an endpoint, the developer's event list, and re-arming a delivery (`send`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use webhooks_model::Category;

/// An event about to be stored. Its body is `body_head || event_sequence ||
/// body_tail`, the sequence being the one the developer's counter hands out
/// in the same transaction.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: String,
    pub developer_id: Uuid,
    pub category: Category,
    /// Its `event_type`, for endpoints narrowed to some types.
    pub event_type: String,
    pub created_at: DateTime<Utc>,
    /// The producer's `Idempotency-Key`, if it sent one.
    pub idempotency_key: Option<String>,
    /// The fingerprint of the request, kept with the key.
    pub request_hash: Option<Vec<u8>>,
    pub body_head: String,
    pub body_tail: String,
    /// The work queue its deliveries wait in: `bulk` past the developer's
    /// fair share.
    pub lane: webhooks_model::Lane,
}

/// An event stored earlier under a producer's `Idempotency-Key`.
#[derive(Debug, Clone)]
pub struct IdempotentEvent {
    /// The fingerprint of the request that made it.
    pub request_hash: Vec<u8>,
    /// The event JSON as answered then.
    pub body: String,
}

/// Where each delivery of an accepted event went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    pub sequence: i64,
    /// Deliveries queued now (active endpoints), due at once.
    pub queued: Vec<QueuedDelivery>,
    /// Deliveries kept as upcoming (disabled endpoints).
    pub held: usize,
    /// The stored event JSON.
    pub body: String,
}

/// A delivery that an ingest made due at once: what its first message needs
/// besides the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedDelivery {
    pub delivery_id: i64,
    pub endpoint_id: String,
    /// Whether the endpoint delivers in order, as the ingest's transaction
    /// read it.
    pub ordered: bool,
}

/// For each event of a batch, whether an earlier event of the same batch has
/// the same producer `Idempotency-Key` (of the same developer): such a twin
/// is not stored, and answers its first's event once that is committed.
pub(super) fn later_twins(events: &[NewEvent]) -> Vec<bool> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .map(|event| event.idempotency_key.as_deref().is_some_and(|key| !seen.insert((event.developer_id, key))))
        .collect()
}

/// A stored event body with its keys for paging.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredEvent {
    pub id: String,
    pub body: String,
    pub created_at: DateTime<Utc>,
}

/// An event as delivered (`GET /v0/webhook_events/{event_id}`): its body and
/// where each of its deliveries stands.
#[derive(Debug, Clone)]
pub struct DeliveredEvent {
    pub body: String,
    pub deliveries: Vec<EventDelivery>,
}

/// One delivery of an event: to which endpoint, where it stands, how many
/// attempts were made, the last answer's status, and when the next is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventDelivery {
    pub endpoint_id: String,
    /// `held`, `pending`, `retrying`, `waiting`, `succeeded`, `failed` or
    /// `cancelled`.
    pub state: String,
    pub attempts: i32,
    /// The HTTP status of the latest attempt, if one was made and answered.
    pub last_status: Option<i32>,
    /// Null once settled or while held.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// Where the delivery of an upcoming event to its endpoint stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpcomingDelivery {
    pub event_id: String,
    /// `held`, `pending` or `retrying`.
    pub state: String,
    /// Attempts made so far.
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// A page request over events: newest first, with cursors.
#[derive(Debug, Clone, Default)]
pub struct EventPage<'a> {
    pub category: Option<Category>,
    pub limit: i64,
    /// Only events older than this one.
    pub starting_after: Option<&'a str>,
    /// Only events newer than this one.
    pub ending_before: Option<&'a str>,
}

/// A time window of recovery (API.md §8.6): events created at or after
/// `since` and before `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryWindow {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// What one batch of a recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecoveryBatch {
    /// Deliveries queued by this batch.
    pub(crate) queued: u64,
    /// The last sequence the batch covered, where the next one starts;
    /// `None` when the range was done already.
    pub(crate) last_sequence: Option<i64>,
}

impl RecoveryBatch {
    /// Events a batch reads at most for each delivery it may queue: a window
    /// where few events are meant for the endpoint is still walked quickly.
    pub(crate) const EVENTS_PER_DELIVERY: i64 = 10;

    /// The end of the slice a batch of at most `limit` deliveries reads
    /// after sequence `after` of a range ending at `until`:
    /// [`Self::EVENTS_PER_DELIVERY`] times `limit` sequences at most. A
    /// developer's sequences are unique, so a batch reads a bounded number
    /// of events whatever plan the database picks. `None` once the range is
    /// done.
    pub(crate) fn slice_end(after: i64, until: i64, limit: i64) -> Option<i64> {
        let events = limit.saturating_mul(Self::EVENTS_PER_DELIVERY);
        (after < until).then(|| until.min(after.saturating_add(events)))
    }

    /// What a batch did that queued the `wanted` deliveries of its slice
    /// ending at `upto`, the latest at sequence `last_wanted`, taking at
    /// most `limit`: a batch that took its fill ends at its last delivery's
    /// event, and the next one starts after it.
    pub(crate) fn taken(queued: u64, (wanted, last_wanted): (i64, Option<i64>), limit: i64, upto: i64) -> Self {
        let last_sequence = match last_wanted {
            Some(last) if wanted >= limit => last,
            _ => upto,
        };
        RecoveryBatch { queued, last_sequence: Some(last_sequence) }
    }
}

/// How `send` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    Queued,
    /// The developer has no such event.
    NoSuchEvent,
    /// The event is the developer's but not meant for this endpoint.
    NotForEndpoint,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(developer_id: Uuid, key: Option<&str>) -> NewEvent {
        NewEvent {
            id: webhooks_model::ids::new_event_id(),
            developer_id,
            category: Category::Transfer,
            event_type: "transfer.updated".into(),
            created_at: webhooks_model::time::now(),
            idempotency_key: key.map(str::to_owned),
            request_hash: key.map(|_| vec![1]),
            body_head: String::new(),
            body_tail: String::new(),
            lane: webhooks_model::Lane::Default,
        }
    }

    #[test]
    fn only_a_later_event_with_the_same_developer_and_key_is_a_twin() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let batch = [
            event(a, Some("k")),
            event(b, Some("k")),
            event(a, None),
            event(a, Some("k")),
            event(a, None),
            event(a, Some("other")),
            event(b, Some("k")),
        ];
        assert_eq!(later_twins(&batch), [false, false, false, true, false, false, true]);
    }

    #[test]
    fn a_recovery_batch_reads_ten_events_a_delivery_and_ends_at_its_fill() {
        assert_eq!(RecoveryBatch::slice_end(100, 10_000, 10), Some(200));
        assert_eq!(RecoveryBatch::slice_end(100, 150, 10), Some(150));
        assert_eq!(RecoveryBatch::slice_end(150, 150, 10), None);
        // Its fill taken at the event of sequence 130: the next batch starts
        // after it, though the slice went on to 200.
        assert_eq!(RecoveryBatch::taken(10, (10, Some(130)), 10, 200).last_sequence, Some(130));
        // Fewer wanted than it may take, or none: the whole slice is done.
        assert_eq!(RecoveryBatch::taken(3, (3, Some(130)), 10, 200).last_sequence, Some(200));
        assert_eq!(RecoveryBatch::taken(0, (0, None), 10, 200).last_sequence, Some(200));
        // A delivery changed meanwhile is wanted but not queued: the cursor
        // still follows what was wanted.
        assert_eq!(
            RecoveryBatch::taken(9, (10, Some(130)), 10, 200),
            RecoveryBatch { queued: 9, last_sequence: Some(130) }
        );
    }
}
