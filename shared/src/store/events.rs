//! Events and their deliveries: ingest in one transaction, the upcoming list of
//! an endpoint, the developer's event list, and re-arming a delivery (`send`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{EndpointRecord, Store, outbox};
use crate::{
    broker::{DeliveryMessage, Envelope, Message},
    model::{Category, EventEpoch},
};

/// An event about to be stored (its body comes separately).
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: String,
    pub developer_id: Uuid,
    pub category: Category,
    pub created_at: DateTime<Utc>,
    /// The producer's `Idempotency-Key`, if it sent one.
    pub idempotency_key: Option<String>,
    /// The fingerprint of the request, kept with the key.
    pub request_hash: Option<Vec<u8>>,
}

/// The name of the unique index that makes an `Idempotency-Key` of ingest
/// name one event per developer; a violation means a concurrent twin won.
pub const EVENT_IDEMPOTENCY_INDEX: &str = "events_idempotency_key";

/// An event stored earlier under a producer's `Idempotency-Key`.
#[derive(Debug, Clone)]
pub struct IdempotentEvent {
    /// The fingerprint of the request that made it.
    pub request_hash: Vec<u8>,
    /// The event JSON as answered then.
    pub body: String,
}

/// Where each delivery of an accepted event went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    pub sequence: i64,
    /// Deliveries queued now (active endpoints).
    pub pending: usize,
    /// Deliveries kept as upcoming (disabled endpoints).
    pub held: usize,
}

/// A stored event body with its keys for paging.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredEvent {
    pub id: String,
    pub body: String,
    pub created_at: DateTime<Utc>,
}

/// A page request over events: newest first, with cursors.
#[derive(Debug, Clone, Default)]
pub struct EventPage<'a> {
    pub category: Option<Category>,
    pub limit: i64,
    /// Only events older than this one.
    pub starting_after: Option<&'a str>,
    /// Only events newer than this one.
    pub ending_before: Option<&'a str>,
}

/// How `send` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    Queued,
    /// The developer has no such event.
    NoSuchEvent,
    /// The event is the developer's but not meant for this endpoint.
    NotForEndpoint,
}

impl Store {
    /// Stores an event, one delivery per endpoint it is meant for (`pending`
    /// for active endpoints, `held` for disabled ones) and one outbox message
    /// per pending delivery, in one statement (so one round trip, atomic).
    /// The body is `body_head || event_sequence || body_tail`, the sequence
    /// being the one the developer's counter hands out. Returns the outcome and
    /// the stored body.
    pub async fn ingest_event(
        &self,
        event: &NewEvent,
        deliveries_queue: &str,
        body_head: &str,
        body_tail: &str,
    ) -> Result<(IngestOutcome, String), sqlx::Error> {
        let (sequence, body, pending, held): (i64, String, i64, i64) = sqlx::query_as(
            "WITH seq AS (
                 INSERT INTO developers (id, next_event_sequence) VALUES ($1, 2)
                 ON CONFLICT (id) DO UPDATE SET next_event_sequence = developers.next_event_sequence + 1
                 RETURNING next_event_sequence - 1 AS n
             ), ev AS (
                 INSERT INTO events (id, developer_id, sequence, category, body, created_at, idempotency_key, request_hash)
                 SELECT $2, $1, n, $3, $4 || n || $5, $6, $8, $9 FROM seq
                 RETURNING sequence, body
             ), d AS (
                 INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at)
                 SELECT $2, id, CASE status WHEN 'active' THEN 'pending' ELSE 'held' END, $6,
                        CASE status WHEN 'active' THEN $6 END
                 FROM endpoints
                 WHERE developer_id = $1 AND status <> 'deleted'
                   AND (cardinality(event_categories) = 0 OR $3 = ANY (event_categories))
                 RETURNING id, endpoint_id, state
             ), o AS (
                 INSERT INTO outbox (exchange, routing_key, payload)
                 SELECT '', $7, convert_to(json_build_object(
                            'v', 1, 'type', 'delivery', 'delivery_id', d.id, 'event_id', $2,
                            'endpoint_id', d.endpoint_id, 'developer_id', $1, 'attempt', 1, 'force', false, 'generation', 0,
                            'body', ev.body, 'event_created_at', $6)::text, 'UTF8')
                 FROM d, ev WHERE d.state = 'pending'
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
        .bind(body_head)
        .bind(body_tail)
        .bind(event.created_at)
        .bind(deliveries_queue)
        .bind(event.idempotency_key.as_deref())
        .bind(event.request_hash.as_deref())
        .fetch_one(&self.pool)
        .await?;
        let outcome = IngestOutcome {
            sequence,
            pending: usize::try_from(pending).unwrap_or_default(),
            held: usize::try_from(held).unwrap_or_default(),
        };
        Ok((outcome, body))
    }

    /// The event `developer_id` made earlier with this `Idempotency-Key`.
    pub async fn find_idempotent_event(
        &self,
        developer_id: Uuid,
        idempotency_key: &str,
    ) -> Result<Option<IdempotentEvent>, sqlx::Error> {
        let found: Option<(Option<Vec<u8>>, String)> =
            sqlx::query_as("SELECT request_hash, body FROM events WHERE developer_id = $1 AND idempotency_key = $2")
                .bind(developer_id)
                .bind(idempotency_key)
                .fetch_optional(&self.pool)
                .await?;
        Ok(found.map(|(request_hash, body)| IdempotentEvent { request_hash: request_hash.unwrap_or_default(), body }))
    }

    /// The endpoint's upcoming events, oldest first: deliveries not yet
    /// settled, and for `beginning_of_time` endpoints the developer's earlier
    /// events of its categories that it never had.
    pub async fn upcoming_events(
        &self,
        endpoint: &EndpointRecord,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, sqlx::Error> {
        let names: Vec<&str> = endpoint.event_categories.iter().map(|c| c.as_str()).collect();
        sqlx::query_as(
            "(SELECT e.id, e.body, e.created_at FROM deliveries d JOIN events e ON e.id = d.event_id
               WHERE d.endpoint_id = $1 AND d.state IN ('held', 'pending', 'retrying')
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
        .await
    }

    /// The developer's events, newest first, paged by event-id cursors.
    /// `None` when a cursor names no event of the developer.
    pub async fn list_events(
        &self,
        developer_id: Uuid,
        page: &EventPage<'_>,
    ) -> Result<Option<Vec<StoredEvent>>, sqlx::Error> {
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
    ) -> Result<Option<Option<(DateTime<Utc>, String)>>, sqlx::Error> {
        let Some(id) = id else { return Ok(Some(None)) };
        let at = sqlx::query_as("SELECT created_at, id FROM events WHERE id = $1 AND developer_id = $2")
            .bind(id)
            .bind(developer_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(at.map(Some))
    }

    /// Queues `event_id` for the endpoint now, whatever its status: writes the
    /// delivery (or re-arms the existing one) and its outbox message.
    pub async fn send_event(
        &self,
        endpoint: &EndpointRecord,
        event_id: &str,
        deliveries_queue: &str,
    ) -> Result<SendOutcome, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let event: Option<(String, String, DateTime<Utc>)> =
            sqlx::query_as("SELECT category, body, created_at FROM events WHERE id = $1 AND developer_id = $2")
                .bind(event_id)
                .bind(endpoint.developer_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((category, body, created_at)) = event else { return Ok(SendOutcome::NoSuchEvent) };
        let category: Option<Category> = category.parse().ok();
        let in_categories = category.is_some_and(|c| crate::model::categories_include(&endpoint.event_categories, c));
        let in_epoch = endpoint.event_epoch == EventEpoch::BeginningOfTime || created_at >= endpoint.created_at;
        let has_delivery: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM deliveries WHERE endpoint_id = $1 AND event_id = $2)")
                .bind(&endpoint.id)
                .bind(event_id)
                .fetch_one(&mut *tx)
                .await?;
        if !(has_delivery || (in_categories && in_epoch)) {
            return Ok(SendOutcome::NotForEndpoint);
        }
        let (delivery_id, generation): (i64, i32) = sqlx::query_as(
            "INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, next_attempt_at)
             VALUES ($1, $2, 'pending', $3, now())
             ON CONFLICT (endpoint_id, event_id) DO UPDATE
                SET state = 'pending', next_attempt_at = now(), updated_at = now(),
                    generation = deliveries.generation + 1
             RETURNING id, generation",
        )
        .bind(event_id)
        .bind(&endpoint.id)
        .bind(created_at)
        .fetch_one(&mut *tx)
        .await?;
        let payload = Envelope::new(Message::Delivery(DeliveryMessage {
            delivery_id,
            event_id: event_id.to_owned(),
            endpoint_id: endpoint.id.clone(),
            developer_id: endpoint.developer_id,
            attempt: 1,
            force: true,
            generation: Some(generation),
            body,
            event_created_at: created_at,
        }))
        .to_bytes();
        outbox::enqueue_many(&mut tx, "", deliveries_queue, &[payload]).await?;
        tx.commit().await?;
        Ok(SendOutcome::Queued)
    }
}
