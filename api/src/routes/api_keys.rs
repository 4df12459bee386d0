//! `/v0/api_keys`: who am I, create, list, delete.

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get},
};
use serde::{Deserialize, Serialize};
use shared::model::{ApiKey, ApiKeyType, List, Scope};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path},
    idempotency::Redact,
    keys,
    state::AppState,
};

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api_keys/whoami", get(whoami))
        .route("/api_keys", get(list).post(create))
        .route("/api_keys/{id}", delete(remove))
}

/// Body of `POST /v0/api_keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// At most 100 characters.
    #[serde(default)]
    pub name: Option<String>,
    /// Defaults to `["platform:api_unrestricted"]`.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
}

/// A key just created: the record plus the plaintext, shown this once.
#[derive(Serialize, ToSchema)]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub api_key: ApiKey,
    /// The key itself. It is not stored and cannot be shown again.
    pub key: String,
}

// `Debug` leaves the secret out, so logging the answer gives no key away.
impl std::fmt::Debug for CreatedApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedApiKey")
            .field("api_key", &self.api_key)
            .field("key", &keys::redacted(&self.key))
            .finish()
    }
}

/// The calling key.
#[utoipa::path(get, path = "/v0/api_keys/whoami", tag = "api_keys",
    responses((status = 200, body = ApiKey), (status = 401, body = ErrorBody)))]
pub async fn whoami(caller: Caller) -> axum::Json<ApiKey> {
    axum::Json(caller.key)
}

/// Creates a key. A scoped key may only create keys with scopes it holds. The
/// plaintext `key` appears in this answer only: an idempotent replay answers
/// the same body without it.
#[utoipa::path(post, path = "/v0/api_keys", tag = "api_keys", request_body = CreateApiKey,
    params(("Idempotency-Key" = String, Header)),
    responses((status = 201, body = CreatedApiKey), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<CreateApiKey>,
) -> ApiResult<Response> {
    caller.require(Scope::ApiKeysWrite)?;
    let name = body.name.as_deref().map(str::trim).filter(|n| !n.is_empty());
    if name.is_some_and(|n| n.chars().count() > 100 || n.chars().any(char::is_control)) {
        return Err(ApiError::invalid(
            Location::Body,
            "name",
            "name must be at most 100 characters, without control characters",
        ));
    }
    let scopes = keys::parse_scopes(body.scopes.as_deref())
        .map_err(|message| ApiError::invalid(Location::Body, "scopes", message))?;
    if !caller.key.scopes.contains(&Scope::Unrestricted)
        && let Some(broader) = scopes.iter().find(|s| !caller.key.scopes.contains(s))
    {
        return Err(ApiError::Forbidden(broader.as_str()));
    }
    let issued = keys::issue(
        &state.store,
        state.config.common.platform_environment,
        caller.developer_id(),
        ApiKeyType::Private,
        &scopes,
        name,
    )
    .await?;
    tracing::info!(api_key_id = %issued.api_key.id, by = %caller.key.id, "api key created");
    let mut response =
        (StatusCode::CREATED, axum::Json(CreatedApiKey { api_key: issued.api_key, key: issued.key })).into_response();
    response.extensions_mut().insert(Redact(&["key"]));
    Ok(response)
}

/// The developer's active keys.
#[utoipa::path(get, path = "/v0/api_keys", tag = "api_keys",
    responses((status = 200, body = List<ApiKey>), (status = 403, body = ErrorBody)))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> ApiResult<axum::Json<List<ApiKey>>> {
    caller.require(Scope::ApiKeysRead)?;
    Ok(axum::Json(state.store.list_api_keys(caller.developer_id()).await?.into()))
}

/// Deletes a key; it stops working at once.
#[utoipa::path(delete, path = "/v0/api_keys/{id}", tag = "api_keys",
    params(("id" = Uuid, Path)),
    responses((status = 200, body = ApiKey), (status = 404, body = ErrorBody)))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ApiKey>> {
    caller.require(Scope::ApiKeysWrite)?;
    let id: Uuid = id.parse().map_err(|_| ApiError::NotFound)?;
    let key = state.store.delete_api_key(caller.developer_id(), id).await?.ok_or(ApiError::NotFound)?;
    tracing::info!(api_key_id = %key.id, by = %caller.key.id, "api key deleted");
    Ok(axum::Json(key))
}
