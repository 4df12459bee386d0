//! Events and their deliveries on PostgreSQL. A delivery queued by `send` or
//! a recovery gets an outbox row that names it (`lane`, `delivery_id`,
//! `generation`, `force`); the relay makes the message from the delivery
//! when it publishes, so no SQL writes a message.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::{
    DeliveredEvent, EndpointRecord, EventDelivery, EventPage, IdempotentEvent, IngestOutcome, NewEvent, QueuedDelivery,
    Recoverable, RecoveryWindow, SendOutcome, StoreError, StoreResult, StoredEvent, UpcomingDelivery,
    events::RecoveryBatch,
};
use webhooks_model::{Category, EventEpoch};

/// The unique indexes that make a producer's `Idempotency-Key` name one
/// event per developer (the keys' own table, and the unpartitioned events
/// table of an installation not yet converted); a violation means a
/// concurrent twin won.
const EVENT_IDEMPOTENCY_INDEXES: [&str; 2] = ["event_idempotency_pkey", "events_idempotency_key"];

/// One batch of events and their deliveries, in one statement.
const INGEST: &str = "WITH input AS (
         SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
                              $7::text[], $8::text[], $9::bytea[], $10::text[])
                WITH ORDINALITY AS i(id, developer_id, category, head, tail, created_at, lane, key, hash,
                                     event_type, ord)
     ), counts AS (
         SELECT developer_id, count(*) AS k FROM input GROUP BY developer_id
     ), seq AS (
         INSERT INTO developers AS dv (id, next_event_sequence)
         SELECT developer_id, k + 1 FROM counts ORDER BY developer_id
         ON CONFLICT (id) DO UPDATE SET next_event_sequence = dv.next_event_sequence + excluded.next_event_sequence - 1
         RETURNING dv.id, dv.next_event_sequence AS next
     ), numbered AS (
         SELECT i.*, s.next - c.k - 1 + row_number() OVER (PARTITION BY i.developer_id ORDER BY i.ord) AS n
           FROM input i JOIN counts c ON c.developer_id = i.developer_id JOIN seq s ON s.id = i.developer_id
     ), ev AS (
         INSERT INTO events (id, developer_id, sequence, category, body, created_at, idempotency_key, request_hash,
                             event_type)
         SELECT id, developer_id, n, category, head || n || tail, created_at, key, hash, event_type
           FROM numbered ORDER BY ord
         RETURNING id, sequence, body
     ), keys AS (
         INSERT INTO event_idempotency (developer_id, key, event_id, request_hash, created_at)
         SELECT developer_id, key, id, hash, created_at FROM numbered WHERE key IS NOT NULL
     ), d AS (
         INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at, event_sequence,
                                 lane)
         SELECT nb.id, e.id, CASE e.status WHEN 'active' THEN 'pending' ELSE 'held' END, nb.created_at,
                CASE e.status WHEN 'active' THEN nb.created_at END, nb.n, nb.lane
           FROM numbered nb JOIN endpoints e ON e.developer_id = nb.developer_id
          WHERE e.status <> 'deleted'
            AND (cardinality(e.event_categories) = 0 OR nb.category = ANY (e.event_categories))
            AND (cardinality(e.event_types) = 0 OR nb.event_type = ANY (e.event_types))
          ORDER BY nb.ord, e.id
         RETURNING id, event_id, endpoint_id, state
     ), per_event AS (
         SELECT d.event_id,
                array_agg(d.id ORDER BY d.id) FILTER (WHERE d.state = 'pending') AS queued,
                array_agg(d.endpoint_id ORDER BY d.id) FILTER (WHERE d.state = 'pending') AS endpoints,
                array_agg(e.ordering = 'ordered' ORDER BY d.id) FILTER (WHERE d.state = 'pending') AS ordered,
                count(*) FILTER (WHERE d.state = 'held') AS held
           FROM d JOIN endpoints e ON e.id = d.endpoint_id GROUP BY d.event_id
     )
     SELECT ev.id, ev.sequence, ev.body, coalesce(p.queued, '{}'), coalesce(p.endpoints, '{}'),
            coalesce(p.ordered, '{}'), coalesce(p.held, 0)
       FROM ev LEFT JOIN per_event p ON p.event_id = ev.id";

impl PgStore {
    pub(crate) async fn find_delivered_event(
        &self,
        developer_id: Uuid,
        event_id: &str,
    ) -> StoreResult<Option<DeliveredEvent>> {
        let body: Option<String> = sqlx::query_scalar("SELECT body FROM events WHERE id = $1 AND developer_id = $2")
            .bind(event_id)
            .bind(developer_id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(body) = body else { return Ok(None) };
        #[allow(clippy::type_complexity)]
        let rows: Vec<(String, String, i32, Option<i16>, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT d.endpoint_id, d.state, d.attempts,
                    (SELECT a.status FROM delivery_attempts a WHERE a.delivery_id = d.id
                      ORDER BY a.created_at DESC, a.id DESC LIMIT 1),
                    CASE WHEN d.state IN ('pending', 'retrying', 'waiting') THEN d.next_attempt_at END
               FROM deliveries d WHERE d.event_id = $1
              ORDER BY d.endpoint_id",
        )
        .bind(event_id)
        .fetch_all(&self.pool)
        .await?;
        let deliveries = rows
            .into_iter()
            .map(|(endpoint_id, state, attempts, last_status, next_attempt_at)| EventDelivery {
                endpoint_id,
                state,
                attempts,
                last_status: last_status.map(i32::from),
                next_attempt_at,
            })
            .collect();
        Ok(Some(DeliveredEvent { body, deliveries }))
    }

    /// One statement for the whole batch (see [`crate::Store::ingest_events`]):
    /// each developer's counter moves once, by the number of its events,
    /// rows locked in developer order so that two API processes cannot
    /// deadlock; the events are numbered in the batch's order. A twin that
    /// another process committed fails the statement on the unique index:
    /// then each event is stored on its own, and only the twin is refused.
    pub(crate) async fn ingest_events(&self, events: &[&NewEvent]) -> StoreResult<Vec<StoreResult<IngestOutcome>>> {
        match self.ingest_batch(events).await {
            Err(StoreError::IdempotencyKeyTaken) if events.len() > 1 => {
                let mut outcomes = Vec::with_capacity(events.len());
                for event in events {
                    outcomes.push(self.ingest_batch(std::slice::from_ref(event)).await.and_then(|mut one| {
                        one.pop().ok_or_else(|| StoreError::Corrupt("an ingest returned no outcome".into()))
                    }));
                }
                Ok(outcomes)
            }
            Err(StoreError::IdempotencyKeyTaken) => Ok(vec![Err(StoreError::IdempotencyKeyTaken)]),
            Err(error) => Err(error),
            Ok(outcomes) => Ok(outcomes.into_iter().map(Ok).collect()),
        }
    }

    async fn ingest_batch(&self, events: &[&NewEvent]) -> StoreResult<Vec<IngestOutcome>> {
        type Stored = (String, i64, String, Vec<i64>, Vec<String>, Vec<bool>, i64);
        let stored = self
            .held
            .ingest
            .fetch_all(&self.pool, || {
                sqlx::query_as::<_, Stored>(INGEST)
                    .bind(events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.developer_id).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.category.as_str()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.body_head.as_str()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.body_tail.as_str()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.lane.as_str()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.idempotency_key.as_deref()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.request_hash.as_deref()).collect::<Vec<_>>())
                    .bind(events.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
            })
            .await;
        let mut stored: std::collections::HashMap<String, Stored> = match stored {
            Ok(rows) => rows.into_iter().map(|row| (row.0.clone(), row)).collect(),
            Err(error)
                if error
                    .as_database_error()
                    .and_then(|e| e.constraint())
                    .is_some_and(|name| EVENT_IDEMPOTENCY_INDEXES.contains(&name)) =>
            {
                return Err(StoreError::IdempotencyKeyTaken);
            }
            Err(error) => return Err(error.into()),
        };
        events
            .iter()
            .map(|event| {
                let (_, sequence, body, queued, endpoints, ordered, held) = stored
                    .remove(&event.id)
                    .ok_or_else(|| StoreError::Corrupt("an ingested event is missing".into()))?;
                if endpoints.len() != queued.len() || ordered.len() != queued.len() {
                    return Err(StoreError::Corrupt("an ingest's deliveries do not line up".into()));
                }
                let queued = queued
                    .into_iter()
                    .zip(endpoints)
                    .zip(ordered)
                    .map(|((delivery_id, endpoint_id), ordered)| QueuedDelivery { delivery_id, endpoint_id, ordered })
                    .collect();
                Ok(IngestOutcome { sequence, queued, held: usize::try_from(held).unwrap_or_default(), body })
            })
            .collect()
    }

    pub(crate) async fn find_idempotent_event(
        &self,
        developer_id: Uuid,
        idempotency_key: &str,
    ) -> StoreResult<Option<IdempotentEvent>> {
        // Keys kept with their events (by the release before this one, until
        // the history is partitioned, which copies them over) are read there.
        let found: Option<(Option<Vec<u8>>, String)> = sqlx::query_as(
            "SELECT k.request_hash, e.body FROM event_idempotency k JOIN events e ON e.id = k.event_id
              WHERE k.developer_id = $1 AND k.key = $2
             UNION ALL
             SELECT request_hash, body FROM events WHERE NOT $3 AND developer_id = $1 AND idempotency_key = $2
             LIMIT 1",
        )
        .bind(developer_id)
        .bind(idempotency_key)
        .bind(self.layout().partitioned)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.map(|(request_hash, body)| IdempotentEvent { request_hash: request_hash.unwrap_or_default(), body }))
    }

    pub(crate) async fn upcoming_events(&self, endpoint: &EndpointRecord, limit: i64) -> StoreResult<Vec<StoredEvent>> {
        let names: Vec<&str> = endpoint.event_categories.iter().map(|c| c.as_str()).collect();
        Ok(sqlx::query_as(
            "(SELECT e.id, e.body, e.created_at FROM deliveries d JOIN events e ON e.id = d.event_id
               WHERE d.endpoint_id = $1 AND d.state IN ('held', 'pending', 'retrying', 'waiting')
               ORDER BY d.event_created_at, d.id LIMIT $6)
             UNION ALL
             (SELECT e.id, e.body, e.created_at FROM events e
               WHERE $3 AND e.developer_id = $2 AND e.created_at < $5
                 AND (cardinality($4::text[]) = 0 OR e.category = ANY ($4))
                 AND (cardinality($7::text[]) = 0 OR e.event_type IS NULL OR e.event_type = ANY ($7))
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
        .bind(&endpoint.event_types)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn upcoming_deliveries(
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

    pub(crate) async fn send_event(&self, endpoint: &EndpointRecord, event_id: &str) -> StoreResult<SendOutcome> {
        let mut tx = self.pool.begin().await?;
        let event: Option<(String, DateTime<Utc>, Option<String>)> =
            sqlx::query_as("SELECT category, created_at, event_type FROM events WHERE id = $1 AND developer_id = $2")
                .bind(event_id)
                .bind(endpoint.developer_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((category, created_at, event_type)) = event else { return Ok(SendOutcome::NoSuchEvent) };
        let has_delivery: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM deliveries WHERE endpoint_id = $1 AND event_id = $2)")
                .bind(&endpoint.id)
                .bind(event_id)
                .fetch_one(&mut *tx)
                .await?;
        if !(has_delivery || endpoint.wants(Category::intern(&category), event_type.as_deref(), created_at)) {
            return Ok(SendOutcome::NotForEndpoint);
        }
        let (delivery_id, generation): (i64, i32) = sqlx::query_as(
            "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at, event_sequence, lane)
             VALUES ($1, $2, 'pending', $3, now(), (SELECT sequence FROM events WHERE id = $1), 'default')
             ON CONFLICT (endpoint_id, event_id) DO UPDATE
                SET state = 'pending', next_attempt_at = now(), updated_at = now(), sweeps = 0, set_aside = false,
                    lane = 'default',
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
            "INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force)
             VALUES ('', '', 'default', $1, $2, true)",
        )
        .bind(delivery_id)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(SendOutcome::Queued)
    }

    /// Counts from the endpoint's side: its failed and held deliveries in
    /// the window, through the `deliveries_recoverable` index, and for a
    /// `beginning_of_time` endpoint the events from before it that never
    /// had one. The same set `recover_batch` queues, without reading every
    /// event of the developer in the window; the same read gives the range
    /// of sequences the batches walk.
    pub(crate) async fn recoverable(
        &self,
        endpoint: &EndpointRecord,
        window: RecoveryWindow,
    ) -> StoreResult<Recoverable> {
        let counted = sqlx::query_as(&format!(
            "WITH made AS (
                 SELECT count(*) AS n, min(m.sequence) AS first, max(m.sequence) AS last
                   FROM (SELECT coalesce(d.event_sequence, (SELECT e.sequence FROM events e WHERE e.id = d.event_id))
                                AS sequence
                           FROM deliveries d
                          WHERE d.endpoint_id = $2 AND d.state IN ('failed', 'held')
                            AND d.event_created_at >= $3 AND d.event_created_at < $4
                            AND ($6 OR d.event_created_at >= $7)
                            AND (cardinality($5::text[]) = 0 AND cardinality($8::text[]) = 0
                                 OR EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id AND {MEANT}))) m
             ), never AS (
                 SELECT count(*) AS n, min(e.sequence) AS first, max(e.sequence) AS last FROM events e
                  WHERE $6 AND e.developer_id = $1 AND e.created_at < $7 AND {MEANT}
                    AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.endpoint_id = $2 AND d.event_id = e.id)
             ), owed AS (
                 SELECT count(*) AS n FROM deliveries d
                  WHERE d.endpoint_id = $2 AND d.state IN ('pending', 'retrying', 'waiting')
                    AND d.event_created_at >= $3 AND d.event_created_at < $4
             )
             SELECT made.n + never.n, least(made.first, never.first), greatest(made.last, never.last), owed.n
               FROM made, never, owed"
        ))
        .bind(endpoint.developer_id)
        .bind(&endpoint.id)
        .bind(window.since)
        .bind(window.until)
        .bind(recovery_categories(endpoint))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(endpoint.created_at)
        .bind(&endpoint.event_types)
        .fetch_one(&self.pool)
        .await?;
        Ok(Recoverable::from_row(counted))
    }
}

/// Queues, in the caller's transaction, the first `limit` recoverable
/// deliveries in the slice of the developer's event sequences after `after`
/// that [`RecoveryBatch::slice_end`] gives, up to `until` at most (the last
/// sequence the recovery counted), as `send` does: one
/// forced attempt, a new generation, in the bulk lane. A delivery that is
/// pending or retrying is left alone, so nothing is queued twice.
///
/// A batch is one slice of the `(developer_id, sequence)` index that the
/// window, categories and event types filter: whatever the planner's
/// statistics say (a burst of events not analyzed yet), a batch reads a
/// bounded number of events, never the whole window again. A batch stays
/// small so that what it queues reaches the relay and the dispatchers as a
/// trickle, not as a burst that live traffic waits behind.
pub(super) async fn recover_batch(
    tx: &mut sqlx::PgConnection,
    endpoint: &EndpointRecord,
    window: RecoveryWindow,
    (after, until): (i64, i64),
    limit: i64,
) -> StoreResult<RecoveryBatch> {
    {
        let Some(upto) = RecoveryBatch::slice_end(after, until, limit) else {
            return Ok(RecoveryBatch { queued: 0, last_sequence: None });
        };
        let (queued, wanted, last_wanted): (i64, i64, Option<i64>) = sqlx::query_as(&format!(
            "WITH slice AS (SELECT e.id, e.sequence, e.created_at, e.category, e.event_type FROM events e
                             WHERE e.developer_id = $1 AND e.sequence > $9 AND e.sequence <= $10
                             ORDER BY e.sequence LIMIT $10 - $9),
                  scanned AS (SELECT e.id, e.sequence, e.created_at FROM slice e WHERE {MEANT}),
                  wanted AS (SELECT * FROM ({WANTED}) w ORDER BY w.sequence LIMIT $11),
                  armed AS (
                      INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at,
                                              event_sequence, lane)
                      SELECT id, $2, 'pending', created_at, now(), sequence, 'bulk' FROM wanted
                      ON CONFLICT (endpoint_id, event_id) DO UPDATE
                         SET state = 'pending', next_attempt_at = now(), updated_at = now(), sweeps = 0, set_aside = false,
                             lane = 'bulk',
                             generation = deliveries.generation + 1,
                             event_sequence = coalesce(deliveries.event_sequence, excluded.event_sequence)
                       WHERE deliveries.state IN ('failed', 'held')
                      RETURNING id, generation),
                  queued AS (
                      INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force)
                      SELECT '', '', 'bulk', id, generation, true FROM armed
                      RETURNING 1)
             SELECT (SELECT count(*) FROM queued), (SELECT count(*) FROM wanted), (SELECT max(sequence) FROM wanted)"
        ))
        .bind(endpoint.developer_id)
        .bind(&endpoint.id)
        .bind(window.since)
        .bind(window.until)
        .bind(recovery_categories(endpoint))
        .bind(endpoint.event_epoch == EventEpoch::BeginningOfTime)
        .bind(endpoint.created_at)
        .bind(&endpoint.event_types)
        .bind(after)
        .bind(upto)
        .bind(limit)
        .fetch_one(tx)
        .await?;
        Ok(RecoveryBatch::taken(u64::try_from(queued).unwrap_or_default(), (wanted, last_wanted), limit, upto))
    }
}

/// The parameters every recovery statement binds first, in this order: `$1`
/// the developer, `$2` the endpoint, `$3` and `$4` the window, `$5` the
/// endpoint's categories, `$6` whether it is `beginning_of_time`, `$7` its
/// creation, `$8` its event types.
///
/// Whether event `e` is in the window and meant for the endpoint.
const MEANT: &str = "
    e.created_at >= $3 AND e.created_at < $4
       AND (cardinality($5::text[]) = 0 OR e.category = ANY ($5))
       AND (cardinality($8::text[]) = 0 OR e.event_type IS NULL OR e.event_type = ANY ($8))
       AND ($6 OR e.created_at >= $7)";

/// Of the events meant (`scanned`), the ones whose delivery failed or is
/// upcoming: held, or never made for an event from before a
/// `beginning_of_time` endpoint (as `upcoming_events` lists them). An event
/// that never had a delivery for other reasons (its category was added
/// later) was never upcoming.
const WANTED: &str = "
    SELECT s.id, s.sequence, s.created_at FROM scanned s
      LEFT JOIN deliveries d ON d.endpoint_id = $2 AND d.event_id = s.id
     WHERE d.state IN ('failed', 'held') OR (d.id IS NULL AND $6 AND s.created_at < $7)";

fn recovery_categories(endpoint: &EndpointRecord) -> Vec<&'static str> {
    endpoint.event_categories.iter().map(|c| c.as_str()).collect()
}
