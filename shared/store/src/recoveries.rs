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

/// What a recovery of a window would queue, counted before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recoverable {
    /// The deliveries it would queue.
    pub count: u64,
    /// The first and the last event sequence among them: the range its
    /// batches walk. `None` when there is nothing to queue.
    pub sequences: Option<(i64, i64)>,
}

impl Recoverable {
    /// From a count's row as both backends select it: the count, the first
    /// and the last sequence.
    pub(crate) fn from_row((count, first, last): (i64, Option<i64>, Option<i64>)) -> Recoverable {
        Recoverable { count: u64::try_from(count).unwrap_or_default(), sequences: first.zip(last) }
    }
}

/// A recovery about to start.
#[derive(Debug, Clone)]
pub struct NewRecovery {
    pub id: Uuid,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub window: RecoveryWindow,
    /// What it was counted to queue, as answered, and where.
    pub counted: Recoverable,
    /// The key that asked for it.
    pub api_key_id: Option<Uuid>,
}

impl NewRecovery {
    /// The deliveries it was counted to queue, as stored.
    pub(crate) fn total(&self) -> i64 {
        i64::try_from(self.counted.count).unwrap_or(i64::MAX)
    }

    /// The cursor and the end of its range as stored: just before the
    /// first sequence counted and the last one. Without them its first
    /// batch finds the range from the window.
    pub(crate) fn range(&self) -> (i64, Option<i64>) {
        match self.counted.sequences {
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
    /// The deliveries it was counted to queue when it started.
    pub total: i64,
    /// The deliveries it queued so far.
    pub queued: i64,
    /// The last event sequence it went through.
    pub after_sequence: i64,
    /// Why the last batch failed, while it is retried.
    pub last_error: Option<String>,
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

/// The columns of a recovery row that both backends select.
pub(crate) const COLUMNS: &str = "id, endpoint_id, developer_id, since, until, state, total, queued, after_sequence, \
                                  last_error, created_at, updated_at, finished_at";

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
            total: row.total.unwrap_or_default(),
            queued: row.queued,
            after_sequence: row.after_sequence,
            last_error: row.last_error,
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
            counted: Recoverable { count, sequences },
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
        assert_eq!(counted(u64::MAX, None).total(), i64::MAX);
    }
}
