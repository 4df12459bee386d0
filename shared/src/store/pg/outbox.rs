//! The transactional outbox: broker messages written with the change they
//! announce, deleted once RabbitMQ confirms them. A lifecycle message is
//! stored whole; a delivery is stored as the delivery it names, and its
//! message is written here, when it is read for publishing.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::PgStore;
use crate::{
    broker::{DeliveryMessage, Envelope, Lane, Message},
    store::StoreResult,
};

/// A message waiting to be published.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub exchange: String,
    pub routing_key: String,
    pub payload: Vec<u8>,
}

/// Adds a message to the outbox inside the caller's transaction.
pub(super) async fn enqueue(
    tx: &mut Transaction<'_, Postgres>,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO outbox (exchange, routing_key, payload) VALUES ($1, $2, $3)")
        .bind(exchange)
        .bind(routing_key)
        .bind(payload)
        .execute(&mut **tx)
        .await
        .map(drop)
}

#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    exchange: String,
    routing_key: String,
    payload: Option<Vec<u8>>,
    delivery_id: Option<i64>,
    generation: Option<i32>,
    force: Option<bool>,
    attempt: Option<i32>,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    developer_id: Option<Uuid>,
    body: Option<String>,
    event_created_at: Option<DateTime<Utc>>,
}

impl Row {
    /// The message to publish (its lane: that of the queue it goes to);
    /// `None` when the delivery it names is gone.
    fn payload(self, bulk_queue: &str) -> Option<Vec<u8>> {
        let lane = if self.routing_key == bulk_queue { Lane::Bulk } else { Lane::Default };
        if let Some(payload) = self.payload {
            return Some(payload);
        }
        let message = DeliveryMessage {
            delivery_id: self.delivery_id?,
            event_id: self.event_id?,
            endpoint_id: self.endpoint_id?,
            developer_id: self.developer_id?,
            attempt: self.attempt.and_then(|a| u32::try_from(a).ok()).filter(|a| *a > 0).unwrap_or(1),
            force: self.force.unwrap_or(false),
            generation: self.generation,
            parks: 0,
            failures: 0,
            pace_ticket: None,
            lane,
            body: self.body?,
            event_created_at: self.event_created_at?,
        };
        Some(Envelope::new(Message::Delivery(message)).to_bytes())
    }
}

impl PgStore {
    /// Locks up to `limit` of the oldest unpublished messages for this
    /// publisher (other publishers skip them) and returns them with their
    /// payloads. Rows whose delivery is gone are returned without one, to be
    /// deleted.
    pub async fn lock_outbox(
        &self,
        limit: i64,
    ) -> StoreResult<(Transaction<'static, Postgres>, Vec<OutboxRow>, Vec<i64>)> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT o.id, o.exchange, o.routing_key, o.payload, o.delivery_id, o.generation, o.force, o.attempt,
                    d.event_id, d.endpoint_id, e.developer_id, e.body, e.created_at AS event_created_at
               FROM outbox o
               LEFT JOIN deliveries d ON d.id = o.delivery_id
               LEFT JOIN events e ON e.id = d.event_id
              ORDER BY o.id LIMIT $1 FOR UPDATE OF o SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut ready = Vec::with_capacity(rows.len());
        let mut orphans = Vec::new();
        for row in rows {
            let (id, exchange, routing_key) = (row.id, row.exchange.clone(), row.routing_key.clone());
            match row.payload(&self.bulk_queue) {
                Some(payload) => ready.push(OutboxRow { id, exchange, routing_key, payload }),
                None => orphans.push(id),
            }
        }
        Ok((tx, ready, orphans))
    }

    /// Writes outbox rows for first attempts that were handed to the relay
    /// after their ingest and not confirmed by the broker, unless their
    /// delivery has moved on since (settled, or re-armed by `send`, a sweep
    /// or a recovery, which queued a message of its own) or has a row already.
    pub async fn outbox_first_attempts(&self, deliveries: &[(i64, Lane)]) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO outbox (exchange, routing_key, delivery_id, generation, force)
             SELECT '', u.queue, d.id, d.generation, false
               FROM unnest($1::int8[], $2::text[]) AS u(id, queue) JOIN deliveries d ON d.id = u.id
              WHERE d.state = 'pending' AND d.generation = 0 AND d.last_attempt = 0
                AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)",
        )
        .bind(deliveries.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .bind(deliveries.iter().map(|(_, lane)| self.work_queue(*lane)).collect::<Vec<_>>())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Deletes published messages inside the locking transaction.
    pub async fn delete_outbox(tx: &mut Transaction<'static, Postgres>, ids: &[i64]) -> StoreResult<()> {
        sqlx::query("DELETE FROM outbox WHERE id = ANY($1)").bind(ids).execute(&mut **tx).await?;
        Ok(())
    }
}
