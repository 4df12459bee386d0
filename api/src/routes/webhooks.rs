//! `/v0/webhooks`: the endpoint lifecycle (API.md §4).

use axum::{Router, extract::State, http::StatusCode, routing::get};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;
use webhooks_keys as keys;
use webhooks_model::{
    Category, DeliveryOrder, EndpointStatus, EventEpoch, List, RATE_LIMIT_RANGE, Scope, SignatureScheme, Webhook, ids,
};
use webhooks_net::{guard as net, guard::parse_target_url, tls};
use webhooks_store::{
    EndpointChange, EndpointRecord, EndpointUpdate, NewEndpoint, NewRecovery, Recoverable, Recovery, RecoveryStart,
    RecoveryWindow, ReplacementKey, UpdateOutcome,
};

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path},
    openapi::IdempotencyKey,
    state::AppState,
};

/// The `{id}` of an endpoint's paths.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EndpointId {
    /// The endpoint's `id`: `wep_` and 32 lowercase hex digits. Anything else
    /// answers 404, as an unknown id does.
    #[param(pattern = "^wep_[0-9a-f]{32}$", min_length = 36, max_length = 36)]
    pub id: String,
}

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/webhooks", get(list).post(create))
        .route("/webhooks/{id}", get(show).put(update).delete(remove))
        .route("/webhooks/{id}/rotate_key", axum::routing::post(rotate_key))
        .route("/webhooks/{id}/recover", get(show_recovery).post(recover))
}

/// Body of `POST /v0/webhooks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://hooks.example.com/webhooks", "event_categories": ["transfer", "customer"]}))]
pub struct CreateWebhook {
    /// An absolute `https` URL without user-info, at most 2048 characters.
    /// Its host must resolve to public addresses only (unless the service runs
    /// with `TARGET_ALLOW_PRIVATE=true`) and complete a TLS handshake with a
    /// certificate valid for it; the path need not exist yet.
    #[schema(format = "uri", min_length = 9, max_length = 2048, pattern = "^https://[^/?#@]")]
    pub url: String,
    /// `webhook_creation` (the default) or `beginning_of_time`.
    #[serde(default)]
    pub event_epoch: Option<EventEpoch>,
    /// Empty or absent means every category; kept sorted and de-duplicated.
    #[serde(default)]
    pub event_categories: Option<Vec<Category>>,
    /// Names of event types (`GET /v0/event_types`) to narrow to, each of
    /// one of `event_categories` (when those are given); empty or absent
    /// means every type of its categories. At most 100; kept sorted and
    /// de-duplicated.
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// `platform` (the default: RSA, `X-Webhook-Signature`) or `standard`
    /// (Standard Webhooks with Ed25519).
    #[serde(default)]
    pub signature_scheme: Option<SignatureScheme>,
    /// The most deliveries per second to this endpoint, across every
    /// dispatcher together (1 to 10000); more wait their turn, none fails for
    /// it. A 429 or 503 from the receiver slows the pace at once (honouring
    /// `Retry-After`); it recovers after successes. Absent or null: no limit
    /// of its own.
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<u32>,
    /// `none` (the default) or `ordered`: deliveries in `event_sequence`
    /// order, each only once every earlier one has succeeded or failed for
    /// good.
    #[serde(default)]
    pub ordering: Option<DeliveryOrder>,
}

/// Body of `PUT /v0/webhooks/{id}`: any of the fields; an empty body changes
/// nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWebhook {
    /// Changes only while the endpoint is `disabled` (409 `invalid_state`
    /// otherwise); the same URL, compared as parsed, is no change. Checked as
    /// at creation.
    #[serde(default)]
    #[schema(format = "uri", min_length = 9, max_length = 2048, pattern = "^https://[^/?#@]")]
    pub url: Option<String>,
    /// `active` or `disabled`; `deleted` is reached by `DELETE` only.
    #[serde(default)]
    #[schema(value_type = Option<TargetStatus>)]
    pub status: Option<String>,
    /// Empty means every category; kept sorted and de-duplicated.
    #[serde(default)]
    pub event_categories: Option<Vec<Category>>,
    /// Event types to narrow to; empty means every type of its categories.
    /// Checked as at creation.
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// Another scheme gives the endpoint a fresh key pair of that scheme; the
    /// old key keeps signing (in its own scheme's headers) for
    /// `KEY_ROTATION_OVERLAP`. The current scheme is no change.
    #[serde(default)]
    pub signature_scheme: Option<SignatureScheme>,
    /// 1 to 10000 deliveries per second; null removes the limit, absent
    /// leaves it.
    #[serde(default, deserialize_with = "present_whole_number")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<Option<u32>>,
    /// `none` or `ordered`. Back to `none`, deliveries waiting for their turn
    /// go at once.
    #[serde(default)]
    pub ordering: Option<DeliveryOrder>,
}

/// A whole number that fits a `u32`, or null. JSON (and so the OpenAPI
/// document's `integer`) counts `20.0` as the integer 20, so it is read as
/// one; `20.5` is refused.
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    let whole = number.as_u64().or_else(|| {
        number.as_f64().filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f)).map(|f| f as u64)
    });
    whole
        .and_then(|n| u32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number, got {number}")))
}

/// [`whole_number`] for a field that may be null: `Some(None)` when it is,
/// `None` (by `#[serde(default)]`) when it is absent.
fn present_whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Option<u32>>, D::Error> {
    whole_number(deserializer).map(Some)
}

/// Refuses a rate limit out of its range.
fn check_rate_limit(limit: Option<u32>) -> ApiResult<Option<u32>> {
    match limit {
        Some(limit) if !RATE_LIMIT_RANGE.contains(&limit) => Err(ApiError::invalid(
            Location::Body,
            "rate_limit_per_second",
            format!(
                "rate_limit_per_second must be between {} and {}, or null for no limit",
                RATE_LIMIT_RANGE.start(),
                RATE_LIMIT_RANGE.end()
            ),
        )),
        limit => Ok(limit),
    }
}

/// The states a `PUT` may set.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // A shape for the document; the body is read as a string.
pub enum TargetStatus {
    /// Deliver events as they come.
    Active,
    /// Keep events as upcoming and deliver nothing automatically.
    Disabled,
}

/// Looks up the caller's endpoint; malformed, missing, deleted and other
/// developers' ids all answer the same 404.
pub(crate) async fn find(state: &AppState, caller: &Caller, id: &str) -> ApiResult<EndpointRecord> {
    if !ids::is_well_formed(id, ids::ENDPOINT_PREFIX) {
        return Err(ApiError::NotFound);
    }
    state.store.get_endpoint(caller.developer_id(), id).await?.ok_or(ApiError::NotFound)
}

/// Parses `raw` and checks its host the way a delivery would connect: the
/// address check, then a full TLS handshake against the trusted roots.
async fn check_url(state: &AppState, raw: &str) -> ApiResult<String> {
    let url = parse_target_url(raw).map_err(|e| ApiError::invalid(Location::Body, "url", e.to_string()))?;
    let common = &state.config.common;
    tls::probe(&url, state.tls.clone(), common.target_allow_private, common.delivery_timeout).await.map_err(|e| {
        tracing::debug!(url = %net::loggable_url(&url), reason = e.code(), "endpoint url refused");
        ApiError::invalid(Location::Body, "url", e.message())
    })?;
    Ok(url.to_string())
}

fn limit_exceeded(limit: u32) -> ApiError {
    ApiError::LimitExceeded(format!("A developer may have at most {limit} webhook endpoints; delete one first"))
}

/// A fresh key pair of `scheme` for endpoint `id`: the public half as the API
/// shows it, the private half sealed. RSA generation takes tens of
/// milliseconds, so it runs off the async threads.
async fn new_key_pair(state: &AppState, scheme: SignatureScheme, id: &str) -> ApiResult<(String, Vec<u8>)> {
    let pair = tokio::task::spawn_blocking(move || keys::generate(scheme))
        .await
        .map_err(|e| ApiError::Unexpected(e.into()))?
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    let private_key =
        state.cipher.seal(&pair.private_pkcs8_der, id.as_bytes()).map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok((pair.public_key_pem, private_key))
}

/// A replacement for the endpoint's key, of `scheme`; the current key
/// overlaps for `KEY_ROTATION_OVERLAP`.
async fn replacement(state: &AppState, scheme: SignatureScheme, id: &str) -> ApiResult<ReplacementKey> {
    let (public_key, private_key) = new_key_pair(state, scheme, id).await?;
    let overlap = chrono::Duration::from_std(state.config.key_rotation_overlap).unwrap_or(chrono::Duration::MAX);
    Ok(ReplacementKey { scheme, public_key, private_key, previous_expires_at: webhooks_model::time::now() + overlap })
}

/// Registers an endpoint.
///
/// Needs `webhooks:write`. The endpoint starts `disabled`, with a fresh
/// RSA-2048 key pair whose public half is `public_key`.
#[utoipa::path(post, path = "/v0/webhooks", tag = "webhooks", operation_id = "createWebhook",
    request_body = CreateWebhook,
    params(IdempotencyKey),
    responses(
        (status = 201, description = "The endpoint, `disabled`", body = Webhook,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`invalid`/`required` body field (`source.key` names it; a `url` that is not https, not public, or whose TLS handshake fails is `invalid`), `limit_exceeded` (already `MAX_ENDPOINTS_PER_DEVELOPER` endpoints), or `Idempotency-Key` missing or malformed", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(body): Json<CreateWebhook>,
) -> ApiResult<(StatusCode, axum::Json<Webhook>)> {
    caller.require(Scope::WebhooksWrite)?;
    let rate_limit_per_second = check_rate_limit(body.rate_limit_per_second)?;
    let limit = state.config.max_endpoints_per_developer;
    // Cheap refusal before the handshake and key generation; the store checks
    // again under a lock.
    if state.store.count_endpoints(caller.developer_id()).await? >= i64::from(limit) {
        return Err(limit_exceeded(limit));
    }
    let event_categories = body.event_categories.unwrap_or_default();
    let event_types = check_event_types(&state, body.event_types.unwrap_or_default(), &event_categories).await?;
    let url = check_url(&state, &body.url).await?;
    let id = ids::new_endpoint_id();
    let scheme = body.signature_scheme.unwrap_or_default();
    let (public_key, private_key) = new_key_pair(&state, scheme, &id).await?;
    let new = NewEndpoint {
        signature_scheme: scheme,
        id,
        developer_id: caller.developer_id(),
        url,
        event_epoch: body.event_epoch.unwrap_or_default(),
        event_categories,
        event_types,
        public_key_pem: public_key,
        private_key,
        rate_limit_per_second,
        ordering: body.ordering.unwrap_or_default(),
    };
    let by = EndpointChange::by_key(caller.key.id);
    let record = state.store.create_endpoint(new, i64::from(limit), by).await?.ok_or_else(|| limit_exceeded(limit))?;
    state.producer.wake();
    tracing::info!(endpoint_id = %record.id, api_key_id = %caller.key.id, "endpoint created");
    Ok((StatusCode::CREATED, axum::Json(record.to_webhook())))
}

/// The developer's endpoints.
///
/// Needs `webhooks:read`. Every non-deleted endpoint, newest first.
#[utoipa::path(get, path = "/v0/webhooks", tag = "webhooks", operation_id = "listWebhooks",
    responses(
        (status = 200, description = "The non-deleted endpoints, newest first", body = List<Webhook>),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
    ))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> ApiResult<axum::Json<List<Webhook>>> {
    caller.require(Scope::WebhooksRead)?;
    let records = state.store.list_endpoints(caller.developer_id()).await?;
    Ok(axum::Json(records.iter().map(EndpointRecord::to_webhook).collect::<Vec<_>>().into()))
}

/// One endpoint.
///
/// Needs `webhooks:read`.
#[utoipa::path(get, path = "/v0/webhooks/{id}", tag = "webhooks", operation_id = "getWebhook",
    params(EndpointId),
    responses(
        (status = 200, description = "The endpoint", body = Webhook),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
    ))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Webhook>> {
    caller.require(Scope::WebhooksRead)?;
    Ok(axum::Json(find(&state, &caller, &id).await?.to_webhook()))
}

/// Changes an endpoint.
///
/// Needs `webhooks:write`. Changes `url` (only while `disabled`), `status`
/// (`active`/`disabled`) or `event_categories`; a refused change changes
/// nothing.
#[utoipa::path(put, path = "/v0/webhooks/{id}", tag = "webhooks", operation_id = "updateWebhook",
    params(EndpointId),
    request_body(content = UpdateWebhook, description = "Any of the fields; an empty body changes nothing"),
    responses(
        (status = 200, description = "The endpoint as changed", body = Webhook),
        (status = 400, description = "`invalid` body field (`source.key` names it: a `status` other than `active`/`disabled`, a `url` refused as at creation)", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
        (status = 409, description = "`invalid_state`: a new `url` for an `active` endpoint; disable it first", body = ErrorBody),
    ))]
pub async fn update(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Json(body): Json<UpdateWebhook>,
) -> ApiResult<axum::Json<Webhook>> {
    caller.require(Scope::WebhooksWrite)?;
    let status = match body.status.as_deref() {
        None => None,
        Some("active") => Some(EndpointStatus::Active),
        Some("disabled") => Some(EndpointStatus::Disabled),
        Some(_) => {
            return Err(ApiError::invalid(Location::Body, "status", "status must be active or disabled"));
        }
    };
    let rate_limit_per_second = body.rate_limit_per_second.map(check_rate_limit).transpose()?;
    let current = find(&state, &caller, &id).await?;
    let event_types = match (body.event_types, body.event_categories.as_deref()) {
        (Some(names), categories) => {
            let categories = categories.unwrap_or(&current.event_categories);
            Some(check_event_types(&state, names, categories).await?)
        }
        // New categories must still hold the types the endpoint keeps.
        (None, Some(categories)) => {
            check_event_types(&state, current.event_types.clone(), categories).await?;
            None
        }
        (None, None) => None,
    };
    // A valid url is compared normalised: `https://Example.COM:443/p`
    // repeats `https://example.com/p` and is no change, even while active.
    let unchanged =
        |raw: &str| parse_target_url(raw).is_ok_and(|url| webhooks_model::same_url(url.as_str(), &current.url));
    let url = match body.url {
        Some(raw) if !unchanged(&raw) => {
            if current.status == EndpointStatus::Active {
                return Err(url_change_while_active());
            }
            Some(check_url(&state, &raw).await?)
        }
        _ => None,
    };
    let new_key = match body.signature_scheme {
        Some(scheme) if scheme != current.signature_scheme => Some(replacement(&state, scheme, &current.id).await?),
        _ => None,
    };
    let update = EndpointUpdate {
        url,
        status,
        event_categories: body.event_categories,
        event_types,
        new_key,
        rate_limit_per_second,
        ordering: body.ordering,
    };
    Ok(axum::Json(apply(&state, &caller, &id, update).await?.to_webhook()))
}

/// The most event types an endpoint may name.
const MAX_EVENT_TYPES: usize = 100;

/// Checks the event types an endpoint narrows to: each a type of the
/// catalog, of one of `categories` (empty: any category).
async fn check_event_types(state: &AppState, names: Vec<String>, categories: &[Category]) -> ApiResult<Vec<String>> {
    if names.len() > MAX_EVENT_TYPES {
        return Err(ApiError::invalid(
            Location::Body,
            "event_types",
            format!("event_types may name at most {MAX_EVENT_TYPES} types"),
        ));
    }
    for name in &names {
        let Some(entry) = state.catalog.get(name).await else {
            let shown: String = name.chars().take(128).collect();
            return Err(ApiError::invalid(
                Location::Body,
                "event_types",
                format!("unknown event type {shown:?}: GET /v0/event_types lists the catalog"),
            ));
        };
        if !webhooks_model::categories_include(categories, entry.event_type.category) {
            return Err(ApiError::invalid(
                Location::Body,
                "event_types",
                format!(
                    "event type {name} is of category {}, which event_categories leaves out",
                    entry.event_type.category
                ),
            ));
        }
    }
    Ok(names)
}

/// Applies `update` to the caller's endpoint `id` and wakes the relay for
/// the changes it recorded: what a PUT and a rotation share.
async fn apply(state: &AppState, caller: &Caller, id: &str, update: EndpointUpdate) -> ApiResult<EndpointRecord> {
    let by = EndpointChange::by_key(caller.key.id);
    match state.store.update_endpoint(caller.developer_id(), id, update, by).await? {
        UpdateOutcome::Updated(record) => {
            state.producer.wake();
            Ok(*record)
        }
        UpdateOutcome::NotFound => Err(ApiError::NotFound),
        UpdateOutcome::UrlChangeWhileActive => Err(url_change_while_active()),
    }
}

fn url_change_while_active() -> ApiError {
    ApiError::InvalidState("The url of an active endpoint cannot change; disable the endpoint first".into())
}

/// Deletes an endpoint.
///
/// Needs `webhooks:write`. From then on every call on its id answers 404,
/// and its private key is gone.
#[utoipa::path(delete, path = "/v0/webhooks/{id}", tag = "webhooks", operation_id = "deleteWebhook",
    params(EndpointId),
    responses(
        (status = 200, description = "The endpoint, with `status: deleted`", body = Webhook),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted already", body = ErrorBody),
    ))]
pub async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Webhook>> {
    caller.require(Scope::WebhooksWrite)?;
    if !ids::is_well_formed(&id, ids::ENDPOINT_PREFIX) {
        return Err(ApiError::NotFound);
    }
    let by = EndpointChange::by_key(caller.key.id);
    let record = state.store.delete_endpoint(caller.developer_id(), &id, by).await?.ok_or(ApiError::NotFound)?;
    state.producer.wake();
    tracing::info!(endpoint_id = %record.id, api_key_id = %caller.key.id, "endpoint deleted");
    Ok(axum::Json(record.to_webhook()))
}

/// Gives an endpoint a fresh key pair.
///
/// Needs `webhooks:write`. The new key (same scheme) signs from now on; the
/// replaced one keeps signing beside it, second in the signature header,
/// until `previous_key_expires_at` (`KEY_ROTATION_OVERLAP`, default 24 hours),
/// so a receiver holding either public key verifies every delivery. Then its
/// private half is deleted. A rotation during an overlap replaces the
/// previous key: only the two newest keys sign.
#[utoipa::path(post, path = "/v0/webhooks/{id}/rotate_key", tag = "webhooks", operation_id = "rotateWebhookKey",
    params(EndpointId, IdempotencyKey),
    responses(
        (status = 200, description = "The endpoint with its new `public_key`, `previous_public_key` and `previous_key_expires_at`", body = Webhook,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`Idempotency-Key` missing or malformed", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
    ))]
pub async fn rotate_key(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Webhook>> {
    caller.require(Scope::WebhooksWrite)?;
    let current = find(&state, &caller, &id).await?;
    let new_key = Some(replacement(&state, current.signature_scheme, &current.id).await?);
    let update = EndpointUpdate { new_key, ..EndpointUpdate::default() };
    let record = apply(&state, &caller, &id, update).await?;
    tracing::info!(endpoint_id = %record.id, api_key_id = %caller.key.id, "endpoint key rotated");
    Ok(axum::Json(record.to_webhook()))
}

/// Body of `POST /v0/webhooks/{id}/recover`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"since": "2026-11-20T00:00:00.000Z", "until": "2026-11-21T00:00:00.000Z"}))]
pub struct RecoverWindow {
    /// Events created at or after this time (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    pub since: chrono::DateTime<chrono::Utc>,
    /// Events created before this time; absent: up to now.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

/// Answer of `POST /v0/webhooks/{id}/recover`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Recovering {
    /// The recovery (`GET …/recover` shows it).
    pub id: Uuid,
    /// How many deliveries are being queued; null while they are still
    /// being counted (`GET …/recover` gives the count once known).
    pub queued: Option<u64>,
    /// When it queues nothing: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How long `POST …/recover` waits for its count before it answers without
/// it: well within the 200 ms the call answers in.
const COUNT_WAIT: std::time::Duration = std::time::Duration::from_millis(120);

/// Queues again every failed or upcoming delivery of a time window.
///
/// Needs `webhooks:write`. Every event of the window meant for the endpoint
/// whose delivery `failed`, is upcoming (held while the endpoint was
/// disabled), or was never made (`beginning_of_time` endpoints) is queued as
/// `send` queues one: an attempt now, whatever the endpoint's status, then
/// the retry schedule. Deliveries already pending or retrying are left
/// alone, so no event is queued twice. Answers at once, whatever the
/// window: with the count when it is known within a moment, else `queued:
/// null` (`GET …/recover` gives it once counted); a recovery that queues
/// nothing says why (`reason`). One count per developer runs at a time (429
/// meanwhile). The deliveries are queued in the background, in batches (`RECOVERY_BATCH`
/// deliveries, 10 by default), oldest first, at most `RECOVERY_RATE`
/// deliveries per second per API process. The recovery's progress is stored
/// with each batch: a stop of the process, or an error, pauses it, and
/// whichever API process is running takes it up where it was. One recovery
/// runs per endpoint at a time: while one runs, another answers 409
/// `invalid_state` naming it; `GET …/recover` shows its progress.
#[utoipa::path(post, path = "/v0/webhooks/{id}/recover", tag = "webhooks", operation_id = "recoverWebhook",
    params(EndpointId, IdempotencyKey),
    request_body = RecoverWindow,
    responses(
        (status = 202, description = "The deliveries are being queued", body = Recovering,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`invalid`/`required` body field (not a time, or a year outside 1 to 9999), or `Idempotency-Key` missing or malformed; a window that ends before it starts is empty (`queued: 0`)", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
        (status = 409, description = "`invalid_state`: a recovery of this endpoint is running (the message names it)", body = ErrorBody),
    ))]
pub async fn recover(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Json(body): Json<RecoverWindow>,
) -> ApiResult<(StatusCode, axum::Json<Recovering>)> {
    caller.require(Scope::WebhooksWrite)?;
    for (name, at) in [("since", Some(body.since)), ("until", body.until)] {
        if at.is_some_and(|at| !crate::extract::time_in_range(&at)) {
            return Err(ApiError::invalid(
                Location::Body,
                name,
                format!("{name} must be a time of the years 1 to 9999"),
            ));
        }
    }
    let endpoint = find(&state, &caller, &id).await?;
    // A window that ends before it starts (or starts in the future) is
    // empty: nothing to queue.
    let until = body.until.unwrap_or_else(webhooks_model::time::now);
    let window = RecoveryWindow { since: body.since, until };
    // One at a time: refused before the window is counted.
    if let Some(running) = state.store.latest_recovery(&endpoint.id).await?.filter(|r| r.running) {
        return Err(running_already(&running));
    }
    // One count in flight per developer: a count reads the window.
    let counting = state.recoveries.begin_count(caller.developer_id()).ok_or(ApiError::RateLimited(COUNT_WAIT * 10))?;
    let new = NewRecovery {
        id: webhooks_model::ids::new_v7(),
        endpoint_id: endpoint.id.clone(),
        developer_id: endpoint.developer_id,
        window,
        counted: None,
        api_key_id: Some(caller.key.id),
    };
    let recovery = match state.store.start_recovery(&new).await? {
        RecoveryStart::Started(recovery) => recovery,
        RecoveryStart::Running(running) => return Err(running_already(&running)),
    };
    // Counted in the background, whatever the window; the answer says the
    // count when it comes quickly.
    let count = state.recoveries.count(counting, endpoint.clone(), recovery.id, window);
    state.recoveries.wake();
    let counted = tokio::time::timeout(COUNT_WAIT, count).await.ok().and_then(Result::ok);
    tracing::info!(
        recovery_id = %recovery.id,
        endpoint_id = %endpoint.id,
        queued = ?counted.map(|c| c.count),
        api_key_id = %caller.key.id,
        "recovery started"
    );
    let answer = Recovering {
        id: recovery.id,
        queued: counted.map(|c| c.count),
        reason: counted.as_ref().and_then(Recoverable::reason),
    };
    Ok((StatusCode::ACCEPTED, axum::Json(answer)))
}

fn running_already(running: &Recovery) -> ApiError {
    ApiError::InvalidState(format!(
        "a recovery of this endpoint is running ({}, since {}, until {}, {} of {} queued); \
         GET /v0/webhooks/{}/recover shows its progress",
        running.id,
        webhooks_model::time::format(&running.window.since),
        webhooks_model::time::format(&running.window.until),
        running.queued,
        running.total.map_or_else(|| "being counted".to_owned(), |total| total.to_string()),
        running.endpoint_id
    ))
}

/// A recovery of an endpoint, as `GET /v0/webhooks/{id}/recover` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecoveryStatus {
    pub id: Uuid,
    /// `running` while it queues, then `done`.
    #[schema(example = "running")]
    pub status: &'static str,
    /// The window: events created at or after `since`, before `until`.
    #[serde(serialize_with = "webhooks_model::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub since: chrono::DateTime<chrono::Utc>,
    #[serde(serialize_with = "webhooks_model::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub until: chrono::DateTime<chrono::Utc>,
    /// The deliveries it was counted to queue (the `queued` its `POST`
    /// answered); null while they are still being counted.
    pub total: Option<i64>,
    /// The deliveries it queued so far (fewer than `total` when some were
    /// pending or delivered meanwhile).
    pub queued: i64,
    /// When it queues nothing: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(serialize_with = "webhooks_model::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(serialize_with = "webhooks_model::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
    #[serde(serialize_with = "webhooks_model::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<Recovery> for RecoveryStatus {
    fn from(recovery: Recovery) -> RecoveryStatus {
        RecoveryStatus {
            id: recovery.id,
            status: if recovery.running { "running" } else { "done" },
            since: recovery.window.since,
            until: recovery.window.until,
            total: recovery.total,
            queued: recovery.queued,
            reason: recovery.reason,
            created_at: recovery.created_at,
            updated_at: recovery.updated_at,
            finished_at: recovery.finished_at,
        }
    }
}

/// The endpoint's latest recovery and how far it got.
///
/// Needs `webhooks:read`. 404 `not_found` when the endpoint has none.
#[utoipa::path(get, path = "/v0/webhooks/{id}/recover", tag = "webhooks", operation_id = "showRecovery",
    params(EndpointId),
    responses(
        (status = 200, description = "The latest recovery", body = RecoveryStatus),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
        (status = 404, description = "`not_found`: no such endpoint, or it was never recovered", body = ErrorBody),
    ))]
pub async fn show_recovery(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<RecoveryStatus>> {
    caller.require(Scope::WebhooksRead)?;
    let endpoint = find(&state, &caller, &id).await?;
    let recovery = state.store.latest_recovery(&endpoint.id).await?.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(recovery.into()))
}
