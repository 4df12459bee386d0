//! Portal sessions (`/internal/portal_sessions`): the platform's console opens
//! the dashboard for one developer without an API key. A session is a bearer
//! token with scopes and an expiry; only its SHA-256 is stored, and the
//! plaintext exists only in the 201 that made it (and in the `url` fragment,
//! which browsers never send to a server).

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, post},
};
use chrono::{DateTime, Utc};
use rand::{Rng, distr::Alphanumeric};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;
use webhooks_model::Scope;
use webhooks_store::{NewPortalSession, hash_key};

use crate::{
    error::{ApiError, ApiResult, Location},
    extract::{Json, Path},
    keys,
    state::AppState,
};

/// Every session token starts so, which tells it from an API key at a glance.
pub const TOKEN_PREFIX: &str = "ps_";
/// Letters and digits after the prefix: about 285 bits.
const TOKEN_SECRET_LEN: usize = 48;
/// Shortest, longest and default lifetime, in seconds.
pub const MIN_TTL_SECONDS: i64 = 60;
pub const MAX_TTL_SECONDS: i64 = 86_400;
pub const DEFAULT_TTL_SECONDS: i64 = 900;
/// A session's scopes when the request names none.
pub const DEFAULT_SCOPES: [Scope; 2] = [Scope::WebhooksRead, Scope::WebhooksWrite];

/// Whether `token` has the shape of a session token (checked before any
/// lookup, so junk costs no query).
pub fn well_formed_token(token: &str) -> bool {
    token
        .strip_prefix(TOKEN_PREFIX)
        .is_some_and(|secret| secret.len() == TOKEN_SECRET_LEN && secret.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The internal routes of portal sessions.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/internal/portal_sessions", post(create))
        .route("/internal/portal_sessions/{id}", delete(revoke))
}

/// Body of `POST /internal/portal_sessions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"developer_id": "0b7e2a54-8a0f-4f63-9d61-4f3c2f1e9a10", "scopes": ["webhooks:read"], "ttl_seconds": 900}))]
pub struct CreatePortalSession {
    /// The developer the dashboard is opened for.
    pub developer_id: Uuid,
    /// Default `["webhooks:read", "webhooks:write"]`; named scopes only
    /// (`platform:api_unrestricted` is refused).
    pub scopes: Option<Vec<String>>,
    /// Lifetime, 60 to 86400 inclusive; default 900.
    #[schema(minimum = 60, maximum = 86400)]
    pub ttl_seconds: Option<i64>,
}

/// A session just made: `token` appears here only.
#[derive(Serialize, ToSchema)]
pub struct PortalSessionCreated {
    pub id: Uuid,
    /// The dashboard's path with the token in the fragment
    /// (`/dashboard#session=<token>`), to be opened on the public listener's
    /// origin. The token is never in a query string.
    pub url: String,
    /// `Authorization: Bearer <token>` on the public API.
    pub token: String,
    #[serde(serialize_with = "webhooks_model::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: DateTime<Utc>,
}

// The token (also in `url`) never shows in a log line or a panic.
impl std::fmt::Debug for PortalSessionCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortalSessionCreated").field("id", &self.id).field("expires_at", &self.expires_at).finish()
    }
}

/// The scopes a request asks for, checked: known names, no unrestricted.
fn session_scopes(requested: Option<&[String]>) -> Result<Vec<Scope>, ApiError> {
    let Some(requested) = requested else { return Ok(DEFAULT_SCOPES.to_vec()) };
    let scopes =
        keys::parse_scopes(Some(requested)).map_err(|message| ApiError::invalid(Location::Body, "scopes", message))?;
    if scopes.contains(&Scope::Unrestricted) {
        return Err(ApiError::invalid(
            Location::Body,
            "scopes",
            "a portal session names its scopes; platform:api_unrestricted is not allowed",
        ));
    }
    Ok(scopes)
}

/// Opens the dashboard for a developer (internal listener).
///
/// The platform's console calls it and sends its user to `url` on the public
/// listener. The token works as `Authorization: Bearer <token>` on the public
/// API, for this developer and these scopes only, until `expires_at` or a
/// `DELETE`. Only its hash is stored. Keys made with it are `type: Public`.
#[utoipa::path(post, path = "/internal/portal_sessions", tag = "internal", operation_id = "createPortalSession",
    request_body = CreatePortalSession,
    security(("internal_token" = [])),
    responses(
        (status = 201, description = "The session; `token` is shown this once", body = PortalSessionCreated),
        (status = 400, description = "`invalid`/`required` body field (`source.key` names it)", body = crate::error::ErrorBody),
        (status = 401, description = "`invalid`: the bearer token is missing or wrong (only when `INTERNAL_TOKEN` is set)", body = crate::error::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not JSON", body = crate::error::ErrorBody),
    ))]
pub async fn create(State(state): State<AppState>, Json(body): Json<CreatePortalSession>) -> ApiResult<Response> {
    let scopes = session_scopes(body.scopes.as_deref())?;
    let ttl = body.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl) {
        return Err(ApiError::invalid(
            Location::Body,
            "ttl_seconds",
            format!("ttl_seconds must be from {MIN_TTL_SECONDS} to {MAX_TTL_SECONDS}"),
        ));
    }
    let secret: String = rand::rng().sample_iter(&Alphanumeric).take(TOKEN_SECRET_LEN).map(char::from).collect();
    let token = format!("{TOKEN_PREFIX}{secret}");
    let created_at = state.config.common.clock.now();
    let session = state
        .store
        .create_portal_session(NewPortalSession {
            developer_id: body.developer_id,
            token_hash: hash_key(&token),
            scopes: &scopes,
            created_at,
            expires_at: created_at + chrono::Duration::seconds(ttl),
        })
        .await?;
    tracing::info!(portal_session_id = %session.id, developer_id = %session.developer_id, ttl, "portal session created");
    let created = PortalSessionCreated {
        id: session.id,
        url: format!("/dashboard#session={token}"),
        token,
        expires_at: session.expires_at,
    };
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// Revokes a session at once (internal listener).
#[utoipa::path(delete, path = "/internal/portal_sessions/{id}", tag = "internal", operation_id = "deletePortalSession",
    params(("id" = Uuid, Path, description = "The session's `id`")),
    security(("internal_token" = [])),
    responses(
        (status = 204, description = "Revoked: its token no longer works"),
        (status = 404, description = "`not_found`: no live session has this id", body = crate::error::ErrorBody),
    ))]
pub async fn revoke(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let id: Uuid = id.parse().map_err(|_| ApiError::NotFound)?;
    if !state.store.revoke_portal_session(id, state.config.common.clock.now()).await? {
        return Err(ApiError::NotFound);
    }
    tracing::info!(portal_session_id = %id, "portal session revoked");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        assert!(well_formed_token(&format!("ps_{}", "a1".repeat(24))));
        assert!(!well_formed_token(&format!("ps_{}", "a".repeat(47))));
        assert!(!well_formed_token(&format!("sk-test-{}", "a".repeat(48))));
        assert!(!well_formed_token(&format!("ps_{}!", "a".repeat(47))));
    }

    #[test]
    fn scopes_default_and_refuse_unrestricted() {
        assert_eq!(session_scopes(None).unwrap(), DEFAULT_SCOPES);
        let named = |names: &[&str]| session_scopes(Some(&names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()));
        assert_eq!(named(&["api_keys:read"]).unwrap(), [Scope::ApiKeysRead]);
        assert!(named(&["platform:api_unrestricted"]).is_err());
        assert!(named(&[]).is_err());
        assert!(named(&["webhooks:everything"]).is_err());
    }
}
