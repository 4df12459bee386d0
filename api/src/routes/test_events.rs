//! Test events (API.md §8.9): the example of a catalog type POSTed to one
//! endpoint now, signed as every delivery is, attempted once, and stored
//! nowhere: not an event of the developer, not in the endpoint's log.

use axum::{Router, extract::State, routing::post};
use serde::Deserialize;
use utoipa::ToSchema;
use webhooks_model::{DeliveryLog, Event, Scope, ids};

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path},
    openapi::IdempotencyKey,
    routes::webhooks::{EndpointId, find},
    state::AppState,
};

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/webhooks/{id}/test", post(send_test))
}

/// Body of `POST /webhooks/{id}/test`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"event_type": "transfer.updated.status_transitioned"}))]
pub struct TestEvent {
    /// A type of the event catalog (`GET /v0/event_types`); its example is
    /// what is sent.
    #[schema(min_length = 1, max_length = 128)]
    pub event_type: String,
}

/// Sends a test event to the endpoint now.
///
/// Needs `webhooks:write`. POSTs the example of `event_type` as an `Event`
/// with `"test": true` (and `event_sequence` 0), signed with the endpoint's
/// keys and scheme like any delivery, whatever the endpoint's status, and
/// attempted once: no retry. Answers with the attempt. The event is not one
/// of the developer's events and the attempt is not in the endpoint's log.
#[utoipa::path(post, path = "/v0/webhooks/{id}/test", tag = "events", operation_id = "sendTestEvent",
    params(EndpointId, IdempotencyKey),
    request_body = TestEvent,
    responses(
        (status = 200, description = "The attempt, whatever the receiver answered (a failure is in `status` and `error`)", body = DeliveryLog,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`invalid`/`required` `event_type` (not a type of the catalog), or `Idempotency-Key` missing or malformed", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id", body = ErrorBody),
    ))]
pub async fn send_test(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Json(body): Json<TestEvent>,
) -> ApiResult<axum::Json<DeliveryLog>> {
    caller.require(Scope::WebhooksWrite)?;
    let record = find(&state, &caller, &id).await?;
    let Some(entry) = state.catalog.get(&body.event_type).await else {
        let shown: String = body.event_type.chars().take(128).collect();
        return Err(ApiError::invalid(
            Location::Body,
            "event_type",
            format!("unknown event_type {shown:?}: GET /v0/event_types lists the catalog"),
        ));
    };
    let event_type = &entry.event_type;
    let created_at = webhooks_model::time::now();
    let event = Event {
        api_version: "v0".into(),
        event_id: ids::new_event_id(),
        event_developer_id: caller.developer_id(),
        event_category: event_type.category,
        event_type: event_type.name.clone(),
        event_sequence: 0,
        event_object_id: event_type.example["id"].as_str().unwrap_or("test").to_owned(),
        event_object_status: event_type.example["state"].as_str().map(str::to_owned),
        event_object: event_type.example.clone(),
        event_object_changes: None,
        event_created_at: created_at,
        test: true,
    };
    let json = serde_json::to_string(&event).map_err(|e| ApiError::Unexpected(e.into()))?;
    let endpoint_id = record.id.clone();
    let endpoint = dispatcher::cache::Endpoint::load(record, &state.cipher).map_err(ApiError::Unexpected)?;
    let allow_private = state.config.common.target_allow_private;
    let attempt = dispatcher::deliver::attempt(
        &state.delivery_client,
        &endpoint,
        &event.event_id,
        &json,
        allow_private,
        created_at,
        state.config.common.delivery_timeout,
    )
    .await;
    tracing::info!(
        %endpoint_id, event_id = %event.event_id, event_type = %event.event_type, status = ?attempt.status,
        error = ?attempt.error, api_key_id = %caller.key.id, "test event sent"
    );
    Ok(axum::Json(DeliveryLog {
        id: uuid::Uuid::new_v4(),
        event_id: event.event_id,
        event_type: Some(event.event_type),
        attempt: 1,
        status: attempt.status.map(i32::from),
        response_body: attempt.response_body,
        error: attempt.error.map(str::to_owned),
        error_detail: attempt.error_detail,
        duration_ms: i64::try_from(attempt.duration.as_millis()).unwrap_or(i64::MAX),
        created_at,
    }))
}
