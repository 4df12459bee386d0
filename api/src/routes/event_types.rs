//! The event catalog as developers read it (API.md §8.9): every type with
//! its category, schema and example.

use axum::{Router, extract::State, routing::get};
use webhooks_model::{EventType, List};

use crate::{
    auth::Caller,
    error::{ApiError, ApiResult, ErrorBody},
    extract::Path,
    state::AppState,
};

/// The routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new().route("/event_types", get(list)).route("/event_types/{name}", get(get_one))
}

/// The event catalog.
///
/// Any valid key. Every type, by name; deprecated types are listed with
/// `deprecated: true`.
#[utoipa::path(get, path = "/v0/event_types", tag = "event_types", operation_id = "listEventTypes",
    responses(
        (status = 200, description = "Every event type, by name", body = List<EventType>),
    ))]
pub async fn list(State(state): State<AppState>, _caller: Caller) -> axum::Json<List<EventType>> {
    axum::Json(List::from(state.catalog.list()))
}

/// One event type.
///
/// Any valid key.
#[utoipa::path(get, path = "/v0/event_types/{name}", tag = "event_types", operation_id = "getEventType",
    params(("name" = String, Path, description = "The type's name, such as `transfer.updated.status_transitioned`")),
    responses(
        (status = 200, description = "The event type", body = EventType),
        (status = 404, description = "`not_found`: the catalog has no such type", body = ErrorBody),
    ))]
pub async fn get_one(
    State(state): State<AppState>,
    _caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<EventType>> {
    let entry = state.catalog.get(&name).await.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(entry.event_type.clone()))
}
