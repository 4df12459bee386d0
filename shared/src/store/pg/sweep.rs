//! The sweeper's statements: deliveries that are owed (`pending` or
//! `retrying`), due for longer than a margin, and that no outbox row names
//! are queued again under a new generation, so whatever older message of
//! theirs is still somewhere is dropped unsent when it comes back. See the
//! README, "Nothing stranded, nothing looping".

use std::time::Duration;

use super::PgStore;
use crate::store::StoreResult;

/// What one sweep batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Deliveries queued again.
    pub queued: u64,
    /// Deliveries failed for having been queued again `limit` times without
    /// an attempt recorded in between.
    pub failed: u64,
}

/// The log entry of a delivery the sweeper gives up on.
const GAVE_UP: &str = "not sent: queued again repeatedly and never processed (see the dispatchers' logs); \
                       send or recover it once the cause is fixed";

/// The owed deliveries due before `now() - $1`, with no outbox row, oldest
/// first; `$3` selects by how often they were swept. Each comes with the
/// attempt its next message makes: the one after the last recorded in its
/// generation, else the first.
const OWED: &str = "
    SELECT d.id, d.event_id, d.endpoint_id,
           CASE WHEN d.last_attempt_generation = d.generation THEN d.last_attempt + 1 ELSE 1 END AS attempt
      FROM deliveries d
     WHERE d.state IN ('pending', 'retrying') AND d.next_attempt_at < now() - make_interval(secs => $1)
       AND d.sweeps {sweeps} $3
       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
     ORDER BY d.next_attempt_at LIMIT $2
       FOR UPDATE OF d SKIP LOCKED";

impl PgStore {
    /// Sweeps up to `batch` stranded deliveries: fails those swept `limit`
    /// times already (with a log entry that says so) and queues the others
    /// again. Rows are locked `SKIP LOCKED` and no longer qualify once swept,
    /// so concurrent sweepers never queue one delivery twice.
    pub async fn sweep_stranded(&self, older_than: Duration, batch: i64, limit: i32) -> StoreResult<Swept> {
        let margin = older_than.as_secs_f64();
        let mut tx = self.pool.begin().await?;
        let failed = sqlx::query(&format!(
            "WITH hopeless AS ({owed}),
                  failed AS (
                      UPDATE deliveries d SET state = 'failed', next_attempt_at = NULL, updated_at = now()
                        FROM hopeless h WHERE d.id = h.id
                      RETURNING h.id, h.event_id, h.endpoint_id, h.attempt)
             INSERT INTO delivery_attempts
                    (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at)
             SELECT gen_random_uuid(), id, endpoint_id, event_id, attempt, NULL, NULL, $4, 0, now() FROM failed",
            owed = OWED.replace("{sweeps}", ">=")
        ))
        .bind(margin)
        .bind(batch)
        .bind(limit)
        .bind(GAVE_UP)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let queued = sqlx::query(&format!(
            "WITH due AS ({owed}),
                  swept AS (
                      UPDATE deliveries d
                         SET generation = d.generation + 1, sweeps = d.sweeps + 1,
                             -- The last attempt stays the last of the new
                             -- generation, so the next sweep numbers on.
                             last_attempt_generation = CASE WHEN d.last_attempt_generation = d.generation
                                                            THEN d.generation + 1
                                                            ELSE d.last_attempt_generation END,
                             next_attempt_at = now(), updated_at = now()
                        FROM due WHERE d.id = due.id
                      RETURNING d.id, d.generation, due.attempt)
             INSERT INTO outbox (exchange, routing_key, delivery_id, generation, force, attempt)
             SELECT '', $4, id, generation, false, attempt FROM swept",
            owed = OWED.replace("{sweeps}", "<")
        ))
        .bind(margin)
        .bind(batch)
        .bind(limit)
        .bind(&self.bulk_queue)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(Swept { queued, failed })
    }
}
