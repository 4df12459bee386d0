//! API keys on SQLite.

use uuid::Uuid;

use super::{SqliteStore, ensure_developer, json_list, micros};
use crate::api_keys::{ApiKeyRow, COLUMNS};
use crate::{NewApiKey, StoreResult};
use webhooks_model::ApiKey;

impl SqliteStore {
    pub(crate) async fn has_api_keys(&self) -> StoreResult<bool> {
        Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM api_keys)").fetch_one(&self.reader).await?)
    }

    pub(crate) async fn create_api_key(&self, key: NewApiKey<'_>) -> StoreResult<ApiKey> {
        let now = webhooks_model::time::now();
        let scopes = json_list(key.scopes.iter().map(|s| s.as_str()).collect());
        let mut tx = self.begin().await?;
        ensure_developer(&mut tx, key.developer_id, now).await?;
        let row: ApiKeyRow = sqlx::query_as(&format!(
            "INSERT INTO api_keys (id, developer_id, key_hash, kind, prefix, last_4, state, scopes, name, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'Active', $7, $8, $9, $9)
             RETURNING {COLUMNS}"
        ))
        .bind(webhooks_model::ids::new_v7().hyphenated())
        .bind(key.developer_id.hyphenated())
        .bind(&key.key_hash)
        .bind(<&str>::from(key.kind))
        .bind(key.prefix)
        .bind(key.last_4)
        .bind(scopes)
        .bind(key.name)
        .bind(micros(now))
        .fetch_one(&mut *tx)
        .await?;
        let key = ApiKey::try_from(row)?;
        tx.commit().await?;
        Ok(key)
    }

    pub(crate) async fn find_active_api_key(&self, key_hash: &[u8]) -> StoreResult<Option<ApiKey>> {
        let row: Option<ApiKeyRow> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM api_keys WHERE key_hash = $1 AND state = 'Active'"))
                .bind(key_hash)
                .fetch_optional(&self.reader)
                .await?;
        row.map(TryInto::try_into).transpose()
    }

    pub(crate) async fn list_api_keys(&self, developer_id: Uuid) -> StoreResult<Vec<ApiKey>> {
        let rows: Vec<ApiKeyRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE developer_id = $1 AND state = 'Active'
             ORDER BY created_at DESC, id DESC"
        ))
        .bind(developer_id.hyphenated())
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    pub(crate) async fn all_api_keys(&self, limit: i64) -> StoreResult<Vec<ApiKey>> {
        let rows: Vec<ApiKeyRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM api_keys WHERE state = 'Active' ORDER BY created_at DESC, id DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    pub(crate) async fn delete_api_key(&self, developer_id: Uuid, id: Uuid) -> StoreResult<Option<ApiKey>> {
        let row: Option<ApiKeyRow> = sqlx::query_as(&format!(
            "UPDATE api_keys SET state = 'Deleted', updated_at = $3
             WHERE id = $1 AND developer_id = $2 AND state = 'Active'
             RETURNING {COLUMNS}"
        ))
        .bind(id.hyphenated())
        .bind(developer_id.hyphenated())
        .bind(micros(webhooks_model::time::now()))
        .fetch_optional(&self.writer)
        .await?;
        row.map(TryInto::try_into).transpose()
    }
}
