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
use webhooks_store::{EventDelivery, EventPage, LogFilter, SendOutcome, StoredEvent};

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
        .route("/webhook_events/{event_id}", get(show))
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
    let _read = state.reads.begin(caller.developer_id()).await?;
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
    /// `succeeded` (a 2xx answer) or `failed` (anything else).
    #[param(pattern = "^(succeeded|failed)$")]
    pub status: Option<String>,
    /// Only attempts at events of this type.
    #[param(min_length = 1, max_length = 200)]
    pub event_type: Option<String>,
    /// Only attempts at this event.
    #[param(pattern = "^wh_[0-9a-f]{32}$", min_length = 35, max_length = 35)]
    pub event_id: Option<String>,
    /// Only attempts made at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<String>,
    /// Only attempts made before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
}

/// A time of a query (RFC 3339, years 1 to 9999), or 400 naming `name`.
fn query_time(value: Option<&str>, name: &str) -> ApiResult<Option<chrono::DateTime<chrono::Utc>>> {
    value
        .map(|text| {
            chrono::DateTime::parse_from_rfc3339(text.trim())
                .ok()
                .map(|at| at.with_timezone(&chrono::Utc))
                .filter(crate::extract::time_in_range)
                .ok_or_else(|| {
                    ApiError::invalid(
                        Location::Query,
                        name,
                        format!("{name} must be an RFC 3339 time such as 2026-11-21T10:04:05.123Z"),
                    )
                })
        })
        .transpose()
}

/// The filters of a log query, checked: each bad value is 400 naming it.
fn log_filter(query: &LogsQuery) -> ApiResult<LogFilter> {
    let succeeded = match query.status.as_deref() {
        None => None,
        Some("succeeded") => Some(true),
        Some("failed") => Some(false),
        Some(_) => return Err(ApiError::invalid(Location::Query, "status", "status must be succeeded or failed")),
    };
    let event_type = match query.event_type.as_deref() {
        None => None,
        Some(name) if !name.is_empty() && name.len() <= 200 && name.bytes().all(|b| b.is_ascii_graphic()) => {
            Some(name.to_owned())
        }
        Some(_) => {
            return Err(ApiError::invalid(Location::Query, "event_type", "event_type must be an event type name"));
        }
    };
    let event_id = match query.event_id.as_deref() {
        None => None,
        Some(id) if ids::is_well_formed(id, ids::EVENT_PREFIX) => Some(id.to_owned()),
        Some(_) => return Err(ApiError::invalid(Location::Query, "event_id", "event_id must be an event id (wh_…)")),
    };
    let since = query_time(query.since.as_deref(), "since")?;
    let until = query_time(query.until.as_deref(), "until")?;
    if let (Some(since), Some(until)) = (since, until)
        && until <= since
    {
        return Err(ApiError::invalid(Location::Query, "until", "until must be later than since"));
    }
    Ok(LogFilter { succeeded, event_type, event_id, since, until })
}

/// The endpoint's delivery log.
///
/// Needs `webhooks:read`. One entry per delivery attempt, newest first. The
/// filters (`status`, `event_type`, `event_id`, `since`, `until`) combine;
/// a page (`starting_after`) keeps them.
#[utoipa::path(get, path = "/v0/webhooks/{id}/logs", tag = "events", operation_id = "listDeliveryLogs",
    params(EndpointId, LogsQuery),
    responses(
        (status = 200, description = "Delivery attempts, newest first", body = List<DeliveryLog>),
        (status = 400, description = "`invalid` query parameter (`source.key` names it): `limit` out of range, a `starting_after` that is no log id of this endpoint, a `status` other than `succeeded`/`failed`, a malformed `event_type` or `event_id`, a `since`/`until` that is no RFC 3339 time, an `until` not after `since`, or an unknown parameter", body = ErrorBody),
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
    let filter = log_filter(&query)?;
    let endpoint = find(&state, &caller, &id).await?;
    let _read = state.reads.begin(caller.developer_id()).await?;
    let rows = state.store.list_logs(&endpoint.id, limit + 1, cursor, &filter).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after", "starting_after names no log entry of this endpoint")
    })?;
    Ok(axum::Json(List::page(rows, limit, false)))
}

/// One delivery of an event, as `GET /webhook_events/{event_id}` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventDeliveryState {
    pub endpoint_id: String,
    /// `held`, `pending`, `retrying`, `waiting`, `succeeded`, `failed` or
    /// `cancelled` (its endpoint was deleted).
    pub state: String,
    /// Attempts made so far.
    pub attempts: i32,
    /// The HTTP status of the latest attempt; null before the first, or when
    /// no answer came.
    pub last_status: Option<i32>,
    /// When the next attempt is due; null once settled, or while held.
    #[serde(serialize_with = "webhooks_model::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<EventDelivery> for EventDeliveryState {
    fn from(d: EventDelivery) -> Self {
        EventDeliveryState {
            endpoint_id: d.endpoint_id,
            state: d.state,
            attempts: d.attempts,
            last_status: d.last_status,
            next_attempt_at: d.next_attempt_at,
        }
    }
}

/// An event as delivered, with its deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveredEvent {
    #[serde(flatten)]
    pub event: Event,
    /// One per endpoint the event is meant for, by endpoint id.
    pub deliveries: Vec<EventDeliveryState>,
}

/// One of the developer's events, exactly as it was delivered, with where
/// each of its deliveries stands.
///
/// Needs `webhooks:read`. Another developer's event answers 404.
#[utoipa::path(get, path = "/v0/webhook_events/{event_id}", tag = "events", operation_id = "getWebhookEvent",
    params(("event_id" = String, Path, description = "The event's `event_id` (`wh_` and 32 hex digits)")),
    responses(
        (status = 200, description = "The `Event` as POSTed to receivers, plus `deliveries`", body = DeliveredEvent),
        (status = 403, description = "`forbidden`: the calling key lacks `webhooks:read`", body = ErrorBody),
        (status = 404, description = "`not_found`: no event of this developer has this id", body = ErrorBody),
    ))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(event_id): Path<String>,
) -> ApiResult<axum::Json<Box<RawValue>>> {
    caller.require(Scope::WebhooksRead)?;
    if !ids::is_well_formed(&event_id, ids::EVENT_PREFIX) {
        return Err(ApiError::NotFound);
    }
    let _read = state.reads.begin(caller.developer_id()).await?;
    let found = state.store.find_delivered_event(caller.developer_id(), &event_id).await?.ok_or(ApiError::NotFound)?;
    let deliveries: Vec<EventDeliveryState> = found.deliveries.into_iter().map(Into::into).collect();
    let deliveries = serde_json::to_string(&deliveries).map_err(|e| ApiError::Unexpected(e.into()))?;
    // The stored body, byte for byte as delivered, with `deliveries` added.
    let trimmed = found.body.trim_end();
    let Some(open) = trimmed.strip_suffix('}') else {
        return Err(ApiError::Unexpected(anyhow::anyhow!("a stored event is not a JSON object")));
    };
    let body = RawValue::from_string(format!("{open},\"deliveries\":{deliveries}}}"))
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok(axum::Json(body))
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
    let category = match query.category.as_deref() {
        None => None,
        Some(name) => Some(state.catalog.category(name).await.ok_or_else(|| {
            ApiError::invalid(Location::Query, "category", "category is not a category of the event catalog")
        })?),
    };
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
    let _read = state.reads.begin(caller.developer_id()).await?;
    let rows = state.store.list_events(caller.developer_id(), &page).await?.ok_or_else(|| {
        ApiError::invalid(Location::Query, "starting_after,ending_before", "a cursor names no event of yours")
    })?;
    // A page before `ending_before` alone is read upwards and flipped: its
    // extra row is the newest, first.
    let backwards = page.ending_before.is_some() && page.starting_after.is_none();
    event_list(List::page(rows, limit, backwards))
}
