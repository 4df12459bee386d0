//! The sweeper's statements (DESIGN.md, "Knowing what is stranded").
//!
//! A delivery that is owed (`pending` or `retrying`), not set aside, and due
//! before its lane's watermark less the sweeper's allowance is in no queue:
//! every message that entered the lane before the watermark has been handed
//! out, and a message enters at the latest the allowance after its
//! delivery's due time (a retry's due time is the end of its retry queue's
//! TTL; a first attempt is published straight after its ingest, or its
//! delivery gets an outbox row; a row the relay publishes later than the
//! allowance moves the due time up to the publish). Such a delivery is
//! queued again under a new generation, so whatever older message of it
//! still turns up is dropped unsent. Deliveries set aside behind a hanging
//! endpoint have no message by design: they are queued again once due, or
//! when a dispatcher hears the endpoint answer.

use chrono::{DateTime, Utc};
use webhooks_model::Lane;

use super::{NEW_V7, PgStore};
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

/// Stranded deliveries of lane `$1` due before the watermark `$2`, oldest
/// first, at most `$3`, with no outbox row, each with its next attempt;
/// `$5`: those whose latest message went to the swept queue, or those whose
/// went to the lane's; `{sweeps}` selects by how often they were swept
/// (`$4`).
const STRANDED: &str = "
    SELECT d.id, d.event_id, d.endpoint_id, false AS set_aside, {next_attempt} AS attempt
      FROM deliveries d
     WHERE d.state IN ('pending', 'retrying') AND NOT d.set_aside AND d.lane = $1 AND d.swept = $5
       AND d.next_attempt_at < $2
       AND {sweeps}
       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
     ORDER BY d.next_attempt_at LIMIT $3
       FOR UPDATE OF d SKIP LOCKED";

/// Queues the deliveries of the CTE `due` (columns `id`, `set_aside`,
/// `attempt`) again, each under a new generation, in the lane that `{lane}`
/// names (of `d`, the delivery) and to the swept queue if `{swept}`;
/// returns how many were set aside and how many in all. A sweep of a
/// delivery that was not set aside counts towards the sweep limit.
const REQUEUE: &str = "
    swept AS (
        UPDATE deliveries d
           SET generation = d.generation + 1, sweeps = d.sweeps + (NOT due.set_aside)::int, set_aside = false,
               -- The last attempt stays the last of the new generation, so
               -- the next sweep numbers on.
               last_attempt_generation = CASE WHEN d.last_attempt_generation = d.generation
                                              THEN d.generation + 1
                                              ELSE d.last_attempt_generation END,
               next_attempt_at = now(), updated_at = now(), lane = {lane}, swept = {swept}
          FROM due WHERE d.id = due.id
        RETURNING d.id, d.generation, d.lane, d.swept, due.attempt, due.set_aside),
    queued AS (
        INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force, attempt, swept)
        SELECT '', '', lane, id, generation, false, attempt, swept FROM swept)
    SELECT count(*) FILTER (WHERE set_aside), count(*) FROM swept";

/// First attempts of lane `$1` made between `$2` and `$3` (their due time is
/// their ingest's), not attempted, with no outbox row and not set aside, at
/// most `$4`, oldest first: queued again to the swept queue, same
/// generation, not counted as sweeps (their message may never have existed;
/// if it did, whichever copy comes second finds the attempt made).
const LOST_FIRST_ATTEMPTS: &str = "
    WITH due AS (
        SELECT d.id FROM deliveries d
         WHERE d.state = 'pending' AND d.generation = 0 AND d.last_attempt = 0 AND NOT d.set_aside AND NOT d.swept
           AND d.lane = $1 AND d.next_attempt_at >= $2 AND d.next_attempt_at < $3
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
         ORDER BY d.next_attempt_at LIMIT $4
           FOR UPDATE OF d SKIP LOCKED),
    swept AS (
        UPDATE deliveries d SET swept = true, next_attempt_at = now(), updated_at = now()
          FROM due WHERE d.id = due.id
        RETURNING d.id, d.generation, d.lane),
    queued AS (
        INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force, attempt, swept)
        SELECT '', '', lane, id, generation, false, 1, true FROM swept)
    SELECT count(*) FROM swept";

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PgStore {
    /// Sweeps up to `batch` stranded deliveries of `lane` due before
    /// `watermark`: fails those swept `limit` times already (with a log
    /// entry that says so) and queues the others again, in their lane.
    /// Rows are locked `SKIP LOCKED` and no longer qualify once swept, so
    /// concurrent sweepers never queue one delivery twice.
    pub(crate) async fn sweep_stranded(
        &self,
        lane: Lane,
        swept: bool,
        watermark: DateTime<Utc>,
        batch: i64,
        limit: i32,
    ) -> StoreResult<Swept> {
        let stranded = |sweeps: &str| STRANDED.replace("{next_attempt}", NEXT_ATTEMPT).replace("{sweeps}", sweeps);
        let mut tx = self.pool.begin().await?;
        let failed = sqlx::query(&format!(
            "WITH hopeless AS ({owed}),
                  failed AS (
                      UPDATE deliveries d SET state = 'failed', next_attempt_at = NULL, updated_at = now()
                        FROM hopeless h WHERE d.id = h.id
                      RETURNING h.id, h.event_id, h.endpoint_id, h.attempt)
             INSERT INTO delivery_attempts
                    (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at)
             SELECT {new_id}, id, endpoint_id, event_id, attempt, NULL, NULL, $6, 0, now() FROM failed",
            new_id = NEW_V7,
            owed = stranded("d.sweeps >= $4")
        ))
        .bind(lane.as_str())
        .bind(watermark)
        .bind(batch)
        .bind(limit)
        .bind(swept)
        .bind(GAVE_UP)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Queued again to the swept queue, ahead of every backlog; its
        // retries go back to its own lane.
        let (_, queued): (i64, i64) = sqlx::query_as(&format!(
            "WITH due AS ({owed}), {requeue}",
            owed = stranded("d.sweeps < $4"),
            requeue = REQUEUE.replace("{lane}", "d.lane").replace("{swept}", "true")
        ))
        .bind(lane.as_str())
        .bind(watermark)
        .bind(batch)
        .bind(limit)
        .bind(swept)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Swept { queued: count(queued), returned: 0, failed })
    }

    /// Queues again up to `batch` deliveries set aside behind a hanging
    /// endpoint whose due time has come, in the bulk lane, without counting
    /// towards the sweep limit.
    pub(crate) async fn sweep_set_aside(&self, batch: i64) -> StoreResult<Swept> {
        let mut tx = self.pool.begin().await?;
        let (returned, _): (i64, i64) = sqlx::query_as(&format!(
            "WITH due AS (
                 SELECT d.id, d.set_aside, {NEXT_ATTEMPT} AS attempt
                   FROM deliveries d
                  WHERE d.set_aside AND d.next_attempt_at < now() AND d.state IN ('pending', 'retrying')
                  ORDER BY d.next_attempt_at LIMIT $1
                    FOR UPDATE OF d SKIP LOCKED),
             {requeue}",
            requeue = REQUEUE.replace("{lane}", "'bulk'").replace("{swept}", "false")
        ))
        .bind(batch)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Swept { returned: count(returned), ..Swept::default() })
    }

    /// See [`crate::queue::Outbox::release_set_aside`]: up to `batch` of
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
            requeue = REQUEUE.replace("{lane}", "'bulk'").replace("{swept}", "false")
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
        Ok(count(returned))
    }

    /// See [`crate::queue::Outbox::requeue_first_attempts`].
    pub(crate) async fn requeue_first_attempts(
        &self,
        lane: Lane,
        (from, until): (DateTime<Utc>, DateTime<Utc>),
        batch: i64,
    ) -> StoreResult<u64> {
        let queued: i64 = sqlx::query_scalar(LOST_FIRST_ATTEMPTS)
            .bind(lane.as_str())
            .bind(from)
            .bind(until)
            .bind(batch)
            .fetch_one(&self.pool)
            .await?;
        Ok(count(queued))
    }

    /// How many deliveries of `lane` are stranded by `watermark`, counted up
    /// to `at_most`.
    pub(crate) async fn count_stranded(&self, lane: Lane, watermark: DateTime<Utc>, at_most: i64) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM (
                 SELECT 1 FROM deliveries d
                  WHERE d.state IN ('pending', 'retrying') AND NOT d.set_aside AND d.lane = $1 AND NOT d.swept
                    AND d.next_attempt_at < $2
                    AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
                  LIMIT $3) s",
        )
        .bind(lane.as_str())
        .bind(watermark)
        .bind(at_most)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Outbox rows waiting to be published.
    pub(crate) async fn count_outbox(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&self.pool).await?)
    }
}
