//! Endpoints' sealed private keys on PostgreSQL (see `crate::sealed_keys`).

use std::collections::HashSet;

use super::PgStore;
use crate::sealed_keys::{CountedGroup, KeyRow, head_parameters, sample_ids, sql_head, with_samples};
use crate::{KeyReseal, KeySlot, SealedKeyGroup, SealedKeys, StoreResult};

impl PgStore {
    pub(crate) async fn sealed_keys(&self, after: &str, limit: i64) -> StoreResult<Vec<SealedKeys>> {
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT id, private_key, previous_private_key FROM endpoints
              WHERE status <> 'deleted' AND id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(endpoint_id, current, previous)| SealedKeys { endpoint_id, current, previous })
            .collect())
    }

    /// Reseals in one transaction, tried again after a deadlock with another
    /// statement that locks many endpoints.
    pub(crate) async fn reseal_keys(&self, reseals: &[KeyReseal]) -> StoreResult<Vec<bool>> {
        super::retrying_deadlocks(|| self.try_reseal_keys(reseals)).await
    }

    /// One transaction: each slot's blobs in one statement, each written
    /// only where the row still holds the blob it was made from.
    async fn try_reseal_keys(&self, reseals: &[KeyReseal]) -> StoreResult<Vec<bool>> {
        let mut tx = self.pool.begin().await?;
        let mut written = HashSet::new();
        for (slot, column) in [(KeySlot::Current, "private_key"), (KeySlot::Previous, "previous_private_key")] {
            let of_slot: Vec<&KeyReseal> = reseals.iter().filter(|r| r.slot == slot).collect();
            if of_slot.is_empty() {
                continue;
            }
            let ids: Vec<&str> = of_slot.iter().map(|r| r.endpoint_id.as_str()).collect();
            let sealed: Vec<&[u8]> = of_slot.iter().map(|r| r.sealed.as_slice()).collect();
            let resealed: Vec<&[u8]> = of_slot.iter().map(|r| r.resealed.as_slice()).collect();
            let ids: Vec<String> = sqlx::query_scalar(&format!(
                "UPDATE endpoints e SET {column} = r.resealed
                   FROM unnest($1::text[], $2::bytea[], $3::bytea[]) AS r(id, sealed, resealed)
                  WHERE e.id = r.id AND e.status <> 'deleted' AND e.{column} = r.sealed
                 RETURNING e.id"
            ))
            .bind(ids)
            .bind(sealed)
            .bind(resealed)
            .fetch_all(&mut *tx)
            .await?;
            written.extend(ids.into_iter().map(|id| (id, slot)));
        }
        tx.commit().await?;
        Ok(reseals.iter().map(|r| written.contains(&(r.endpoint_id.clone(), r.slot))).collect())
    }

    pub(crate) async fn sealed_key_groups(&self) -> StoreResult<Vec<SealedKeyGroup>> {
        let (named, head_len) = head_parameters();
        // One pass over the table. `age` sorts as the creation time, then
        // the id (20 digits, then the id), so its minimum and maximum name
        // the oldest and newest endpoint of each group.
        let groups: Vec<CountedGroup> = sqlx::query_as(&format!(
            "WITH held AS (
                 SELECT id, created_at, private_key AS sealed FROM endpoints WHERE status <> 'deleted'
                 UNION ALL
                 SELECT id, created_at, previous_private_key FROM endpoints
                  WHERE status <> 'deleted' AND previous_private_key IS NOT NULL
             ), headed AS (
                 SELECT DISTINCT {head} AS head,
                        to_char(created_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') || id AS age
                   FROM held
             )
             SELECT head, count(*), substr(min(age), 21), substr(max(age), 21) FROM headed GROUP BY head",
            head = sql_head("sealed"),
        ))
        .bind(named)
        .bind(head_len)
        .fetch_all(&self.pool)
        .await?;
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT id, private_key, previous_private_key FROM endpoints WHERE id = ANY($1) AND status <> 'deleted'",
        )
        .bind(sample_ids(&groups))
        .fetch_all(&self.pool)
        .await?;
        Ok(with_samples(groups, rows))
    }
}
