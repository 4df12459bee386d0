//! `Idempotency-Key` on `POST /internal/events`: a producer that retries gets
//! the event it already made, never a second one, and no gap in
//! `event_sequence`.

mod common;

use common::*;
use reqwest::Method;
use serde_json::Value;
use tests::{ApiResponse, TestApi};

async fn ingest_with_key(api: &TestApi, key: &str, body: &Value) -> ApiResponse {
    api.send(api.internal_request(Method::POST, "/internal/events").header("Idempotency-Key", key).json(body)).await
}

fn replayed(response: &ApiResponse) -> bool {
    response.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_event_is_made_once_and_answered_again() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let endpoint = api.create_endpoint(&key, &api.receiver().await.url()).await;
    let input = event_input(key.developer_id(), "transfer", 1);

    let first = ingest_with_key(&api, "order-42-paid", &input).await;
    let event = first.expect(201).clone();
    assert_event(&event, &input);
    assert!(!replayed(&first), "a first answer is not a replay");
    let again = ingest_with_key(&api, "order-42-paid", &input).await;
    assert_eq!(again.expect(201), &event, "the retry answers the same event");
    assert!(replayed(&again), "{:?}", again.headers);

    assert_eq!(webhook_events(&api, &key, "").await.len(), 1, "one event, not two");
    assert_eq!(upcoming_ids(&api, &key, &endpoint).await, [event_id(&event)], "one delivery, not two");

    // The same key with another event is refused and makes nothing.
    let other = event_input(key.developer_id(), "transfer", 2);
    ingest_with_key(&api, "order-42-paid", &other).await.expect_error(422, "idempotency_key_reused");
    assert_eq!(webhook_events(&api, &key, "").await.len(), 1);

    // Keys are per developer, and an event without a key is always new.
    let someone_else = api.new_developer().await;
    let theirs = ingest_with_key(&api, "order-42-paid", &event_input(someone_else.developer_id(), "transfer", 1)).await;
    assert_ne!(theirs.expect(201)["event_id"], event["event_id"]);
    let next = ingest(&api, key.developer_id(), "transfer", 1).await;
    assert_ne!(next["event_id"], event["event_id"]);
    assert_eq!(next["event_sequence"], event["event_sequence"].as_i64().unwrap() + 1, "no gap in event_sequence");

    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_twins_make_one_event_and_leave_no_sequence_gap() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let input = event_input(key.developer_id(), "customer", 7);

    let answers = futures::future::join_all((0..8).map(|_| ingest_with_key(&api, "twin", &input))).await;
    let ids: Vec<Value> = answers.iter().map(|a| a.expect(201)["event_id"].clone()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "twins made different events: {ids:?}");
    assert_eq!(answers.iter().filter(|a| !replayed(a)).count(), 1, "exactly one answer made the event");
    assert_eq!(answers[0].json["event_sequence"], 1);

    let next = ingest(&api, key.developer_id(), "customer", 8).await;
    assert_eq!(next["event_sequence"], 2, "the losing twins used no sequence number: {next}");
    assert_eq!(webhook_events(&api, &key, "").await.len(), 2);

    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_key_is_a_400_on_the_header() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let input = event_input(key.developer_id(), "transfer", 1);
    for bad in ["has space".to_owned(), "x".repeat(256), "tab\tkey".to_owned()] {
        let answer = ingest_with_key(&api, &bad, &input).await;
        answer.expect_error_at(400, "invalid", "header", "Idempotency-Key");
    }
    assert!(webhook_events(&api, &key, "").await.is_empty());
    // An empty value is no key at all on the public API either: refused.
    ingest_with_key(&api, "", &input).await.expect_error_at(400, "invalid", "header", "Idempotency-Key");
    api.shutdown().await.unwrap();
}
