//! Stored responses for `Idempotency-Key` on PostgreSQL.

use uuid::Uuid;

use super::PgStore;
use crate::{Claim, IDEMPOTENCY_CLAIM_TIMEOUT, IDEMPOTENCY_KEY_LIFETIME, StoreResult, StoredResponse};

/// fingerprint, status, body
type StoredRow = (Vec<u8>, Option<i16>, Option<Vec<u8>>);

fn seconds(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64()
}

impl PgStore {
    pub(crate) async fn claim_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        fingerprint: &[u8],
    ) -> StoreResult<Claim> {
        let claimed = sqlx::query(
            "INSERT INTO idempotency_keys (developer_id, key, fingerprint, created_at)
             VALUES ($1, $2, $3, now())
             ON CONFLICT (developer_id, key) DO UPDATE
                SET fingerprint = EXCLUDED.fingerprint, status = NULL, body = NULL,
                    created_at = EXCLUDED.created_at
                WHERE idempotency_keys.created_at < now() - make_interval(secs => $4)
                   OR (idempotency_keys.status IS NULL AND idempotency_keys.created_at < now() - make_interval(secs => $5))",
        )
        .bind(developer_id)
        .bind(key)
        .bind(fingerprint)
        .bind(seconds(IDEMPOTENCY_KEY_LIFETIME))
        .bind(seconds(IDEMPOTENCY_CLAIM_TIMEOUT))
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1;
        if claimed {
            return Ok(Claim::Claimed);
        }
        let row: Option<StoredRow> = sqlx::query_as(
            "SELECT fingerprint, status, body FROM idempotency_keys WHERE developer_id = $1 AND key = $2",
        )
        .bind(developer_id)
        .bind(key)
        .fetch_optional(&self.pool)
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
            .bind(developer_id)
            .bind(key)
            .bind(i16::try_from(response.status).unwrap_or(500))
            .bind(&response.body)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn release_idempotency_key(&self, developer_id: Uuid, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency_keys WHERE developer_id = $1 AND key = $2 AND status IS NULL")
            .bind(developer_id)
            .bind(key)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn purge_idempotency_keys(&self) -> StoreResult<u64> {
        let purged = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1)")
            .bind(seconds(IDEMPOTENCY_KEY_LIFETIME))
            .execute(&self.pool)
            .await?;
        // Producers' keys (`POST /internal/events`) live as long, in small
        // batches: a day of them may be millions.
        let mut producers = 0;
        loop {
            let batch = sqlx::query(
                "DELETE FROM event_idempotency WHERE (developer_id, key) IN (
                     SELECT developer_id, key FROM event_idempotency
                      WHERE created_at < now() - make_interval(secs => $1) LIMIT 10000)",
            )
            .bind(seconds(IDEMPOTENCY_KEY_LIFETIME))
            .execute(&self.pool)
            .await?
            .rows_affected();
            producers += batch;
            if batch < 10_000 {
                break;
            }
        }
        Ok(purged.rows_affected() + producers)
    }
}
