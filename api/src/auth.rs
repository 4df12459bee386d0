//! `Api-Key` authentication and scope checks.
//!
//! A middleware resolves the key to a [`Caller`] once per request; handlers
//! take the `Caller` and call [`Caller::require`] with their scope.

use axum::{
    extract::{FromRequestParts, Request, State},
    http::request::Parts,
    middleware::Next,
    response::Response,
};
use uuid::Uuid;
use webhooks_model::{ApiKey, Scope, scopes_grant};
use webhooks_store::hash_key;

use crate::{error::ApiError, state::AppState};

/// The header every public request carries.
pub const API_KEY_HEADER: &str = "Api-Key";

/// The authenticated key behind a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub key: ApiKey,
}

impl Caller {
    /// The developer every object of this request belongs to.
    pub fn developer_id(&self) -> Uuid {
        self.key.owner_id
    }

    /// Refuses with 403 unless the key holds `scope` (or is unrestricted).
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if scopes_grant(&self.key.scopes, scope) { Ok(()) } else { Err(ApiError::Forbidden(scope.as_str())) }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or(ApiError::MissingApiKey)
    }
}

/// Whether `key` has the shape of a key of this environment: the prefix, a
/// dash, and letters and digits only.
fn well_formed(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix).and_then(|rest| rest.strip_prefix('-')).is_some_and(|secret| {
        secret.len() >= 32 && secret.len() <= 128 && secret.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// Resolves `Api-Key` to a [`Caller`], or answers one of the two 401s, or
/// 429 when the key's developer is over its request limit.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let header = request.headers().get(API_KEY_HEADER).ok_or(ApiError::MissingApiKey)?;
    let key = header.to_str().map_err(|_| ApiError::InvalidApiKey)?.trim();
    if key.is_empty() {
        return Err(ApiError::MissingApiKey);
    }
    if !well_formed(key, state.config.common.platform_environment.key_prefix()) {
        return Err(ApiError::InvalidApiKey);
    }
    let key = state.store.find_active_api_key(&hash_key(key)).await?.ok_or(ApiError::InvalidApiKey)?;
    if let Some(limit) = &state.rate_limit {
        limit.check(key.owner_id).map_err(ApiError::RateLimited)?;
    }
    request.extensions_mut().insert(Caller { key });
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shape_follows_the_environment() {
        let secret = "a".repeat(43);
        assert!(well_formed(&format!("sk-test-{secret}"), "sk-test"));
        assert!(!well_formed(&format!("sk-live-{secret}"), "sk-test"));
        assert!(!well_formed("sk-test-short", "sk-test"));
        assert!(!well_formed(&format!("sk-test-{}!", "a".repeat(40)), "sk-test"));
        assert!(!well_formed(&format!("sk-test{secret}"), "sk-test"));
    }
}
