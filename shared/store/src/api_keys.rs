//! API keys: stored by SHA-256 hash only, looked up by that hash.

use aws_lc_rs::digest;
use uuid::Uuid;

use crate::{
    StoreError,
    columns::{At, Id, Names},
};
use webhooks_model::{ApiKey, ApiKeyState, ApiKeyType, OwnerType, Scope};

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

/// The columns of an API key row that both backends select.
pub(crate) const COLUMNS: &str = "id, developer_id, kind, prefix, last_4, state, scopes, name, created_at, updated_at";

/// An API key row as [`COLUMNS`] selects it, in either dialect.
#[derive(sqlx::FromRow)]
pub(crate) struct ApiKeyRow {
    id: Id,
    developer_id: Id,
    kind: String,
    prefix: String,
    last_4: String,
    state: String,
    scopes: Names,
    name: Option<String>,
    created_at: At,
    updated_at: At,
}

impl TryFrom<ApiKeyRow> for ApiKey {
    type Error = StoreError;
    fn try_from(row: ApiKeyRow) -> Result<ApiKey, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("api key {}: bad {what}", row.id.0));
        Ok(ApiKey {
            id: row.id.0,
            kind: row.kind.parse::<ApiKeyType>().map_err(|_| corrupt("kind"))?,
            owner_type: OwnerType::Developer,
            owner_id: row.developer_id.0,
            prefix: row.prefix,
            last_4: row.last_4,
            state: row.state.parse::<ApiKeyState>().map_err(|_| corrupt("state"))?,
            created_at: row.created_at.0,
            updated_at: row.updated_at.0,
            scopes: row.scopes.0.iter().filter_map(|s| s.parse().ok()).collect(),
            name: row.name,
        })
    }
}
