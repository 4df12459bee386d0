//! Logs you can search (API.md §8.12), on both backends: a delivery log
//! entry carries its event's type and a safe `error_detail`; the log filters
//! by status, event type, event id and time, combined; bad filter values are
//! 400 naming the parameter; `GET /webhook_events/{event_id}` answers the
//! event as delivered with where each of its deliveries stands.

mod common;

use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, Reply, TestApi};
use uuid::Uuid;
use webhooks_model::Scope;

/// An event of `event_type` (category `transfer`) for `developer_id`.
async fn ingest_type(api: &TestApi, developer_id: Uuid, event_type: &str, n: usize) -> Value {
    let mut input = event_input(developer_id, "transfer", n);
    input["event_type"] = json!(event_type);
    api.ingest(&input).await.expect(201).clone()
}

fn encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[tests::test]
async fn logs_carry_the_event_type_and_why_an_attempt_failed_and_filter_by_all_of_it() {
    // One attempt per event within the test: the first retry is an hour away.
    let api =
        TestApi::start_with(ApiOptions { retry_schedule: Some("1h".into()), ..ApiOptions::default() }).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    // A token in the URL's query must never show in a log.
    let endpoint = active_endpoint(&api, &key, &format!("{}/hook?token=s3cretvalue", receiver.url())).await;

    receiver.reply_always(Reply::status(500).body("down for maintenance"));
    let failed = ingest_type(&api, key.developer_id(), "transfer.refunded", 1).await;
    let first = wait_for_logs(&api, &key, &endpoint, 1).await;
    receiver.reply_always(Reply::ok());
    let succeeded = ingest_type(&api, key.developer_id(), "transfer.created", 2).await;
    let entries = wait_for_logs(&api, &key, &endpoint, 2).await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    let (newest, oldest) = (&entries[0], &entries[1]);
    assert_eq!(oldest["id"], first[0]["id"]);

    assert_eq!(oldest["event_id"], failed["event_id"]);
    assert_eq!(oldest["event_type"], "transfer.refunded");
    assert_eq!(oldest["status"], 500);
    assert_eq!(oldest["error_detail"], "HTTP 500 Internal Server Error", "{oldest}");
    assert_eq!(newest["event_id"], succeeded["event_id"]);
    assert_eq!(newest["event_type"], "transfer.created");
    assert_eq!(newest["status"], 200);
    assert!(newest["error_detail"].is_null(), "{newest}");

    let ids = |entries: &[Value]| entries.iter().map(|e| e["id"].clone()).collect::<Vec<_>>();
    let (api_ref, key_ref, endpoint_ref) = (&api, &key, &endpoint);
    let query = |q: String| async move { logs(api_ref, key_ref, endpoint_ref, &q).await };
    assert_eq!(ids(&query("?status=failed".into()).await), [oldest["id"].clone()]);
    assert_eq!(ids(&query("?status=succeeded".into()).await), [newest["id"].clone()]);
    assert_eq!(ids(&query("?event_type=transfer.refunded".into()).await), [oldest["id"].clone()]);
    assert!(query("?event_type=transfer.refunded&status=succeeded".into()).await.is_empty());
    assert!(query("?event_type=customer.created".into()).await.is_empty());
    let by_event = format!("?event_id={}", event_id(&succeeded));
    assert_eq!(ids(&query(by_event.clone()).await), [newest["id"].clone()]);
    assert!(query(format!("{by_event}&status=failed")).await.is_empty());
    let at = newest["created_at"].as_str().unwrap();
    assert_eq!(ids(&query(format!("?since={}", encoded(at))).await), [newest["id"].clone()]);
    assert_eq!(ids(&query(format!("?until={}", encoded(at))).await), [oldest["id"].clone()]);
    let from = oldest["created_at"].as_str().unwrap();
    let both = query(format!("?since={}&until={}&status=failed", encoded(from), encoded(at))).await;
    assert_eq!(ids(&both), [oldest["id"].clone()]);
    // A page keeps the filters.
    let page = query(format!("?status=succeeded&starting_after={}", newest["id"].as_str().unwrap())).await;
    assert!(page.is_empty(), "{page:?}");

    // Nothing in any entry names the URL or its token.
    for entry in logs(&api, &key, &endpoint, "?limit=100").await {
        let text = entry.to_string();
        assert!(!text.contains("s3cretvalue"), "{text}");
        assert!(!entry["error_detail"].as_str().unwrap_or_default().contains("://"), "{text}");
    }

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_timeout_is_described_without_the_url() {
    let api = TestApi::start_with(ApiOptions {
        retry_schedule: Some("1h".into()),
        delivery_timeout: "2s".into(),
        ..ApiOptions::default()
    })
    .await
    .unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &format!("{}/slow?token=s3cretvalue", receiver.url())).await;
    receiver.reply_always(Reply::hang());
    ingest(&api, key.developer_id(), "transfer", 1).await;
    let entries = wait_for_logs(&api, &key, &endpoint, 1).await;
    let entry = &entries[0];
    assert_eq!(entry["error"], "timeout", "{entry}");
    let detail = entry["error_detail"].as_str().unwrap_or_else(|| panic!("no error_detail: {entry}"));
    assert!(detail.starts_with("timed out") && detail.contains("2s"), "{detail}");
    assert!(!detail.contains("://") && !detail.contains("s3cretvalue"), "{detail}");
    assert!(detail.len() <= 300, "{detail}");
    assert_eq!(logs(&api, &key, &endpoint, "?status=failed").await.len(), 1);
    assert!(logs(&api, &key, &endpoint, "?status=succeeded").await.is_empty());

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn bad_filter_values_answer_400_naming_the_parameter() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = api.create_endpoint(&key, &receiver.url()).await;
    let path = |q: &str| format!("/webhooks/{}/logs{q}", id(&endpoint));
    for (query, parameter) in [
        ("?status=ok", "status"),
        ("?status=", "status"),
        ("?status=SUCCEEDED", "status"),
        ("?event_type=", "event_type"),
        ("?event_type=a%20b", "event_type"),
        ("?event_id=nope", "event_id"),
        ("?event_id=wh_123", "event_id"),
        ("?since=yesterday", "since"),
        ("?since=2026-13-01T00:00:00Z", "since"),
        ("?until=1700000000", "until"),
        ("?since=2026-11-21T10:00:00Z&until=2026-11-21T10:00:00Z", "until"),
        ("?since=2026-11-21T10:00:00Z&until=2026-11-20T10:00:00Z", "until"),
        ("?colour=red", "colour"),
    ] {
        api.get(&path(query), &key).await.expect_error_at(400, "invalid", "query", parameter);
    }
    // Good values on an empty log.
    let fine =
        "?status=failed&event_type=transfer.created&since=2026-11-21T10:00:00.000Z&until=2126-11-21T10:00:00%2B02:00";
    assert!(list(api.get(&path(fine), &key).await).is_empty());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_event_is_shown_as_delivered_with_its_deliveries() {
    let api =
        TestApi::start_with(ApiOptions { retry_schedule: Some("1h".into()), ..ApiOptions::default() }).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let good = api.receiver().await;
    let bad = api.receiver().await;
    bad.reply_always(Reply::status(503));
    let to_good = active_endpoint(&api, &key, &good.url()).await;
    let to_bad = active_endpoint(&api, &key, &bad.url()).await;
    let disabled = create(&api, &key, json!({ "url": good.url() })).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_logs(&api, &key, &to_good, 1).await;
    wait_for_logs(&api, &key, &to_bad, 1).await;
    let received = good.requests()[0].json().unwrap();

    let shown = api.get(&format!("/webhook_events/{}", event_id(&event)), &key).await.expect(200).clone();
    let mut as_delivered = shown.clone();
    let deliveries = as_delivered.as_object_mut().unwrap().remove("deliveries").unwrap();
    assert_eq!(as_delivered, received, "the event as POSTed to the receiver");
    let deliveries = deliveries.as_array().unwrap().clone();
    assert_eq!(deliveries.len(), 3, "{deliveries:?}");
    let of = |endpoint: &Value| {
        deliveries
            .iter()
            .find(|d| d["endpoint_id"] == endpoint["id"])
            .cloned()
            .unwrap_or_else(|| panic!("{deliveries:?}"))
    };
    let ok = of(&to_good);
    assert_eq!(
        (ok["state"].as_str(), ok["attempts"].as_i64(), ok["last_status"].as_i64()),
        (Some("succeeded"), Some(1), Some(200))
    );
    assert!(ok["next_attempt_at"].is_null(), "{ok}");
    let failing = of(&to_bad);
    assert_eq!(failing["state"], "retrying", "{failing}");
    assert_eq!((failing["attempts"].as_i64(), failing["last_status"].as_i64()), (Some(1), Some(503)));
    let next = tests::expect::timestamp(&failing["next_attempt_at"]);
    assert!(next > chrono::Utc::now() + chrono::Duration::minutes(30), "{failing}");
    let held = of(&disabled);
    assert_eq!(held["state"], "held", "{held}");
    assert_eq!(held["attempts"], 0);
    assert!(held["last_status"].is_null() && held["next_attempt_at"].is_null(), "{held}");

    // Another developer's event is 404, as is an unknown or malformed id; the
    // scope is webhooks:read.
    let other = api.new_developer().await;
    let path = format!("/webhook_events/{}", event_id(&event));
    api.get(&path, &other).await.expect_error(404, "not_found");
    api.get(&format!("/webhook_events/{}", unknown_event_id()), &key).await.expect_error(404, "not_found");
    api.get("/webhook_events/nope", &key).await.expect_error(404, "not_found");
    let writer = api.key_for(key.developer_id(), &[Scope::WebhooksWrite]).await;
    api.get(&path, &writer).await.expect_error(403, "forbidden");
    let reader = api.key_for(key.developer_id(), &[Scope::WebhooksRead]).await;
    api.get(&path, &reader).await.expect(200);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
