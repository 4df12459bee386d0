//! The public `/v0` API: one module per resource, each with its `router()`,
//! merged here behind authentication and idempotency.

pub mod api_keys;
pub mod event_types;
pub mod events;
pub mod test_events;
pub mod webhooks;

use axum::{Router, extract::DefaultBodyLimit, middleware, routing::get};
use webhooks_model::Scope;

use crate::{auth, error::ApiError, idempotency, openapi, state::AppState};

/// Every public route, with its middleware.
pub fn router(state: AppState) -> Router {
    let authenticated = Router::new()
        .merge(api_keys::router())
        .merge(webhooks::router())
        .merge(events::router())
        .merge(event_types::router())
        .merge(test_events::router())
        .route_layer(middleware::from_fn_with_state(state.clone(), idempotency::idempotency))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::authenticate));
    let v0 = Router::new().merge(authenticated).route("/openapi.json", get(openapi::serve));
    Router::new()
        .nest("/v0", v0)
        .merge(crate::dashboard::router(crate::dashboard::Branding::from_config(&state.config)))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_request_bytes))
        .layer(axum::Extension(crate::extract::BodyLimit(state.config.max_request_bytes)))
        .with_state(state)
}

/// The scope each POST route needs, by its route (`/v0/webhooks/{id}/send`).
/// The idempotency middleware checks it before it claims or replays a key,
/// so a key without the scope gets 403 rather than another key's stored
/// answer, and its 403 is never the stored answer of the key. The handlers
/// check their scope again; a unit test keeps this list and the routes in
/// step.
pub(crate) fn post_scope(route: &str) -> Option<Scope> {
    match route {
        "/v0/api_keys" => Some(Scope::ApiKeysWrite),
        "/v0/webhooks"
        | "/v0/webhooks/{id}/send"
        | "/v0/webhooks/{id}/test"
        | "/v0/webhooks/{id}/rotate_key"
        | "/v0/webhooks/{id}/recover" => Some(Scope::WebhooksWrite),
        _ => None,
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every POST of the OpenAPI document (which lists every public route)
    /// has its scope declared, and every declared route is a POST there.
    #[test]
    fn every_post_route_declares_its_scope() {
        let document: serde_json::Value = serde_json::from_str(&crate::openapi::document()).unwrap();
        let paths = document["paths"].as_object().unwrap();
        let posts: Vec<&str> = paths
            .iter()
            .filter(|(path, item)| path.starts_with("/v0/") && item.get("post").is_some())
            .map(|(path, _)| path.as_str())
            .collect();
        assert_eq!(posts.len(), 6, "{posts:?}");
        for path in posts {
            assert!(post_scope(path).is_some(), "POST {path} declares no scope in post_scope");
        }
        assert_eq!(post_scope("/v0/webhooks/{id}"), None);
    }
}
