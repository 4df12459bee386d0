//! Events and their deliveries on SQLite. A queued delivery is due in the
//! deliveries table itself: `pending` with its next attempt time set, which the
//! queue ([`SqliteStore::claim_due`]) picks up; [`SqliteStore::work`] wakes it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{SqliteStore, json_list, micros, time};
use crate::{
    DeliveredEvent, EndpointRecord, EventDelivery, EventPage, IdempotentEvent, IngestOutcome, NewEvent, QueuedDelivery,
    Recoverable, RecoveryWindow, SendOutcome, StoreError, StoreResult, StoredEvent, UpcomingDelivery,
    endpoints::category_names, events::RecoveryBatch,
};
use webhooks_model::{Category, EventEpoch};

/// id, body, created_at
type EventRow = (String, String, i64);

/// endpoint_id, state, attempts, last_status, next_attempt_at
type DeliveryRow = (String, String, i32, Option<i32>, Option<i64>);

fn stored((id, body, created_at): EventRow) -> StoreResult<StoredEvent> {
    Ok(StoredEvent { id, body, created_at: time(created_at)? })
}

impl SqliteStore {
    pub(crate) async fn find_delivered_event(
        &self,
        developer_id: Uuid,
        event_id: &str,
    ) -> StoreResult<Option<DeliveredEvent>> {
        let body: Option<String> = sqlx::query_scalar("SELECT body FROM events WHERE id = $1 AND developer_id = $2")
            .bind(event_id)
            .bind(developer_id.hyphenated())
            .fetch_optional(&self.reader)
            .await?;
        let Some(body) = body else { return Ok(None) };
        let rows: Vec<DeliveryRow> = sqlx::query_as(
            "SELECT d.endpoint_id, d.state, d.attempts,
                    (SELECT a.status FROM delivery_attempts a WHERE a.delivery_id = d.id
                      ORDER BY a.created_at DESC, a.id DESC LIMIT 1),
                    CASE WHEN d.state IN ('pending', 'retrying', 'waiting') THEN d.next_attempt_at END
               FROM deliveries d WHERE d.event_id = $1
              ORDER BY d.endpoint_id",
        )
        .bind(event_id)
        .fetch_all(&self.reader)
        .await?;
        let deliveries = rows
            .into_iter()
            .map(|(endpoint_id, state, attempts, last_status, next_attempt_at)| {
                Ok(EventDelivery {
                    endpoint_id,
                    state,
                    attempts,
                    last_status,
                    next_attempt_at: next_attempt_at.map(time).transpose()?,
                })
            })
            .collect::<StoreResult<_>>()?;
        Ok(Some(DeliveredEvent { body, deliveries }))
    }

    /// The whole batch in one transaction, one event after the other (see
    /// [`crate::Store::ingest_events`]): one commit, one fsync. The
    /// write lock is held from the first check to the commit, so a key found
    /// free stays free and the counter hands out each sequence once.
    pub(crate) async fn ingest_events(&self, events: &[&NewEvent]) -> StoreResult<Vec<StoreResult<IngestOutcome>>> {
        let now = micros(webhooks_model::time::now());
        let mut tx = self.begin().await?;
        let mut outcomes = Vec::with_capacity(events.len());
        for event in events {
            outcomes.push(ingest_one(&mut tx, event, now).await?);
        }
        tx.commit().await?;
        if outcomes.iter().any(|outcome| outcome.as_ref().is_ok_and(|o| !o.queued.is_empty())) {
            self.work.notify_one();
        }
        Ok(outcomes)
    }

    pub(crate) async fn find_idempotent_event(
        &self,
        developer_id: Uuid,
        idempotency_key: &str,
    ) -> StoreResult<Option<IdempotentEvent>> {
        let found: Option<(Option<Vec<u8>>, String)> =
            sqlx::query_as("SELECT request_hash, body FROM events WHERE developer_id = $1 AND idempotency_key = $2")
                .bind(developer_id.hyphenated())
                .bind(idempotency_key)
                .fetch_optional(&self.reader)
                .await?;
        Ok(found.map(|(request_hash, body)| IdempotentEvent { request_hash: request_hash.unwrap_or_default(), body }))
    }

    pub(crate) async fn upcoming_events(&self, endpoint: &EndpointRecord, limit: i64) -> StoreResult<Vec<StoredEvent>> {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT id, body, created_at FROM (
                 SELECT * FROM (
                     SELECT e.id, e.body, e.created_at FROM deliveries d JOIN events e ON e.id = d.event_id
                      WHERE d.endpoint_id = $1 AND d.state IN ('held', 'pending', 'retrying')
                      ORDER BY d.event_created_at, d.id LIMIT $6)
                 UNION ALL
                 SELECT * FROM (
                     SELECT e.id, e.body, e.created_at FROM events e
                      WHERE $3 AND e.developer_id = $2 AND e.created_at < $5
                        AND (json_array_length($4) = 0 OR e.category IN (SELECT value FROM json_each($4)))
                        AND (json_array_length($7) = 0 OR e.event_type IS NULL
                             OR e.event_type IN (SELECT value FROM json_each($7)))
                        AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.endpoint_id = $1 AND d.event_id = e.id)
                      ORDER BY e.created_at, e.id LIMIT $6))
             ORDER BY created_at, id LIMIT $6",
        )
        .bind(&endpoint.id)
        .bind(endpoint.developer_id.hyphenated())
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(json_list(category_names(&endpoint.event_categories)))
        .bind(micros(endpoint.created_at))
        .bind(limit)
        .bind(json_list(endpoint.event_types.iter().map(String::as_str).collect()))
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(stored).collect()
    }

    pub(crate) async fn upcoming_deliveries(
        &self,
        endpoint_id: &str,
        event_ids: &[String],
    ) -> StoreResult<Vec<UpcomingDelivery>> {
        let rows: Vec<(String, String, i32, Option<i64>)> = sqlx::query_as(
            "SELECT event_id, state, attempts, next_attempt_at FROM deliveries
              WHERE endpoint_id = $1 AND event_id IN (SELECT value FROM json_each($2))",
        )
        .bind(endpoint_id)
        .bind(serde_json::Value::from(event_ids.to_vec()).to_string())
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter()
            .map(|(event_id, state, attempts, next)| {
                Ok(UpcomingDelivery { event_id, state, attempts, next_attempt_at: next.map(time).transpose()? })
            })
            .collect()
    }

    pub(crate) async fn list_events(
        &self,
        developer_id: Uuid,
        page: &EventPage<'_>,
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let Some(after) = self.event_cursor(developer_id, page.starting_after).await? else { return Ok(None) };
        let Some(before) = self.event_cursor(developer_id, page.ending_before).await? else { return Ok(None) };
        let category = page.category.map(|c| c.as_str());
        // With only `ending_before`, walk upwards from the cursor, then flip.
        let upwards = before.is_some() && after.is_none();
        // Only the conditions in use, so each is an index condition: SQLite
        // plans a statement once, whatever its parameters will be.
        let mut sql = String::from("SELECT id, body, created_at FROM events WHERE developer_id = $1");
        if category.is_some() {
            sql.push_str(" AND category = $2");
        }
        if after.is_some() {
            sql.push_str(" AND (created_at, id) < ($3, $4)");
        }
        if before.is_some() {
            sql.push_str(" AND (created_at, id) > ($5, $6)");
        }
        let order = if upwards { "ASC" } else { "DESC" };
        sql.push_str(&format!(" ORDER BY created_at {order}, id {order} LIMIT $7"));
        let rows: Vec<EventRow> = sqlx::query_as(&sql)
            .bind(developer_id.hyphenated())
            .bind(category)
            .bind(after.as_ref().map(|a| a.0))
            .bind(after.as_ref().map(|a| a.1.clone()))
            .bind(before.as_ref().map(|b| b.0))
            .bind(before.as_ref().map(|b| b.1.clone()))
            .bind(page.limit)
            .fetch_all(&self.reader)
            .await?;
        let mut rows = rows.into_iter().map(stored).collect::<StoreResult<Vec<_>>>()?;
        if upwards {
            rows.reverse();
        }
        Ok(Some(rows))
    }

    /// Where a paging cursor stands (stored time, id): `Some(None)` without a
    /// cursor, `None` when it names no event of the developer.
    async fn event_cursor(&self, developer_id: Uuid, id: Option<&str>) -> StoreResult<Option<Option<(i64, String)>>> {
        let Some(id) = id else { return Ok(Some(None)) };
        let at = sqlx::query_as("SELECT created_at, id FROM events WHERE id = $1 AND developer_id = $2")
            .bind(id)
            .bind(developer_id.hyphenated())
            .fetch_optional(&self.reader)
            .await?;
        Ok(at.map(Some))
    }

    pub(crate) async fn send_event(&self, endpoint: &EndpointRecord, event_id: &str) -> StoreResult<SendOutcome> {
        let mut tx = self.begin().await?;
        let event: Option<(String, i64, Option<String>)> =
            sqlx::query_as("SELECT category, created_at, event_type FROM events WHERE id = $1 AND developer_id = $2")
                .bind(event_id)
                .bind(endpoint.developer_id.hyphenated())
                .fetch_optional(&mut *tx)
                .await?;
        let Some((category, created_at, event_type)) = event else { return Ok(SendOutcome::NoSuchEvent) };
        let has_delivery: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM deliveries WHERE endpoint_id = $1 AND event_id = $2)")
                .bind(&endpoint.id)
                .bind(event_id)
                .fetch_one(&mut *tx)
                .await?;
        let created: DateTime<Utc> = time(created_at)?;
        if !(has_delivery || endpoint.wants(Category::intern(&category), event_type.as_deref(), created)) {
            return Ok(SendOutcome::NotForEndpoint);
        }
        // A claimed delivery is released: the message in flight belongs to the
        // generation this replaces, and its outcome will change nothing.
        sqlx::query(
            "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at,
                                     next_attempt, force, claimed, created_at, updated_at, event_sequence)
             VALUES ($1, $2, 'pending', $3, $4, 1, 1, 0, $4, $4, (SELECT sequence FROM events WHERE id = $1))
             ON CONFLICT (endpoint_id, event_id) DO UPDATE
                SET state = 'pending', next_attempt_at = $4, updated_at = $4,
                    generation = deliveries.generation + 1, next_attempt = 1, force = 1, claimed = 0, parks = 0, failures = 0,
                    pace_ticket = NULL, lane = 'default',
                    event_sequence = coalesce(deliveries.event_sequence, excluded.event_sequence)",
        )
        .bind(event_id)
        .bind(&endpoint.id)
        .bind(created_at)
        .bind(micros(webhooks_model::time::now()))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.work.notify_one();
        Ok(SendOutcome::Queued)
    }

    pub(crate) async fn recoverable(
        &self,
        endpoint: &EndpointRecord,
        window: RecoveryWindow,
    ) -> StoreResult<Recoverable> {
        let counted = sqlx::query_as(&format!(
            "WITH scanned AS (SELECT e.id, e.sequence, e.created_at FROM events e
                               WHERE e.developer_id = $1 AND e.sequence > $5 AND {MEANT} LIMIT $9),
                  wanted AS ({WANTED})
             SELECT count(*), min(sequence), max(sequence),
                    (SELECT count(*) FROM deliveries d
                      WHERE d.endpoint_id = $2 AND d.state IN ('pending', 'retrying', 'waiting')
                        AND d.event_created_at >= $3 AND d.event_created_at < $4)
               FROM wanted"
        ))
        .bind(endpoint.developer_id.hyphenated())
        .bind(&endpoint.id)
        .bind(micros(window.since))
        .bind(micros(window.until))
        .bind(0_i64)
        .bind(json_list(category_names(&endpoint.event_categories)))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(micros(endpoint.created_at))
        .bind(i64::MAX)
        .bind(json_list(endpoint.event_types.iter().map(String::as_str).collect()))
        .fetch_one(&self.reader)
        .await?;
        Ok(Recoverable::from_row(counted))
    }
}

/// Queues, in the caller's transaction, the first `limit` recoverable
/// deliveries in the slice of the developer's event sequences after `after`
/// that [`RecoveryBatch::slice_end`] gives (see the PostgreSQL store's
/// `recover_batch`).
pub(super) async fn recover_batch(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    endpoint: &EndpointRecord,
    window: RecoveryWindow,
    (after, until): (i64, i64),
    limit: i64,
) -> StoreResult<RecoveryBatch> {
    {
        let Some(upto) = RecoveryBatch::slice_end(after, until, limit) else {
            return Ok(RecoveryBatch { queued: 0, last_sequence: None });
        };
        let now = micros(webhooks_model::time::now());
        // The slice's events, each marked whether it is to be queued.
        let scanned: Vec<(String, i64, i64, bool)> = sqlx::query_as(&format!(
            "WITH slice AS (SELECT e.id, e.sequence, e.created_at, e.category, e.event_type FROM events e
                             WHERE e.developer_id = $1 AND e.sequence > $5 AND e.sequence <= $11
                             ORDER BY e.sequence LIMIT $9),
                  scanned AS (SELECT e.id, e.sequence, e.created_at FROM slice e WHERE {MEANT})
             SELECT s.id, s.created_at, s.sequence, s.id IN (SELECT id FROM ({WANTED})) FROM slice s
              ORDER BY s.sequence"
        ))
        .bind(endpoint.developer_id.hyphenated())
        .bind(&endpoint.id)
        .bind(micros(window.since))
        .bind(micros(window.until))
        .bind(after)
        .bind(json_list(category_names(&endpoint.event_categories)))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(micros(endpoint.created_at))
        .bind(upto - after)
        .bind(json_list(endpoint.event_types.iter().map(String::as_str).collect()))
        .bind(upto)
        .fetch_all(&mut **tx)
        .await?;
        let wanted: Vec<_> =
            scanned.into_iter().filter(|row| row.3).take(limit.try_into().unwrap_or(usize::MAX)).collect();
        let taken = (i64::try_from(wanted.len()).unwrap_or(i64::MAX), wanted.last().map(|row| row.2));
        let mut queued = 0;
        for (event_id, created_at, sequence, _) in wanted {
            // As `send`: a new generation, one forced attempt.
            queued += sqlx::query(
                "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at,
                                         next_attempt, force, claimed, created_at, updated_at, event_sequence, lane)
                 VALUES ($1, $2, 'pending', $3, $4, 1, 1, 0, $4, $4, $5, 'bulk')
                 ON CONFLICT (endpoint_id, event_id) DO UPDATE
                    SET state = 'pending', next_attempt_at = $4, updated_at = $4,
                        generation = deliveries.generation + 1, next_attempt = 1, force = 1, claimed = 0,
                        parks = 0, failures = 0, pace_ticket = NULL, lane = 'bulk',
                        event_sequence = coalesce(deliveries.event_sequence, excluded.event_sequence)
                  WHERE deliveries.state IN ('failed', 'held')",
            )
            .bind(&event_id)
            .bind(&endpoint.id)
            .bind(created_at)
            .bind(now)
            .bind(sequence)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        }
        Ok(RecoveryBatch::taken(queued, taken, limit, upto))
    }
}

/// Whether event `e` of developer `$1` is in the window (`$3` to `$4`) and
/// meant for endpoint `$2`: categories `$6` and event types `$10` as JSON
/// lists, epoch (`$7`, or created since `$8`).
const MEANT: &str = "
    e.created_at >= $3 AND e.created_at < $4
       AND (json_array_length($6) = 0 OR e.category IN (SELECT value FROM json_each($6)))
       AND (json_array_length($10) = 0 OR e.event_type IS NULL OR e.event_type IN (SELECT value FROM json_each($10)))
       AND ($7 OR e.created_at >= $8)";

/// Of the events meant (`scanned`), the ones whose delivery failed or is
/// upcoming: held, or never made for an event from before a
/// `beginning_of_time` endpoint (as `upcoming_events` lists them). An event
/// that never had a delivery for other reasons (its category was added
/// later) was never upcoming.
const WANTED: &str = "
    SELECT s.id, s.sequence, s.created_at FROM scanned s
      LEFT JOIN deliveries d ON d.endpoint_id = $2 AND d.event_id = s.id
     WHERE d.state IN ('failed', 'held') OR (d.id IS NULL AND $7 AND s.created_at < $8)";

/// Stores one event of a batch; `Ok(Err(IdempotencyKeyTaken))` when its key
/// is taken (the batch goes on), `Err` when the transaction failed.
async fn ingest_one(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    event: &NewEvent,
    now: i64,
) -> StoreResult<StoreResult<IngestOutcome>> {
    let developer_id = event.developer_id.hyphenated();
    let created_at = micros(event.created_at);
    if let Some(key) = &event.idempotency_key {
        let taken: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM events WHERE developer_id = $1 AND idempotency_key = $2)")
                .bind(developer_id)
                .bind(key)
                .fetch_one(&mut **tx)
                .await?;
        if taken {
            return Ok(Err(StoreError::IdempotencyKeyTaken));
        }
    }
    let sequence: i64 = sqlx::query_scalar(
        "INSERT INTO developers (id, next_event_sequence, created_at) VALUES ($1, 2, $2)
         ON CONFLICT (id) DO UPDATE SET next_event_sequence = developers.next_event_sequence + 1
         RETURNING next_event_sequence - 1",
    )
    .bind(developer_id)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    let body = format!("{}{sequence}{}", event.body_head, event.body_tail);
    sqlx::query(
        "INSERT INTO events (id, developer_id, sequence, category, body, created_at, idempotency_key, request_hash,
                             event_type)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(&event.id)
    .bind(developer_id)
    .bind(sequence)
    .bind(event.category.as_str())
    .bind(&body)
    .bind(created_at)
    .bind(event.idempotency_key.as_deref())
    .bind(event.request_hash.as_deref())
    .bind(&event.event_type)
    .execute(&mut **tx)
    .await?;
    let deliveries: Vec<(i64, String, String, bool)> = sqlx::query_as(
        "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at, created_at, updated_at,
                                 event_sequence, lane)
         SELECT $1, id, CASE status WHEN 'active' THEN 'pending' ELSE 'held' END, $3,
                CASE status WHEN 'active' THEN $3 END, $5, $5, $6, $7
           FROM endpoints
          WHERE developer_id = $2 AND status <> 'deleted'
            AND (json_array_length(event_categories) = 0
                 OR EXISTS (SELECT 1 FROM json_each(event_categories) WHERE value = $4))
            AND (json_array_length(event_types) = 0
                 OR EXISTS (SELECT 1 FROM json_each(event_types) WHERE value = $8))
         RETURNING id, endpoint_id, state,
                   (SELECT e.ordering = 'ordered' FROM endpoints e WHERE e.id = deliveries.endpoint_id)",
    )
    .bind(&event.id)
    .bind(developer_id)
    .bind(created_at)
    .bind(event.category.as_str())
    .bind(now)
    .bind(sequence)
    .bind(event.lane.as_str())
    .bind(&event.event_type)
    .fetch_all(&mut **tx)
    .await?;
    let held = deliveries.iter().filter(|(_, _, state, _)| state == "held").count();
    let queued = deliveries
        .into_iter()
        .filter(|(_, _, state, _)| state == "pending")
        .map(|(delivery_id, endpoint_id, _, ordered)| QueuedDelivery { delivery_id, endpoint_id, ordered })
        .collect();
    Ok(Ok(IngestOutcome { sequence, queued, held, body }))
}
