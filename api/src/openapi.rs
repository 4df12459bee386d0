//! The OpenAPI 3.1 document, generated from the handlers and types, served at
//! `GET /v0/openapi.json` and checked in as `api/openapi.json`.

use axum::{Json, response::IntoResponse};
use utoipa::{
    Modify, OpenApi,
    openapi::{
        ContentBuilder, HeaderBuilder, ObjectBuilder, Ref, ResponseBuilder, Type,
        security::{ApiKey as ApiKeyScheme, ApiKeyValue, SecurityScheme},
    },
};

use crate::routes::{api_keys, events, webhooks};

/// The `Api-Key` scheme, and the answers every operation can give whatever
/// it does: the two 401s and the 429 of the request limit.
struct Common;

impl Modify for Common {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("api_key", SecurityScheme::ApiKey(ApiKeyScheme::Header(ApiKeyValue::new("Api-Key"))));
        let error_body = || ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
        let unauthorized = ResponseBuilder::new()
            .description("`Api-Key` missing (`required`) or not a valid key (`invalid`)")
            .content("application/json", error_body())
            .build();
        let retry_after = HeaderBuilder::new()
            .schema(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)))
            .description(Some("Seconds to wait before the next request"))
            .build();
        let rate_limited = ResponseBuilder::new()
            .description("`rate_limited`: the developer is over `RATE_LIMIT_PER_SECOND`")
            .header("Retry-After", retry_after)
            .content("application/json", error_body())
            .build();
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                let responses = &mut operation.responses.responses;
                responses.entry("401".into()).or_insert_with(|| unauthorized.clone().into());
                responses.entry("429".into()).or_insert_with(|| rate_limited.clone().into());
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Webhooks API",
        description = "Register HTTPS endpoints, switch them on and off, list upcoming events, resend and read delivery logs. Every request carries `Api-Key`; every POST carries `Idempotency-Key`.",
        version = "v0"
    ),
    paths(
        api_keys::whoami, api_keys::create, api_keys::list, api_keys::remove,
        webhooks::create, webhooks::list, webhooks::show, webhooks::update, webhooks::remove,
        events::upcoming, events::logs, events::send, events::list,
    ),
    components(schemas(crate::error::ErrorBody)),
    modifiers(&Common),
    security(("api_key" = [])),
)]
struct Document;

/// The document as pretty JSON, with a trailing newline (the checked-in form).
pub fn document() -> String {
    let mut json = Document::openapi().to_pretty_json().unwrap_or_default();
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
    #[test]
    fn checked_in_document_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == super::document(),
            "api/openapi.json is stale; regenerate it with `cargo run -p api -- openapi > api/openapi.json`"
        );
    }
}
