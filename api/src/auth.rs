//! `Api-Key` and portal-session authentication, and scope checks.
//!
//! A middleware resolves the key (or the portal session's bearer token) to a
//! [`Caller`] once per request; handlers take the `Caller` and call
//! [`Caller::require`] with their scope.

use axum::{
    extract::{FromRequestParts, Request, State},
    http::{StatusCode, header, request::Parts},
    middleware::Next,
    response::Response,
};
use uuid::Uuid;
use webhooks_model::{ApiKey, ApiKeyState, ApiKeyType, OwnerType, Scope, scopes_grant};
use webhooks_store::{PortalSession, hash_key};

use crate::{
    error::{ApiError, Location},
    portal,
    state::AppState,
};

/// The header every public request carries.
pub const API_KEY_HEADER: &str = "Api-Key";

/// The authenticated key behind a request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The calling key, or for a portal session a key-shaped record of the
    /// session (its id, `type: Public`, its scopes, named `Portal session`).
    pub key: ApiKey,
    /// Whether the caller is a portal session rather than an API key.
    pub portal_session: bool,
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

/// Resolves `Api-Key` (or, without one, a portal session's `Authorization:
/// Bearer`) to a [`Caller`], or answers 401, or 429 when the developer is
/// over its request limit.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let bearer = match request.headers().get(API_KEY_HEADER) {
        Some(_) => None,
        None => request.headers().get(header::AUTHORIZATION).map(|value| value.as_bytes().to_vec()),
    };
    if let Some(authorization) = bearer {
        let Some(session) = portal_session(&state, &authorization).await? else {
            return Ok(ApiError::invalid(
                Location::Header,
                "Authorization",
                "Invalid, expired or revoked portal session",
            )
            .into_status(StatusCode::UNAUTHORIZED));
        };
        if let Some(limit) = &state.rate_limit {
            limit.check(session.developer_id).map_err(ApiError::RateLimited)?;
        }
        request.extensions_mut().insert(Caller { key: session_key(&state, &session), portal_session: true });
        return Ok(next.run(request).await);
    }
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
    request.extensions_mut().insert(Caller { key, portal_session: false });
    Ok(next.run(request).await)
}

/// The live session a `Bearer` value names, if any.
async fn portal_session(state: &AppState, authorization: &[u8]) -> Result<Option<PortalSession>, ApiError> {
    let token = std::str::from_utf8(authorization).ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let Some(token) = token.filter(|token| portal::well_formed_token(token)) else { return Ok(None) };
    let session = state.store.find_portal_session(&hash_key(token)).await?;
    let now = state.config.common.clock.now();
    Ok(session.filter(|session| session.is_live(now)))
}

/// A session as the key record handlers and `whoami` see: it acts as a
/// `Public` key of its developer with the session's scopes.
fn session_key(state: &AppState, session: &PortalSession) -> ApiKey {
    ApiKey {
        id: session.id,
        kind: ApiKeyType::Public,
        owner_type: OwnerType::Developer,
        owner_id: session.developer_id,
        prefix: state.config.common.platform_environment.key_prefix().to_owned(),
        last_4: session.id.simple().to_string()[28..].to_owned(),
        state: ApiKeyState::Active,
        created_at: session.created_at,
        updated_at: session.created_at,
        scopes: session.scopes.clone(),
        name: Some("Portal session".to_owned()),
    }
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
