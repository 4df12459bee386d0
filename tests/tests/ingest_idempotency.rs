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

#[tests::test]
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

#[tests::test]
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

/// Requests that arrive together are stored together (one transaction for
/// what queued up while the previous one committed): twins, twins that
/// disagree, keyed and unkeyed events side by side must each be answered as
/// if they had come one by one.
#[tests::test]
async fn a_burst_of_twins_and_new_events_makes_each_event_once() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let developer = key.developer_id();
    // (Idempotency-Key, body) of every request: 30 keys sent three times
    // alike, 10 keys sent twice alike and once with another event, and 40
    // events without a key.
    let mut requests: Vec<(Option<String>, Value)> = Vec::new();
    for k in 0..30 {
        for _ in 0..3 {
            requests.push((Some(format!("alike-{k}")), event_input(developer, "transfer", k)));
        }
    }
    for k in 0..10 {
        requests.push((Some(format!("split-{k}")), event_input(developer, "customer", k)));
        requests.push((Some(format!("split-{k}")), event_input(developer, "customer", 1000 + k)));
        requests.push((Some(format!("split-{k}")), event_input(developer, "customer", k)));
    }
    for n in 0..40 {
        requests.push((None, event_input(developer, "transfer", 2000 + n)));
    }
    let answers = futures::future::join_all(requests.iter().map(|(key, body)| async {
        match key {
            Some(key) => ingest_with_key(&api, key, body).await,
            None => api.ingest(body).await,
        }
    }))
    .await;

    let mut made = std::collections::HashMap::new();
    for ((idempotency_key, body), answer) in requests.iter().zip(&answers) {
        let Some(idempotency_key) = idempotency_key else {
            assert_event(answer.expect(201), body);
            assert!(!replayed(answer), "an event without a key is always new");
            assert!(made.insert(event_id(&answer.json), answer.json.clone()).is_none());
            continue;
        };
        let twins: Vec<&ApiResponse> = requests
            .iter()
            .zip(&answers)
            .filter(|((k, _), _)| k == &Some(idempotency_key.clone()))
            .map(|(_, a)| a)
            .collect();
        let first = twins.iter().find(|a| a.status == 201 && !replayed(a)).expect("one request made the event");
        assert_eq!(twins.iter().filter(|a| a.status == 201 && !replayed(a)).count(), 1, "{idempotency_key}");
        let event = &first.json;
        if answer.status == 201 {
            assert_eq!(answer.json, *event, "{idempotency_key}: a twin answers the event the first one made");
        } else {
            answer.expect_error(422, "idempotency_key_reused");
            assert_ne!(event["event_object_id"], body["event_object_id"], "{idempotency_key}: refused the same event");
        }
        made.insert(event_id(event), event.clone());
    }
    assert_eq!(made.len(), 30 + 10 + 40);
    let mut sequences: Vec<i64> = made.values().map(|e| e["event_sequence"].as_i64().unwrap()).collect();
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=80).collect::<Vec<i64>>(), "each event made once, counted by one");
    assert_eq!(webhook_events(&api, &key, "?limit=500").await.len(), 80, "no other event was stored");

    api.shutdown().await.unwrap();
}

#[tests::test]
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
