//! Helpers the delivery-pipeline tests share: events to ingest, endpoints in a
//! given state, the contract's lists, and waits on outcomes (never on time).
//!
//! Each test binary uses a part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::{
    collections::{BTreeSet, HashSet},
    time::Duration,
};

use futures::StreamExt;
use serde_json::{Value, json};
use tests::{ApiResponse, DeveloperKey, Receiver, RecordedRequest, TestApi, WAIT, expect};
use uuid::Uuid;
use webhooks_signature::platform::SIGNATURE_HEADER;

/// A body for `POST /internal/events`; `n` makes the object distinct.
pub fn event_input(developer_id: Uuid, category: &str, n: usize) -> Value {
    json!({
        "developer_id": developer_id,
        "event_category": category,
        "event_type": format!("{category}.updated.status_transitioned"),
        "event_object_id": format!("obj_{n}"),
        "event_object": { "id": format!("obj_{n}"), "n": n, "state": "payment_processed" },
        "event_object_status": "payment_processed",
        "event_object_changes": { "state": ["pending", "payment_processed"] },
    })
}

/// Ingests one event and returns the `Event` the API answered (asserts 201 and its shape).
pub async fn ingest(api: &TestApi, developer_id: Uuid, category: &str, n: usize) -> Value {
    let input = event_input(developer_id, category, n);
    let event = api.ingest(&input).await.expect(201).clone();
    assert_event(&event, &input);
    event
}

/// Ingests `count` events of `category`, `concurrency` at a time; returns them
/// in no particular order.
pub async fn ingest_many(
    api: &TestApi,
    developer_id: Uuid,
    category: &str,
    count: usize,
    concurrency: usize,
) -> Vec<Value> {
    futures::stream::iter(0..count)
        .map(|n| async move {
            let response = api.ingest(&event_input(developer_id, category, n)).await;
            response.expect(201).clone()
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Whether `id` is `wh_` + 32 lowercase hex digits.
pub fn is_event_id(id: &str) -> bool {
    id.strip_prefix("wh_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Checks an `Event` (API.md §5) against the ingest body it came from.
#[track_caller]
pub fn assert_event(event: &Value, input: &Value) {
    assert_eq!(event["api_version"], "v0", "{event}");
    let id = event["event_id"].as_str().unwrap_or_else(|| panic!("no event_id: {event}"));
    assert!(is_event_id(id), "event_id {id:?} is not wh_ + 32 hex: {event}");
    assert_eq!(event["event_developer_id"], input["developer_id"], "{event}");
    for field in ["event_category", "event_type", "event_object_id", "event_object", "event_object_status"] {
        assert_eq!(event[field], input[field], "{field} of {event}");
    }
    assert_eq!(event["event_object_changes"], input["event_object_changes"], "{event}");
    assert!(event["event_sequence"].as_i64().is_some_and(|s| s >= 1), "event_sequence of {event}");
    expect::timestamp(&event["event_created_at"]);
}

/// The `event_id` of an `Event`.
#[track_caller]
pub fn event_id(event: &Value) -> String {
    event["event_id"].as_str().unwrap_or_else(|| panic!("no event_id: {event}")).to_owned()
}

/// The `id` of a `Webhook`.
#[track_caller]
pub fn id(webhook: &Value) -> String {
    webhook["id"].as_str().unwrap_or_else(|| panic!("no id: {webhook}")).to_owned()
}

/// The `public_key` of a `Webhook`.
#[track_caller]
pub fn pem(webhook: &Value) -> String {
    webhook["public_key"].as_str().unwrap_or_else(|| panic!("no public_key: {webhook}")).to_owned()
}

/// `POST /webhooks` with `body` (which must hold `url`); asserts 201.
pub async fn create(api: &TestApi, key: &DeveloperKey, body: Value) -> Value {
    api.post("/webhooks", key, &body).await.expect(201).clone()
}

/// `PUT /webhooks/{id}` with `{"status": status}`; asserts 200 and the new status.
pub async fn set_status(api: &TestApi, key: &DeveloperKey, webhook: &Value, status: &str) -> Value {
    let answer = api.put(&format!("/webhooks/{}", id(webhook)), key, &json!({ "status": status })).await;
    let updated = answer.expect(200).clone();
    assert_eq!(updated["status"], status, "{updated}");
    updated
}

/// An endpoint for `url`, switched on.
pub async fn active_endpoint(api: &TestApi, key: &DeveloperKey, url: &str) -> Value {
    active_endpoint_with(api, key, json!({ "url": url })).await
}

/// An endpoint created with `body`, switched on.
pub async fn active_endpoint_with(api: &TestApi, key: &DeveloperKey, body: Value) -> Value {
    let created = create(api, key, body).await;
    set_status(api, key, &created, "active").await
}

/// `GET /webhooks/{id}/events{query}`, asserting 200 and `count == data.len()`:
/// the `Event`s, each without the `delivery` it is listed with (whose shape
/// is checked).
pub async fn upcoming(api: &TestApi, key: &DeveloperKey, webhook: &Value, query: &str) -> Vec<Value> {
    let mut entries = upcoming_entries(api, key, webhook, query).await;
    for entry in &mut entries {
        entry.as_object_mut().expect("an object").remove("delivery");
    }
    entries
}

/// `GET /webhooks/{id}/events{query}` as listed: each entry an `Event` with
/// `delivery: {state, attempts, next_attempt_at}` or null.
pub async fn upcoming_entries(api: &TestApi, key: &DeveloperKey, webhook: &Value, query: &str) -> Vec<Value> {
    let entries = list(api.get(&format!("/webhooks/{}/events{query}", id(webhook)), key).await);
    for entry in &entries {
        let delivery = entry.get("delivery").unwrap_or_else(|| panic!("an upcoming entry without delivery: {entry}"));
        if !delivery.is_null() {
            assert!(
                ["held", "pending", "retrying", "waiting"].contains(&delivery["state"].as_str().unwrap_or("")),
                "{entry}"
            );
            assert!(delivery["attempts"].as_i64().is_some_and(|a| a >= 0), "{entry}");
            assert!(delivery["next_attempt_at"].is_null() || delivery["next_attempt_at"].is_string(), "{entry}");
        }
    }
    entries
}

/// The event ids of `GET /webhooks/{id}/events?limit=100`, in the order listed.
pub async fn upcoming_ids(api: &TestApi, key: &DeveloperKey, webhook: &Value) -> Vec<String> {
    upcoming(api, key, webhook, "?limit=100").await.iter().map(event_id).collect()
}

/// `GET /webhooks/{id}/logs{query}`, asserting 200, `count == data.len()` and
/// the shape of every `DeliveryLog`.
pub async fn logs(api: &TestApi, key: &DeveloperKey, webhook: &Value, query: &str) -> Vec<Value> {
    let entries = list(api.get(&format!("/webhooks/{}/logs{query}", id(webhook)), key).await);
    for entry in &entries {
        assert_log(entry);
    }
    entries
}

/// `GET /webhook_events{query}`, asserting 200 and `count == data.len()`.
pub async fn webhook_events(api: &TestApi, key: &DeveloperKey, query: &str) -> Vec<Value> {
    list(api.get(&format!("/webhook_events{query}"), key).await)
}

/// The `data` of a `{count, data}` answer (asserts 200 and the count).
#[track_caller]
pub fn list(response: ApiResponse) -> Vec<Value> {
    let body = response.expect(200);
    let data = body["data"].as_array().unwrap_or_else(|| panic!("{} answered no data: {body}", response.request));
    assert_eq!(body["count"].as_u64(), Some(data.len() as u64), "{} answered {body}", response.request);
    assert!(body["has_more"].is_boolean(), "{} answered without has_more: {body}", response.request);
    data.clone()
}

/// Checks a `DeliveryLog` (API.md §5).
#[track_caller]
pub fn assert_log(entry: &Value) {
    let id = entry["id"].as_str().unwrap_or_else(|| panic!("log without id: {entry}"));
    assert!(!id.is_empty(), "{entry}");
    assert!(entry["event_id"].as_str().is_some_and(is_event_id), "{entry}");
    assert!(entry["attempt"].as_i64().is_some_and(|a| a >= 1), "{entry}");
    assert!(entry["status"].is_null() || entry["status"].as_i64().is_some(), "{entry}");
    assert!(entry.get("response_body").is_some(), "{entry}");
    assert!(entry["error"].is_null() || entry["error"].as_str().is_some_and(|e| !e.is_empty()), "{entry}");
    assert!(entry["duration_ms"].as_i64().is_some_and(|d| d >= 0), "{entry}");
    expect::timestamp(&entry["created_at"]);
}

/// `POST /webhooks/{id}/send` with `{"event_id": event_id}` and a fresh `Idempotency-Key`.
pub async fn send(api: &TestApi, key: &DeveloperKey, webhook: &Value, event_id: &str) -> ApiResponse {
    api.post(&format!("/webhooks/{}/send", id(webhook)), key, &json!({ "event_id": event_id })).await
}

/// Asserts a `send` answer: 200 `{"message": "…"}`.
#[track_caller]
pub fn assert_sent(response: &ApiResponse) {
    let body = response.expect(200);
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{} answered {body}", response.request);
}

/// A well-formed event id that names no event.
pub fn unknown_event_id() -> String {
    format!("wh_{}", Uuid::new_v4().simple())
}

/// The event ids a receiver got, in arrival order (duplicates kept).
pub fn received_ids(receiver: &Receiver) -> Vec<String> {
    receiver.requests().iter().map(|r| r.header("x-webhook-id").unwrap_or_default().to_owned()).collect()
}

/// The distinct event ids a receiver got.
pub fn distinct_ids(receiver: &Receiver) -> HashSet<String> {
    received_ids(receiver).into_iter().collect()
}

/// Waits until the receiver got at least `n` distinct `X-Webhook-Id`s, up to `timeout`.
pub async fn wait_for_distinct(receiver: &Receiver, n: usize, timeout: Duration) -> HashSet<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = receiver.count();
        let distinct = distinct_ids(receiver);
        if distinct.len() >= n {
            return distinct;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if receiver.wait_for_within(seen + 1, left).await.is_err() {
            panic!(
                "the receiver got {} distinct events of {n} ({} requests) within {timeout:?}",
                distinct_ids(receiver).len(),
                receiver.count()
            );
        }
    }
}

/// Waits until the receiver got every event of `ids`, up to `timeout`.
pub async fn wait_for_events(receiver: &Receiver, ids: &[String], timeout: Duration) {
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = receiver.count();
        let got = distinct_ids(receiver);
        let missing: Vec<&str> = wanted.iter().copied().filter(|id| !got.contains(*id)).collect();
        if missing.is_empty() {
            return;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if receiver.wait_for_within(seen + 1, left).await.is_err() {
            panic!("{} of {} events never arrived within {timeout:?}: {missing:?}", missing.len(), wanted.len());
        }
    }
}

/// Asserts what every delivery carries (API.md §5 rule 5, README): a POST of
/// the `Event` as JSON with `X-Webhook-Id`, `User-Agent` and a signature header.
#[track_caller]
pub fn assert_delivery(request: &RecordedRequest, event: &Value) {
    assert_eq!(request.method, "POST");
    assert_eq!(request.header("content-type"), Some("application/json"), "Content-Type of {:?}", request.headers);
    assert_eq!(request.header("x-webhook-id"), event["event_id"].as_str(), "X-Webhook-Id");
    let agent = request.header("user-agent").unwrap_or_default();
    assert!(agent.starts_with("webhooks-dispatcher/"), "User-Agent {agent:?}");
    assert!(request.header(SIGNATURE_HEADER).is_some(), "no {SIGNATURE_HEADER}: {:?}", request.headers);
    assert_eq!(&request.json().expect("a JSON body"), event, "the body is not the Event");
}

/// Checks the signature of every request the receiver got against the
/// endpoint's PEM key, as a user's receiver would.
#[track_caller]
pub fn verify_all(receiver: &Receiver, webhook: &Value) {
    let signed = receiver.verify_with(&pem(webhook)).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(signed.len(), receiver.count());
}

/// Polls `check` until it answers `Ok`, up to `timeout`; fails with the last
/// `Err` otherwise.
pub async fn eventually<T>(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not so within {timeout:?}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until the endpoint's log holds at least `n` entries and returns them
/// (newest first).
pub async fn wait_for_logs(api: &TestApi, key: &DeveloperKey, webhook: &Value, n: usize) -> Vec<Value> {
    eventually(&format!("{n} log entries"), WAIT, async || {
        let entries = logs(api, key, webhook, "?limit=100").await;
        if entries.len() >= n { Ok(entries) } else { Err(format!("{entries:?}")) }
    })
    .await
}

/// Waits until `event_id` is (or is no longer) among the endpoint's upcoming events.
pub async fn wait_upcoming(api: &TestApi, key: &DeveloperKey, webhook: &Value, event_id: &str, listed: bool) {
    let what = format!("{event_id} {} upcoming", if listed { "is" } else { "is no longer" });
    eventually(&what, WAIT, async || {
        let ids = upcoming_ids(api, key, webhook).await;
        if ids.iter().any(|i| i == event_id) == listed { Ok(()) } else { Err(format!("{ids:?}")) }
    })
    .await;
}

/// The `/metrics` text of a listener at `addr`.
pub async fn metrics(client: &reqwest::Client, addr: std::net::SocketAddr) -> String {
    let response = client.get(format!("http://{addr}/metrics")).send().await.expect("GET /metrics");
    assert_eq!(response.status(), 200);
    response.text().await.expect("metrics text")
}

/// The value of the sample `name` (with its labels, as exposed) in a metrics text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}
