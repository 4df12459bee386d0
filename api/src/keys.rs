//! Issuing API keys: the plaintext exists only in the answer to its creation.

use rand::{Rng, distr::Alphanumeric};
use uuid::Uuid;
use webhooks_config::Environment;
use webhooks_model::{ApiKey, ApiKeyType, Scope};
use webhooks_store::{NewApiKey, Store, StoreError, hash_key};

/// Characters of the secret part: 48 letters and digits carry about 285 bits,
/// more than the 32 random bytes the contract asks for.
const SECRET_LEN: usize = 48;

/// A key made just now: the plaintext, shown once, and its record. Its
/// `Debug` leaves the secret out, so logging one gives no key away.
pub struct IssuedKey {
    pub key: String,
    pub api_key: ApiKey,
}

impl std::fmt::Debug for IssuedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedKey").field("key", &redacted(&self.key)).field("api_key", &self.api_key).finish()
    }
}

/// A plaintext key as `Debug` output may show it: its environment prefix
/// (`sk-test-***`), never the secret.
pub fn redacted(key: &str) -> String {
    match key.rsplit_once('-') {
        Some((prefix, _)) => format!("{prefix}-***"),
        None => "***".to_owned(),
    }
}

/// Makes and stores a key; only its hash is kept.
pub async fn issue(
    store: &Store,
    environment: Environment,
    developer_id: Uuid,
    kind: ApiKeyType,
    scopes: &[Scope],
    name: Option<&str>,
) -> Result<IssuedKey, StoreError> {
    let secret: String = rand::rng().sample_iter(&Alphanumeric).take(SECRET_LEN).map(char::from).collect();
    let prefix = environment.key_prefix();
    let key = format!("{prefix}-{secret}");
    let last_4 = &key[key.len() - 4..];
    let api_key = store
        .create_api_key(NewApiKey { developer_id, kind, prefix, key_hash: hash_key(&key), last_4, scopes, name })
        .await?;
    Ok(IssuedKey { key, api_key })
}

/// Checks a requested scope list: known names, and `platform:api_unrestricted`
/// only alone. Absent means unrestricted.
pub fn parse_scopes(requested: Option<&[String]>) -> Result<Vec<Scope>, String> {
    let Some(requested) = requested else { return Ok(vec![Scope::Unrestricted]) };
    if requested.is_empty() {
        return Err("scopes must name at least one scope".into());
    }
    let mut scopes = Vec::with_capacity(requested.len());
    for name in requested {
        let scope: Scope = name.parse().map_err(|_| format!("unknown scope {name:?}"))?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    if scopes.contains(&Scope::Unrestricted) && scopes.len() > 1 {
        return Err("platform:api_unrestricted must be the only scope of a key".into());
    }
    Ok(scopes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn issued_keys_keep_their_secret_out_of_debug() {
        let secret = "Ab3".repeat(16);
        let key = format!("sk-test-{secret}");
        let api_key = ApiKey {
            id: Uuid::nil(),
            kind: ApiKeyType::Public,
            owner_type: webhooks_model::OwnerType::Developer,
            owner_id: Uuid::nil(),
            prefix: "sk-test".into(),
            last_4: key[key.len() - 4..].into(),
            state: webhooks_model::ApiKeyState::Active,
            created_at: webhooks_model::time::now(),
            updated_at: webhooks_model::time::now(),
            scopes: vec![Scope::Unrestricted],
            name: None,
        };
        let debug = format!("{:?}", IssuedKey { key: key.clone(), api_key });
        assert!(!debug.contains(&secret), "{debug}");
        assert!(debug.contains("sk-test-***"), "{debug}");
        assert_eq!(redacted("no-dashes-here"), "no-dashes-***");
        assert_eq!(redacted("nodash"), "***");
    }

    #[test]
    fn scope_lists() {
        assert_eq!(parse_scopes(None), Ok(vec![Scope::Unrestricted]));
        assert_eq!(parse_scopes(Some(&strings(&["webhooks:read", "webhooks:read"]))), Ok(vec![Scope::WebhooksRead]));
        assert!(parse_scopes(Some(&[])).is_err());
        assert!(parse_scopes(Some(&strings(&["webhooks:delete"]))).is_err());
        assert!(parse_scopes(Some(&strings(&["platform:api_unrestricted", "webhooks:read"]))).is_err());
    }
}
