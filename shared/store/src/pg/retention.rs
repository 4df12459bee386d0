//! Retention on PostgreSQL: one batch per call (what goes and what stays:
//! `store/retention.rs`). Several API instances may sweep at once:
//! each skips the rows another one holds instead of waiting for them.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::{PgStore, history};
use crate::{Purged, StoreResult};

impl PgStore {
    pub(crate) async fn purge_expired(&self, cutoff: DateTime<Utc>, limit: u32) -> StoreResult<Purged> {
        let limit = i64::from(limit);
        // Partitioned by day, a retention of two days or more drops whole
        // days (`history.rs`); rows go one by one only in the partitions from
        // before partitioning, and for a shorter retention. The bound on
        // the ids keeps each statement to those partitions.
        let layout = self.layout();
        let long = webhooks_model::time::now() - cutoff >= chrono::Duration::days(2);
        let before = match (layout.partitioned, long, layout.legacy_before) {
            (true, true, None) => return Ok(Purged::default()),
            (true, true, Some(legacy)) => legacy.min(cutoff),
            _ => cutoff,
        };
        let (event_bound, log_bound) = (history::event_id_bound(before), history::uuid_bound(before));
        // Log entries by their own age, in one statement of its own. `=
        // ANY(ARRAY(…))` rather than `IN (…)`: the batch is looked up by
        // primary key, where `IN` may be planned as a scan of the table.
        let logs = sqlx::query(
            "DELETE FROM delivery_attempts WHERE id = ANY(ARRAY(
                 SELECT id FROM delivery_attempts WHERE created_at < $1 AND id < $3::uuid
                  ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
        )
        .bind(cutoff)
        .bind(limit)
        .bind(&log_bound)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let mut purged = Purged { logs, ..Purged::default() };

        // Old events, with all they carry, in one transaction. Locking the
        // events (FOR UPDATE conflicts with the key-share lock a foreign key
        // check takes) makes a concurrent `send` that would add a delivery to
        // one of them wait for this commit, and then find the event gone.
        let mut tx = self.pool.begin().await?;
        let candidates: Vec<String> = sqlx::query_scalar(
            "SELECT e.id FROM events e
              WHERE e.created_at < $1 AND e.id < $3
                AND NOT EXISTS (SELECT 1 FROM deliveries d
                                 WHERE d.event_id = e.id AND d.state IN ('pending', 'retrying', 'waiting'))
              ORDER BY e.created_at LIMIT $2
              FOR UPDATE OF e SKIP LOCKED",
        )
        .bind(cutoff)
        .bind(limit)
        .bind(&event_bound)
        .fetch_all(&mut *tx)
        .await?;
        if candidates.is_empty() {
            return Ok(purged);
        }
        // Lock their deliveries (in id order, as the dispatchers' batches
        // lock them) and look at their states again: a `send` may have
        // re-armed one since the read above, and its attempt may be under
        // way. Locked, no state changes until this commits.
        let deliveries: Vec<(String, String)> =
            sqlx::query_as("SELECT event_id, state FROM deliveries WHERE event_id = ANY($1) ORDER BY id FOR UPDATE")
                .bind(&candidates)
                .fetch_all(&mut *tx)
                .await?;
        let busy: HashSet<&str> = deliveries
            .iter()
            .filter(|(_, state)| matches!(state.as_str(), "pending" | "retrying" | "waiting"))
            .map(|(event_id, _)| event_id.as_str())
            .collect();
        let doomed: Vec<&str> = candidates.iter().map(String::as_str).filter(|id| !busy.contains(id)).collect();
        purged.delivery_logs = sqlx::query(
            "DELETE FROM delivery_attempts
              WHERE delivery_id IN (SELECT id FROM deliveries WHERE event_id = ANY($1))",
        )
        .bind(&doomed)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        purged.deliveries = sqlx::query("DELETE FROM deliveries WHERE event_id = ANY($1)")
            .bind(&doomed)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        purged.events =
            sqlx::query("DELETE FROM events WHERE id = ANY($1)").bind(&doomed).execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(purged)
    }
}
