//! Authentication (API.md §1, §2): the two fixed 401 bodies, and which keys work.

use reqwest::Method;
use tests::{TestApi, expect};
use webhooks_config::Environment;
use webhooks_model::Scope;

#[tests::test]
async fn a_request_without_api_key_gets_the_missing_body() {
    let api = TestApi::start().await.unwrap();

    for (method, path) in
        [(Method::GET, "/v0/api_keys/whoami"), (Method::GET, "/v0/webhooks"), (Method::POST, "/v0/webhooks")]
    {
        let response = api.send(api.raw_request(method, path).header("Idempotency-Key", "k")).await;
        response.expect(401);
        assert_eq!(response.json, expect::missing_key_body(), "{}: {}", response.request, response.text());
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_misspelled_header_name_counts_as_missing() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    let response = api.send(api.raw_request(Method::GET, "/v0/api_keys/whoami").header("Api-Kye", key.as_str())).await;
    response.expect(401);
    assert_eq!(response.json, expect::missing_key_body(), "{}", response.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_unknown_key_gets_the_invalid_body() {
    let api = TestApi::start().await.unwrap();
    let unknown = format!("sk-test-{}", "a1B2c3D4".repeat(6));

    for key in [unknown.as_str(), "sk-test-short", "nonsense", "sk-test-"] {
        let response = api.get("/api_keys/whoami", key).await;
        response.expect(401);
        assert_eq!(response.json, expect::invalid_key_body(), "key {key:?}: {}", response.text());
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_key_of_the_other_environment_is_invalid() {
    let api = TestApi::start().await.unwrap();
    // A real, stored, active key, but made for production: a sandbox
    // deployment must refuse it.
    let live = api.issue_key(Environment::Production, uuid::Uuid::new_v4(), &[Scope::Unrestricted]).await;
    assert!(live.key.starts_with("sk-live-"), "{}", live.key);

    let response = api.get("/api_keys/whoami", &live).await;
    response.expect(401);
    assert_eq!(response.json, expect::invalid_key_body(), "{}", response.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_deleted_key_stops_working_at_once() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let created = api.post("/api_keys", &admin, &serde_json::json!({})).await;
    let created = created.expect(201);
    let doomed = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    api.get("/api_keys/whoami", &doomed).await.expect(200);

    api.delete(&format!("/api_keys/{id}"), &admin).await.expect(200);

    for response in [
        api.get("/api_keys/whoami", &doomed).await,
        api.get("/webhooks", &doomed).await,
        api.post("/api_keys", &doomed, &serde_json::json!({})).await,
    ] {
        response.expect(401);
        assert_eq!(response.json, expect::invalid_key_body(), "{}: {}", response.request, response.text());
    }

    // A key can delete itself; the next request with it is refused.
    api.delete(&format!("/api_keys/{}", admin.id()), &admin).await.expect(200);
    let response = api.get("/api_keys/whoami", &admin).await;
    response.expect(401);
    assert_eq!(response.json, expect::invalid_key_body(), "{}", response.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_valid_key_is_accepted_on_every_route() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    api.get("/api_keys/whoami", &key).await.expect(200);
    api.get("/api_keys", &key).await.expect(200);
    api.get("/webhooks", &key).await.expect(200);

    api.shutdown().await.unwrap();
}
