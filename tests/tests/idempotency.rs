//! `Idempotency-Key` on every POST (API.md §3).

use reqwest::Method;
use serde_json::json;
use tests::{ApiOptions, TestApi};

#[tests::test]
async fn a_post_without_the_header_is_refused() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    for (path, body) in [("/webhooks", json!({ "url": receiver.url() })), ("/api_keys", json!({}))] {
        let response = api.send(api.request(Method::POST, path, &key).json(&body)).await;
        response.expect_error_at(400, "required", "header", "Idempotency-Key");
    }
    let hooks = api.get("/webhooks", &key).await;
    assert_eq!(hooks.expect(200)["count"], 0, "{}", hooks.text());
    let keys = api.get("/api_keys", &key).await;
    assert_eq!(keys.expect(200)["count"], 1, "{}", keys.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn malformed_keys_are_refused() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    let longest = "k".repeat(255);
    api.post_idempotent("/api_keys", &key, &longest, &json!({})).await.expect(201);

    for bad in ["k".repeat(256), "has space".to_owned(), String::new()] {
        let response = api.post_idempotent("/api_keys", &key, &bad, &json!({})).await;
        assert_eq!(response.status, 400, "Idempotency-Key {bad:?}: {}", response.text());
        response.expect_error(400, response.json["code"].as_str().unwrap_or("?"));
        assert_eq!(response.json["source"]["location"], "header", "{}", response.text());
        assert_eq!(response.json["source"]["key"], "Idempotency-Key", "{}", response.text());
    }
    let keys = api.get("/api_keys", &key).await;
    assert_eq!(keys.expect(200)["count"], 2, "{}", keys.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_repeat_answers_the_first_response_and_does_nothing_else() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url(), "event_categories": ["transfer"] });

    let first = api.post_idempotent("/webhooks", &key, "create-once", &body).await;
    first.expect(201);
    for _ in 0..3 {
        let again = api.post_idempotent("/webhooks", &key, "create-once", &body).await;
        assert_eq!(again.status, 201, "{}", again.text());
        assert_eq!(again.body, first.body, "the repeat's body is not byte-identical");
    }

    let list = api.get("/webhooks", &key).await;
    let list = list.expect(200);
    assert_eq!(list["count"], 1, "{list}");
    assert_eq!(list["data"][0]["id"], first.json["id"], "{list}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_same_key_with_another_body_answers_422() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    api.post_idempotent("/webhooks", &key, "reused", &json!({ "url": receiver.url() })).await.expect(201);
    let other = json!({ "url": receiver.url(), "event_categories": ["customer"] });
    let reused = api.post_idempotent("/webhooks", &key, "reused", &other).await;
    reused.expect_error(422, "idempotency_key_reused");

    let list = api.get("/webhooks", &key).await;
    let list = list.expect(200);
    assert_eq!(list["count"], 1, "{list}");
    assert_eq!(list["data"][0]["event_categories"], json!([]), "{list}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn keys_are_per_developer() {
    let api = TestApi::start().await.unwrap();
    let a = api.new_developer().await;
    let b = api.new_developer().await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url() });

    let from_a = api.post_idempotent("/webhooks", &a, "shared-string", &body).await;
    from_a.expect(201);
    let from_b = api.post_idempotent("/webhooks", &b, "shared-string", &body).await;
    from_b.expect(201);
    assert_ne!(from_a.json["id"], from_b.json["id"], "B got A's stored answer");

    // And B may use it with a body A never sent.
    let c = api.new_developer().await;
    api.post_idempotent("/api_keys", &c, "shared-string", &json!({ "name": "c" })).await.expect(201);

    for (who, expected_id) in [(&a, &from_a.json["id"]), (&b, &from_b.json["id"])] {
        let list = api.get("/webhooks", who).await;
        let list = list.expect(200);
        assert_eq!(list["count"], 1, "{list}");
        assert_eq!(&list["data"][0]["id"], expected_id, "{list}");
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn another_key_of_the_same_developer_gets_the_stored_answer() {
    let api = TestApi::start().await.unwrap();
    let first_key = api.new_developer().await;
    let second_key = api.key_for(first_key.developer_id(), &[webhooks_model::Scope::WebhooksWrite]).await;
    let reader = api.key_for(first_key.developer_id(), &[webhooks_model::Scope::WebhooksRead]).await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url() });

    let first = api.post_idempotent("/webhooks", &first_key, "per-developer", &body).await;
    first.expect(201);
    let second = api.post_idempotent("/webhooks", &second_key, "per-developer", &body).await;
    assert_eq!(second.status, 201, "{}", second.text());
    assert_eq!(second.body, first.body, "keys are per developer, not per API key");
    let list = api.get("/webhooks", &reader).await;
    assert_eq!(list.expect(200)["count"], 1, "{}", list.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_refusal_is_not_kept_so_the_same_request_can_succeed_later() {
    let api = TestApi::start_with(ApiOptions { max_endpoints: 1, ..ApiOptions::default() }).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url() });

    let existing = api.create_endpoint(&key, &receiver.url()).await;
    let refused = api.post_idempotent("/webhooks", &key, "over-the-limit", &body).await;
    refused.expect_error(400, "limit_exceeded");

    // Room again: the same request with the same key goes through now, once.
    api.delete(&format!("/webhooks/{}", existing["id"].as_str().unwrap()), &key).await.expect(200);
    let created = api.post_idempotent("/webhooks", &key, "over-the-limit", &body).await;
    created.expect(201);
    let replayed = api.post_idempotent("/webhooks", &key, "over-the-limit", &body).await;
    assert_eq!(replayed.status, 201, "{}", replayed.text());
    assert_eq!(replayed.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(replayed.body, created.body);
    let list = api.get("/webhooks", &key).await;
    assert_eq!(list.expect(200)["count"], 1, "{}", list.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_client_fixes_a_refused_request_and_retries_with_the_same_key() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    let first = api.post_idempotent("/webhooks", &key, "fix-me", &json!({ "url": "http://localhost/hook" })).await;
    first.expect_error_at(400, "invalid", "body", "url");
    // Another body under the same key is no reuse: nothing was kept.
    let fixed = api.post_idempotent("/webhooks", &key, "fix-me", &json!({ "url": receiver.url() })).await;
    fixed.expect(201);
    let unsupported = api
        .send(
            api.request(reqwest::Method::POST, "/webhooks", &key)
                .header("Idempotency-Key", "fix-me-too")
                .header("Content-Type", "text/plain")
                .body("url=x"),
        )
        .await;
    assert_eq!(unsupported.status, 415, "{}", unsupported.text());
    let retried = api.post_idempotent("/webhooks", &key, "fix-me-too", &json!({ "url": receiver.url() })).await;
    retried.expect(201);

    api.shutdown().await.unwrap();
}
