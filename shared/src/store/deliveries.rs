//! Delivery state and the delivery log. Dispatchers write both in batches:
//! one transaction for many attempts.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Store;
use crate::model::DeliveryLog;

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Kept for a disabled endpoint; delivered only by `send`.
    Held,
    /// Queued for its first attempt.
    Pending,
    /// Failed at least once; another attempt is scheduled.
    Retrying,
    Succeeded,
    /// Every attempt failed; `send` can still deliver it.
    Failed,
    /// Its endpoint was deleted.
    Cancelled,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Held => "held",
            DeliveryState::Pending => "pending",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Succeeded => "succeeded",
            DeliveryState::Failed => "failed",
            DeliveryState::Cancelled => "cancelled",
        }
    }
}

/// The outcome of one message: an attempt to log (if one was made) and the
/// delivery's new state.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub delivery_id: i64,
    pub state: DeliveryState,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// `None` when nothing was sent (endpoint disabled or deleted).
    pub log: Option<DeliveryLog>,
    pub endpoint_id: String,
    /// The generation of the message; the state is written only if the
    /// delivery is still at it (any state when unknown).
    pub generation: Option<i32>,
}

/// Whether a retry message still stands for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStanding {
    /// The delivery is still at the message's generation and not settled.
    Current,
    /// `send` re-armed the delivery since, or it succeeded or was cancelled
    /// (or is gone): the message is dropped without an attempt.
    Superseded,
}

impl Store {
    /// Writes a batch of outcomes in one transaction: the log rows, then the
    /// delivery states, in delivery-id order (so concurrent batches and bulk
    /// cancellations lock rows in one order). Every attempt is logged; the
    /// state is written only while the delivery is at the record's generation
    /// (an outcome of a generation `send` has replaced changes nothing), and a
    /// cancelled delivery stays cancelled.
    pub async fn record_attempts(&self, records: &[AttemptRecord]) -> Result<(), sqlx::Error> {
        if records.is_empty() {
            return Ok(());
        }
        let mut records: Vec<&AttemptRecord> = records.iter().collect();
        records.sort_by_key(|r| r.delivery_id);
        let logs: Vec<(&AttemptRecord, &DeliveryLog)> =
            records.iter().filter_map(|r| r.log.as_ref().map(|l| (*r, l))).collect();
        let mut tx = self.pool.begin().await?;
        if !logs.is_empty() {
            sqlx::query(
                "INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at)
                 SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::int4[], $6::int2[], $7::text[], $8::text[], $9::int4[], $10::timestamptz[])
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(logs.iter().map(|(_, l)| l.id).collect::<Vec<_>>())
            .bind(logs.iter().map(|(r, _)| r.delivery_id).collect::<Vec<_>>())
            .bind(logs.iter().map(|(r, _)| r.endpoint_id.as_str()).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.event_id.as_str()).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.attempt).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.status.and_then(|s| i16::try_from(s).ok())).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.response_body.as_deref()).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.error.as_deref()).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| i32::try_from(l.duration_ms).unwrap_or(i32::MAX)).collect::<Vec<_>>())
            .bind(logs.iter().map(|(_, l)| l.created_at).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "UPDATE deliveries d
                SET state = u.state, next_attempt_at = u.next_attempt_at,
                    attempts = d.attempts + u.attempted, updated_at = now()
               FROM unnest($1::int8[], $2::text[], $3::timestamptz[], $4::int4[], $5::int4[])
                    AS u(id, state, next_attempt_at, attempted, generation)
              WHERE d.id = u.id AND d.state <> 'cancelled'
                AND (u.generation IS NULL OR d.generation = u.generation)",
        )
        .bind(records.iter().map(|r| r.delivery_id).collect::<Vec<_>>())
        .bind(records.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
        .bind(records.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
        .bind(records.iter().map(|r| i32::from(r.log.is_some())).collect::<Vec<_>>())
        .bind(records.iter().map(|r| r.generation).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Whether a retry of `delivery_id` at `generation` (unknown: `None`)
    /// should still be made.
    pub async fn retry_standing(
        &self,
        delivery_id: i64,
        generation: Option<i32>,
    ) -> Result<RetryStanding, sqlx::Error> {
        let current: Option<bool> = sqlx::query_scalar(
            "SELECT ($2::int4 IS NULL OR generation = $2) AND state NOT IN ('succeeded', 'cancelled')
               FROM deliveries WHERE id = $1",
        )
        .bind(delivery_id)
        .bind(generation)
        .fetch_optional(&self.pool)
        .await?;
        Ok(if current == Some(true) { RetryStanding::Current } else { RetryStanding::Superseded })
    }

    /// The endpoint's delivery log, newest first; `None` when the cursor names
    /// no log entry of this endpoint.
    pub async fn list_logs(
        &self,
        endpoint_id: &str,
        limit: i64,
        starting_after: Option<Uuid>,
    ) -> Result<Option<Vec<DeliveryLog>>, sqlx::Error> {
        let cursor: Option<DateTime<Utc>> = match starting_after {
            None => None,
            Some(id) => {
                let at =
                    sqlx::query_scalar("SELECT created_at FROM delivery_attempts WHERE id = $1 AND endpoint_id = $2")
                        .bind(id)
                        .bind(endpoint_id)
                        .fetch_optional(&self.pool)
                        .await?;
                match at {
                    None => return Ok(None),
                    at => at,
                }
            }
        };
        #[allow(clippy::type_complexity)]
        let rows: Vec<(Uuid, String, i32, Option<i16>, Option<String>, Option<String>, i32, DateTime<Utc>)> =
            sqlx::query_as(
                "SELECT id, event_id, attempt, status, response_body, error, duration_ms, created_at
                   FROM delivery_attempts
                  WHERE endpoint_id = $1 AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
                  ORDER BY created_at DESC, id DESC LIMIT $4",
            )
            // Planned with the actual cursor each time (see `list_events`).
            .persistent(false)
            .bind(endpoint_id)
            .bind(cursor)
            .bind(starting_after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(Some(
            rows.into_iter()
                .map(|(id, event_id, attempt, status, response_body, error, duration_ms, created_at)| DeliveryLog {
                    id,
                    event_id,
                    attempt,
                    status: status.map(i32::from),
                    response_body,
                    error,
                    duration_ms: i64::from(duration_ms),
                    created_at,
                })
                .collect(),
        ))
    }
}
