//! The OpenAPI 3.1 document, generated from the handlers and types, served at
//! `GET /v0/openapi.json` and checked in as `api/openapi.json`.

use axum::{Json, response::IntoResponse};
use utoipa::{
    Modify, OpenApi,
    openapi::security::{ApiKey as ApiKeyScheme, ApiKeyValue, SecurityScheme},
};

use crate::routes::{api_keys, events, webhooks};

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("api_key", SecurityScheme::ApiKey(ApiKeyScheme::Header(ApiKeyValue::new("Api-Key"))));
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
    modifiers(&Security),
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
