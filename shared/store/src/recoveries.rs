//! Recoveries (`POST /v0/webhooks/{id}/recover`) as stored jobs: one
//! running per endpoint, their progress kept with the deliveries each batch
//! queues (in the same transaction), resumed by any API process once the
//! one working on it stops.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::RecoveryWindow;

/// A recovery about to start.
#[derive(Debug, Clone)]
pub struct NewRecovery {
    pub id: Uuid,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub window: RecoveryWindow,
    /// The deliveries it was counted to queue, as answered.
    pub total: i64,
    /// The key that asked for it.
    pub api_key_id: Option<Uuid>,
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
