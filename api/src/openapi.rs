//! The OpenAPI 3.1 document, generated from the handlers and types, served at
//! `GET /v0/openapi.json` and checked in as `api/openapi.json`.
//!
//! Each handler's annotation lists the answers of its own making (its body
//! and parameter checks, its scope, its 404); [`Common`] adds those that the
//! middleware and the server give, each on exactly the operations where it
//! can occur, as shared `components.responses`.

use axum::{Json, response::IntoResponse};
use serde::Deserialize;
use utoipa::{
    IntoParams, Modify, OpenApi,
    openapi::{
        Components, ContentBuilder, Header, HeaderBuilder, ObjectBuilder, Ref, RefOr, Required, Response,
        ResponseBuilder, Schema, Type,
        link::LinkBuilder,
        path::{HttpMethod, Operation},
        security::{ApiKey as ApiKeyScheme, ApiKeyValue, SecurityScheme},
    },
};

use crate::routes::{api_keys, event_types, events, test_events, webhooks};

/// The `Idempotency-Key` header every `POST` carries (API.md §3).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// 1 to 255 visible ASCII characters, chosen by the client, per developer.
    /// The same key with the same request within 24 hours answers the first
    /// answer again (`Idempotent-Replayed: true`) and does nothing else; with
    /// another request it answers 422 `idempotency_key_reused`. Missing: 400
    /// `required`; malformed: 400 `invalid`.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255, pattern = "^[\\x21-\\x7E]+$")]
    #[allow(dead_code)] // Read by the idempotency middleware, not through this type.
    pub idempotency_key: String,
}

/// Names of the shared answers in `components.responses`.
const UNAUTHORIZED: &str = "Unauthorized";
const METHOD_NOT_ALLOWED: &str = "MethodNotAllowed";
const REQUEST_TIMEOUT: &str = "RequestTimeout";
const IN_PROGRESS: &str = "IdempotencyKeyInProgress";
const TOO_LARGE: &str = "PayloadTooLarge";
const UNSUPPORTED_MEDIA_TYPE: &str = "UnsupportedMediaType";
const KEY_REUSED: &str = "IdempotencyKeyReused";
const RATE_LIMITED: &str = "RateLimited";
const UNAVAILABLE: &str = "Unavailable";
const HEADERS_TOO_LARGE: &str = "HeadersTooLarge";

/// The `Api-Key` scheme, the shared answers, and on each operation the
/// shared answers it can give:
///
/// - every operation: 401 (authentication), 408 (`REQUEST_TIMEOUT`), 429
///   (the request limit), 431 (request headers over the server's limit),
///   503 (the database too busy for it now);
/// - every operation with a body (`POST`, `PUT`): 413 and 415;
/// - every `POST`: 409 (its `Idempotency-Key` still in progress) and 422 (the
///   key reused with another request).
///
/// 405 answers a method that no operation of a path has, so it belongs to no
/// operation: it is described in `components.responses` and in the info.
struct Common;

fn error_content() -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build()
}

fn error_response(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content("application/json", error_content())
}

fn header(schema: ObjectBuilder, description: &str) -> Header {
    HeaderBuilder::new().schema(schema).description(Some(description)).build()
}

fn connection_close() -> Header {
    header(
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["close"])),
        "The server closes the connection after this answer",
    )
}

/// The shared answers, by name.
fn shared_responses() -> Vec<(&'static str, Response)> {
    vec![
        (
            UNAUTHORIZED,
            error_response(
                "`Api-Key` missing (`required`) or not a valid key of this environment (`invalid`); \
                 the two bodies are fixed and carry `location` and `name` besides `source`. Without `Api-Key`, \
                 a portal session's `Authorization: Bearer` that is unknown, expired or revoked answers \
                 `invalid` with `source.key` `Authorization`",
            )
            .build(),
        ),
        (
            METHOD_NOT_ALLOWED,
            error_response("`method_not_allowed`: the path exists, the method does not; `Allow` lists those it has")
                .header(
                    "Allow",
                    header(ObjectBuilder::new().schema_type(Type::String), "The methods of this path, comma-separated"),
                )
                .build(),
        ),
        (
            REQUEST_TIMEOUT,
            error_response(
                "`timeout`: the request, its body included, was not answered within `REQUEST_TIMEOUT`; \
                 send it again (a POST with the same `Idempotency-Key`)",
            )
            .header("Connection", connection_close())
            .build(),
        ),
        (
            IN_PROGRESS,
            error_response(
                "`invalid_state`: a request with this `Idempotency-Key` is still in progress; retry later \
                 with the same key",
            )
            .build(),
        ),
        (
            TOO_LARGE,
            error_response("`too_large`: the body is over `MAX_REQUEST_BYTES` (64 KiB by default)")
                .header("Connection", connection_close())
                .build(),
        ),
        (
            UNSUPPORTED_MEDIA_TYPE,
            error_response(
                "`unsupported_media_type`: a non-empty body whose `Content-Type` is not `application/json` \
                 (or `application/*+json`)",
            )
            .build(),
        ),
        (
            KEY_REUSED,
            error_response(
                "`idempotency_key_reused`: this `Idempotency-Key` was used within 24 hours with another \
                 request (method, path or body bytes)",
            )
            .build(),
        ),
        (
            RATE_LIMITED,
            error_response(
                "`rate_limited`: the developer is over `RATE_LIMIT_PER_SECOND` (in bursts of `RATE_LIMIT_BURST`), \
                 or has three searches (log searches, event lists and lookups, upcoming events) or one recovery \
                 count in flight already; nothing was done",
            )
            .header(
                "Retry-After",
                header(
                    ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)),
                    "Whole seconds to wait before the next request",
                ),
            )
            .build(),
        ),
        (
            UNAVAILABLE,
            error_response(
                "`unavailable`: the database is too busy for this request now (a statement ran past \
                 `DATABASE_STATEMENT_TIMEOUT`, or no connection came free in time, or the process's share of \
                 connections for searches is taken); nothing was done, and the connection it held is free",
            )
            .header(
                "Retry-After",
                header(
                    ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)),
                    "Whole seconds to wait before trying again",
                ),
            )
            .build(),
        ),
        (
            HEADERS_TOO_LARGE,
            error_response(
                "`too_large`: the request line and headers are over the server's limit (100 headers, \
                 or about 400 KiB); nothing was done",
            )
            .header("Connection", connection_close())
            .build(),
        ),
    ]
}

/// Whether the body `schema` (a component) requires any property. A body
/// that requires none may be left out: the server reads an empty body as `{}`
/// (`extract::Json`).
fn requires_properties(components: &Components, schema: &RefOr<Schema>) -> bool {
    let schema = match schema {
        RefOr::Ref(reference) => {
            let name = reference.ref_location.rsplit('/').next().unwrap_or_default();
            match components.schemas.get(name) {
                Some(schema) => schema,
                None => return true,
            }
        }
        schema => schema,
    };
    match schema {
        RefOr::T(Schema::Object(object)) => !object.required.is_empty(),
        _ => true,
    }
}

/// The operation and status of an answer, and its links: name and target
/// operation.
type LinksFrom = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// Links from an answer that names an object (by operation, its status) to
/// the operations on that object: `{id}` is the answer's `id`. Generated
/// clients and stateful testers follow them.
const LINKS: &[LinksFrom] = &[
    ("createApiKey", "201", &[("DeleteApiKey", "deleteApiKey")]),
    (
        "createWebhook",
        "201",
        &[
            ("GetWebhook", "getWebhook"),
            ("UpdateWebhook", "updateWebhook"),
            ("DeleteWebhook", "deleteWebhook"),
            ("ListUpcomingEvents", "listUpcomingEvents"),
            ("ListDeliveryLogs", "listDeliveryLogs"),
            // No link to `sendEvent`: it needs an event of the endpoint as
            // well, which a new endpoint's answer cannot name; its 404 for an
            // unknown event would read as the endpoint being gone.
        ],
    ),
];

fn add_links(operation: &mut Operation) {
    let Some(id) = operation.operation_id.as_deref() else { return };
    for (from, status, links) in LINKS {
        if id != *from {
            continue;
        }
        let Some(RefOr::T(response)) = operation.responses.responses.get_mut(*status) else { continue };
        for (name, target) in *links {
            let link = LinkBuilder::new()
                .operation_id(*target)
                .parameter("id", "$response.body#/id")
                .description(format!("`{target}` on the object this answer names"))
                .build();
            response.links.insert((*name).into(), RefOr::T(link));
        }
    }
}

/// Adds `name` as the answer of `status` to `operation` unless its handler
/// documents that status itself.
fn add(operation: &mut Operation, status: &str, name: &str) {
    operation.responses.responses.entry(status.into()).or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
}

impl Modify for Common {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("api_key", SecurityScheme::ApiKey(ApiKeyScheme::Header(ApiKeyValue::new("Api-Key"))));
        components.add_security_scheme(
            "portal_session",
            SecurityScheme::Http(
                utoipa::openapi::security::HttpBuilder::new()
                    .scheme(utoipa::openapi::security::HttpAuthScheme::Bearer)
                    .description(Some(
                        "A portal session's token (`POST /internal/portal_sessions`), instead of `Api-Key`: the \
                         session's developer and scopes, until it expires or is revoked",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "internal_token",
            SecurityScheme::Http(
                utoipa::openapi::security::HttpBuilder::new()
                    .scheme(utoipa::openapi::security::HttpAuthScheme::Bearer)
                    .description(Some("`INTERNAL_TOKEN`, when the service runs with one"))
                    .build(),
            ),
        );
        for (name, response) in shared_responses() {
            components.responses.insert(name.into(), RefOr::T(response));
        }
        let components = components.clone();
        for (path, item) in openapi.paths.paths.iter_mut() {
            // The internal listener: its own address, none of the public
            // API's middleware (keys, idempotency store, request limit).
            if !path.starts_with("/v0/") {
                item.servers = Some(vec![utoipa::openapi::Server::new("http://127.0.0.1:8081")]);
                for operation in [&mut item.get, &mut item.put, &mut item.post, &mut item.delete].into_iter().flatten()
                {
                    add(operation, "408", REQUEST_TIMEOUT);
                    add(operation, "431", HEADERS_TOO_LARGE);
                }
                continue;
            }
            let operations = [
                (HttpMethod::Get, &mut item.get),
                (HttpMethod::Put, &mut item.put),
                (HttpMethod::Post, &mut item.post),
                (HttpMethod::Delete, &mut item.delete),
                (HttpMethod::Patch, &mut item.patch),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else { continue };
                add_links(operation);
                add(operation, "401", UNAUTHORIZED);
                add(operation, "408", REQUEST_TIMEOUT);
                add(operation, "429", RATE_LIMITED);
                add(operation, "431", HEADERS_TOO_LARGE);
                add(operation, "503", UNAVAILABLE);
                if let Some(body) = &mut operation.request_body {
                    let schemas = body.content.values().filter_map(|content| content.schema.as_ref());
                    let required = schemas.into_iter().any(|schema| requires_properties(&components, schema));
                    body.required = Some(if required { Required::True } else { Required::False });
                    add(operation, "413", TOO_LARGE);
                    add(operation, "415", UNSUPPORTED_MEDIA_TYPE);
                }
                if method == HttpMethod::Post {
                    add(operation, "409", IN_PROGRESS);
                    add(operation, "422", KEY_REUSED);
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Webhooks API",
        description = "Register HTTPS endpoints, switch them on and off, list upcoming events, resend and read delivery logs.\n\n\
Every request carries `Api-Key` (or a portal session's `Authorization: Bearer`); every `POST` carries `Idempotency-Key`. Every error answer has the body `ErrorBody`: \
`code` and `message`, and `source` where a part of the request is at fault. Besides the answers each operation lists, \
a method that a path does not have answers 405 `method_not_allowed` with `Allow` (`components.responses.MethodNotAllowed`), \
and an unknown path 404 `not_found`.",
        version = "v0"
    ),
    paths(
        api_keys::whoami, api_keys::create, api_keys::list, api_keys::remove,
        webhooks::create, webhooks::list, webhooks::show, webhooks::update, webhooks::remove,
        webhooks::rotate_key, webhooks::recover, webhooks::show_recovery,
        events::upcoming, events::logs, events::send, events::list, events::show,
        event_types::list, event_types::get_one, test_events::send_test,
        crate::ingest::ingest, crate::internal::put_event_type, crate::internal::healthz, crate::internal::readyz, crate::internal::metrics,
        crate::portal::create, crate::portal::revoke,
    ),
    components(schemas(crate::error::ErrorBody)),
    modifiers(&Common),
    security(("api_key" = []), ("portal_session" = [])),
)]
struct Document;

/// The document as pretty JSON, with a trailing newline (the checked-in form).
pub fn document() -> String {
    let json = Document::openapi().to_pretty_json().unwrap_or_default();
    // utoipa 5 writes the fields of a Link Object in snake case; OpenAPI
    // names it `operationId`. As a key (quoted, then a colon) the name occurs
    // nowhere else: a quote inside a string value is escaped.
    let mut json = json.replace("\"operation_id\": ", "\"operationId\": ");
    json.push('\n');
    json
}

/// `GET /v0/openapi.json`.
pub async fn serve() -> impl IntoResponse {
    let value: serde_json::Value = serde_json::from_str(&document()).unwrap_or_default();
    Json(value)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use serde_json::Value;

    #[test]
    fn checked_in_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == super::document(),
            "api/openapi.json is stale; regenerate it with `cargo run -p webhooks-api -- openapi > api/openapi.json`"
        );
    }

    fn operations(document: &Value) -> Vec<(String, String, &Value)> {
        let mut all = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            // `servers` is no operation (the internal listener's paths have it).
            for (method, operation) in item.as_object().unwrap().iter().filter(|(key, _)| *key != "servers") {
                all.push((method.to_uppercase(), path.clone(), operation));
            }
        }
        all
    }

    /// Generated clients name their methods after `operationId`s.
    #[test]
    fn operation_ids_are_unique() {
        let document: Value = serde_json::from_str(&super::document()).unwrap();
        let mut seen = HashSet::new();
        for (method, path, operation) in operations(&document) {
            let id = operation["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(seen.insert(id.to_owned()), "operationId {id} repeats ({method} {path})");
        }
    }

    /// Every parameter sits where the server reads it: `{name}` in the path,
    /// the rest never `in: path`.
    #[test]
    fn parameters_sit_where_the_server_reads_them() {
        let document: Value = serde_json::from_str(&super::document()).unwrap();
        for (method, path, operation) in operations(&document) {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().unwrap();
                let placeholder = path.contains(&format!("{{{name}}}"));
                assert_eq!(parameter["in"] == "path", placeholder, "{method} {path}: parameter {name}");
                if parameter["in"] == "query" {
                    assert_ne!(parameter["required"], true, "{method} {path}: query parameter {name}");
                }
            }
        }
    }

    /// The answers the middleware and the server give are documented on the
    /// operations that can give them, each with the error body.
    #[test]
    fn shared_answers_are_documented_where_they_occur() {
        let document: Value = serde_json::from_str(&super::document()).unwrap();
        for (method, path, operation) in operations(&document) {
            let responses = operation["responses"].as_object().unwrap();
            if !path.starts_with("/v0/") {
                // The internal listener: no keys, no idempotency store, no request limit.
                for status in ["408", "431"] {
                    assert!(responses.contains_key(status), "{method} {path} does not document {status}");
                }
                continue;
            }
            let mut expected = vec!["401", "408", "429", "431"];
            if operation.get("requestBody").is_some() {
                expected.extend(["413", "415"]);
            }
            if method == "POST" {
                expected.extend(["400", "409", "422"]);
            }
            for status in expected {
                assert!(responses.contains_key(status), "{method} {path} does not document {status}");
            }
        }
        for (name, response) in document["components"]["responses"].as_object().unwrap() {
            assert_eq!(
                response["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                "{name}"
            );
        }
        let ids: HashSet<&str> =
            operations(&document).iter().filter_map(|(_, _, operation)| operation["operationId"].as_str()).collect();
        for (method, path, operation) in operations(&document) {
            for (status, response) in operation["responses"].as_object().unwrap() {
                for (name, link) in response["links"].as_object().into_iter().flatten() {
                    let target = link["operationId"].as_str().unwrap_or_default();
                    assert!(ids.contains(target), "{method} {path} {status}: link {name} names no operation");
                }
            }
        }
        let create = &document["paths"]["/v0/api_keys"]["post"];
        let idempotency_key = &create["parameters"][0];
        assert_eq!(idempotency_key["name"], "Idempotency-Key");
        assert_eq!(idempotency_key["required"], true);
        assert_eq!(idempotency_key["schema"]["maxLength"], 255);
    }
}
