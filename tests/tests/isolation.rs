//! Each developer sees only its own objects; another developer's object
//! answers 404 exactly as a missing one (API.md §1).

use serde_json::json;
use tests::TestApi;

#[tests::test]
async fn another_developers_endpoint_is_not_found() {
    let api = TestApi::start().await.unwrap();
    let a = api.new_developer().await;
    let b = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&a, &receiver.url()).await;
    let path = format!("/webhooks/{}", endpoint["id"].as_str().unwrap());
    let missing_path = format!("/webhooks/wep_{}", uuid::Uuid::new_v4().simple());

    let missing_get = api.get(&missing_path, &b).await;
    missing_get.expect_error(404, "not_found");
    let missing_put = api.put(&missing_path, &b, &json!({ "status": "active" })).await;
    missing_put.expect_error(404, "not_found");
    let missing_delete = api.delete(&missing_path, &b).await;
    missing_delete.expect_error(404, "not_found");

    let get = api.get(&path, &b).await;
    get.expect_error(404, "not_found");
    assert_eq!(get.json, missing_get.json, "GET of another developer's endpoint differs from a missing one");

    for body in
        [json!({ "status": "active" }), json!({ "url": receiver.url() }), json!({ "event_categories": ["transfer"] })]
    {
        let put = api.put(&path, &b, &body).await;
        put.expect_error(404, "not_found");
        assert_eq!(put.json, missing_put.json, "PUT {body} of another developer's endpoint differs from a missing one");
    }

    let delete = api.delete(&path, &b).await;
    delete.expect_error(404, "not_found");
    assert_eq!(delete.json, missing_delete.json, "DELETE of another developer's endpoint differs from a missing one");

    // The endpoint's sub-resources are hidden the same way.
    let id = endpoint["id"].as_str().unwrap();
    let missing_id = missing_path.trim_start_matches("/webhooks/");
    for sub in ["events", "logs"] {
        let foreign = api.get(&format!("/webhooks/{id}/{sub}"), &b).await;
        let missing = api.get(&format!("/webhooks/{missing_id}/{sub}"), &b).await;
        missing.expect_error(404, "not_found");
        foreign.expect_error(404, "not_found");
        assert_eq!(foreign.json, missing.json, "GET {sub} of another developer's endpoint differs from a missing one");
    }
    let send_body = json!({ "event_id": format!("wh_{}", uuid::Uuid::new_v4().simple()) });
    let foreign = api.post(&format!("/webhooks/{id}/send"), &b, &send_body).await;
    let missing = api.post(&format!("/webhooks/{missing_id}/send"), &b, &send_body).await;
    missing.expect_error(404, "not_found");
    foreign.expect_error(404, "not_found");
    assert_eq!(foreign.json, missing.json, "send to another developer's endpoint differs from a missing one");

    // A's endpoint is untouched.
    let after = api.get(&path, &a).await;
    assert_eq!(after.expect(200), &endpoint);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn another_developers_key_cannot_be_deleted() {
    let api = TestApi::start().await.unwrap();
    let a = api.new_developer().await;
    let b = api.new_developer().await;

    let missing = api.delete(&format!("/api_keys/{}", uuid::Uuid::new_v4()), &b).await;
    missing.expect_error(404, "not_found");
    let foreign = api.delete(&format!("/api_keys/{}", a.id()), &b).await;
    foreign.expect_error(404, "not_found");
    assert_eq!(foreign.json, missing.json, "deleting another developer's key differs from a missing one");

    let still = api.get("/api_keys/whoami", &a).await;
    assert_eq!(still.expect(200)["state"], "Active");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn lists_show_only_the_callers_objects() {
    let api = TestApi::start().await.unwrap();
    let a = api.new_developer().await;
    let b = api.new_developer().await;
    let receiver = api.receiver().await;
    let a_endpoint = api.create_endpoint(&a, &receiver.url()).await;
    let b_endpoint = api.create_endpoint(&b, &receiver.url()).await;
    let a_key = api.post("/api_keys", &a, &json!({ "name": "a's second" })).await.expect(201).clone();

    let b_hooks = api.get("/webhooks", &b).await;
    let b_hooks = b_hooks.expect(200);
    assert_eq!(b_hooks["count"], 1, "{b_hooks}");
    assert_eq!(b_hooks["data"][0]["id"], b_endpoint["id"], "{b_hooks}");
    assert!(!b_hooks.to_string().contains(a_endpoint["id"].as_str().unwrap()));

    let b_keys = api.get("/api_keys", &b).await;
    let b_keys = b_keys.expect(200);
    assert_eq!(b_keys["count"], 1, "{b_keys}");
    for key in b_keys["data"].as_array().unwrap() {
        assert_eq!(key["owner_id"], b.developer_id().to_string(), "{key}");
    }
    assert!(!b_keys.to_string().contains(a_key["id"].as_str().unwrap()));
    assert!(!b_keys.to_string().contains(&a.id().to_string()));

    let a_keys = api.get("/api_keys", &a).await;
    assert_eq!(a_keys.expect(200)["count"], 2, "{}", a_keys.text());
    let a_hooks = api.get("/webhooks", &a).await;
    assert_eq!(a_hooks.expect(200)["count"], 1, "{}", a_hooks.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn whoami_names_the_callers_developer() {
    let api = TestApi::start().await.unwrap();
    let a = api.new_developer().await;
    let b = api.new_developer().await;

    assert_eq!(api.get("/api_keys/whoami", &a).await.expect(200)["owner_id"], a.developer_id().to_string());
    assert_eq!(api.get("/api_keys/whoami", &b).await.expect(200)["owner_id"], b.developer_id().to_string());

    api.shutdown().await.unwrap();
}
