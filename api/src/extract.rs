//! Extractors whose rejections speak the error model: JSON bodies and query
//! strings with the offending field named in `source.key`.

use std::borrow::Cow;

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
    http::{StatusCode, header, request::Parts},
};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Location};

/// A JSON request body. An empty body reads as `{}`, so optional bodies work;
/// unknown fields, wrong types and bad JSON answer 400 with `source`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

/// The public API's body limit (`MAX_REQUEST_BYTES`), for the error that
/// names it; set on every request by the router.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
            });
        let limit = req.extensions().get::<BodyLimit>().map_or(0, |limit| limit.0);
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge { limit, setting: "MAX_REQUEST_BYTES" }
            } else {
                ApiError::invalid(Location::Body, "body", "The request body could not be read")
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return parse_json(b"{}").map(Json);
        }
        if is_json != Some(true) {
            return Err(ApiError::UnsupportedMediaType);
        }
        parse_json(&bytes).map(Json)
    }
}

/// Deserializes a JSON object, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Syntax first: serde_json reports some type mismatches (a number where an
    // enum name belongs) as syntax errors, which must still name their field.
    if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
        return Err(ApiError::invalid(Location::Body, "body", "The request body is not valid JSON"));
    }
    // Every body is an object; serde would also read a struct from an array
    // of its fields in order (`[null, "active"]`), which no client means.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid(Location::Body, "body", "The request body must be a JSON object"));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let inner = error.inner();
        let text = inner.to_string();
        let field = top_level_field(error.path());
        if let Some(missing) = text.strip_prefix("missing field `").and_then(|t| t.split('`').next()) {
            let key = field.map_or_else(|| missing.to_owned(), |f| f.to_owned());
            return ApiError::required(Location::Body, key, format!("The field {missing} is required"));
        }
        if let Some(unknown) = text.strip_prefix("unknown field `").and_then(|t| t.split('`').next()) {
            if unknown.is_empty() {
                return ApiError::invalid(Location::Body, "body", "Unknown field with an empty name");
            }
            return ApiError::invalid(Location::Body, unknown, format!("Unknown field {unknown}"));
        }
        let key = field.filter(|f| !f.is_empty()).unwrap_or("body").to_owned();
        ApiError::invalid(Location::Body, key.clone(), format!("The field {key} is invalid: {}", public_reason(&text)))
    })
}

/// The first segment of a serde path (`event_categories[2]` → `event_categories`).
fn top_level_field(path: &serde_path_to_error::Path) -> Option<&str> {
    path.iter().find_map(|segment| match segment {
        serde_path_to_error::Segment::Map { key } => Some(key.as_str()),
        _ => None,
    })
}

/// serde's message without the position suffix, which says nothing to a user.
fn public_reason(text: &str) -> &str {
    text.split(" at line ").next().unwrap_or(text)
}

/// A query string, with the parameter at fault named in `source.key`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = named_pairs(parts.uri.query().unwrap_or_default());
        let deserializer = serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer).map(Query).map_err(|error| {
            let text = error.inner().to_string();
            if let Some(unknown) = text.strip_prefix("unknown field `").and_then(|t| t.split('`').next()) {
                let key = if unknown.is_empty() { "query" } else { unknown };
                return ApiError::invalid(Location::Query, key, format!("Unknown query parameter {unknown}"));
            }
            let key = top_level_field(error.path()).filter(|f| !f.is_empty()).unwrap_or("query").to_owned();
            ApiError::invalid(Location::Query, key.clone(), format!("The query parameter {key} is invalid"))
        })
    }
}

/// A path parameter. An id that cannot even be read (say, not UTF-8) names
/// nothing, so it answers 404 like any other unknown id.
#[derive(Debug, Clone)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|_| ApiError::NotFound)
    }
}

/// The query less its pairs without a name (`?=`, `?=x`): they name no
/// parameter, so there is nothing to refuse them by.
fn named_pairs(query: &str) -> Cow<'_, str> {
    let pairs = url::form_urlencoded::parse(query.as_bytes());
    if pairs.clone().all(|(name, _)| !name.is_empty()) {
        return Cow::Borrowed(query);
    }
    let named = pairs.filter(|(name, _)| !name.is_empty());
    Cow::Owned(url::form_urlencoded::Serializer::new(String::new()).extend_pairs(named).finish())
}

/// Whether a time a request gave is one the stores keep: years 1 to 9999,
/// as RFC 3339 writes them (chrono reads years far beyond, which
/// PostgreSQL refuses).
pub fn time_in_range(at: &chrono::DateTime<chrono::Utc>) -> bool {
    use chrono::Datelike;
    (1..=9999).contains(&at.year())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        url: String,
        #[serde(default)]
        tags: Vec<u32>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Kinds {
        kinds: Vec<webhooks_model::Category>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Page {
        limit: Option<i64>,
    }

    async fn query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
        let request = axum::http::Request::get(format!("/p?{query}")).body(()).unwrap();
        let (mut parts, ()) = request.into_parts();
        Query::<T>::from_request_parts(&mut parts, &()).await.map(|Query(q)| q)
    }

    #[tokio::test]
    async fn nameless_query_pairs_are_nothing_and_unknown_names_are_named() {
        assert_eq!(query::<Page>("=&limit=5&=x").await.unwrap().limit, Some(5));
        assert_eq!(source(query::<Page>("limt=5").await.unwrap_err()), ("invalid", "limt".into()));
        assert_eq!(source(query::<Page>("limit=x").await.unwrap_err()), ("invalid", "limit".into()));
    }

    fn source(error: ApiError) -> (&'static str, String) {
        let body = error.body();
        (body.code, body.source.map(|s| s.key).unwrap_or_default())
    }

    #[test]
    fn rejections_name_the_field() {
        assert_eq!(source(parse_json::<Body>(b"{}").unwrap_err()), ("required", "url".into()));
        assert_eq!(source(parse_json::<Body>(br#"{"url":1}"#).unwrap_err()), ("invalid", "url".into()));
        assert_eq!(source(parse_json::<Body>(br#"{"url":"x","tags":["a"]}"#).unwrap_err()), ("invalid", "tags".into()));
        assert_eq!(source(parse_json::<Body>(br#"{"url":"x","y":1}"#).unwrap_err()), ("invalid", "y".into()));
        assert_eq!(source(parse_json::<Body>(b"{\"url\":").unwrap_err()), ("invalid", "body".into()));
        assert_eq!(source(parse_json::<Body>(b"[1]").unwrap_err()).0, "invalid");
        assert_eq!(source(parse_json::<Body>(br#"["x", []]"#).unwrap_err()), ("invalid", "body".into()));
        assert_eq!(source(parse_json::<Body>(b"null").unwrap_err()), ("invalid", "body".into()));
        assert!(parse_json::<Body>(br#" {"url":"x"}"#).is_ok());
        assert_eq!(source(parse_json::<Body>(br#"{"url":"x","":1}"#).unwrap_err()), ("invalid", "body".into()));
        assert_eq!(source(parse_json::<Kinds>(br#"{"kinds":[1]}"#).unwrap_err()), ("invalid", "kinds".into()));
    }
}
