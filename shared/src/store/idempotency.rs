//! Stored responses for `Idempotency-Key` (API.md §3): per developer, 24 hours.

use uuid::Uuid;

use super::Store;

/// A response kept for replay.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// fingerprint, status, body
type StoredRow = (Vec<u8>, Option<i16>, Option<Vec<u8>>);

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The key is new (or expired): this request runs and records its answer.
    Claimed,
    /// The same key came with another request.
    Mismatch,
    /// The first request with this key has not finished yet.
    InProgress,
    /// The answer to replay.
    Completed(StoredResponse),
}

impl Store {
    /// Claims `key` for a request with `fingerprint`, or reports what an earlier
    /// request with the same key left. A claim left unanswered for 5 minutes (its
    /// process died) is taken over.
    pub async fn claim_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        fingerprint: &[u8],
    ) -> Result<Claim, sqlx::Error> {
        let claimed = sqlx::query(
            "INSERT INTO idempotency_keys (developer_id, key, fingerprint, created_at)
             VALUES ($1, $2, $3, now())
             ON CONFLICT (developer_id, key) DO UPDATE
                SET fingerprint = EXCLUDED.fingerprint, status = NULL, body = NULL,
                    created_at = EXCLUDED.created_at
                WHERE idempotency_keys.created_at < now() - interval '24 hours'
                   OR (idempotency_keys.status IS NULL AND idempotency_keys.created_at < now() - interval '5 minutes')",
        )
        .bind(developer_id)
        .bind(key)
        .bind(fingerprint)
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
        Ok(match row {
            // Released between the two statements: the caller may try again.
            None => Claim::InProgress,
            Some((stored, _, _)) if stored != fingerprint => Claim::Mismatch,
            Some((_, Some(status), body)) => Claim::Completed(StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                body: body.unwrap_or_default(),
            }),
            Some((_, None, _)) => Claim::InProgress,
        })
    }

    /// Records the answer of a claimed key.
    pub async fn complete_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        response: &StoredResponse,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE idempotency_keys SET status = $3, body = $4 WHERE developer_id = $1 AND key = $2")
            .bind(developer_id)
            .bind(key)
            .bind(i16::try_from(response.status).unwrap_or(500))
            .bind(&response.body)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Forgets a claimed key whose request failed on our side, so the client
    /// can retry with the same key.
    pub async fn release_idempotency_key(&self, developer_id: Uuid, key: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM idempotency_keys WHERE developer_id = $1 AND key = $2 AND status IS NULL")
            .bind(developer_id)
            .bind(key)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Deletes stored responses older than 24 hours; returns how many.
    pub async fn purge_idempotency_keys(&self) -> Result<u64, sqlx::Error> {
        sqlx::query("DELETE FROM idempotency_keys WHERE created_at < now() - interval '24 hours'")
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
    }
}
