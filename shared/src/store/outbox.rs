//! The transactional outbox: broker messages written with the change they
//! announce, deleted once RabbitMQ confirms them.

use sqlx::{Postgres, Transaction};

use super::Store;

/// A message waiting to be published.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub exchange: String,
    pub routing_key: String,
    pub payload: Vec<u8>,
}

/// Adds a message to the outbox inside the caller's transaction.
pub(crate) async fn enqueue(
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

/// Adds several messages for one destination inside the caller's transaction,
/// in one statement.
pub(crate) async fn enqueue_many(
    tx: &mut Transaction<'_, Postgres>,
    exchange: &str,
    routing_key: &str,
    payloads: &[Vec<u8>],
) -> Result<(), sqlx::Error> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("INSERT INTO outbox (exchange, routing_key, payload) SELECT $1, $2, unnest($3::bytea[])")
        .bind(exchange)
        .bind(routing_key)
        .bind(payloads)
        .execute(&mut **tx)
        .await
        .map(drop)
}

impl Store {
    /// Locks up to `limit` of the oldest unpublished messages for this
    /// publisher; other publishers skip them.
    pub async fn lock_outbox(
        &self,
        limit: i64,
    ) -> Result<(Transaction<'static, Postgres>, Vec<OutboxRow>), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query_as(
            "SELECT id, exchange, routing_key, payload FROM outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        Ok((tx, rows))
    }

    /// Deletes published messages inside the locking transaction.
    pub async fn delete_outbox(tx: &mut Transaction<'static, Postgres>, ids: &[i64]) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM outbox WHERE id = ANY($1)").bind(ids).execute(&mut **tx).await.map(drop)
    }
}
