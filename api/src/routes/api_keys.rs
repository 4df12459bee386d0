//! `/v0/api_keys`: who am I, create, list, delete.

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get},
};
use serde::{Deserialize, Serialize};
use utoipa::{
    PartialSchema, ToSchema,
    openapi::{ArrayBuilder, ObjectBuilder, OneOfBuilder, RefOr, Schema, Type},
};
use uuid::Uuid;
use webhooks_model::{ApiKey, ApiKeyType, List, Scope};

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path},
    idempotency::Redact,
    keys,
    openapi::IdempotencyKey,
    state::AppState,
};

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api_keys/whoami", get(whoami))
        .route("/api_keys", get(list).post(create))
        .route("/api_keys/{id}", delete(remove))
}

/// Body of `POST /v0/api_keys`. An empty body is `{}`: an unrestricted key
/// without a name.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// At most 100 characters, no control characters; surrounding white
    /// space is trimmed, and a name of white space only is no name.
    #[serde(default)]
    #[schema(max_length = 100, pattern = r"^[^\x00-\x1F\x7F-\x9F]*$")]
    pub name: Option<String>,
    /// What the key may do: `["platform:api_unrestricted"]` (the default when
    /// absent) alone, or one or more of the other scopes. A scoped caller may
    /// only give scopes it holds itself (403 `forbidden` otherwise).
    #[serde(default)]
    #[schema(value_type = Option<RequestedScopes>)]
    pub scopes: Option<Vec<String>>,
}

/// The scopes a new key asks for: the unrestricted scope alone, or one or
/// more of the others (repeats count once). A shape for the document: the
/// body is read as strings and checked by `keys::parse_scopes`.
#[derive(Debug)]
pub struct RequestedScopes;

impl PartialSchema for RequestedScopes {
    fn schema() -> RefOr<Schema> {
        let names =
            |names: &[&str]| ObjectBuilder::new().schema_type(Type::String).enum_values(Some(names.iter().copied()));
        let others: Vec<&str> = Scope::ALL.iter().filter(|s| **s != Scope::Unrestricted).map(|s| s.as_str()).collect();
        OneOfBuilder::new()
            .item(
                ArrayBuilder::new()
                    .items(names(&[Scope::Unrestricted.as_str()]))
                    .min_items(Some(1))
                    .description(Some("Everything: `platform:api_unrestricted`, alone")),
            )
            .item(
                ArrayBuilder::new()
                    .items(names(&others))
                    .min_items(Some(1))
                    .description(Some("Only what the scopes name")),
            )
            .description(Some(
                "`[\"platform:api_unrestricted\"]` alone, or one or more of the other scopes; repeats count once",
            ))
            .into()
    }
}

impl ToSchema for RequestedScopes {}

/// A key just created: the record plus the plaintext `key`.
#[derive(Serialize, ToSchema)]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub api_key: ApiKey,
    /// The key itself (`sk-test-…` or `sk-live-…`), in the answer that created
    /// it and never again: only its hash is stored. An idempotent replay of
    /// the same `POST` (`Idempotent-Replayed: true`) answers the same status
    /// and record without `key`; a client that lost the first answer deletes
    /// that key and creates another.
    #[schema(required = false)]
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

/// The header by which the dashboard names itself.
pub const CLIENT_HEADER: &str = "Webhooks-Client";

/// The calling key.
///
/// Any valid key may call it, whatever its scopes.
#[utoipa::path(get, path = "/v0/api_keys/whoami", tag = "api_keys", operation_id = "getCurrentApiKey",
    responses((status = 200, description = "The record of the key that made the request", body = ApiKey)))]
pub async fn whoami(caller: Caller) -> axum::Json<ApiKey> {
    axum::Json(caller.key)
}

/// Creates a key.
///
/// Needs `api_keys:write`. A scoped key may only create keys with scopes it
/// holds. The plaintext `key` appears in this answer only: an idempotent
/// replay answers the same status and body without it. The key is of `type:
/// Private`, or `Public` when the request carries `Webhooks-Client:
/// dashboard` (the dashboard's keys) or comes from a portal session; the
/// type is a label and grants nothing.
#[utoipa::path(post, path = "/v0/api_keys", tag = "api_keys", operation_id = "createApiKey",
    request_body(content = CreateApiKey, description = "May be empty: an unrestricted key without a name"),
    params(IdempotencyKey, ("Webhooks-Client" = Option<String>, Header, description = "`dashboard`: the key is made by the dashboard and is of `type: Public`")),
    responses(
        (status = 201, description = "The key was created; `key` is its plaintext, shown this once", body = CreatedApiKey,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer, which has no `key`"))),
        (status = 400, description = "`invalid` `name` or `scopes`, or `Idempotency-Key` missing (`required`) or malformed (`invalid`); `source` names the part", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `api_keys:write`, or asks for a scope it does not hold", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Json(body): Json<CreateApiKey>,
) -> ApiResult<Response> {
    caller.require(Scope::ApiKeysWrite)?;
    // Checked as sent, as the document states it, then trimmed: a name of
    // spaces only is no name.
    if body.name.as_deref().is_some_and(|n| n.chars().count() > 100 || n.chars().any(char::is_control)) {
        return Err(ApiError::invalid(
            Location::Body,
            "name",
            "name must be at most 100 characters, without control characters",
        ));
    }
    let name = body.name.as_deref().map(str::trim).filter(|n| !n.is_empty());
    let scopes = keys::parse_scopes(body.scopes.as_deref())
        .map_err(|message| ApiError::invalid(Location::Body, "scopes", message))?;
    if !caller.key.scopes.contains(&Scope::Unrestricted)
        && let Some(broader) = scopes.iter().find(|s| !caller.key.scopes.contains(s))
    {
        return Err(ApiError::Forbidden(broader.as_str()));
    }
    let from_dashboard = headers.get(CLIENT_HEADER).is_some_and(|client| client.as_bytes() == b"dashboard");
    let issued = keys::issue(
        &state.store,
        state.config.common.platform_environment,
        caller.developer_id(),
        if from_dashboard || caller.portal_session { ApiKeyType::Public } else { ApiKeyType::Private },
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
///
/// Needs `api_keys:read`.
#[utoipa::path(get, path = "/v0/api_keys", tag = "api_keys", operation_id = "listApiKeys",
    responses(
        (status = 200, description = "The developer's keys in state `Active`", body = List<ApiKey>),
        (status = 403, description = "`forbidden`: the calling key lacks `api_keys:read`", body = ErrorBody),
    ))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> ApiResult<axum::Json<List<ApiKey>>> {
    caller.require(Scope::ApiKeysRead)?;
    Ok(axum::Json(state.store.list_api_keys(caller.developer_id()).await?.into()))
}

/// Deletes a key.
///
/// Needs `api_keys:write`. A scoped key may only delete keys whose scopes
/// it holds itself. The key stops working at once.
#[utoipa::path(delete, path = "/v0/api_keys/{id}", tag = "api_keys", operation_id = "deleteApiKey",
    params(("id" = Uuid, Path, description = "The key's `id`")),
    responses(
        (status = 200, description = "The deleted key, with `state: Deleted`", body = ApiKey),
        (status = 403, description = "`forbidden`: the calling key lacks `api_keys:write`, or the key to delete holds a scope the caller does not", body = ErrorBody),
        (status = 404, description = "`not_found`: no active key of this developer has this id", body = ErrorBody),
    ))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ApiKey>> {
    caller.require(Scope::ApiKeysWrite)?;
    let id: Uuid = id.parse().map_err(|_| ApiError::NotFound)?;
    // A scoped key may not remove a key that can do more than it can: the
    // same rule as for creating one. A key's scopes never change.
    if !caller.key.scopes.contains(&Scope::Unrestricted) {
        let keys = state.store.list_api_keys(caller.developer_id()).await?;
        let target = keys.iter().find(|key| key.id == id).ok_or(ApiError::NotFound)?;
        if let Some(broader) = target.scopes.iter().find(|s| !caller.key.scopes.contains(s)) {
            return Err(ApiError::Forbidden(broader.as_str()));
        }
    }
    let key = state.store.delete_api_key(caller.developer_id(), id).await?.ok_or(ApiError::NotFound)?;
    tracing::info!(api_key_id = %key.id, by = %caller.key.id, "api key deleted");
    Ok(axum::Json(key))
}
