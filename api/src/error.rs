//! The error model of API.md §2: one enum, one mapping to status and stable
//! `code`, and one body shape. Server faults are logged with their cause and
//! answered without it.

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;

/// Which part of the request is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Location {
    Path,
    Query,
    Body,
    Header,
}

/// `source` of an error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorSource {
    pub location: Location,
    /// Comma-separated names of the offending fields, parameters or headers.
    #[schema(min_length = 1)]
    pub key: String,
}

/// One entry of the `errors` list of a 500.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorItem {
    #[schema(min_length = 1, max_length = 256)]
    pub code: &'static str,
    #[schema(min_length = 1, max_length = 512)]
    pub message: String,
}

/// Every error body (API.md §2). Field order is the wire order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable, for programs: `required`, `invalid`, `limit_exceeded`,
    /// `forbidden`, `not_found`, `method_not_allowed`, `invalid_state`,
    /// `timeout`, `too_large`, `unsupported_media_type`,
    /// `idempotency_key_reused`, `rate_limited`, `unavailable`, `unexpected`.
    #[schema(min_length = 1, max_length = 256)]
    pub code: &'static str,
    /// Only on the two 401 bodies, which repeat `source` at the top level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// Only on the two 401 bodies: `Api-Key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'static str>,
    /// For people; may change.
    #[schema(min_length = 1, max_length = 512)]
    pub message: String,
    /// The part of the request at fault, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<ErrorSource>,
    /// Only on a 500: one entry, `unexpected`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<ErrorItem>>,
}

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing Api-Key header")]
    MissingApiKey,
    #[error("invalid Api-Key header")]
    InvalidApiKey,
    #[error("{message}")]
    Required { location: Location, key: String, message: String },
    #[error("{message}")]
    Invalid { location: Location, key: String, message: String },
    #[error("{0}")]
    LimitExceeded(String),
    #[error("this API key lacks the scope {0}")]
    Forbidden(&'static str),
    #[error("not found")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{0}")]
    InvalidState(String),
    /// The body is over `limit` bytes, the value of `setting`.
    #[error("request body over {limit} bytes")]
    TooLarge { limit: usize, setting: &'static str },
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("Idempotency-Key reused with a different request")]
    IdempotencyKeyReused,
    #[error("rate limited for {0:?}")]
    RateLimited(std::time::Duration),
    /// The service is too busy for this request now (the database, or the
    /// share of it expensive reads may hold): try again after the wait.
    #[error("unavailable for {0:?}: {1}")]
    Unavailable(std::time::Duration, &'static str),
    #[error("internal error")]
    Unexpected(#[source] anyhow::Error),
}

impl ApiError {
    /// A missing part of the request.
    pub fn required(location: Location, key: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Required { location, key: key.into(), message: message.into() }
    }

    /// A malformed or unacceptable part of the request.
    pub fn invalid(location: Location, key: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid { location, key: key.into(), message: message.into() }
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingApiKey | ApiError::InvalidApiKey => StatusCode::UNAUTHORIZED,
            ApiError::Required { .. } | ApiError::Invalid { .. } | ApiError::LimitExceeded(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::InvalidState(_) => StatusCode::CONFLICT,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(..) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body this error answers with; `message` is cut to the contract's
    /// 512 characters (it may quote what the client sent).
    pub fn body(&self) -> ErrorBody {
        let mut body = self.full_body();
        if body.message.chars().count() > 512 {
            body.message = body.message.chars().take(509).chain("...".chars()).collect();
        }
        body
    }

    fn full_body(&self) -> ErrorBody {
        let plain =
            |code, message: String| ErrorBody { code, location: None, name: None, message, source: None, errors: None };
        let header_401 = |code, message: &str| ErrorBody {
            code,
            location: Some(Location::Header),
            name: Some("Api-Key"),
            message: message.to_owned(),
            source: Some(ErrorSource { location: Location::Header, key: "Api-Key".into() }),
            errors: None,
        };
        match self {
            ApiError::MissingApiKey => header_401("required", "Missing Api-Key header"),
            ApiError::InvalidApiKey => header_401("invalid", "Invalid Api-Key header"),
            ApiError::Required { location, key, message } | ApiError::Invalid { location, key, message } => {
                let code = if matches!(self, ApiError::Required { .. }) { "required" } else { "invalid" };
                ErrorBody {
                    source: Some(ErrorSource { location: *location, key: key.clone() }),
                    ..plain(code, message.clone())
                }
            }
            ApiError::LimitExceeded(message) => plain("limit_exceeded", message.clone()),
            ApiError::Forbidden(scope) => {
                plain("forbidden", format!("This API key does not have the scope {scope} that this operation needs"))
            }
            ApiError::NotFound => plain("not_found", "The requested resource was not found".into()),
            ApiError::MethodNotAllowed => {
                plain("method_not_allowed", "This method is not allowed on this resource".into())
            }
            ApiError::InvalidState(message) => plain("invalid_state", message.clone()),
            ApiError::TooLarge { limit, setting } => plain(
                "too_large",
                format!("The request body is over the limit of {limit} bytes (the service's {setting})"),
            ),
            ApiError::UnsupportedMediaType => {
                plain("unsupported_media_type", "The request body must be JSON (Content-Type: application/json)".into())
            }
            ApiError::IdempotencyKeyReused => ErrorBody {
                source: Some(ErrorSource { location: Location::Header, key: "Idempotency-Key".into() }),
                ..plain(
                    "idempotency_key_reused",
                    "This Idempotency-Key was already used with a different request".into(),
                )
            },
            ApiError::RateLimited(wait) => {
                plain("rate_limited", format!("Too many requests for this developer; retry after {} s", wait.as_secs()))
            }
            ApiError::Unavailable(wait, why) => {
                plain("unavailable", format!("{why}; retry after {} s", wait.as_secs().max(1)))
            }
            ApiError::Unexpected(_) => {
                let message = "An unexpected error occurred; please try again".to_owned();
                ErrorBody {
                    errors: Some(vec![ErrorItem { code: "unexpected", message: message.clone() }]),
                    ..plain("unexpected", message)
                }
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Unexpected(cause) => tracing::error!(error = ?cause, "request failed"),
            other => tracing::debug!(%status, error = %other, "request refused"),
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::CONFLICT || status == StatusCode::INTERNAL_SERVER_ERROR {
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        }
        if let ApiError::RateLimited(wait) | ApiError::Unavailable(wait, _) = &self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs().max(1)));
        }
        if let ApiError::TooLarge { .. } = &self {
            // The rest of the body may stay unread, so the server closes
            // the connection: say so, or a client may send its next request
            // on it and lose that request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl ApiError {
    /// This error's body under another status, for the few answers (like the
    /// internal listener's 401) that reuse a body shape.
    pub fn into_status(self, status: StatusCode) -> Response {
        (status, Json(self.body())).into_response()
    }
}

impl From<webhooks_store::StoreError> for ApiError {
    fn from(error: webhooks_store::StoreError) -> Self {
        use webhooks_store::StoreError;
        match error {
            StoreError::TimedOut(cause) => {
                tracing::warn!(error = %cause, "a request's statement took too long");
                ApiError::Unavailable(std::time::Duration::from_secs(1), "The service is busy")
            }
            // A batch of the ingest writer's, with this request's in it.
            StoreError::Batch(shared) if matches!(*shared, StoreError::TimedOut(_)) => {
                tracing::warn!(error = %shared, "a batch's statement took too long");
                ApiError::Unavailable(std::time::Duration::from_secs(1), "The service is busy")
            }
            error => ApiError::Unexpected(error.into()),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(error: anyhow::Error) -> Self {
        ApiError::Unexpected(error)
    }
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_401_bodies_are_word_for_word() {
        assert_eq!(
            serde_json::to_string(&ApiError::MissingApiKey.body()).unwrap(),
            r#"{"code":"required","location":"header","name":"Api-Key","message":"Missing Api-Key header","source":{"location":"header","key":"Api-Key"}}"#
        );
        assert_eq!(
            serde_json::to_string(&ApiError::InvalidApiKey.body()).unwrap(),
            r#"{"code":"invalid","location":"header","name":"Api-Key","message":"Invalid Api-Key header","source":{"location":"header","key":"Api-Key"}}"#
        );
    }

    #[test]
    fn messages_stay_within_512_characters() {
        let error = ApiError::invalid(Location::Body, "x", "é".repeat(2000));
        assert_eq!(error.body().message.chars().count(), 512);
    }

    #[test]
    fn a_500_says_nothing_of_its_cause() {
        let error = ApiError::Unexpected(anyhow::anyhow!("relation \"endpoints\" does not exist"));
        let body = serde_json::to_string(&error.body()).unwrap();
        assert!(!body.contains("relation"), "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["code"], "unexpected");
        assert_eq!(json["errors"][0]["code"], "unexpected");
    }

    #[test]
    fn a_statement_out_of_time_is_503_alone_or_in_a_batch() {
        use webhooks_store::StoreError;
        let timed_out = || StoreError::TimedOut(Box::new(std::io::Error::other("canceling statement")));
        let batch = StoreError::Batch(std::sync::Arc::new(timed_out()));
        for error in [timed_out(), batch] {
            let response = ApiError::from(error).into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(response.headers().contains_key(axum::http::header::RETRY_AFTER));
        }
    }
}
