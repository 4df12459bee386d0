//! The delivery queue of standalone mode, in the deliveries table itself. A
//! delivery is due when it is `pending` or `retrying`, unclaimed, and its next
//! attempt time has come. Claiming hands out the message its row describes;
//! the record of the attempt ([`SqliteStore::record_attempts`]) or a deferral
//! releases it. A retry is its recorded next attempt time, so retries survive
//! any restart; claims do not need to: one process holds the data directory,
//! and it releases every claim when it starts.

use chrono::{DateTime, Utc};
use sqlx::{Connection, Sqlite, SqliteConnection, SqlitePool, pool::PoolConnection};
use uuid::fmt::Hyphenated;

use super::{BEGIN_WRITE, SqliteStore, micros, time};
use crate::{DueDelivery, StoreError, StoreResult};
use webhooks_model::Lane;

#[derive(sqlx::FromRow)]
struct DueRow {
    id: i64,
    event_id: String,
    endpoint_id: String,
    developer_id: Hyphenated,
    next_attempt: i64,
    force: bool,
    generation: i32,
    parks: i64,
    failures: i64,
    pace_ticket: Option<i64>,
    lane: String,
    body: String,
    event_created_at: i64,
}

impl TryFrom<DueRow> for DueDelivery {
    type Error = StoreError;
    fn try_from(row: DueRow) -> Result<DueDelivery, StoreError> {
        Ok(DueDelivery {
            attempt: u32::try_from(row.next_attempt)
                .map_err(|_| StoreError::Corrupt(format!("delivery {}: bad next_attempt", row.id)))?,
            event_created_at: time(row.event_created_at)?,
            delivery_id: row.id,
            event_id: row.event_id,
            endpoint_id: row.endpoint_id,
            developer_id: row.developer_id.into_uuid(),
            force: row.force,
            generation: Some(row.generation),
            parks: u32::try_from(row.parks).unwrap_or(u32::MAX),
            failures: u32::try_from(row.failures).unwrap_or(u32::MAX),
            pace_ticket: row.pace_ticket,
            lane: if row.lane == "bulk" { Lane::Bulk } else { Lane::Default },
            body: row.body,
        })
    }
}

/// Whether delivery `d` may go now: not a delivery of an ordered endpoint
/// with an earlier one unsettled (claimed, due, or due later), unless `send`
/// forced it. So an ordered endpoint's deliveries leave the queue one at a
/// time, in `event_sequence` order, and nothing else waits for them.
pub(super) const IN_TURN: &str = "(d.force = 1
     OR NOT EXISTS (SELECT 1 FROM endpoints ep WHERE ep.id = d.endpoint_id AND ep.ordering = 'ordered')
     OR NOT EXISTS (SELECT 1 FROM deliveries o
                     WHERE o.endpoint_id = d.endpoint_id AND o.state IN ('pending', 'retrying')
                       AND o.event_sequence < d.event_sequence))";

impl SqliteStore {
    /// Claims up to `limit` due deliveries, those of the default lane first
    /// and at most `bulk_limit` of the bulk lane, the longest due first in
    /// each, and returns what the message of each is made of. A claimed delivery is not
    /// handed out again until its record, [`SqliteStore::defer`] or
    /// [`SqliteStore::release_claims`] releases it.
    ///
    /// A claim need not outlive the process (every claim is released when
    /// the process starts), so its commit does not wait for the disk: an
    /// ingested event reaches its POST after one fsync, not two. In WAL mode
    /// such a commit still survives the process being killed; only a power
    /// loss may undo it, and the next commit that syncs takes it along.
    pub(crate) async fn claim_due(&self, limit: usize, bulk_limit: usize) -> StoreResult<Vec<DueDelivery>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut writer = Unsynced::take(&self.writer).await?;
        let claimed = claim(&mut writer.connection, limit, bulk_limit).await;
        writer.give_back().await;
        claimed
    }

    /// When the next unclaimed delivery falls due (possibly already past), so
    /// the queue can sleep until then; `None` when nothing is waiting. Only
    /// the default lane's unless `bulk` (the bulk lane has slots free).
    pub(crate) async fn next_due_at(&self, bulk: bool) -> StoreResult<Option<DateTime<Utc>>> {
        let next: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT d.next_attempt_at FROM deliveries d
                  WHERE d.state IN ('pending', 'retrying') AND d.claimed = 0 AND d.next_attempt_at IS NOT NULL
                    AND (d.lane = 'default' OR $1) AND {IN_TURN}
                  ORDER BY d.next_attempt_at LIMIT 1"
        ))
        .bind(bulk)
        .fetch_optional(&self.reader)
        .await?;
        next.map(time).transpose()
    }

    /// Puts a claimed delivery back, due at `until`, without counting an
    /// attempt: its endpoint had no free slot, or the store failed. `parks`
    /// are the message's counts of this attempt's parks and failures, kept
    /// for its next claim (`None` keeps the stored ones, as a `requeue`
    /// does). Nothing changes unless the delivery is still at `generation`
    /// (any, when `None`), still waiting for an attempt and still claimed (a
    /// handler dropped at shutdown after its outcome was recorded must not
    /// move the recorded retry time). `pace_ticket` is
    /// the ticket the delivery took in its endpoint's pace, which its next
    /// claim carries.
    pub(crate) async fn defer(
        &self,
        delivery_id: i64,
        generation: Option<i32>,
        until: DateTime<Utc>,
        parks: Option<(u32, u32)>,
        pace_ticket: Option<i64>,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE deliveries SET next_attempt_at = $3, claimed = 0, updated_at = $4,
                    parks = coalesce($5, parks), failures = coalesce($6, failures), pace_ticket = coalesce($7, pace_ticket)
              WHERE id = $1 AND ($2 IS NULL OR generation = $2) AND state IN ('pending', 'retrying')
                AND claimed = 1",
        )
        .bind(delivery_id)
        .bind(generation)
        .bind(micros(until))
        .bind(micros(webhooks_model::time::now()))
        .bind(parks.map(|(parks, _)| i64::from(parks)))
        .bind(parks.map(|(_, failures)| i64::from(failures)))
        .bind(pace_ticket)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// See [`crate::queue::DeliveryTable::bring_forward`]: the deliveries of
    /// the endpoint put back without an attempt (`parks > 0`) and not due
    /// yet.
    pub(crate) async fn bring_forward(&self, endpoint_id: &str) -> StoreResult<u64> {
        let now = micros(webhooks_model::time::now());
        let moved = sqlx::query(
            "UPDATE deliveries SET next_attempt_at = $2, updated_at = $2
              WHERE endpoint_id = $1 AND state IN ('pending', 'retrying') AND claimed = 0 AND parks > 0
                AND next_attempt_at > $2",
        )
        .bind(endpoint_id)
        .bind(now)
        .execute(&self.writer)
        .await?
        .rows_affected();
        if moved > 0 {
            self.work.notify_one();
        }
        Ok(moved)
    }

    /// Releases every claim; returns how many there were. Called when the
    /// process starts: it holds the data directory alone, so any claim is one
    /// a stopped process left, whose deliveries are due again.
    pub(crate) async fn release_claims(&self) -> StoreResult<u64> {
        let released = sqlx::query("UPDATE deliveries SET claimed = 0 WHERE claimed = 1").execute(&self.writer).await?;
        Ok(released.rows_affected())
    }
}

/// The writer, switched to `synchronous = NORMAL` for one transaction. It
/// goes back to the pool only once switched back; otherwise it is closed,
/// and the pool opens the next writer as configured.
struct Unsynced {
    connection: PoolConnection<Sqlite>,
    synced: bool,
}

impl Unsynced {
    async fn take(writer: &SqlitePool) -> StoreResult<Unsynced> {
        let mut unsynced = Unsynced { connection: writer.acquire().await?, synced: false };
        sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *unsynced.connection).await?;
        Ok(unsynced)
    }

    async fn give_back(mut self) {
        self.synced = sqlx::query("PRAGMA synchronous = FULL").execute(&mut *self.connection).await.is_ok();
    }
}

impl Drop for Unsynced {
    fn drop(&mut self) {
        if !self.synced {
            self.connection.close_on_drop();
        }
    }
}

/// [`SqliteStore::claim_due`] on `writer`, in one write transaction.
async fn claim(writer: &mut SqliteConnection, limit: usize, bulk_limit: usize) -> StoreResult<Vec<DueDelivery>> {
    let mut tx = writer.begin_with(BEGIN_WRITE).await?;

    let mut rows = Vec::new();
    for (lane, limit) in [(Lane::Default, limit), (Lane::Bulk, bulk_limit.min(limit))] {
        let limit = limit.saturating_sub(if lane == Lane::Bulk { rows.len() } else { 0 });
        if limit == 0 {
            continue;
        }
        // The WHERE of the `deliveries_due_by_lane` index, so the scan walks it.
        let due: Vec<DueRow> = sqlx::query_as(&format!(
            "SELECT d.id, d.event_id, d.endpoint_id, e.developer_id, d.next_attempt, d.force, d.generation,
                    d.parks, d.failures, d.pace_ticket, d.lane, e.body, e.created_at AS event_created_at
               FROM deliveries d JOIN events e ON e.id = d.event_id
              WHERE d.lane = $3 AND d.state IN ('pending', 'retrying') AND d.claimed = 0
                AND d.next_attempt_at <= $1 AND {IN_TURN}
              ORDER BY d.next_attempt_at, d.id LIMIT $2"
        ))
        .bind(micros(webhooks_model::time::now()))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(lane.as_str())
        .fetch_all(&mut *tx)
        .await?;
        rows.extend(due);
    }
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids = serde_json::Value::from(rows.iter().map(|r| r.id).collect::<Vec<_>>()).to_string();
    // A row that cannot be read is claimed too, but not handed out: it
    // leaves the queue (until the next start) instead of blocking it.
    let messages = rows
        .into_iter()
        .filter_map(|row| {
            let id = row.id;
            DueDelivery::try_from(row)
                .inspect_err(|error| tracing::error!(%error, delivery_id = id, "unreadable delivery set aside"))
                .ok()
        })
        .collect();
    sqlx::query("UPDATE deliveries SET claimed = 1 WHERE id IN (SELECT value FROM json_each($1))")
        .bind(ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(messages)
}
