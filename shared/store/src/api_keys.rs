//! API keys: stored by SHA-256 hash only, looked up by that hash.

use aws_lc_rs::digest;
use uuid::Uuid;

use webhooks_model::{ApiKeyType, Scope};

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
