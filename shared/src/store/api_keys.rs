//! API keys: stored by SHA-256 hash only, looked up by that hash.

use aws_lc_rs::digest;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Store;
use crate::model::{ApiKey, ApiKeyState, ApiKeyType, OwnerType, Scope};

/// The SHA-256 of a key: what is stored and looked up. A key carries at least
/// 32 random bytes, so a fast hash is enough; no salt is needed for lookups.
pub fn hash_key(key: &str) -> Vec<u8> {
    digest::digest(&digest::SHA256, key.as_bytes()).as_ref().to_vec()
}

/// A key about to be stored.
#[derive(Debug)]
pub struct NewApiKey<'a> {
    pub developer_id: Uuid,
    pub kind: ApiKeyType,
    pub prefix: &'a str,
    pub key_hash: Vec<u8>,
    pub last_4: &'a str,
    pub scopes: &'a [Scope],
    pub name: Option<&'a str>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    developer_id: Uuid,
    kind: ApiKeyType,
    prefix: String,
    last_4: String,
    state: ApiKeyState,
    scopes: Vec<String>,
    name: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<Row> for ApiKey {
    fn from(row: Row) -> ApiKey {
        ApiKey {
            id: row.id,
            kind: row.kind,
            owner_type: OwnerType::Developer,
            owner_id: row.developer_id,
            prefix: row.prefix,
            last_4: row.last_4,
            state: row.state,
            created_at: row.created_at,
            updated_at: row.updated_at,
            scopes: row.scopes.iter().filter_map(|s| s.parse().ok()).collect(),
            name: row.name,
        }
    }
}

const COLUMNS: &str = "id, developer_id, kind, prefix, last_4, state, scopes, name, created_at, updated_at";

impl Store {
    /// Stores a new key (and its developer, if new).
    pub async fn create_api_key(&self, key: NewApiKey<'_>) -> Result<ApiKey, sqlx::Error> {
        let now = crate::time::now();
        let scopes: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO developers (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(key.developer_id)
            .execute(&mut *tx)
            .await?;
        let row: Row = sqlx::query_as(&format!(
            "INSERT INTO api_keys (id, developer_id, key_hash, kind, prefix, last_4, state, scopes, name, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'Active', $7, $8, $9, $9)
             RETURNING {COLUMNS}"
        ))
        .bind(Uuid::now_v7())
        .bind(key.developer_id)
        .bind(&key.key_hash)
        .bind(key.kind)
        .bind(key.prefix)
        .bind(key.last_4)
        .bind(&scopes)
        .bind(key.name)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.into())
    }

    /// The active key with this hash, if any.
    pub async fn find_active_api_key(&self, key_hash: &[u8]) -> Result<Option<ApiKey>, sqlx::Error> {
        let row: Option<Row> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM api_keys WHERE key_hash = $1 AND state = 'Active'"))
                .bind(key_hash)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(Into::into))
    }

    /// The developer's active keys, newest first.
    pub async fn list_api_keys(&self, developer_id: Uuid) -> Result<Vec<ApiKey>, sqlx::Error> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE developer_id = $1 AND state = 'Active'
             ORDER BY created_at DESC, id DESC"
        ))
        .bind(developer_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// Marks the developer's active key deleted; `None` when there is no such key.
    pub async fn delete_api_key(&self, developer_id: Uuid, id: Uuid) -> Result<Option<ApiKey>, sqlx::Error> {
        let row: Option<Row> = sqlx::query_as(&format!(
            "UPDATE api_keys SET state = 'Deleted', updated_at = $3
             WHERE id = $1 AND developer_id = $2 AND state = 'Active'
             RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(developer_id)
        .bind(crate::time::now())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Into::into))
    }
}
