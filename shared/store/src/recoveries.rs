//! Recoveries (`POST /v0/webhooks/{id}/recover`) as stored jobs: one
//! running per endpoint, their progress kept with the deliveries each batch
//! queues (in the same transaction), resumed by any API process once the
//! one working on it stops.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    RecoveryWindow,
    columns::{At, Id, optional},
};

/// What a recovery of a window would queue, counted as it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recoverable {
    /// The deliveries it would queue.
    pub count: u64,
    /// The first and the last event sequence among them: the range its
    /// batches walk. `None` when there is nothing to queue.
    pub sequences: Option<(i64, i64)>,
    /// Deliveries of the window still owed (pending, retrying, or waiting
    /// for their turn): a recovery leaves them be.
    pub owed: u64,
}

impl Recoverable {
    /// From a count's row as both backends select it: the count, the first
    /// and the last sequence, the deliveries still owed.
    pub(crate) fn from_row((count, first, last, owed): (i64, Option<i64>, Option<i64>, i64)) -> Recoverable {
        Recoverable {
            count: u64::try_from(count).unwrap_or_default(),
            sequences: first.zip(last),
            owed: u64::try_from(owed).unwrap_or_default(),
        }
    }

    /// Why a recovery of this count queues nothing, if it does not.
    pub fn reason(&self) -> Option<String> {
        let none = "no delivery of this window failed or is upcoming";
        match (self.count, self.owed) {
            (0, 0) => Some(none.to_owned()),
            (0, owed) => Some(format!(
                "{none}; {owed} of its deliveries are still pending or retrying, and go out on their own schedule"
            )),
            _ => None,
        }
    }
}

/// A recovery about to start.
#[derive(Debug, Clone)]
pub struct NewRecovery {
    pub id: Uuid,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub window: RecoveryWindow,
    /// What it was counted to queue, and where: `None` while the count
    /// goes on (it is stored once done, [`crate::Store::count_recovery`]).
    pub counted: Option<Recoverable>,
    /// The key that asked for it.
    pub api_key_id: Option<Uuid>,
}

impl NewRecovery {
    /// The deliveries it was counted to queue, as stored (`None` while
    /// counting).
    pub(crate) fn total(&self) -> Option<i64> {
        self.counted.map(|counted| counted.total())
    }

    /// The cursor and the end of its range as stored: just before the
    /// first sequence counted and the last one. Without them its first
    /// batch finds the range from the window.
    pub(crate) fn range(&self) -> (i64, Option<i64>) {
        self.counted.map_or((0, None), |counted| counted.range())
    }
}

impl Recoverable {
    /// The count as stored.
    pub(crate) fn total(&self) -> i64 {
        i64::try_from(self.count).unwrap_or(i64::MAX)
    }

    /// The cursor and the end of the range as stored (see
    /// [`NewRecovery::range`]); `None` for the end when there is nothing.
    pub(crate) fn range(&self) -> (i64, Option<i64>) {
        match self.sequences {
            Some((first, last)) => (first.saturating_sub(1), Some(last)),
            None => (0, None),
        }
    }
}

/// A recovery as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub id: Uuid,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub window: RecoveryWindow,
    /// Still queueing.
    pub running: bool,
    /// The deliveries it was counted to queue; `None` while the count goes
    /// on.
    pub total: Option<i64>,
    /// The deliveries it queued so far.
    pub queued: i64,
    /// The last event sequence it went through.
    pub after_sequence: i64,
    /// Why the last batch failed, while it is retried.
    pub last_error: Option<String>,
    /// Why it queued nothing, when it did not.
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// How a start went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryStart {
    Started(Recovery),
    /// Another recovery of the endpoint is running: this one.
    Running(Recovery),
}

/// What one batch of a recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryStep {
    /// Deliveries queued by the batch.
    pub queued: u64,
    /// The recovery is over (the window is done, the endpoint is gone, or it
    /// is no longer this worker's).
    pub done: bool,
}

/// The running recoveries free to take (`{free}`, the owner `$1`), at most
/// `$3`, in turns across developers: every developer's oldest first, then
/// every developer's second, so one developer's many recoveries never hold
/// up another's.
pub(crate) const TURNS: &str = "
    SELECT id FROM (
        SELECT id, created_at, row_number() OVER (PARTITION BY developer_id ORDER BY created_at) AS turn
          FROM recoveries WHERE state = 'running' AND ({free})) r
     ORDER BY turn, created_at LIMIT $3";

/// Stores the count of recovery `$1`, made after it started: `$2` the
/// deliveries it queues, its range (`$3` the cursor before it, `$4` its
/// end) unless a batch fixed one already, and when it queues nothing, why
/// (`$5`); then it is done (`$6`: now).
pub(crate) const COUNTED: &str = "
    UPDATE recoveries
       SET total = $2,
           after_sequence = CASE WHEN until_sequence IS NULL AND $4 IS NOT NULL THEN $3 ELSE after_sequence END,
           until_sequence = coalesce(until_sequence, $4),
           reason = $5,
           state = CASE WHEN $2 = 0 THEN 'done' ELSE state END,
           finished_at = CASE WHEN $2 = 0 AND state = 'running' THEN $6 ELSE finished_at END,
           updated_at = $6
     WHERE id = $1 AND total IS NULL";

/// The columns of a recovery row that both backends select.
pub(crate) const COLUMNS: &str = "id, endpoint_id, developer_id, since, until, state, total, queued, after_sequence, \
                                  last_error, reason, created_at, updated_at, finished_at";

/// A recovery row as [`COLUMNS`] selects it, in either dialect.
#[derive(sqlx::FromRow)]
pub(crate) struct RecoveryRow {
    id: Id,
    endpoint_id: String,
    developer_id: Id,
    since: At,
    until: At,
    state: String,
    total: Option<i64>,
    queued: i64,
    after_sequence: i64,
    last_error: Option<String>,
    reason: Option<String>,
    created_at: At,
    updated_at: At,
    finished_at: Option<At>,
}

impl From<RecoveryRow> for Recovery {
    fn from(row: RecoveryRow) -> Recovery {
        Recovery {
            id: row.id.0,
            endpoint_id: row.endpoint_id,
            developer_id: row.developer_id.0,
            window: RecoveryWindow { since: row.since.0, until: row.until.0 },
            running: row.state == "running",
            total: row.total,
            queued: row.queued,
            after_sequence: row.after_sequence,
            last_error: row.last_error,
            reason: row.reason,
            created_at: row.created_at.0,
            updated_at: row.updated_at.0,
            finished_at: optional(row.finished_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(count: u64, sequences: Option<(i64, i64)>) -> NewRecovery {
        let at = webhooks_model::time::now();
        NewRecovery {
            id: Uuid::nil(),
            endpoint_id: "ep_1".into(),
            developer_id: Uuid::nil(),
            window: RecoveryWindow { since: at, until: at },
            counted: Some(Recoverable { count, sequences, owed: 0 }),
            api_key_id: None,
        }
    }

    #[test]
    fn a_recovery_starts_just_before_the_first_sequence_it_counted() {
        // Batches take sequences after the cursor, up to the end inclusive.
        assert_eq!(counted(3, Some((7, 12))).range(), (6, Some(12)));
        assert_eq!(counted(1, Some((1, 1))).range(), (0, Some(1)));
        // Without a range its first batch takes the window's.
        assert_eq!(counted(0, None).range(), (0, None));
        assert_eq!(counted(u64::MAX, None).total(), Some(i64::MAX));
        let counting = NewRecovery { counted: None, ..counted(0, None) };
        assert_eq!((counting.total(), counting.range()), (None, (0, None)));
    }

    #[test]
    fn a_count_of_nothing_says_why() {
        let nothing = Recoverable::default();
        assert!(nothing.reason().unwrap().contains("failed or is upcoming"));
        let owed = Recoverable { owed: 12, ..Recoverable::default() };
        assert!(owed.reason().unwrap().contains("12 of its deliveries are still pending or retrying"));
        assert_eq!(Recoverable { count: 1, sequences: Some((1, 1)), owed: 3 }.reason(), None);
    }
}
