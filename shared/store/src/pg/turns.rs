//! The turns of ordered endpoints on PostgreSQL (docs/architecture.md, "Scheduling"). Only
//! the lowest unsettled `event_sequence` of an ordered endpoint is attempted;
//! a delivery whose turn has not come is marked `waiting` and its message
//! dropped, and the settling of the delivery before it releases it with a new
//! outbox row.
//!
//! Both sides take the endpoint's advisory lock first, then read in a
//! statement of their own (so the read sees what the lock's holder
//! committed): a check and a release can never both miss each other.

use sqlx::{Postgres, Transaction};

use super::PgStore;
use crate::{StoreResult, Turn};

impl PgStore {
    /// Whether the delivery may be attempted now; marks it `waiting` when its
    /// endpoint is ordered (as stored now, not as a cache has it) and an
    /// earlier delivery of it is unsettled. A delivery already `waiting` (a
    /// repeated message) waits too.
    pub(crate) async fn take_turn(
        &self,
        delivery_id: i64,
        generation: Option<i32>,
        endpoint_id: &str,
    ) -> StoreResult<Turn> {
        let mut tx = self.pool.begin().await?;
        lock_turns(&mut tx, &[endpoint_id]).await?;
        let waits = sqlx::query_as(
            "WITH marked AS (
                 UPDATE deliveries me SET state = 'waiting', next_attempt_at = NULL, updated_at = now()
                  WHERE me.id = $1 AND ($2::int4 IS NULL OR me.generation = $2) AND me.state IN ('pending', 'retrying')
                    AND EXISTS (SELECT 1 FROM endpoints ep WHERE ep.id = $3 AND ep.ordering = 'ordered')
                    AND EXISTS (SELECT 1 FROM deliveries d
                                 WHERE d.endpoint_id = $3 AND d.state IN ('pending', 'retrying', 'waiting')
                                   AND d.event_sequence < me.event_sequence)
                 RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM marked)
                 OR EXISTS (SELECT 1 FROM deliveries WHERE id = $1 AND state = 'waiting')",
        )
        .bind(delivery_id)
        .bind(generation)
        .bind(endpoint_id)
        .fetch_one(&mut *tx)
        .await
        .map(|row: (bool,)| row.0)?;
        tx.commit().await?;
        Ok(if waits { Turn::Wait } else { Turn::Go })
    }

    /// Releases, for each of `endpoints`, its lowest waiting delivery when
    /// nothing before it is unsettled (`all`: every waiting delivery, for an
    /// endpoint no longer ordered). Runs in the caller's transaction, which
    /// took the endpoints' locks ([`lock_turns`]) before it changed any of
    /// their deliveries.
    pub(super) async fn release_turns(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        endpoints: &[String],
        all: bool,
    ) -> StoreResult<u64> {
        let released = sqlx::query(&format!(
            "WITH next AS (
                 SELECT w.id, w.endpoint_id, w.event_sequence FROM deliveries w
                  WHERE w.endpoint_id = ANY ($1) AND w.state = 'waiting'
                    AND ($2 OR w.event_sequence = (SELECT min(f.event_sequence) FROM deliveries f
                                                     WHERE f.endpoint_id = w.endpoint_id AND f.state = 'waiting'))
             ), released AS (
                 UPDATE deliveries d SET state = 'pending', next_attempt_at = now(), updated_at = now()
                   FROM next
                  WHERE d.id = next.id AND d.state = 'waiting'
                    AND ($2 OR NOT EXISTS (SELECT 1 FROM deliveries o
                                            WHERE o.endpoint_id = next.endpoint_id
                                              AND o.state IN ('pending', 'retrying')
                                              AND o.event_sequence < next.event_sequence))
                 RETURNING d.id, d.generation, d.lane, {next_attempt} AS attempt
             )
             INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force, attempt)
             SELECT '', '', lane, id, generation, false, attempt FROM released",
            next_attempt = super::sweep::NEXT_ATTEMPT
        ))
        .bind(endpoints)
        .bind(all)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if released > 0 {
            // The relay may run in another process: wake it at the commit.
            sqlx::query("SELECT pg_notify($1, '')").bind(super::OUTBOX_CHANNEL).execute(&mut **tx).await?;
        }
        Ok(released)
    }

    /// The safety net for turns a settling did not release (an endpoint's
    /// categories narrowed, the sweeper failed a delivery, an endpoint
    /// switched to ordered while a delivery was in flight): looks at up to
    /// `batch` endpoints with waiting deliveries whose id comes after
    /// `after`, in id order, and releases the turns that are stalled.
    /// Returns how many deliveries it released and the last endpoint it
    /// looked at (`None`: it reached the end), where the next call goes on,
    /// so every endpoint comes round however many are legitimately blocked.
    pub(crate) async fn release_stalled_turns(
        &self,
        after: Option<&str>,
        batch: i64,
    ) -> StoreResult<(u64, Option<String>)> {
        let endpoints: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT endpoint_id FROM deliveries
              WHERE state = 'waiting' AND ($1::text IS NULL OR endpoint_id > $1)
              ORDER BY endpoint_id LIMIT $2",
        )
        .bind(after)
        .bind(batch)
        .fetch_all(&self.pool)
        .await?;
        let last = (endpoints.len() as i64 == batch).then(|| endpoints.last().cloned()).flatten();
        if endpoints.is_empty() {
            return Ok((0, None));
        }
        let mut tx = self.pool.begin().await?;
        lock_turns(&mut tx, &endpoints.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        let released = self.release_turns(&mut tx, &endpoints, false).await?;
        tx.commit().await?;
        Ok((released, last))
    }
}

/// Takes the turn locks of `endpoints` (advisory, on a seed of their own),
/// sorted, and before the transaction changes any of their deliveries: every
/// transaction takes them in one order and ahead of row locks, so none waits
/// on another in a cycle.
pub(super) async fn lock_turns(tx: &mut Transaction<'_, Postgres>, endpoints: &[&str]) -> StoreResult<()> {
    let mut endpoints = endpoints.to_vec();
    endpoints.sort_unstable();
    endpoints.dedup();
    for endpoint_id in endpoints {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 8117))")
            .bind(endpoint_id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}
