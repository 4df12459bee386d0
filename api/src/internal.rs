//! The internal listener: health, readiness, metrics, event ingest and
//! portal sessions. Keep it off the public network; off loopback it needs
//! `INTERNAL_TOKEN`, and with a token set every request needs
//! `Authorization: Bearer <token>` except the probes `/healthz` and
//! `/readyz`, which orchestrators call without one and which tell nothing
//! but up or down.

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
};
use webhooks_listener::Token;

use crate::{error::ApiError, state::AppState};

/// The internal routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::ingest::router())
        .merge(crate::portal::router())
        .route("/internal/event_types/{name}", axum::routing::put(put_event_type))
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            Token::new(state.config.internal_token(), &PROBES),
            webhooks_listener::require_token,
        ))
        .layer(middleware::from_fn_with_state(state.config.limits.request_timeout, webhooks_listener::request_timeout))
        .with_state(state)
}

/// Adds or replaces a type of the event catalog.
///
/// Takes effect at once in this process, and within a second in every other
/// (API and dispatcher alike); no restart. The example must satisfy the
/// schema, which must be a valid JSON Schema (2020-12). A category named
/// here for the first time becomes a category of the catalog.
#[utoipa::path(put, path = "/internal/event_types/{name}", tag = "internal", operation_id = "putEventType",
    params(("name" = String, Path, description = "1 to 128 of `a-z`, `0-9`, `_`, `-`, `.`, starting with a letter")),
    request_body = crate::catalog::EventTypeInput,
    security(("internal_token" = [])),
    responses(
        (status = 200, description = "The type was changed", body = webhooks_model::EventType),
        (status = 201, description = "The type is new", body = webhooks_model::EventType),
        (status = 400, description = "`invalid`/`required` (`source.key` names the field): a bad name, category or description, a schema that is not one, an example that breaks its schema", body = crate::error::ErrorBody),
        (status = 401, description = "`invalid`: the bearer token is missing or wrong (only when `INTERNAL_TOKEN` is set)", body = crate::error::ErrorBody),
    ))]
pub async fn put_event_type(
    State(state): State<AppState>,
    crate::extract::Path(name): crate::extract::Path<String>,
    crate::extract::Json(input): crate::extract::Json<crate::catalog::EventTypeInput>,
) -> Result<Response, ApiError> {
    let new = crate::catalog::check_input(&name, input).map_err(|refusal| match refusal {
        crate::catalog::Refusal::Invalid { key: "name", message } => {
            ApiError::invalid(crate::error::Location::Path, "name", message)
        }
        crate::catalog::Refusal::Invalid { key, message } => {
            ApiError::invalid(crate::error::Location::Body, key, message)
        }
    })?;
    let (stored, created) = state.catalog.put(&new).await?;
    tracing::info!(name = %stored.name, category = %stored.category, created, "event type stored");
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(stored)).into_response())
}

/// The paths served without the token: the liveness and readiness probes.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// Liveness: the process is up.
///
/// Served without the token, and tells nothing else.
#[utoipa::path(get, path = "/healthz", tag = "internal", operation_id = "healthz", security(()),
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String)))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the database answers and (distributed mode) the relay holds a
/// broker channel.
///
/// Served without the token. The body says which part is down.
#[utoipa::path(get, path = "/readyz", tag = "internal", operation_id = "readyz", security(()),
    responses(
        (status = 200, description = "Ready", body = Object,
            example = json!({"database": "ok", "broker": "ok"})),
        (status = 503, description = "Not ready", body = Object,
            example = json!({"database": "ok", "broker": "down"})),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let database = state.store.ping().await.is_ok();
    // Standalone mode has no broker: its queue is the store.
    let broker_up = state.producer.broker_up();
    let broker = broker_up.unwrap_or(true);
    let body = serde_json::json!({
        "database": if database { "ok" } else { "down" },
        "broker": match broker_up { None => "embedded", Some(true) => "ok", Some(false) => "down" },
    });
    let status = if database && broker { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

/// Metrics in the OpenMetrics text format, for Prometheus.
///
/// Needs the bearer token when `INTERNAL_TOKEN` is set.
#[utoipa::path(get, path = "/metrics", tag = "internal", operation_id = "metrics", security(("internal_token" = [])),
    responses((status = 200, description = "The API's metrics (and in standalone mode delivery's)",
        content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.render(state.delivery_metrics.as_deref()),
    )
        .into_response()
}
