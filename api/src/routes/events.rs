//! Events as developers see them: an endpoint's upcoming events, its delivery
//! log, `send`, and the developer's event list (API.md §4, §5).

use axum::{
    Router,
    extract::State,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use shared::{
    ids,
    model::{Category, DeliveryLog, Event, List, Scope},
    store::{EventPage, SendOutcome, StoredEvent},
};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path, Query},
    routes::webhooks::find,
    state::AppState,
};

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/webhooks/{id}/events", get(upcoming))
        .route("/webhooks/{id}/logs", get(logs))
        .route("/webhooks/{id}/send", post(send))
        .route("/webhook_events", get(list))
}

/// A list of events, each exactly as stored and delivered.
#[derive(Debug, Serialize)]
pub struct EventList {
    count: usize,
    data: Vec<Box<RawValue>>,
}

fn event_list(rows: Vec<StoredEvent>) -> ApiResult<axum::Json<EventList>> {
    let data = rows
        .into_iter()
        .map(|row| RawValue::from_string(row.body))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok(axum::Json(EventList { count: data.len(), data }))
}

fn limit(value: Option<i64>, default: i64, max: i64) -> ApiResult<i64> {
    match value {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid(Location::Query, "limit", format!("limit must be between 1 and {max}"))),
    }
}

/// Query of `GET /webhooks/{id}/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UpcomingQuery {
    /// 1 to 100, default 10.
    pub limit: Option<i64>,
}

/// The endpoint's upcoming events (held, pending, retrying), oldest first.
#[utoipa::path(get, path = "/v0/webhooks/{id}/events", tag = "events", params(("id" = String, Path), UpcomingQuery),
    responses((status = 200, body = List<Event>), (status = 404, body = ErrorBody)))]
pub async fn upcoming(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<UpcomingQuery>,
) -> ApiResult<axum::Json<EventList>> {
    caller.require(Scope::WebhooksRead)?;
    let limit = limit(query.limit, 10, 100)?;
    let endpoint = find(&state, &caller, &id).await?;
    let rows = state.store.upcoming_events(&endpoint, limit).await?;
    event_list(rows)
}

/// Query of `GET /webhooks/{id}/logs`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    /// 1 to 100, default 10.
    pub limit: Option<i64>,
    /// A log id: only entries older than it.
    pub starting_after: Option<String>,
}

/// The endpoint's delivery attempts, newest first.
#[utoipa::path(get, path = "/v0/webhooks/{id}/logs", tag = "events", params(("id" = String, Path), LogsQuery),
    responses((status = 200, body = List<DeliveryLog>), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn logs(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<LogsQuery>,
) -> ApiResult<axum::Json<List<DeliveryLog>>> {
    caller.require(Scope::WebhooksRead)?;
    let limit = limit(query.limit, 10, 100)?;
    let cursor = query
        .starting_after
        .as_deref()
        .map(|c| c.parse::<Uuid>())
        .transpose()
        .map_err(|_| ApiError::invalid(Location::Query, "starting_after", "starting_after must be a log id"))?;
    let endpoint = find(&state, &caller, &id).await?;
    let rows = state.store.list_logs(&endpoint.id, limit, cursor).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after", "starting_after names no log entry of this endpoint")
    })?;
    Ok(axum::Json(rows.into()))
}

/// Body of `POST /webhooks/{id}/send`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendEvent {
    /// `wh_` + 32 hex.
    pub event_id: String,
}

/// The answer of `send`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SendAnswer {
    pub message: String,
}

/// Queues an event for this endpoint now, whether it is active or disabled.
#[utoipa::path(post, path = "/v0/webhooks/{id}/send", tag = "events", params(("id" = String, Path), ("Idempotency-Key" = String, Header)),
    request_body = SendEvent,
    responses((status = 200, body = SendAnswer), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn send(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Json(body): Json<SendEvent>,
) -> ApiResult<axum::Json<SendAnswer>> {
    caller.require(Scope::WebhooksWrite)?;
    let endpoint = find(&state, &caller, &id).await?;
    if !ids::is_well_formed(&body.event_id, ids::EVENT_PREFIX) {
        return Err(ApiError::NotFound);
    }
    match state.store.send_event(&endpoint, &body.event_id).await? {
        SendOutcome::Queued => {
            state.relay_wake.notify_one();
            tracing::info!(endpoint_id = %endpoint.id, event_id = %body.event_id, api_key_id = %caller.key.id, "event sent on request");
            Ok(axum::Json(SendAnswer {
                message: format!("Event {} is queued for delivery to {}", body.event_id, endpoint.id),
            }))
        }
        SendOutcome::NoSuchEvent => Err(ApiError::NotFound),
        SendOutcome::NotForEndpoint => Err(ApiError::invalid(
            Location::Body,
            "event_id",
            "This event is not meant for this endpoint (its category or time is outside the endpoint's event_categories and event_epoch)",
        )),
    }
}

/// Query of `GET /webhook_events`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    pub category: Option<String>,
    /// 1 to 500, default 100.
    pub limit: Option<i64>,
    /// An event id: only events older than it.
    pub starting_after: Option<String>,
    /// An event id: only events newer than it.
    pub ending_before: Option<String>,
}

/// The developer's events, newest first.
#[utoipa::path(get, path = "/v0/webhook_events", tag = "events", params(EventsQuery),
    responses((status = 200, body = List<Event>), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<EventsQuery>,
) -> ApiResult<axum::Json<EventList>> {
    caller.require(Scope::WebhooksRead)?;
    let limit = limit(query.limit, 100, 500)?;
    let category = query
        .category
        .as_deref()
        .map(|c| c.parse::<Category>())
        .transpose()
        .map_err(|()| ApiError::invalid(Location::Query, "category", "category is not a known event category"))?;
    let cursor = |key: &'static str, value: &Option<String>| -> ApiResult<()> {
        match value {
            Some(v) if !ids::is_well_formed(v, ids::EVENT_PREFIX) => {
                Err(ApiError::invalid(Location::Query, key, format!("{key} must be an event id")))
            }
            _ => Ok(()),
        }
    };
    cursor("starting_after", &query.starting_after)?;
    cursor("ending_before", &query.ending_before)?;
    let page = EventPage {
        category,
        limit,
        starting_after: query.starting_after.as_deref(),
        ending_before: query.ending_before.as_deref(),
    };
    let rows = state.store.list_events(caller.developer_id(), &page).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after,ending_before", "a cursor names no event of yours")
    })?;
    event_list(rows)
}
