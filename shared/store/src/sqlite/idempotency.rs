//! Stored responses for `Idempotency-Key` on SQLite.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{SqliteStore, micros};
use crate::{Claim, IDEMPOTENCY_CLAIM_TIMEOUT, IDEMPOTENCY_KEY_LIFETIME, StoreResult, StoredResponse};

/// fingerprint, status, body
type StoredRow = (Vec<u8>, Option<i64>, Option<Vec<u8>>);

/// The stored time `age` before `now`.
fn before(now: DateTime<Utc>, age: std::time::Duration) -> i64 {
    micros(now) - i64::try_from(age.as_micros()).unwrap_or(i64::MAX)
}

impl SqliteStore {
    pub(crate) async fn claim_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        fingerprint: &[u8],
    ) -> StoreResult<Claim> {
        let now = webhooks_model::time::now();
        let claimed = sqlx::query(
            "INSERT INTO idempotency_keys (developer_id, key, fingerprint, created_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (developer_id, key) DO UPDATE
                SET fingerprint = excluded.fingerprint, status = NULL, body = NULL,
                    created_at = excluded.created_at
                WHERE idempotency_keys.created_at < $5
                   OR (idempotency_keys.status IS NULL AND idempotency_keys.created_at < $6)",
        )
        .bind(developer_id.hyphenated())
        .bind(key)
        .bind(fingerprint)
        .bind(micros(now))
        .bind(before(now, IDEMPOTENCY_KEY_LIFETIME))
        .bind(before(now, IDEMPOTENCY_CLAIM_TIMEOUT))
        .execute(&self.writer)
        .await?
        .rows_affected()
            == 1;
        if claimed {
            return Ok(Claim::Claimed);
        }
        let row: Option<StoredRow> = sqlx::query_as(
            "SELECT fingerprint, status, body FROM idempotency_keys WHERE developer_id = $1 AND key = $2",
        )
        .bind(developer_id.hyphenated())
        .bind(key)
        .fetch_optional(&self.reader)
        .await?;
        let row = row.map(|(stored, status, body)| (stored, status.map(|s| u16::try_from(s).unwrap_or(500)), body));
        Ok(Claim::of_existing(fingerprint, row))
    }

    pub(crate) async fn complete_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        response: &StoredResponse,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE idempotency_keys SET status = $3, body = $4 WHERE developer_id = $1 AND key = $2")
            .bind(developer_id.hyphenated())
            .bind(key)
            .bind(i64::from(response.status))
            .bind(&response.body)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub(crate) async fn release_idempotency_key(&self, developer_id: Uuid, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency_keys WHERE developer_id = $1 AND key = $2 AND status IS NULL")
            .bind(developer_id.hyphenated())
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub(crate) async fn purge_idempotency_keys(&self) -> StoreResult<u64> {
        let purged = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
            .bind(before(webhooks_model::time::now(), IDEMPOTENCY_KEY_LIFETIME))
            .execute(&self.writer)
            .await?;
        Ok(purged.rows_affected())
    }
}
