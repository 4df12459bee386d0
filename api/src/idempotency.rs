//! `Idempotency-Key` on every POST (API.md §3): the first answer that did
//! something (a 2xx) is stored per developer and key for 24 hours and replayed
//! for the same request; the same key with another request answers 422. A
//! refusal is not kept. The route's scope is checked first:
//! a key without it gets 403, never a stored answer.

use aws_lc_rs::digest;
use axum::{
    body::{Body, to_bytes},
    extract::{MatchedPath, Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use webhooks_store::{Claim, StoredResponse};

use crate::{
    auth::Caller,
    error::{ApiError, Location},
    state::AppState,
};

/// The request header.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
/// Set on a replayed answer.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// Set on a response whose body carries secrets: the listed top-level fields
/// are left out of the stored copy, so a replay answers the same status and
/// body without them (the plaintext of an API key is shown once, never stored).
#[derive(Debug, Clone, Copy)]
pub struct Redact(pub &'static [&'static str]);

/// The body kept for replay: `body` less the fields a [`Redact`] names.
fn stored_body(body: &[u8], redact: Option<Redact>) -> Vec<u8> {
    let Some(Redact(fields)) = redact else { return body.to_vec() };
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut object) => {
            for field in fields {
                object.remove(*field);
            }
            serde_json::to_vec(&object).unwrap_or_default()
        }
        // Not an object: keep nothing rather than risk keeping a secret.
        Err(_) => b"{}".to_vec(),
    }
}

/// Largest response kept for replay; every answer of this API is far smaller.
const MAX_STORED_RESPONSE: usize = 1024 * 1024;

fn valid_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// What makes two requests "the same": method, path and body bytes.
pub(crate) fn fingerprint(method: &Method, path: &str, body: &[u8]) -> Vec<u8> {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(method.as_str().as_bytes());
    context.update(b" ");
    context.update(path.as_bytes());
    context.update(b"\n");
    context.update(body);
    context.finish().as_ref().to_vec()
}

/// The request's `Idempotency-Key`, if it has one; 400 `invalid` when it is
/// not 1 to 255 visible characters.
pub(crate) fn key_from_headers(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else { return Ok(None) };
    match value.to_str().ok().filter(|k| valid_key(k)) {
        Some(key) => Ok(Some(key.to_owned())),
        None => Err(ApiError::invalid(
            Location::Header,
            IDEMPOTENCY_KEY_HEADER,
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )),
    }
}

/// Runs after authentication on the public routes.
pub async fn idempotency(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    if request.method() != Method::POST {
        return Ok(next.run(request).await);
    }
    let caller = request.extensions().get::<Caller>().cloned().ok_or(ApiError::MissingApiKey)?;
    // The scope before anything is claimed or replayed: a stored answer is
    // the developer's, and only a key allowed to make the request may see it.
    let route = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    let scope = route.and_then(crate::routes::post_scope).ok_or_else(|| {
        ApiError::Unexpected(anyhow::anyhow!("POST route {route:?} declares no scope in routes::post_scope"))
    })?;
    caller.require(scope)?;
    let key = key_from_headers(request.headers())?.ok_or_else(|| {
        ApiError::required(Location::Header, IDEMPOTENCY_KEY_HEADER, "Every POST needs an Idempotency-Key header")
    })?;

    let (parts, body) = request.into_parts();
    let limit = state.config.max_request_bytes;
    let bytes = to_bytes(body, limit).await.map_err(|_| ApiError::TooLarge { limit, setting: "MAX_REQUEST_BYTES" })?;
    let developer_id = caller.developer_id();
    let print = fingerprint(&parts.method, parts.uri.path(), &bytes);

    match state.store.claim_idempotency_key(developer_id, &key, &print).await? {
        Claim::Claimed => {}
        Claim::Mismatch => return Err(ApiError::IdempotencyKeyReused),
        Claim::InProgress => {
            return Err(ApiError::InvalidState(
                "A request with this Idempotency-Key is still in progress; retry later".into(),
            ));
        }
        Claim::Completed(stored) => return Ok(replay(stored)),
    }

    // The work and its record run in their own task: a client that hangs up
    // mid-request must not leave the key claimed and unanswered.
    let request = Request::from_parts(parts, Body::from(bytes));
    let store = state.store.clone();
    tokio::spawn(async move {
        let response = next.run(request).await;
        let status = response.status();
        // Only an answer that did something is kept. Every refusal (4xx)
        // is given before a handler changes anything, so the client may fix
        // its request and retry with the same key, as with Stripe; a failure
        // on our side (5xx) likewise leaves the key free.
        if !status.is_success() {
            if let Err(error) = store.release_idempotency_key(developer_id, &key).await {
                tracing::warn!(error = %error, "could not release an idempotency key");
            }
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let bytes = match to_bytes(body, MAX_STORED_RESPONSE).await {
            Ok(bytes) => bytes,
            Err(error) => {
                let _ = store.release_idempotency_key(developer_id, &key).await;
                return Err(ApiError::Unexpected(anyhow::anyhow!("response body unreadable: {error}")));
            }
        };
        let stored = StoredResponse {
            status: status.as_u16(),
            body: stored_body(&bytes, parts.extensions.get::<Redact>().copied()),
        };
        store.complete_idempotency_key(developer_id, &key, &stored).await?;
        Ok(Response::from_parts(parts, Body::from(bytes)))
    })
    .await
    .map_err(|e| ApiError::Unexpected(e.into()))?
}

/// A stored answer, replayed with `Idempotent-Replayed: true`.
pub(crate) fn replay(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut response = (status, stored.body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        assert!(valid_key("a"));
        assert!(valid_key(&"k".repeat(255)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"k".repeat(256)));
        assert!(!valid_key("has space"));
        assert!(!valid_key("tab\t"));
    }

    #[test]
    fn redacted_fields_are_not_stored() {
        let body = br#"{"id":"k1","key":"sk-test-secret","name":"n"}"#;
        let stored = String::from_utf8(stored_body(body, Some(Redact(&["key"])))).unwrap();
        assert!(!stored.contains("secret"), "{stored}");
        assert!(stored.contains(r#""id":"k1""#));
        assert_eq!(stored_body(body, None), body.to_vec());
    }

    #[test]
    fn fingerprint_covers_path_and_body() {
        let a = fingerprint(&Method::POST, "/v0/webhooks", b"{}");
        assert_eq!(a, fingerprint(&Method::POST, "/v0/webhooks", b"{}"));
        assert_ne!(a, fingerprint(&Method::POST, "/v0/api_keys", b"{}"));
        assert_ne!(a, fingerprint(&Method::POST, "/v0/webhooks", b"{ }"));
    }
}
