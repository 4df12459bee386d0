//! Events and their deliveries on PostgreSQL. A queued delivery gets an
//! outbox row that names it (`delivery_id`, `generation`, `force`); the relay
//! builds the message from the delivery when it publishes, so no SQL writes
//! the message: its JSON comes only from [`crate::broker::DeliveryMessage`].

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::{
    model::EventEpoch,
    store::{
        EndpointRecord, EventPage, IdempotentEvent, IngestOutcome, NewEvent, RecoveryBatch, RecoveryWindow,
        SendOutcome, StoreError, StoreResult, StoredEvent, UpcomingDelivery,
    },
};

/// The unique index that makes a producer's `Idempotency-Key` name one event
/// per developer; a violation means a concurrent twin won.
const EVENT_IDEMPOTENCY_INDEX: &str = "events_idempotency_key";

impl PgStore {
    pub(in crate::store) async fn ingest_event(&self, event: &NewEvent) -> StoreResult<IngestOutcome> {
        let stored: Result<(i64, String, i64, i64), sqlx::Error> = sqlx::query_as(
            "WITH seq AS (
                 INSERT INTO developers (id, next_event_sequence) VALUES ($1, 2)
                 ON CONFLICT (id) DO UPDATE SET next_event_sequence = developers.next_event_sequence + 1
                 RETURNING next_event_sequence - 1 AS n
             ), ev AS (
                 INSERT INTO events (id, developer_id, sequence, category, body, created_at, idempotency_key, request_hash)
                 SELECT $2, $1, n, $3, $4 || n || $5, $6, $8, $9 FROM seq
                 RETURNING sequence, body
             ), d AS (
                 INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at, event_sequence)
                 SELECT $2, id, CASE status WHEN 'active' THEN 'pending' ELSE 'held' END, $6,
                        CASE status WHEN 'active' THEN $6 END, seq.n
                 FROM endpoints, seq
                 WHERE developer_id = $1 AND status <> 'deleted'
                   AND (cardinality(event_categories) = 0 OR $3 = ANY (event_categories))
                 RETURNING id, state
             ), o AS (
                 INSERT INTO outbox (exchange, routing_key, delivery_id, generation, force)
                 SELECT '', $7, d.id, 0, false FROM d, ev WHERE d.state = 'pending'
                 RETURNING 1
             )
             SELECT ev.sequence, ev.body,
                    (SELECT count(*) FROM d WHERE state = 'pending'),
                    (SELECT count(*) FROM d WHERE state = 'held')
             FROM ev",
        )
        .bind(event.developer_id)
        .bind(&event.id)
        .bind(event.category.as_str())
        .bind(&event.body_head)
        .bind(&event.body_tail)
        .bind(event.created_at)
        .bind(self.work_queue(event.lane))
        .bind(event.idempotency_key.as_deref())
        .bind(event.request_hash.as_deref())
        .fetch_one(&self.pool)
        .await;
        let (sequence, body, pending, held) = match stored {
            Ok(stored) => stored,
            Err(error) if error.as_database_error().and_then(|e| e.constraint()) == Some(EVENT_IDEMPOTENCY_INDEX) => {
                return Err(StoreError::IdempotencyKeyTaken);
            }
            Err(error) => return Err(error.into()),
        };
        Ok(IngestOutcome {
            sequence,
            pending: usize::try_from(pending).unwrap_or_default(),
            held: usize::try_from(held).unwrap_or_default(),
            body,
        })
    }

    pub(in crate::store) async fn find_idempotent_event(
        &self,
        developer_id: Uuid,
        idempotency_key: &str,
    ) -> StoreResult<Option<IdempotentEvent>> {
        let found: Option<(Option<Vec<u8>>, String)> =
            sqlx::query_as("SELECT request_hash, body FROM events WHERE developer_id = $1 AND idempotency_key = $2")
                .bind(developer_id)
                .bind(idempotency_key)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.map(|(request_hash, body)| IdempotentEvent { request_hash: request_hash.unwrap_or_default(), body }))
    }

    pub(in crate::store) async fn upcoming_events(
        &self,
        endpoint: &EndpointRecord,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>> {
        let names: Vec<&str> = endpoint.event_categories.iter().map(|c| c.as_str()).collect();
        Ok(sqlx::query_as(
            "(SELECT e.id, e.body, e.created_at FROM deliveries d JOIN events e ON e.id = d.event_id
               WHERE d.endpoint_id = $1 AND d.state IN ('held', 'pending', 'retrying', 'waiting')
               ORDER BY d.event_created_at, d.id LIMIT $6)
             UNION ALL
             (SELECT e.id, e.body, e.created_at FROM events e
               WHERE $3 AND e.developer_id = $2 AND e.created_at < $5
                 AND (cardinality($4::text[]) = 0 OR e.category = ANY ($4))
                 AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.endpoint_id = $1 AND d.event_id = e.id)
               ORDER BY e.created_at, e.id LIMIT $6)
             ORDER BY created_at, id LIMIT $6",
        )
        .bind(&endpoint.id)
        .bind(endpoint.developer_id)
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(&names)
        .bind(endpoint.created_at)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(in crate::store) async fn upcoming_deliveries(
        &self,
        endpoint_id: &str,
        event_ids: &[String],
    ) -> StoreResult<Vec<UpcomingDelivery>> {
        let rows: Vec<(String, String, i32, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT event_id, state, attempts, next_attempt_at FROM deliveries
              WHERE endpoint_id = $1 AND event_id = ANY ($2)",
        )
        .bind(endpoint_id)
        .bind(event_ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(event_id, state, attempts, next_attempt_at)| UpcomingDelivery {
                event_id,
                state,
                attempts,
                next_attempt_at,
            })
            .collect())
    }

    pub(in crate::store) async fn list_events(
        &self,
        developer_id: Uuid,
        page: &EventPage<'_>,
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let Some(after) = self.event_cursor(developer_id, page.starting_after).await? else { return Ok(None) };
        let Some(before) = self.event_cursor(developer_id, page.ending_before).await? else { return Ok(None) };
        let category = page.category.map(|c| c.as_str());
        // With only `ending_before`, walk upwards from the cursor, then flip.
        let upwards = before.is_some() && after.is_none();
        let sql = format!(
            "SELECT id, body, created_at FROM events
             WHERE developer_id = $1
               AND ($2::text IS NULL OR category = $2)
               AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4))
               AND ($5::timestamptz IS NULL OR (created_at, id) > ($5, $6))
             ORDER BY created_at {order}, id {order} LIMIT $7",
            order = if upwards { "ASC" } else { "DESC" }
        );
        // Unnamed (not prepared once and reused): planned with the actual
        // cursor and filter values, so they stay index conditions.
        let mut rows: Vec<StoredEvent> = sqlx::query_as(&sql)
            .persistent(false)
            .bind(developer_id)
            .bind(category)
            .bind(after.as_ref().map(|a| a.0))
            .bind(after.as_ref().map(|a| a.1.clone()))
            .bind(before.as_ref().map(|b| b.0))
            .bind(before.as_ref().map(|b| b.1.clone()))
            .bind(page.limit)
            .fetch_all(&self.pool)
            .await?;
        if upwards {
            rows.reverse();
        }
        Ok(Some(rows))
    }

    /// Where a paging cursor stands: `Some(None)` without a cursor, `None`
    /// when it names no event of the developer.
    async fn event_cursor(
        &self,
        developer_id: Uuid,
        id: Option<&str>,
    ) -> StoreResult<Option<Option<(DateTime<Utc>, String)>>> {
        let Some(id) = id else { return Ok(Some(None)) };
        let at = sqlx::query_as("SELECT created_at, id FROM events WHERE id = $1 AND developer_id = $2")
            .bind(id)
            .bind(developer_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(at.map(Some))
    }

    pub(in crate::store) async fn send_event(
        &self,
        endpoint: &EndpointRecord,
        event_id: &str,
    ) -> StoreResult<SendOutcome> {
        let mut tx = self.pool.begin().await?;
        let event: Option<(String, DateTime<Utc>)> =
            sqlx::query_as("SELECT category, created_at FROM events WHERE id = $1 AND developer_id = $2")
                .bind(event_id)
                .bind(endpoint.developer_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((category, created_at)) = event else { return Ok(SendOutcome::NoSuchEvent) };
        let has_delivery: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM deliveries WHERE endpoint_id = $1 AND event_id = $2)")
                .bind(&endpoint.id)
                .bind(event_id)
                .fetch_one(&mut *tx)
                .await?;
        if !(has_delivery || endpoint.wants(category.parse().ok(), created_at)) {
            return Ok(SendOutcome::NotForEndpoint);
        }
        let (delivery_id, generation): (i64, i32) = sqlx::query_as(
            "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at, event_sequence)
             VALUES ($1, $2, 'pending', $3, now(), (SELECT sequence FROM events WHERE id = $1))
             ON CONFLICT (endpoint_id, event_id) DO UPDATE
                SET state = 'pending', next_attempt_at = now(), updated_at = now(), sweeps = 0,
                    generation = deliveries.generation + 1,
                    event_sequence = coalesce(deliveries.event_sequence, excluded.event_sequence)
             RETURNING id, generation",
        )
        .bind(event_id)
        .bind(&endpoint.id)
        .bind(created_at)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO outbox (exchange, routing_key, delivery_id, generation, force) VALUES ('', $1, $2, $3, true)",
        )
        .bind(&self.deliveries_queue)
        .bind(delivery_id)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(SendOutcome::Queued)
    }

    pub(in crate::store) async fn recoverable(
        &self,
        endpoint: &EndpointRecord,
        window: RecoveryWindow,
    ) -> StoreResult<u64> {
        let count: i64 = sqlx::query_scalar(&format!(
            "WITH scanned AS ({SCANNED}), wanted AS ({WANTED}) SELECT count(*) FROM wanted"
        ))
        .bind(endpoint.developer_id)
        .bind(&endpoint.id)
        .bind(window.since)
        .bind(window.until)
        .bind(0_i64)
        .bind(recovery_categories(endpoint))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(endpoint.created_at)
        .bind(i64::MAX)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(count).unwrap_or_default())
    }

    pub(in crate::store) async fn recover_batch(
        &self,
        endpoint: &EndpointRecord,
        window: RecoveryWindow,
        after: i64,
        limit: i64,
    ) -> StoreResult<RecoveryBatch> {
        let (queued, last_sequence): (i64, Option<i64>) = sqlx::query_as(&format!(
            "WITH scanned AS ({SCANNED}),
                  wanted AS ({WANTED}),
                  armed AS (
                      INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at,
                                              event_sequence)
                      SELECT id, $2, 'pending', created_at, now(), sequence FROM wanted
                      ON CONFLICT (endpoint_id, event_id) DO UPDATE
                         SET state = 'pending', next_attempt_at = now(), updated_at = now(), sweeps = 0,
                             generation = deliveries.generation + 1,
                             event_sequence = coalesce(deliveries.event_sequence, excluded.event_sequence)
                       WHERE deliveries.state IN ('failed', 'held')
                      RETURNING id, generation),
                  queued AS (
                      INSERT INTO outbox (exchange, routing_key, delivery_id, generation, force)
                      SELECT '', $10, id, generation, true FROM armed
                      RETURNING 1)
             SELECT (SELECT count(*) FROM queued), (SELECT max(sequence) FROM scanned)"
        ))
        .bind(endpoint.developer_id)
        .bind(&endpoint.id)
        .bind(window.since)
        .bind(window.until)
        .bind(after)
        .bind(recovery_categories(endpoint))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(endpoint.created_at)
        .bind(limit)
        .bind(&self.bulk_queue)
        .fetch_one(&self.pool)
        .await?;
        Ok(RecoveryBatch { queued: u64::try_from(queued).unwrap_or_default(), last_sequence })
    }
}

/// The window's events meant for endpoint `$2` of developer `$1` (categories
/// `$6`, epoch: `$7` or created since `$8`), after sequence `$5`, at most `$9`.
const SCANNED: &str = "
    SELECT e.id, e.sequence, e.created_at FROM events e
     WHERE e.developer_id = $1 AND e.created_at >= $3 AND e.created_at < $4 AND e.sequence > $5
       AND (cardinality($6::text[]) = 0 OR e.category = ANY ($6))
       AND ($7 OR e.created_at >= $8)
     ORDER BY e.sequence LIMIT $9";

/// Of those, the ones whose delivery failed or is upcoming: held, or never
/// made for an event from before a `beginning_of_time` endpoint (as
/// `upcoming_events` lists them). An event that never had a delivery for
/// other reasons (its category was added later) was never upcoming.
const WANTED: &str = "
    SELECT s.id, s.sequence, s.created_at FROM scanned s
      LEFT JOIN deliveries d ON d.endpoint_id = $2 AND d.event_id = s.id
     WHERE d.state IN ('failed', 'held') OR (d.id IS NULL AND $7 AND s.created_at < $8)";

fn recovery_categories(endpoint: &EndpointRecord) -> Vec<&'static str> {
    endpoint.event_categories.iter().map(|c| c.as_str()).collect()
}
