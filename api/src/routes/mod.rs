//! The public `/v0` API: one module per resource, each with its `router()`,
//! merged here behind authentication and idempotency.

pub mod api_keys;
pub mod events;
pub mod webhooks;

use axum::{Router, extract::DefaultBodyLimit, middleware, routing::get};

use crate::{auth, error::ApiError, idempotency, openapi, state::AppState};

/// Every public route, with its middleware.
pub fn router(state: AppState) -> Router {
    let authenticated = Router::new()
        .merge(api_keys::router())
        .merge(webhooks::router())
        .merge(events::router())
        .route_layer(middleware::from_fn_with_state(state.clone(), idempotency::idempotency))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::authenticate));
    let v0 = Router::new().merge(authenticated).route("/openapi.json", get(openapi::serve));
    Router::new()
        .nest("/v0", v0)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_request_bytes))
        .with_state(state)
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}
