//! Every endpoint state change is published on `{prefix}.lifecycle`
//! (API.md §4, DESIGN.md): versioned, typed, with the endpoint, the change and
//! the key that made it.

use std::collections::BTreeMap;

use serde_json::json;
use tests::{LifecycleTap, TestApi, broker::TapMessage};
use webhooks_model::ChangeKind;

/// Checks the message as published: `v`, `type`, endpoint, change, key.
#[track_caller]
fn assert_message(
    message: &TapMessage,
    endpoint_id: &str,
    change: &str,
    api_key_id: uuid::Uuid,
    developer: uuid::Uuid,
) {
    let raw = &message.raw;
    assert_eq!(raw["v"], 1, "{raw}");
    assert_eq!(raw["type"], "endpoint_changed", "{raw}");
    assert_eq!(raw["endpoint_id"], endpoint_id, "{raw}");
    assert_eq!(raw["change"], change, "{raw}");
    assert_eq!(raw["api_key_id"], api_key_id.to_string(), "{raw}");
    assert_eq!(raw["developer_id"], developer.to_string(), "{raw}");
    assert!(message.endpoint_changed().is_some(), "the message does not decode as a webhooks_queue::Message: {raw}");
}

async fn wait(tap: &LifecycleTap, change: ChangeKind, endpoint_id: &str) -> TapMessage {
    tap.wait_for(change, endpoint_id).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_change_is_published_with_the_acting_key() {
    let api = TestApi::start().await.unwrap();
    let tap = api.lifecycle_tap().await;
    let owner = api.new_developer().await;
    let second = api.key_for(owner.developer_id(), &[webhooks_model::Scope::WebhooksWrite]).await;
    let developer = owner.developer_id();
    let receiver = api.receiver().await;
    let other = api.receiver().await;
    let started = chrono::Utc::now();

    let webhook = api.create_endpoint(&owner, &receiver.url()).await;
    let id = webhook["id"].as_str().unwrap().to_owned();
    let path = format!("/webhooks/{id}");
    let created = wait(&tap, ChangeKind::Created, &id).await;
    assert_message(&created, &id, "created", owner.id(), developer);

    api.put(&path, &second, &json!({ "status": "active" })).await.expect(200);
    let activated = wait(&tap, ChangeKind::Activated, &id).await;
    assert_message(&activated, &id, "activated", second.id(), developer);

    // Refused requests publish nothing.
    api.put(&path, &owner, &json!({ "url": other.url() })).await.expect_error(409, "invalid_state");
    api.put(&path, &owner, &json!({ "status": "deleted" })).await.expect_error(400, "invalid");

    api.put(&path, &owner, &json!({ "status": "disabled" })).await.expect(200);
    let disabled = wait(&tap, ChangeKind::Disabled, &id).await;
    assert_message(&disabled, &id, "disabled", owner.id(), developer);

    api.put(&path, &second, &json!({ "url": other.url() })).await.expect(200);
    let url_changed = wait(&tap, ChangeKind::UrlChanged, &id).await;
    assert_message(&url_changed, &id, "url_changed", second.id(), developer);

    api.put(&path, &owner, &json!({ "event_categories": ["transfer"] })).await.expect(200);
    let categories_changed = wait(&tap, ChangeKind::CategoriesChanged, &id).await;
    assert_message(&categories_changed, &id, "categories_changed", owner.id(), developer);

    api.delete(&path, &second).await.expect(200);
    let deleted = wait(&tap, ChangeKind::Deleted, &id).await;
    assert_message(&deleted, &id, "deleted", second.id(), developer);

    // Exactly these six changes, each once, in order of their change ids,
    // each stamped within the test.
    let mut by_change_id = BTreeMap::new();
    for message in tap.messages_for(&id) {
        let changed = message.endpoint_changed().unwrap().clone();
        assert!(changed.occurred_at >= started - chrono::Duration::seconds(5), "{}", message.raw);
        assert!(changed.occurred_at <= chrono::Utc::now() + chrono::Duration::seconds(5), "{}", message.raw);
        by_change_id.insert(changed.change_id, changed.change);
    }
    let kinds: Vec<ChangeKind> = by_change_id.into_values().collect();
    assert_eq!(
        kinds,
        [
            ChangeKind::Created,
            ChangeKind::Activated,
            ChangeKind::Disabled,
            ChangeKind::UrlChanged,
            ChangeKind::CategoriesChanged,
            ChangeKind::Deleted
        ],
        "messages: {:?}",
        tap.messages_for(&id).iter().map(|m| m.raw.to_string()).collect::<Vec<_>>()
    );

    tap.close().await;
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_create_publishes_nothing_more() {
    let api = TestApi::start().await.unwrap();
    let tap = api.lifecycle_tap().await;
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let body = json!({ "url": receiver.url() });

    let first = api.post_idempotent("/webhooks", &key, "once", &body).await;
    let id = first.expect(201)["id"].as_str().unwrap().to_owned();
    wait(&tap, ChangeKind::Created, &id).await;
    api.post_idempotent("/webhooks", &key, "once", &body).await.expect(201);

    // A later change is published after anything the replay could have sent.
    api.put(&format!("/webhooks/{id}"), &key, &json!({ "status": "active" })).await.expect(200);
    wait(&tap, ChangeKind::Activated, &id).await;
    let created: Vec<_> = tap
        .messages_for(&id)
        .into_iter()
        .filter(|m| m.endpoint_changed().is_some_and(|c| c.change == ChangeKind::Created))
        .collect();
    assert_eq!(created.len(), 1, "{:?}", created.iter().map(|m| m.raw.to_string()).collect::<Vec<_>>());

    tap.close().await;
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn each_endpoint_gets_its_own_messages() {
    let api = TestApi::start().await.unwrap();
    let tap = api.lifecycle_tap().await;
    let a = api.new_developer().await;
    let b = api.new_developer().await;
    let receiver = api.receiver().await;

    let a_id = api.create_endpoint(&a, &receiver.url()).await["id"].as_str().unwrap().to_owned();
    let b_id = api.create_endpoint(&b, &receiver.url()).await["id"].as_str().unwrap().to_owned();
    api.delete(&format!("/webhooks/{b_id}"), &b).await.expect(200);

    assert_message(&wait(&tap, ChangeKind::Created, &a_id).await, &a_id, "created", a.id(), a.developer_id());
    assert_message(&wait(&tap, ChangeKind::Created, &b_id).await, &b_id, "created", b.id(), b.developer_id());
    assert_message(&wait(&tap, ChangeKind::Deleted, &b_id).await, &b_id, "deleted", b.id(), b.developer_id());
    assert!(
        tap.messages_for(&a_id).iter().all(|m| m.endpoint_changed().unwrap().change == ChangeKind::Created),
        "{:?}",
        tap.messages_for(&a_id).iter().map(|m| m.raw.to_string()).collect::<Vec<_>>()
    );

    tap.close().await;
    api.shutdown().await.unwrap();
}
