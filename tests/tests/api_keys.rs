//! API keys (API.md §1): whoami, create, list, delete, and scopes on every route.

use serde_json::{Value, json};
use tests::{ApiResponse, DeveloperKey, TestApi, expect};
use webhooks_model::Scope;

/// Checks an `ApiKey` record's shape and that it never carries the key itself.
#[track_caller]
fn assert_api_key_record(record: &Value, developer: uuid::Uuid) {
    let id = record["id"].as_str().unwrap_or_else(|| panic!("no id: {record}"));
    uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("id {id:?} is not a uuid: {e}"));
    assert!(matches!(record["type"].as_str(), Some("Private" | "Public")), "{record}");
    assert_eq!(record["owner_type"], "Developer", "{record}");
    assert_eq!(record["owner_id"], developer.to_string(), "{record}");
    assert_eq!(record["prefix"], "sk-test", "{record}");
    assert_eq!(record["last_4"].as_str().map(|s| s.chars().count()), Some(4), "{record}");
    assert!(matches!(record["state"].as_str(), Some("Active" | "Deleted")), "{record}");
    expect::timestamp(&record["created_at"]);
    expect::timestamp(&record["updated_at"]);
    assert!(record["scopes"].is_array(), "{record}");
    if let Some(name) = record.get("name").filter(|n| !n.is_null()) {
        assert!(name.as_str().is_some_and(|n| n.chars().count() <= 100), "{record}");
    }
}

/// Whether any string in `value` contains a plaintext key.
fn leaks_a_key(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains("sk-test-") || s.contains("sk-live-"),
        Value::Array(items) => items.iter().any(leaks_a_key),
        Value::Object(map) => map.contains_key("key") || map.values().any(leaks_a_key),
        _ => false,
    }
}

async fn create_key(api: &TestApi, by: &DeveloperKey, body: Value) -> ApiResponse {
    api.post("/api_keys", by, &body).await
}

#[tests::test]
async fn whoami_shows_the_calling_key_and_never_the_key_itself() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    let response = api.get("/api_keys/whoami", &key).await;
    let record = response.expect(200);
    assert_api_key_record(record, key.developer_id());
    assert_eq!(record["id"], key.id().to_string());
    assert_eq!(record["type"], "Public", "a key made by the operator's command line");
    assert_eq!(record["state"], "Active");
    assert_eq!(record["scopes"], json!(["platform:api_unrestricted"]));
    assert_eq!(record["last_4"], key.key[key.key.len() - 4..]);
    assert!(!leaks_a_key(record), "whoami shows a key: {record}");
    assert!(!response.text().contains(&key.key), "whoami shows the key");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn creating_a_key_returns_the_plaintext_once() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;

    let response = create_key(&api, &admin, json!({ "name": "ci deploys" })).await;
    let created = response.expect(201).clone();
    assert_api_key_record(&created, admin.developer_id());
    assert_eq!(created["type"], "Private");
    assert_eq!(created["state"], "Active");
    assert_eq!(created["name"], "ci deploys");
    assert_eq!(created["scopes"], json!(["platform:api_unrestricted"]), "default scopes are unrestricted");

    let plaintext = created["key"].as_str().expect("the plaintext key").to_owned();
    let secret = plaintext.strip_prefix("sk-test-").unwrap_or_else(|| panic!("key {plaintext:?} lacks sk-test-"));
    // 32 random bytes in letters and digits take at least 43 characters.
    assert!(secret.len() >= 43, "secret of {} characters", secret.len());
    assert!(secret.bytes().all(|b| b.is_ascii_alphanumeric()), "secret {secret:?}");
    assert_eq!(created["last_4"], plaintext[plaintext.len() - 4..]);

    // The new key works and is the key just made.
    let whoami = api.get("/api_keys/whoami", &plaintext).await;
    let me = whoami.expect(200);
    assert_eq!(me["id"], created["id"]);
    assert!(!leaks_a_key(me), "{me}");

    // Never shown again: not in the list, not to whoami.
    let list = api.get("/api_keys", &admin).await;
    assert!(!list.text().contains(&plaintext), "the list shows the key");
    assert!(!leaks_a_key(list.expect(200)), "{}", list.text());
    assert!(!whoami.text().contains(&plaintext));

    // A key the dashboard makes is of type Public.
    let request = api
        .request(reqwest::Method::POST, "/api_keys", &admin)
        .header("Idempotency-Key", "from-the-dashboard")
        .header("Webhooks-Client", "dashboard")
        .json(&json!({ "name": "made in the dashboard" }));
    let made = api.send(request).await;
    assert_eq!(made.expect(201)["type"], "Public", "{}", made.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn key_names_are_at_most_100_characters() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;

    let longest = "n".repeat(100);
    let created = create_key(&api, &admin, json!({ "name": longest })).await;
    assert_eq!(created.expect(201)["name"], longest);

    let too_long = create_key(&api, &admin, json!({ "name": "n".repeat(101) })).await;
    too_long.expect_error_at(400, "invalid", "body", "name");

    // Characters, not bytes: 100 two-byte characters are fine.
    let accented = "é".repeat(100);
    let created = create_key(&api, &admin, json!({ "name": accented })).await;
    assert_eq!(created.expect(201)["name"], accented);

    let list = api.get("/api_keys", &admin).await;
    assert_eq!(list.expect(200)["count"], 3, "only the refused key is missing: {}", list.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_list_shows_active_keys_only() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let kept = create_key(&api, &admin, json!({ "name": "kept" })).await.expect(201).clone();
    let gone = create_key(&api, &admin, json!({ "name": "gone" })).await.expect(201).clone();
    api.delete(&format!("/api_keys/{}", gone["id"].as_str().unwrap()), &admin).await.expect(200);

    let response = api.get("/api_keys", &admin).await;
    let list = response.expect(200);
    let data = list["data"].as_array().expect("data");
    assert_eq!(list["count"], data.len(), "{list}");
    let ids: Vec<&str> = data.iter().filter_map(|k| k["id"].as_str()).collect();
    assert!(ids.contains(&admin.id().to_string().as_str()), "{list}");
    assert!(ids.contains(&kept["id"].as_str().unwrap()), "{list}");
    assert!(!ids.contains(&gone["id"].as_str().unwrap()), "a deleted key is listed: {list}");
    assert_eq!(data.len(), 2, "{list}");
    for record in data {
        assert_api_key_record(record, admin.developer_id());
        assert_eq!(record["state"], "Active", "{record}");
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn deleting_a_key_answers_it_deleted_and_then_404() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let created = create_key(&api, &admin, json!({})).await.expect(201).clone();
    let path = format!("/api_keys/{}", created["id"].as_str().unwrap());

    let deleted = api.delete(&path, &admin).await;
    let record = deleted.expect(200);
    assert_api_key_record(record, admin.developer_id());
    assert_eq!(record["id"], created["id"]);
    assert_eq!(record["state"], "Deleted");
    assert!(!leaks_a_key(record), "{record}");

    api.delete(&path, &admin).await.expect_error(404, "not_found");
    let missing = api.delete(&format!("/api_keys/{}", uuid::Uuid::new_v4()), &admin).await;
    missing.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_webhooks_read_key_can_only_read_webhooks() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&admin, &receiver.url()).await;
    let id = endpoint["id"].as_str().unwrap();
    let reader = api.key_for(admin.developer_id(), &[Scope::WebhooksRead]).await;

    api.get("/api_keys/whoami", &reader).await.expect(200);
    api.get("/webhooks", &reader).await.expect(200);
    api.get(&format!("/webhooks/{id}"), &reader).await.expect(200);

    api.post("/webhooks", &reader, &json!({ "url": receiver.url() })).await.expect_error(403, "forbidden");
    api.put(&format!("/webhooks/{id}"), &reader, &json!({ "status": "active" })).await.expect_error(403, "forbidden");
    api.delete(&format!("/webhooks/{id}"), &reader).await.expect_error(403, "forbidden");
    api.post("/api_keys", &reader, &json!({})).await.expect_error(403, "forbidden");
    api.get("/api_keys", &reader).await.expect_error(403, "forbidden");
    api.delete(&format!("/api_keys/{}", admin.id()), &reader).await.expect_error(403, "forbidden");

    // Nothing changed.
    let after = api.get(&format!("/webhooks/{id}"), &admin).await;
    assert_eq!(after.expect(200), &endpoint);
    let list = api.get("/webhooks", &admin).await;
    assert_eq!(list.expect(200)["count"], 1);
    api.get("/api_keys/whoami", &admin).await.expect(200);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_webhooks_write_key_cannot_read() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&admin, &receiver.url()).await;
    let id = endpoint["id"].as_str().unwrap();
    let writer = api.key_for(admin.developer_id(), &[Scope::WebhooksWrite]).await;

    api.get("/webhooks", &writer).await.expect_error(403, "forbidden");
    api.get(&format!("/webhooks/{id}"), &writer).await.expect_error(403, "forbidden");
    api.get("/api_keys", &writer).await.expect_error(403, "forbidden");
    api.post("/api_keys", &writer, &json!({})).await.expect_error(403, "forbidden");

    let updated = api.put(&format!("/webhooks/{id}"), &writer, &json!({ "status": "active" })).await;
    assert_eq!(updated.expect(200)["status"], "active");
    api.post("/webhooks", &writer, &json!({ "url": receiver.url() })).await.expect(201);
    api.delete(&format!("/webhooks/{id}"), &writer).await.expect(200);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_api_keys_read_key_can_list_keys_but_not_create_or_delete() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let reader = api.key_for(admin.developer_id(), &[Scope::ApiKeysRead]).await;

    let list = api.get("/api_keys", &reader).await;
    assert_eq!(list.expect(200)["count"], 2, "{}", list.text());
    api.post("/api_keys", &reader, &json!({ "scopes": ["api_keys:read"] })).await.expect_error(403, "forbidden");
    api.delete(&format!("/api_keys/{}", admin.id()), &reader).await.expect_error(403, "forbidden");
    api.get("/webhooks", &reader).await.expect_error(403, "forbidden");

    let after = api.get("/api_keys", &admin).await;
    assert_eq!(after.expect(200)["count"], 2, "nothing was created or deleted: {}", after.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_scoped_key_creates_only_keys_within_its_scopes() {
    let api = TestApi::start().await.unwrap();
    let developer = uuid::Uuid::new_v4();
    let scoped = api.key_for(developer, &[Scope::ApiKeysWrite, Scope::ApiKeysRead, Scope::WebhooksRead]).await;

    // Broader: unrestricted (explicitly or by default), or a scope it lacks.
    for body in [
        json!({}),
        json!({ "scopes": ["platform:api_unrestricted"] }),
        json!({ "scopes": ["webhooks:write"] }),
        json!({ "scopes": ["webhooks:read", "webhooks:write"] }),
    ] {
        create_key(&api, &scoped, body.clone()).await.expect_error(403, "forbidden");
    }

    // A subset is fine, and the new key carries exactly those scopes.
    let created = create_key(&api, &scoped, json!({ "scopes": ["webhooks:read"] })).await;
    let created = created.expect(201).clone();
    assert_eq!(created["scopes"], json!(["webhooks:read"]));
    let narrow = created["key"].as_str().unwrap().to_owned();
    api.get("/webhooks", &narrow).await.expect(200);
    api.get("/api_keys", &narrow).await.expect_error(403, "forbidden");
    api.post("/api_keys", &narrow, &json!({ "scopes": ["webhooks:read"] })).await.expect_error(403, "forbidden");

    let same =
        create_key(&api, &scoped, json!({ "scopes": ["api_keys:write", "api_keys:read", "webhooks:read"] })).await;
    same.expect(201);

    let list = api.get("/api_keys", &scoped).await;
    assert_eq!(list.expect(200)["count"], 3, "only the two allowed keys were made: {}", list.text());

    api.shutdown().await.unwrap();
}

/// Deleting follows the rule of creating: a scoped key cannot remove a key
/// that holds a scope it lacks (the unrestricted key included), only keys
/// within its own scopes.
#[tests::test]
async fn a_scoped_key_deletes_only_keys_within_its_scopes() {
    let api = TestApi::start().await.unwrap();
    let developer = uuid::Uuid::new_v4();
    let admin = api.key_for(developer, &[Scope::Unrestricted]).await;
    let scoped = api.key_for(developer, &[Scope::ApiKeysWrite, Scope::ApiKeysRead, Scope::WebhooksRead]).await;
    let writer = create_key(&api, &admin, json!({ "scopes": ["webhooks:write"] })).await.expect(201).clone();
    let reader = create_key(&api, &admin, json!({ "scopes": ["webhooks:read"] })).await.expect(201).clone();

    let admin_id = api.get("/api_keys/whoami", &admin).await.expect(200)["id"].as_str().unwrap().to_owned();
    for target in [admin_id.as_str(), writer["id"].as_str().unwrap()] {
        let refused = api.delete(&format!("/api_keys/{target}"), &scoped).await;
        refused.expect_error(403, "forbidden");
    }
    api.get("/webhooks", &admin).await.expect(200);
    api.get("/webhooks", writer["key"].as_str().unwrap()).await.expect_error(403, "forbidden");

    let deleted = api.delete(&format!("/api_keys/{}", reader["id"].as_str().unwrap()), &scoped).await;
    assert_eq!(deleted.expect(200)["state"], "Deleted");
    api.get("/webhooks", reader["key"].as_str().unwrap()).await.expect_error(401, "invalid");
    let missing = api.delete(&format!("/api_keys/{}", uuid::Uuid::new_v4()), &scoped).await;
    missing.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn unknown_scopes_are_refused() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;

    for scopes in [json!(["webhooks:delete"]), json!(["webhooks:read", "nope"]), json!(["WEBHOOKS:READ"])] {
        let response = create_key(&api, &admin, json!({ "scopes": scopes })).await;
        response.expect_error_at(400, "invalid", "body", "scopes");
    }
    let list = api.get("/api_keys", &admin).await;
    assert_eq!(list.expect(200)["count"], 1, "{}", list.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn event_routes_need_the_webhooks_scopes() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&admin, &receiver.url()).await;
    let id = endpoint["id"].as_str().unwrap();
    let keys_only = api.key_for(admin.developer_id(), &[Scope::ApiKeysRead, Scope::ApiKeysWrite]).await;
    let reader = api.key_for(admin.developer_id(), &[Scope::WebhooksRead]).await;
    let send_body = json!({ "event_id": format!("wh_{}", uuid::Uuid::new_v4().simple()) });

    for path in [format!("/webhooks/{id}/events"), format!("/webhooks/{id}/logs"), "/webhook_events".to_owned()] {
        api.get(&path, &keys_only).await.expect_error(403, "forbidden");
        api.get(&path, &reader).await.expect(200);
    }
    let send = format!("/webhooks/{id}/send");
    api.post(&send, &keys_only, &send_body).await.expect_error(403, "forbidden");
    api.post(&send, &reader, &send_body).await.expect_error(403, "forbidden");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn only_a_hash_of_a_key_is_stored() {
    let api = TestApi::start().await.unwrap();
    let admin = api.new_developer().await;
    let created = create_key(&api, &admin, json!({ "name": "stored?" })).await.expect(201).clone();
    let plaintext = created["key"].as_str().unwrap().to_owned();
    let secret = plaintext.trim_start_matches("sk-test-").to_owned();
    let hex_of = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();

    let dump = api.stored_dump().await;
    let mut found = Vec::new();
    for (what, needle) in [
        ("the key", plaintext.clone()),
        ("the secret", secret.clone()),
        ("the key, hex-encoded", hex_of(&plaintext)),
        ("the secret, hex-encoded", hex_of(&secret)),
        ("the operator's key", admin.key.clone()),
        ("the operator's key, hex-encoded", hex_of(&admin.key)),
    ] {
        if let Some(at) = dump.find(&needle) {
            let table = dump[..at].rsplit("== ").next().and_then(|t| t.lines().next()).unwrap_or("?");
            found.push(format!("{what} in table {table}"));
        }
    }
    assert!(found.is_empty(), "plaintext keys stored: {}", found.join("; "));

    api.shutdown().await.unwrap();
}
