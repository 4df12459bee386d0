//! The sweeper's statements: deliveries that are owed (`pending` or
//! `retrying`), due for longer than a margin, and that no outbox row names
//! are queued again under a new generation, so whatever older message of
//! theirs is still somewhere is dropped unsent when it comes back. See the
//! README, "Nothing stranded, nothing looping". Deliveries set aside behind
//! a hanging endpoint are queued again the same way, by the sweeper once
//! due, or by a dispatcher once the endpoint answers.

use std::time::Duration;

use super::PgStore;
use crate::StoreResult;

/// What one sweep batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Stranded deliveries queued again.
    pub queued: u64,
    /// Deliveries set aside behind a hanging endpoint, queued again at their
    /// due time (not stranded: nothing carried them on purpose).
    pub returned: u64,
    /// Deliveries failed for having been queued again `limit` times without
    /// an attempt recorded in between.
    pub failed: u64,
}

/// The log entry of a delivery the sweeper gives up on.
const GAVE_UP: &str = "not sent: queued again repeatedly and never processed (see the dispatchers' logs); \
                       send or recover it once the cause is fixed";

/// The attempt a delivery's next message makes: the one after the last
/// recorded in its generation, else the first.
pub(super) const NEXT_ATTEMPT: &str =
    "CASE WHEN d.last_attempt_generation = d.generation THEN d.last_attempt + 1 ELSE 1 END";

/// The owed deliveries that are due, with no outbox row, oldest first, each
/// with its next attempt: `{which}` says which ([`STRANDED_OR_SET_ASIDE`],
/// [`SET_ASIDE`]), `{sweeps}` selects by how often they were swept (`$3`).
const OWED: &str = "
    SELECT d.id, d.event_id, d.endpoint_id, d.set_aside, {next_attempt} AS attempt
      FROM deliveries d
     WHERE d.state IN ('pending', 'retrying') AND d.next_attempt_at < now() AND {which} AND {sweeps}
       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
     ORDER BY d.next_attempt_at LIMIT $2
       FOR UPDATE OF d SKIP LOCKED";

/// Stranded (due before `now() - $1`) or set aside.
const STRANDED_OR_SET_ASIDE: &str = "(d.set_aside OR d.next_attempt_at < now() - make_interval(secs => $1))";

/// Set aside only (a partial index holds them); `$1` is not needed.
const SET_ASIDE: &str = "d.set_aside";

/// [`OWED`] selecting `which`, with `sweeps`.
fn owed(which: &str, sweeps: &str) -> String {
    OWED.replace("{next_attempt}", NEXT_ATTEMPT).replace("{which}", which).replace("{sweeps}", sweeps)
}

/// Queues the deliveries of the CTE `due` (columns `id`, `set_aside`,
/// `attempt`) again, each under a new generation, in the lane that
/// `{lane}` names; returns how many were set aside and how
/// many in all. A sweep of a delivery that was not set aside counts towards
/// the sweep limit.
const REQUEUE: &str = "
    swept AS (
        UPDATE deliveries d
           SET generation = d.generation + 1, sweeps = d.sweeps + (NOT due.set_aside)::int, set_aside = false,
               -- The last attempt stays the last of the new generation, so
               -- the next sweep numbers on.
               last_attempt_generation = CASE WHEN d.last_attempt_generation = d.generation
                                              THEN d.generation + 1
                                              ELSE d.last_attempt_generation END,
               next_attempt_at = now(), updated_at = now()
          FROM due WHERE d.id = due.id
        RETURNING d.id, d.generation, due.attempt, due.set_aside),
    queued AS (
        INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force, attempt)
        SELECT '', '', {lane}, id, generation, false, attempt FROM swept)
    SELECT count(*) FILTER (WHERE set_aside), count(*) FROM swept";

impl PgStore {
    /// Sweeps up to `batch` set-aside deliveries that are due and, with
    /// `stranded`, stranded ones: fails those swept `limit` times already
    /// (with a log entry that says so) and queues the others again. Rows are
    /// locked `SKIP LOCKED` and no longer qualify once swept, so concurrent
    /// sweepers never queue one delivery twice.
    pub async fn sweep_stranded(
        &self,
        older_than: Duration,
        batch: i64,
        limit: i32,
        stranded: bool,
    ) -> StoreResult<Swept> {
        let margin = older_than.as_secs_f64();
        let mut tx = self.pool.begin().await?;
        // Only stranded deliveries can be hopeless.
        let failed = if stranded {
            sqlx::query(&format!(
            "WITH hopeless AS ({owed}),
                  failed AS (
                      UPDATE deliveries d SET state = 'failed', next_attempt_at = NULL, updated_at = now()
                        FROM hopeless h WHERE d.id = h.id
                      RETURNING h.id, h.event_id, h.endpoint_id, h.attempt)
             INSERT INTO delivery_attempts
                    (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at)
             SELECT gen_random_uuid(), id, endpoint_id, event_id, attempt, NULL, NULL, $4, 0, now() FROM failed",
                owed = owed(STRANDED_OR_SET_ASIDE, "NOT d.set_aside AND d.sweeps >= $3")
            ))
            .bind(margin)
            .bind(batch)
            .bind(limit)
            .bind(GAVE_UP)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        } else {
            0
        };
        let which = if stranded { STRANDED_OR_SET_ASIDE } else { SET_ASIDE };
        let (returned, queued): (i64, i64) = sqlx::query_as(&format!(
            "WITH due AS ({owed}), {requeue}",
            owed = owed(which, "(d.set_aside OR d.sweeps < $3)"),
            requeue = REQUEUE.replace("{lane}", "'bulk'")
        ))
        .bind(margin)
        .bind(batch)
        .bind(limit)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(Swept { queued: count(queued - returned), returned: count(returned), failed })
    }

    /// See [`crate::Store::release_set_aside`]: up to `batch` of
    /// them, in one transaction that wakes the relay.
    pub(crate) async fn release_set_aside(&self, endpoint_id: &str, batch: i64) -> StoreResult<u64> {
        let mut tx = self.pool.begin().await?;
        let (returned, _): (i64, i64) = sqlx::query_as(&format!(
            "WITH due AS (
                 SELECT d.id, d.set_aside, {NEXT_ATTEMPT} AS attempt
                   FROM deliveries d
                  -- An outbox row of a set-aside delivery is that of the
                  -- message it was set aside from, which the relay may not
                  -- have deleted yet (it deletes after the broker confirms).
                  WHERE d.endpoint_id = $1 AND d.set_aside AND d.state IN ('pending', 'retrying')
                  ORDER BY d.event_sequence LIMIT $2
                    FOR UPDATE OF d SKIP LOCKED),
             {requeue}",
            requeue = REQUEUE.replace("{lane}", "'bulk'")
        ))
        .bind(endpoint_id)
        .bind(batch)
        .fetch_one(&mut *tx)
        .await?;
        if returned > 0 {
            // The relay runs in another process: wake it at the commit.
            sqlx::query("SELECT pg_notify($1, '')").bind(super::OUTBOX_CHANNEL).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(u64::try_from(returned).unwrap_or(0))
    }
}
