//! Webhook endpoints (API.md §4): create, list, get, update, delete, and the
//! per-developer limit.

use serde_json::{Value, json};
use tests::{ApiOptions, TestApi, expect};

/// Checks a `Webhook` object's shape.
#[track_caller]
fn assert_webhook(webhook: &Value) {
    let id = webhook["id"].as_str().unwrap_or_else(|| panic!("no id: {webhook}"));
    assert!(expect::is_endpoint_id(id), "id {id:?} is not wep_ + 32 hex");
    assert!(webhook["url"].as_str().is_some_and(|u| u.starts_with("https://")), "{webhook}");
    assert!(matches!(webhook["status"].as_str(), Some("disabled" | "active" | "deleted")), "{webhook}");
    expect::rsa_2048_public_key(webhook["public_key"].as_str().unwrap_or_default());
    assert!(matches!(webhook["event_epoch"].as_str(), Some("webhook_creation" | "beginning_of_time")), "{webhook}");
    assert!(webhook["event_categories"].is_array(), "{webhook}");
    let created = expect::timestamp(&webhook["created_at"]);
    let updated = expect::timestamp(&webhook["updated_at"]);
    assert!(updated >= created, "{webhook}");
}

/// The categories of a webhook, sorted, for order-insensitive comparison.
fn categories(webhook: &Value) -> Vec<String> {
    let mut names: Vec<String> = webhook["event_categories"]
        .as_array()
        .unwrap_or_else(|| panic!("no event_categories: {webhook}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tests::test]
async fn creating_an_endpoint_answers_a_disabled_webhook_with_its_own_key() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    let response = api.post("/webhooks", &key, &json!({ "url": receiver.url() })).await;
    let webhook = response.expect(201).clone();
    assert_webhook(&webhook);
    assert_eq!(webhook["url"], receiver.url());
    assert_eq!(webhook["status"], "disabled");
    assert_eq!(webhook["event_epoch"], "webhook_creation");
    assert_eq!(webhook["event_categories"], json!([]));
    assert!(webhook.get("private_key").is_none(), "{webhook}");

    // A second endpoint gets a key pair of its own.
    let second = api.create_endpoint(&key, &receiver.url()).await;
    assert_ne!(second["id"], webhook["id"]);
    assert_ne!(second["public_key"], webhook["public_key"]);

    let shown = api.get(&format!("/webhooks/{}", webhook["id"].as_str().unwrap()), &key).await;
    assert_eq!(shown.expect(200), &webhook);

    // Creation talks TLS only: the receiver got no HTTP request.
    assert_eq!(receiver.count(), 0, "{:?}", receiver.requests());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn creation_takes_epoch_and_categories() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    let body = json!({
        "url": receiver.url(),
        "event_epoch": "beginning_of_time",
        "event_categories": ["transfer", "liquidation_address.drain", "posted_card_account_transaction"],
    });
    let webhook = api.post("/webhooks", &key, &body).await.expect(201).clone();
    assert_webhook(&webhook);
    assert_eq!(webhook["event_epoch"], "beginning_of_time");
    assert_eq!(categories(&webhook), ["liquidation_address.drain", "posted_card_account_transaction", "transfer"]);

    let every = json!({
        "url": receiver.url(),
        "event_categories": ["customer", "kyc_link", "transfer", "external_account", "liquidation_address",
            "liquidation_address.drain", "virtual_account", "virtual_account.activity", "static_memo.activity",
            "platform_wallet.activity", "card_account", "card_transaction", "card_withdrawal",
            "posted_card_account_transaction"],
    });
    let all = api.post("/webhooks", &key, &every).await;
    assert_eq!(categories(all.expect(201)).len(), 14, "{}", all.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn creation_refuses_bad_fields_and_creates_nothing() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let url = receiver.url();

    api.post("/webhooks", &key, &json!({})).await.expect_error_at(400, "required", "body", "url");
    for (body, field) in [
        (json!({ "url": url, "event_categories": ["nope"] }), "event_categories"),
        (json!({ "url": url, "event_categories": ["transfer", "Transfer"] }), "event_categories"),
        (json!({ "url": url, "event_categories": "transfer" }), "event_categories"),
        (json!({ "url": url, "event_epoch": "yesterday" }), "event_epoch"),
        (json!({ "url": url, "status": "active" }), "status"),
    ] {
        api.post("/webhooks", &key, &body).await.expect_error_at(400, "invalid", "body", field);
    }
    let list = api.get("/webhooks", &key).await;
    assert_eq!(list.expect(200)["count"], 0, "{}", list.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_list_is_newest_first() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(api.create_endpoint(&key, &receiver.url()).await["id"].clone());
    }

    let response = api.get("/webhooks", &key).await;
    let list = response.expect(200);
    assert_eq!(list["count"], 3, "{list}");
    let listed: Vec<Value> = list["data"].as_array().unwrap().iter().map(|w| w["id"].clone()).collect();
    ids.reverse();
    assert_eq!(listed, ids, "not newest first");
    for webhook in list["data"].as_array().unwrap() {
        assert_webhook(webhook);
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn status_switches_between_active_and_disabled() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let active = api.put(&path, &key, &json!({ "status": "active" })).await.expect(200).clone();
    assert_webhook(&active);
    assert_eq!(active["status"], "active");
    assert_eq!(active["id"], webhook["id"]);
    assert_eq!(active["public_key"], webhook["public_key"]);
    assert_eq!(active["created_at"], webhook["created_at"]);
    assert!(expect::timestamp(&active["updated_at"]) >= expect::timestamp(&webhook["updated_at"]));
    assert_eq!(api.get(&path, &key).await.expect(200), &active);

    let disabled = api.put(&path, &key, &json!({ "status": "disabled" })).await.expect(200).clone();
    assert_eq!(disabled["status"], "disabled");
    assert_eq!(api.get(&path, &key).await.expect(200), &disabled);

    // An empty PUT changes nothing.
    let same = api.put(&path, &key, &json!({})).await;
    assert_eq!(same.expect(200)["status"], "disabled");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn status_accepts_only_active_or_disabled_and_changes_nothing_otherwise() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    for status in [json!("deleted"), json!("paused"), json!("ACTIVE"), json!(""), json!(1)] {
        for body in [json!({ "status": status }), json!({ "status": status, "event_categories": ["transfer"] })] {
            api.put(&path, &key, &body).await.expect_error_at(400, "invalid", "body", "status");
            let after = api.get(&path, &key).await;
            assert_eq!(after.expect(200), &webhook, "PUT {body} changed the endpoint");
        }
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_url_of_an_active_endpoint_cannot_change() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let other = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());
    let active = api.put(&path, &key, &json!({ "status": "active" })).await.expect(200).clone();

    for body in [
        json!({ "url": other.url() }),
        json!({ "url": other.url(), "status": "disabled" }),
        json!({ "status": "disabled", "url": other.url(), "event_categories": ["transfer"] }),
    ] {
        let response = api.put(&path, &key, &body).await;
        response.expect_error(409, "invalid_state");
        let after = api.get(&path, &key).await;
        assert_eq!(after.expect(200), &active, "PUT {body} changed the endpoint");
    }

    // Sending the url it already has is no change.
    let same = api.put(&path, &key, &json!({ "url": receiver.url(), "status": "disabled" })).await;
    let same = same.expect(200);
    assert_eq!(same["status"], "disabled");
    assert_eq!(same["url"], receiver.url());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_url_of_a_disabled_endpoint_changes_after_a_new_check() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let other = api.receiver().await;
    let untrusted = tests::Receiver::with_cert(tests::TestCa::self_signed(tests::ca::LOCAL_NAMES)).await.unwrap();
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let moved = api.put(&path, &key, &json!({ "url": other.url() })).await.expect(200).clone();
    assert_webhook(&moved);
    assert_eq!(moved["url"], other.url());
    assert_eq!(moved["status"], "disabled");
    assert_eq!(moved["public_key"], webhook["public_key"], "the key pair stays with the endpoint");
    assert_eq!(api.get(&path, &key).await.expect(200), &moved);

    // The new url is checked like a new endpoint's.
    let refused = api.put(&path, &key, &json!({ "url": untrusted.url() })).await;
    refused.expect_error_at(400, "invalid", "body", "url");
    let refused = api.put(&path, &key, &json!({ "url": "http://localhost/hook" })).await;
    refused.expect_error_at(400, "invalid", "body", "url");
    assert_eq!(api.get(&path, &key).await.expect(200), &moved, "a refused url changed the endpoint");

    // Url and activation in one request, from disabled, is allowed.
    let both = api.put(&path, &key, &json!({ "url": receiver.url(), "status": "active" })).await;
    let both = both.expect(200);
    assert_eq!(both["url"], receiver.url());
    assert_eq!(both["status"], "active");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn categories_change_and_unknown_ones_are_refused() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let changed = api.put(&path, &key, &json!({ "event_categories": ["transfer", "customer"] })).await;
    let changed = changed.expect(200).clone();
    assert_eq!(categories(&changed), ["customer", "transfer"]);
    assert_eq!(categories(api.get(&path, &key).await.expect(200)), ["customer", "transfer"]);

    let refused = api.put(&path, &key, &json!({ "event_categories": ["transfer", "nope"] })).await;
    refused.expect_error_at(400, "invalid", "body", "event_categories");
    assert_eq!(api.get(&path, &key).await.expect(200), &changed);

    // Categories change while active too.
    api.put(&path, &key, &json!({ "status": "active" })).await.expect(200);
    let every = api.put(&path, &key, &json!({ "event_categories": [] })).await;
    let every = every.expect(200);
    assert_eq!(every["event_categories"], json!([]));
    assert_eq!(every["status"], "active");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_deleted_endpoint_answers_404_everywhere() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let kept = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());
    api.put(&path, &key, &json!({ "status": "active" })).await.expect(200);

    let deleted = api.delete(&path, &key).await;
    let deleted = deleted.expect(200);
    assert_webhook(deleted);
    assert_eq!(deleted["id"], webhook["id"]);
    assert_eq!(deleted["status"], "deleted");

    api.get(&path, &key).await.expect_error(404, "not_found");
    api.put(&path, &key, &json!({ "status": "active" })).await.expect_error(404, "not_found");
    api.put(&path, &key, &json!({ "event_categories": ["transfer"] })).await.expect_error(404, "not_found");
    api.delete(&path, &key).await.expect_error(404, "not_found");

    let list = api.get("/webhooks", &key).await;
    let list = list.expect(200);
    assert_eq!(list["count"], 1, "{list}");
    assert_eq!(list["data"][0]["id"], kept["id"], "{list}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_developer_has_at_most_the_configured_number_of_endpoints() {
    let api = TestApi::start_with(ApiOptions { max_endpoints: 5, ..ApiOptions::default() }).await.unwrap();
    let key = api.new_developer().await;
    let other = api.new_developer().await;
    let receiver = api.receiver().await;

    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(api.create_endpoint(&key, &receiver.url()).await["id"].as_str().unwrap().to_owned());
    }
    let sixth = api.post("/webhooks", &key, &json!({ "url": receiver.url() })).await;
    sixth.expect_error(400, "limit_exceeded");
    let list = api.get("/webhooks", &key).await;
    assert_eq!(list.expect(200)["count"], 5, "{}", list.text());

    // The limit is per developer.
    api.create_endpoint(&other, &receiver.url()).await;

    // Disabled and active ones both count; deleted ones do not.
    api.put(&format!("/webhooks/{}", ids[0]), &key, &json!({ "status": "active" })).await.expect(200);
    api.post("/webhooks", &key, &json!({ "url": receiver.url() })).await.expect_error(400, "limit_exceeded");
    api.delete(&format!("/webhooks/{}", ids[1]), &key).await.expect(200);
    api.create_endpoint(&key, &receiver.url()).await;
    api.post("/webhooks", &key, &json!({ "url": receiver.url() })).await.expect_error(400, "limit_exceeded");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn concurrent_creates_do_not_pass_the_limit() {
    let api = TestApi::start_with(ApiOptions { max_endpoints: 2, ..ApiOptions::default() }).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url() });

    let attempts = futures::future::join_all((0..6).map(|_| api.post("/webhooks", &key, &body))).await;
    let created = attempts.iter().filter(|r| r.status == 201).count();
    for refused in attempts.iter().filter(|r| r.status != 201) {
        refused.expect_error(400, "limit_exceeded");
    }
    assert_eq!(created, 2, "{:?}", attempts.iter().map(|r| r.status).collect::<Vec<_>>());
    let list = api.get("/webhooks", &key).await;
    assert_eq!(list.expect(200)["count"], 2, "{}", list.text());

    api.shutdown().await.unwrap();
}
