//! Events as developers see them: an endpoint's upcoming events, its delivery
//! log, `send`, and the developer's event list (API.md §4, §5).

use axum::{
    Router,
    extract::State,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;
use webhooks_model::{Category, DeliveryLog, Event, List, Scope, ids};
use webhooks_store::{EventPage, SendOutcome, StoredEvent};

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody, Location},
    extract::{Json, Path, Query},
    openapi::IdempotencyKey,
    routes::webhooks::{EndpointId, find},
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
    has_more: bool,
}

fn event_list(page: List<StoredEvent>) -> ApiResult<axum::Json<EventList>> {
    let data = page
        .data
        .into_iter()
        .map(|row| RawValue::from_string(row.body))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok(axum::Json(EventList { count: data.len(), data, has_more: page.has_more }))
}

/// An upcoming event as `GET /webhooks/{id}/events` lists it: the `Event`,
/// and where its delivery to this endpoint stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct UpcomingEvent {
    #[serde(flatten)]
    pub event: Event,
    /// Null when no delivery was made yet: an earlier event of a
    /// `beginning_of_time` endpoint, which only `send` or `recover` deliver.
    pub delivery: Option<UpcomingDeliveryState>,
}

/// Where an upcoming delivery stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct UpcomingDeliveryState {
    /// `held` (kept while the endpoint is disabled), `pending` (queued for
    /// its first attempt), `retrying`, or `waiting` (an `ordered` endpoint's
    /// delivery whose turn has not come).
    #[schema(pattern = "^(held|pending|retrying|waiting)$")]
    pub state: String,
    /// Attempts made so far.
    pub attempts: i32,
    /// When the next attempt is due; null while held.
    #[serde(serialize_with = "webhooks_model::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// `event` (an `Event` object as stored) with `"delivery": delivery` added.
fn with_delivery(event: String, delivery: Option<&UpcomingDeliveryState>) -> ApiResult<Box<RawValue>> {
    let delivery = serde_json::to_string(&delivery).map_err(|e| ApiError::Unexpected(e.into()))?;
    let trimmed = event.trim_end();
    let Some(open) = trimmed.strip_suffix('}') else {
        return Err(ApiError::Unexpected(anyhow::anyhow!("a stored event is not a JSON object")));
    };
    RawValue::from_string(format!("{open},\"delivery\":{delivery}}}")).map_err(|e| ApiError::Unexpected(e.into()))
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
#[into_params(parameter_in = Query)]
pub struct UpcomingQuery {
    /// How many events to return: 1 to 100, default 10.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
}

/// The endpoint's upcoming events.
///
/// Needs `webhooks:read`. The events meant for the endpoint that it has not
/// been sent yet (deliveries `held`, `pending` or `retrying`, and for
/// `event_epoch: beginning_of_time` the earlier events of its categories),
/// oldest first.
#[utoipa::path(get, path = "/v0/webhooks/{id}/events", tag = "events", operation_id = "listUpcomingEvents",
    params(EndpointId, UpcomingQuery),
    responses(
        (status = 200, description = "Upcoming events, oldest first, each with its delivery's state", body = List<UpcomingEvent>),
        (status = 400, description = "`invalid` query parameter (`source.key` names it): `limit` out of range, or an unknown parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
    ))]
pub async fn upcoming(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<UpcomingQuery>,
) -> ApiResult<axum::Json<EventList>> {
    caller.require(Scope::WebhooksRead)?;
    let limit = limit(query.limit, 10, 100)?;
    let endpoint = find(&state, &caller, &id).await?;
    let page = List::page(state.store.upcoming_events(&endpoint, limit + 1).await?, limit, false);
    let ids: Vec<String> = page.data.iter().map(|row| row.id.clone()).collect();
    let deliveries: std::collections::HashMap<String, UpcomingDeliveryState> = state
        .store
        .upcoming_deliveries(&endpoint.id, &ids)
        .await?
        .into_iter()
        .map(|d| {
            (
                d.event_id,
                UpcomingDeliveryState { state: d.state, attempts: d.attempts, next_attempt_at: d.next_attempt_at },
            )
        })
        .collect();
    // Read after the list: a delivery that settled in between is no longer
    // upcoming, and leaves the page.
    let upcoming = |d: &&UpcomingDeliveryState| matches!(d.state.as_str(), "held" | "pending" | "retrying" | "waiting");
    let data = page
        .data
        .into_iter()
        .filter(|row| deliveries.get(&row.id).is_none_or(|d| upcoming(&d)))
        .map(|row| with_delivery(row.body, deliveries.get(&row.id)))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(axum::Json(EventList { count: data.len(), data, has_more: page.has_more }))
}

/// Query of `GET /webhooks/{id}/logs`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// How many entries to return: 1 to 100, default 10.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// The `id` of a log entry of this endpoint: only entries older than it
    /// (the next page). An id that names no entry of the endpoint is 400.
    #[param(value_type = Option<Uuid>)]
    pub starting_after: Option<String>,
}

/// The endpoint's delivery log.
///
/// Needs `webhooks:read`. One entry per delivery attempt, newest first.
#[utoipa::path(get, path = "/v0/webhooks/{id}/logs", tag = "events", operation_id = "listDeliveryLogs",
    params(EndpointId, LogsQuery),
    responses(
        (status = 200, description = "Delivery attempts, newest first", body = List<DeliveryLog>),
        (status = 400, description = "`invalid` query parameter (`source.key` names it): `limit` out of range, a `starting_after` that is no log id of this endpoint, or an unknown parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or it is deleted", body = ErrorBody),
    ))]
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
    let rows = state.store.list_logs(&endpoint.id, limit + 1, cursor).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after", "starting_after names no log entry of this endpoint")
    })?;
    Ok(axum::Json(List::page(rows, limit, false)))
}

/// Body of `POST /webhooks/{id}/send`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendEvent {
    /// The event's `event_id`: `wh_` and 32 lowercase hex digits. An id of
    /// another shape answers 404, as an unknown one does.
    #[schema(pattern = "^wh_[0-9a-f]{32}$", min_length = 35, max_length = 35)]
    pub event_id: String,
}

/// The answer of `send`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SendAnswer {
    /// What was queued, for people.
    #[schema(min_length = 1)]
    pub message: String,
}

/// Sends an event to the endpoint now.
///
/// Needs `webhooks:write`. Queues the event for this endpoint whether it is
/// `active` or `disabled`, and restarts its retry schedule.
#[utoipa::path(post, path = "/v0/webhooks/{id}/send", tag = "events", operation_id = "sendEvent",
    params(EndpointId, IdempotencyKey),
    request_body = SendEvent,
    responses(
        (status = 200, description = "The event is queued for delivery to the endpoint", body = SendAnswer,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`invalid`/`required` `event_id` (an event not meant for this endpoint: another category, or from before a `webhook_creation` endpoint existed), or `Idempotency-Key` missing or malformed", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:write`", body = ErrorBody),
        (status = 404, description = "`not_found`: no endpoint of this developer has this id, or no event of this developer has `event_id`", body = ErrorBody),
    ))]
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
            state.producer.wake();
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
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of this category.
    #[param(value_type = Option<Category>)]
    pub category: Option<String>,
    /// How many events to return: 1 to 500, default 100.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// The `event_id` of one of the developer's events: only events older
    /// than it (the next page). An id that names no event of the developer is
    /// 400.
    #[param(pattern = "^wh_[0-9a-f]{32}$", min_length = 35, max_length = 35)]
    pub starting_after: Option<String>,
    /// The `event_id` of one of the developer's events: only events newer
    /// than it (the previous page). An id that names no event of the
    /// developer is 400.
    #[param(pattern = "^wh_[0-9a-f]{32}$", min_length = 35, max_length = 35)]
    pub ending_before: Option<String>,
}

/// The developer's events.
///
/// Needs `webhooks:read`. Newest first, paged by event ids.
#[utoipa::path(get, path = "/v0/webhook_events", tag = "events", operation_id = "listWebhookEvents",
    params(EventsQuery),
    responses(
        (status = 200, description = "Events, newest first", body = List<Event>),
        (status = 400, description = "`invalid` query parameter (`source.key` names it): an unknown `category`, `limit` out of range, a cursor that is no event id of the developer, or an unknown parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
    ))]
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
        limit: limit + 1,
        starting_after: query.starting_after.as_deref(),
        ending_before: query.ending_before.as_deref(),
    };
    let rows = state.store.list_events(caller.developer_id(), &page).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after,ending_before", "a cursor names no event of yours")
    })?;
    // A page before `ending_before` alone is read upwards and flipped: its
    // extra row is the newest, first.
    let backwards = page.ending_before.is_some() && page.starting_after.is_none();
    event_list(List::page(rows, limit, backwards))
}
