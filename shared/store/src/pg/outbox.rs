//! The transactional outbox: what the broker must be told, written in the
//! transaction of the change it announces, and deleted once RabbitMQ
//! confirmed it. A row names what it announces (a delivery's next attempt,
//! an endpoint change); the queue makes the message when it publishes, so
//! no SQL writes a message.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::{DueDelivery, StoreResult};
use webhooks_model::{ChangeKind, EndpointChanged, Lane};

/// A row claimed for publishing.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub item: OutboxItem,
}

/// What an outbox row announces.
#[derive(Debug, Clone)]
pub enum OutboxItem {
    /// The next attempt of a delivery, as the delivery stands now; `true`
    /// when it goes to the swept queue (the sweeper queued it again).
    Delivery(DueDelivery, bool),
    /// An endpoint changed.
    Change(EndpointChanged),
    /// A message stored whole (rows written before the outbox named
    /// deliveries), with where it goes.
    Stored { exchange: String, routing_key: String, payload: Vec<u8> },
    /// The delivery or change it names is gone (retention): nothing to send.
    Gone,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    exchange: String,
    routing_key: String,
    payload: Option<Vec<u8>>,
    lane: Option<String>,
    delivery_id: Option<i64>,
    generation: Option<i32>,
    force: Option<bool>,
    attempt: Option<i32>,
    swept: bool,
    event_id: Option<String>,
    endpoint_id: Option<String>,
    developer_id: Option<Uuid>,
    body: Option<String>,
    event_created_at: Option<DateTime<Utc>>,
    change_id: Option<i64>,
    change_endpoint_id: Option<String>,
    change_developer_id: Option<Uuid>,
    change: Option<String>,
    change_api_key_id: Option<Uuid>,
    change_at: Option<DateTime<Utc>>,
}

impl Row {
    fn item(self) -> OutboxItem {
        if let Some(change_id) = self.change_id {
            let change = (|| {
                Some(EndpointChanged {
                    change_id,
                    endpoint_id: self.change_endpoint_id?,
                    developer_id: self.change_developer_id?,
                    change: self.change?.parse::<ChangeKind>().ok()?,
                    api_key_id: self.change_api_key_id,
                    occurred_at: self.change_at?,
                })
            })();
            return change.map_or(OutboxItem::Gone, OutboxItem::Change);
        }
        if let Some(payload) = self.payload {
            return OutboxItem::Stored { exchange: self.exchange, routing_key: self.routing_key, payload };
        }
        // Rows written before `lane` existed name the bulk lane by its queue.
        let lane = match self.lane.as_deref() {
            Some("bulk") => Lane::Bulk,
            Some(_) => Lane::Default,
            None if self.routing_key.ends_with(".deliveries.bulk") => Lane::Bulk,
            None => Lane::Default,
        };
        let delivery = (|| {
            Some(DueDelivery {
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
            })
        })();
        let swept = self.swept;
        delivery.map_or(OutboxItem::Gone, |due| OutboxItem::Delivery(due, swept))
    }
}

/// A delivery of `d` still owed whose due time is more than the allowance
/// (`$2`, seconds) before its message entered (`$3`, or now if later).
const LATE: &str = "d.state IN ('pending', 'retrying') AND NOT d.set_aside
                    AND d.next_attempt_at < greatest(now(), $3) - make_interval(secs => $2)";

/// The due time of a late delivery once its message entered.
const MOVED_UP: &str = "greatest(d.next_attempt_at, now(), $3)";

impl PgStore {
    /// Claims up to `limit` of the oldest unclaimed rows for `lease` (rows
    /// another relay claimed are skipped until its claim lapses) and returns
    /// what each announces. Delete them once published, or release them.
    pub async fn claim_outbox(&self, limit: i64, lease: std::time::Duration) -> StoreResult<Vec<OutboxRow>> {
        let rows: Vec<Row> = sqlx::query_as(
            "WITH claimed AS (
                 UPDATE outbox SET claimed_until = now() + make_interval(secs => $2)
                  WHERE id IN (SELECT id FROM outbox WHERE claimed_until IS NULL OR claimed_until < now()
                                ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING *)
             SELECT o.id, o.exchange, o.routing_key, o.payload, o.lane, o.delivery_id, o.generation, o.force,
                    o.attempt, o.swept, d.event_id, d.endpoint_id, e.developer_id, e.body, e.created_at AS event_created_at,
                    o.change_id, c.endpoint_id AS change_endpoint_id, c.developer_id AS change_developer_id,
                    c.change, c.api_key_id AS change_api_key_id, c.created_at AS change_at
               FROM claimed o
               LEFT JOIN deliveries d ON d.id = o.delivery_id
               LEFT JOIN events e ON e.id = d.event_id
               LEFT JOIN endpoint_changes c ON c.id = o.change_id
              ORDER BY o.id",
        )
        .bind(limit)
        .bind(lease.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|row| OutboxRow { id: row.id, item: row.item() }).collect())
    }

    /// Deletes rows that were published (or announce nothing any more).
    ///
    /// Their messages entered their lanes stamped `entered`. The sweeper
    /// allows any message `allowance` past its delivery's due time to enter
    /// (see `sweep.rs`), so only a delivery due longer before the stamp (or
    /// before now) has its due time moved up to the later of the two; a row
    /// published soon after it was written (nearly all) costs no write to
    /// `deliveries`.
    ///
    /// The statement skips a delivery another transaction holds locked
    /// rather than wait for it: a dispatcher often settles a message before
    /// its relay round ends, and two statements whose plans visit the same
    /// rows in different orders deadlock. The skipped ones are moved up
    /// afterwards, one statement each, which waits for the holder and then
    /// looks again: one row lock at a time cannot close a cycle.
    pub async fn delete_outbox(
        &self,
        ids: &[i64],
        entered: DateTime<Utc>,
        allowance: std::time::Duration,
    ) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let skipped: Vec<(i64, i32)> = sqlx::query_as(&format!(
            "WITH gone AS (DELETE FROM outbox WHERE id = ANY($1) RETURNING delivery_id, generation),
                  late AS MATERIALIZED (
                      SELECT d.id, d.generation FROM deliveries d
                        JOIN gone ON d.id = gone.delivery_id AND d.generation = gone.generation
                       WHERE {LATE}),
                  -- Checked again on the row as it stands once locked.
                  locked AS MATERIALIZED (
                      SELECT d.id FROM deliveries d JOIN late ON late.id = d.id
                       WHERE {LATE}
                       ORDER BY d.id
                         FOR NO KEY UPDATE OF d SKIP LOCKED),
                  moved AS (
                      UPDATE deliveries d SET next_attempt_at = {MOVED_UP}
                        FROM locked WHERE d.id = locked.id
                      RETURNING d.id)
             SELECT id, generation FROM late WHERE id NOT IN (SELECT id FROM moved)"
        ))
        .bind(ids)
        .bind(allowance.as_secs_f64())
        .bind(entered)
        .fetch_all(&self.pool)
        .await?;
        if skipped.is_empty() {
            return Ok(());
        }
        let move_up = format!(
            "UPDATE deliveries d SET next_attempt_at = {MOVED_UP}
              WHERE d.id = $1 AND d.generation = $4 AND {LATE}"
        );
        for (delivery_id, generation) in skipped {
            sqlx::query(&move_up)
                .bind(delivery_id)
                .bind(allowance.as_secs_f64())
                .bind(entered)
                .bind(generation)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Gives claimed rows back at once, for the next round to try again.
    pub async fn release_outbox(&self, ids: &[i64]) -> StoreResult<()> {
        if !ids.is_empty() {
            sqlx::query("UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1)")
                .bind(ids)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Writes outbox rows for first attempts that were handed to the relay
    /// after their ingest and not confirmed by the broker, unless their
    /// delivery has moved on since (settled, or re-armed by `send`, a sweep
    /// or a recovery, which queued a message of its own) or has a row already.
    pub async fn outbox_first_attempts(&self, deliveries: &[(i64, Lane)]) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force)
             SELECT '', '', u.lane, d.id, d.generation, false
               FROM unnest($1::int8[], $2::text[]) AS u(id, lane) JOIN deliveries d ON d.id = u.id
              WHERE d.state = 'pending' AND d.generation = 0 AND d.last_attempt = 0
                AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)",
        )
        .bind(deliveries.iter().map(|(id, _)| *id).collect::<Vec<_>>())
        .bind(deliveries.iter().map(|(_, lane)| lane.as_str()).collect::<Vec<_>>())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
