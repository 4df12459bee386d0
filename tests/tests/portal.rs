//! Portal sessions (API.md §8.10), on both backends: the internal listener
//! makes a session for one developer; its token works on the public API as
//! `Authorization: Bearer` with the session's scopes, for that developer
//! only, until it expires or is revoked; only its hash is stored, and it is
//! never in a URL's query or in a log. The dashboard's frame and branding
//! settings are checked on its answers.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tests::{ApiOptions, ApiResponse, TestApi, expect};
use uuid::Uuid;
use webhooks_model::Scope;

/// `POST /internal/portal_sessions` with `body`.
async fn open_session(api: &TestApi, body: &Value) -> ApiResponse {
    api.send(api.internal_request(Method::POST, "/internal/portal_sessions").json(body)).await
}

/// A session of `developer_id` with `extra` fields; asserts the 201.
async fn session(api: &TestApi, developer_id: Uuid, extra: Value) -> Value {
    let mut body = json!({ "developer_id": developer_id });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    open_session(api, &body).await.expect(201).clone()
}

fn token(session: &Value) -> String {
    session["token"].as_str().unwrap_or_else(|| panic!("no token: {session}")).to_owned()
}

/// A public API request with the session's token as a bearer.
fn bearer(api: &TestApi, method: Method, path: &str, token: &str) -> reqwest::RequestBuilder {
    api.raw_request(method, &format!("/v0{path}")).bearer_auth(token)
}

async fn get(api: &TestApi, path: &str, token: &str) -> ApiResponse {
    api.send(bearer(api, Method::GET, path, token)).await
}

async fn post(api: &TestApi, path: &str, token: &str, body: &Value) -> ApiResponse {
    api.send(bearer(api, Method::POST, path, token).header("Idempotency-Key", Uuid::new_v4().to_string()).json(body))
        .await
}

/// The answer to a token that no longer (or never did) open the API.
#[track_caller]
fn assert_refused(response: &ApiResponse) {
    response.expect_error_at(401, "invalid", "header", "Authorization");
}

#[tests::test]
async fn a_session_opens_the_api_for_its_developer_with_the_default_scopes() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&key, &receiver.url()).await;

    let before = chrono::Utc::now();
    let opened = session(&api, key.developer_id(), json!({})).await;
    let token = token(&opened);
    assert!(opened["id"].as_str().is_some_and(|id| id.parse::<Uuid>().is_ok()), "{opened}");
    assert!(token.starts_with("ps_") && token.len() >= 40, "{opened}");
    assert_eq!(opened["url"], format!("/dashboard#session={token}"), "the token is in the fragment only");
    let expires_at = expect::timestamp(&opened["expires_at"]);
    let ttl = (expires_at - before).num_seconds();
    assert!((895..=905).contains(&ttl), "default ttl is 900 s, got {ttl}");

    // The developer's objects, through the session.
    let listed = get(&api, "/webhooks", &token).await.expect(200).clone();
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(listed["data"][0]["id"], endpoint["id"]);
    let me = get(&api, "/api_keys/whoami", &token).await.expect(200).clone();
    assert_eq!(me["owner_id"], key.developer_id().to_string(), "{me}");
    assert_eq!(me["type"], "Public", "{me}");
    assert_eq!(me["scopes"], json!(["webhooks:read", "webhooks:write"]), "{me}");
    // webhooks:write holds.
    post(&api, "/webhooks", &token, &json!({ "url": receiver.url() })).await.expect(201);

    // A session for a developer the service has never seen works too (the
    // console may open the portal before any key exists): it sees nothing.
    let stranger = session(&api, Uuid::new_v4(), json!({})).await;
    let empty = get(&api, "/webhooks", &super::token(&stranger)).await.expect(200).clone();
    assert_eq!(empty["count"], 0, "{empty}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_session_can_do_only_what_its_scopes_name() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    api.create_endpoint(&key, &receiver.url()).await;

    // Default scopes: no API keys.
    let default = token(&session(&api, key.developer_id(), json!({})).await);
    get(&api, "/api_keys", &default).await.expect_error(403, "forbidden");
    post(&api, "/api_keys", &default, &json!({})).await.expect_error(403, "forbidden");

    // Read only: listing works, writing is refused.
    let reader = token(&session(&api, key.developer_id(), json!({ "scopes": ["webhooks:read"] })).await);
    get(&api, "/webhooks", &reader).await.expect(200);
    post(&api, "/webhooks", &reader, &json!({ "url": receiver.url() })).await.expect_error(403, "forbidden");

    // With the API-key scopes, keys made from the session are Public (no
    // Webhooks-Client header), and only as broad as the session.
    let keys = token(
        &session(&api, key.developer_id(), json!({ "scopes": ["api_keys:read", "api_keys:write", "webhooks:read"] }))
            .await,
    );
    get(&api, "/api_keys", &keys).await.expect(200);
    let made = post(&api, "/api_keys", &keys, &json!({ "scopes": ["webhooks:read"] })).await.expect(201).clone();
    assert_eq!(made["type"], "Public", "{made}");
    assert_eq!(made["owner_id"], key.developer_id().to_string(), "{made}");
    post(&api, "/api_keys", &keys, &json!({})).await.expect_error(403, "forbidden");
    post(&api, "/api_keys", &keys, &json!({ "scopes": ["webhooks:write"] })).await.expect_error(403, "forbidden");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn another_developers_objects_answer_404() {
    let api = TestApi::start().await.unwrap();
    let mine = api.new_developer().await;
    let theirs = api.new_developer().await;
    let receiver = api.receiver().await;
    let their_endpoint = api.create_endpoint(&theirs, &receiver.url()).await;
    let their_key = api.new_developer_key(&[Scope::WebhooksRead]).await;
    let id = their_endpoint["id"].as_str().unwrap();

    let token = token(
        &session(&api, mine.developer_id(), json!({ "scopes": ["webhooks:read", "webhooks:write", "api_keys:write"] }))
            .await,
    );
    get(&api, &format!("/webhooks/{id}"), &token).await.expect_error(404, "not_found");
    get(&api, &format!("/webhooks/{id}/logs"), &token).await.expect_error(404, "not_found");
    api.send(bearer(&api, Method::DELETE, &format!("/webhooks/{id}"), &token)).await.expect_error(404, "not_found");
    let their_key_path = format!("/api_keys/{}", their_key.id());
    api.send(bearer(&api, Method::DELETE, &their_key_path, &token)).await.expect_error(404, "not_found");
    let listed = get(&api, "/webhooks", &token).await.expect(200).clone();
    assert_eq!(listed["count"], 0, "{listed}");
    // Untouched.
    api.get(&format!("/webhooks/{id}"), &theirs).await.expect(200);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_session_stops_working_when_it_expires() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let short = session(&api, key.developer_id(), json!({ "ttl_seconds": 60 })).await;
    let long = session(&api, key.developer_id(), json!({ "ttl_seconds": 86400 })).await;
    let before = chrono::Utc::now();
    assert!((expect::timestamp(&short["expires_at"]) - before).num_seconds() <= 60, "{short}");
    get(&api, "/webhooks", &token(&short)).await.expect(200);

    // The service's clock, which tests move, passes the minimum lifetime.
    api.clock.advance(Duration::from_secs(61));
    assert_refused(&get(&api, "/webhooks", &token(&short)).await);
    assert_refused(&get(&api, "/api_keys/whoami", &token(&short)).await);
    get(&api, "/webhooks", &token(&long)).await.expect(200);
    api.clock.advance(Duration::from_secs(86400));
    assert_refused(&get(&api, "/webhooks", &token(&long)).await);
    // An expired session is no live session: revoking it answers 404.
    let path = format!("/internal/portal_sessions/{}", long["id"].as_str().unwrap());
    api.send(api.internal_request(Method::DELETE, &path)).await.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_revoked_session_stops_working_at_once() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let revoked = session(&api, key.developer_id(), json!({})).await;
    let kept = session(&api, key.developer_id(), json!({})).await;
    get(&api, "/webhooks", &token(&revoked)).await.expect(200);

    let path = format!("/internal/portal_sessions/{}", revoked["id"].as_str().unwrap());
    let gone = api.send(api.internal_request(Method::DELETE, &path)).await;
    assert_eq!(gone.status, 204, "{}", gone.text());
    assert!(gone.body.is_empty());
    assert_refused(&get(&api, "/webhooks", &token(&revoked)).await);
    get(&api, "/webhooks", &token(&kept)).await.expect(200);

    // Unknown ids, the same one again included, are 404.
    api.send(api.internal_request(Method::DELETE, &path)).await.expect_error(404, "not_found");
    let unknown = format!("/internal/portal_sessions/{}", Uuid::new_v4());
    api.send(api.internal_request(Method::DELETE, &unknown)).await.expect_error(404, "not_found");
    let nonsense = "/internal/portal_sessions/not-a-uuid";
    api.send(api.internal_request(Method::DELETE, nonsense)).await.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn tokens_that_are_not_sessions_are_refused() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let live = token(&session(&api, key.developer_id(), json!({})).await);

    let unknown = format!("ps_{}", "a1B2c3D4".repeat(6));
    for token in [unknown.as_str(), "ps_short", &live[..live.len() - 1], "", key.as_str()] {
        assert_refused(&get(&api, "/webhooks", token).await);
    }
    // Not a bearer: refused.
    let basic = api.raw_request(Method::GET, "/v0/webhooks").header("Authorization", format!("Basic {live}"));
    assert_refused(&api.send(basic).await);
    // The token in a URL's query is never read.
    let in_query = api.send(api.raw_request(Method::GET, &format!("/v0/webhooks?session={live}"))).await;
    in_query.expect(401);
    assert_eq!(in_query.json, expect::missing_key_body(), "{}", in_query.text());
    // An API key wins over a bearer when both are sent.
    let both = api.raw_request(Method::GET, "/v0/api_keys/whoami").header("Api-Key", key.as_str()).bearer_auth(&live);
    let me = api.send(both).await.expect(200).clone();
    assert_eq!(me["id"], key.id().to_string(), "{me}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn bad_bodies_answer_400_naming_the_field() {
    let api = TestApi::start().await.unwrap();
    let developer_id = Uuid::new_v4();
    let cases = [
        (json!({}), "required", "developer_id"),
        (json!({ "developer_id": "not-a-uuid" }), "invalid", "developer_id"),
        (json!({ "developer_id": developer_id, "ttl_seconds": 59 }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "ttl_seconds": 86401 }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "ttl_seconds": 0 }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "ttl_seconds": -60 }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "ttl_seconds": "900" }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "ttl_seconds": 90.5 }), "invalid", "ttl_seconds"),
        (json!({ "developer_id": developer_id, "scopes": [] }), "invalid", "scopes"),
        (json!({ "developer_id": developer_id, "scopes": ["webhooks:everything"] }), "invalid", "scopes"),
        (json!({ "developer_id": developer_id, "scopes": ["platform:api_unrestricted"] }), "invalid", "scopes"),
        (json!({ "developer_id": developer_id, "scopes": "webhooks:read" }), "invalid", "scopes"),
        (json!({ "developer_id": developer_id, "role": "admin" }), "invalid", "role"),
    ];
    for (body, code, field) in cases {
        open_session(&api, &body).await.expect_error_at(400, code, "body", field);
    }
    let not_json =
        api.internal_request(Method::POST, "/internal/portal_sessions").header("Content-Type", "application/json");
    api.send(not_json.body("{")).await.expect_error_at(400, "invalid", "body", "body");
    let array = api.internal_request(Method::POST, "/internal/portal_sessions").json(&json!([developer_id]));
    api.send(array).await.expect_error_at(400, "invalid", "body", "body");
    let text = api.internal_request(Method::POST, "/internal/portal_sessions").header("Content-Type", "text/plain");
    api.send(text.body(json!({ "developer_id": developer_id }).to_string()))
        .await
        .expect_error(415, "unsupported_media_type");
    // The bounds themselves are accepted.
    for ttl in [60, 86400] {
        session(&api, developer_id, json!({ "ttl_seconds": ttl })).await;
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_internal_token_guards_sessions() {
    let api = TestApi::start_with(ApiOptions { internal_token: Some("s3cret".into()), ..ApiOptions::default() })
        .await
        .unwrap();
    let bare = api.client.post(format!("{}/internal/portal_sessions", api.internal_url()));
    api.send(bare.json(&json!({ "developer_id": Uuid::new_v4() }))).await.expect(401);
    session(&api, Uuid::new_v4(), json!({})).await;

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_token_is_neither_stored_nor_logged() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let revoked = session(&api, key.developer_id(), json!({})).await;
    let revoked_token = token(&revoked);
    get(&api, "/webhooks", &revoked_token).await.expect(200);
    let path = format!("/internal/portal_sessions/{}", revoked["id"].as_str().unwrap());
    api.send(api.internal_request(Method::DELETE, &path)).await;
    assert_refused(&get(&api, "/webhooks", &revoked_token).await);
    let live_token = token(&session(&api, key.developer_id(), json!({})).await);
    get(&api, "/webhooks", &live_token).await.expect(200);

    let dump = api.stored_dump().await;
    let secret = revoked_token.trim_start_matches("ps_");
    assert!(!dump.contains(secret), "the token is stored");
    assert!(!dump.contains(live_token.trim_start_matches("ps_")), "the token is stored");
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    assert!(!dump.contains(&hex), "the token is stored as bytes");
    // What the binary logged (the API's lines included), at its level.
    let lines = tests::recorded_lines();
    assert!(lines.iter().any(|line| line.contains("portal session created")), "the creation is logged");
    assert!(!lines.iter().any(|line| line.contains(secret)), "a log line holds the token");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_dashboard_forbids_frames_by_default() {
    let api = TestApi::start().await.unwrap();
    for path in ["/dashboard", "/dashboard/app.js", "/dashboard/style.css"] {
        let page = api.send(api.raw_request(Method::GET, path)).await;
        page.expect(200);
        let policy = page.headers["content-security-policy"].to_str().unwrap();
        assert!(policy.ends_with("frame-ancestors 'none'"), "{path}: {policy}");
        assert_eq!(page.headers["x-frame-options"], "DENY", "{path}");
    }
    let page = api.send(api.raw_request(Method::GET, "/dashboard")).await;
    assert!(page.text().contains("<title>Webhooks dashboard</title>"));

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_settings_allow_frames_and_brand_the_dashboard() {
    let extra_args = [
        "--portal-frame-ancestors",
        "https://console.example.com http://127.0.0.1:9999",
        "--portal-title",
        "Acme <Payments>",
        "--portal-accent-color",
        "#0A7F5a",
    ]
    .map(String::from)
    .to_vec();
    let api = TestApi::start_with(ApiOptions { extra_args, ..ApiOptions::default() }).await.unwrap();
    let page = api.send(api.raw_request(Method::GET, "/dashboard")).await;
    page.expect(200);
    let policy = page.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.ends_with("frame-ancestors https://console.example.com http://127.0.0.1:9999"), "{policy}");
    assert!(page.headers.get("x-frame-options").is_none(), "no DENY when framing is allowed");
    let html = page.text();
    assert!(html.contains("<title>Acme &lt;Payments&gt;</title>"), "{html}");
    assert!(html.contains("<span class=\"brand\">Acme &lt;Payments&gt;</span>"), "{html}");
    let style = api.send(api.raw_request(Method::GET, "/dashboard/style.css")).await;
    assert!(style.text().contains("--accent: #0a7f5a;"), "{}", style.text());

    api.shutdown().await.unwrap();
}

#[test]
fn bad_portal_settings_are_refused_at_start() {
    for (flag, value) in [
        ("--portal-accent-color", "blue"),
        ("--portal-accent-color", "#12345"),
        ("--portal-frame-ancestors", "https://a.example/path"),
        ("--portal-frame-ancestors", "*; script-src *"),
        ("--portal-title", ""),
    ] {
        assert!(api::Config::from_args(["webhooks-api", flag, value]).is_err(), "{flag} {value}");
    }
}
