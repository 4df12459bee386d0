//! Retries on a shortened `RETRY_SCHEDULE` (API.md §5 rule 6, §6): every
//! attempt signed afresh and logged, `failed` after the last one and still
//! sendable, the delivery log and its paging, a deleted endpoint's retries
//! cancelled, and the retries of a `send` held while the endpoint is disabled.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tests::{ApiOptions, Reply, TestApi, WAIT};
use webhooks_signature::platform::SIGNATURE_HEADER;

fn schedule(retry_schedule: &str) -> ApiOptions {
    ApiOptions { retry_schedule: Some(retry_schedule.to_owned()), ..ApiOptions::default() }
}

fn field(entries: &[Value], name: &str) -> Vec<Value> {
    entries.iter().map(|e| e[name].clone()).collect()
}

#[tests::test]
async fn failed_attempts_are_retried_signed_afresh_and_logged_newest_first() {
    let api = TestApi::start_with(schedule("1s,1s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::status(500).body("try later"), Reply::status(500).body("try later")]);
    receiver.reply_always(Reply::ok().body("thanks"));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    let requests = receiver.wait_for(3).await.unwrap();
    for request in &requests {
        assert_delivery(request, &event);
    }
    let stamps = receiver.verify_with(&pem(&endpoint)).unwrap();
    let signatures: Vec<&str> = requests.iter().map(|r| r.header(SIGNATURE_HEADER).unwrap()).collect();
    for (i, pair) in signatures.windows(2).enumerate() {
        assert_ne!(pair[0], pair[1], "attempts {} and {} carry the same signature", i + 1, i + 2);
    }
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "each attempt signs a later time: {stamps:?}");

    let entries = wait_for_logs(&api, &key, &endpoint, 3).await;
    assert_eq!(entries.len(), 3, "{entries:?}");
    assert_eq!(field(&entries, "attempt"), [3, 2, 1], "{entries:?}");
    assert_eq!(field(&entries, "status"), [200, 500, 500], "{entries:?}");
    assert_eq!(field(&entries, "response_body"), ["thanks", "try later", "try later"], "{entries:?}");
    assert!(entries.iter().all(|e| e["event_id"] == event["event_id"]), "{entries:?}");
    assert!(entries[0]["error"].is_null(), "a success carries no error: {}", entries[0]);
    let created: Vec<&str> = entries.iter().map(|e| e["created_at"].as_str().unwrap()).collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "not newest first: {created:?}");
    wait_upcoming(&api, &key, &endpoint, &event_id(&event), false).await;

    // Paging: limit, then starting_after a log id.
    let ids: Vec<String> = entries.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(logs(&api, &key, &endpoint, "?limit=2").await, entries[..2].to_vec());
    assert_eq!(logs(&api, &key, &endpoint, "?limit=1").await, entries[..1].to_vec());
    assert_eq!(logs(&api, &key, &endpoint, &format!("?starting_after={}", ids[0])).await, entries[1..].to_vec());
    assert_eq!(logs(&api, &key, &endpoint, &format!("?limit=1&starting_after={}", ids[0])).await, entries[1..2]);
    assert_eq!(logs(&api, &key, &endpoint, &format!("?starting_after={}", ids[1])).await, entries[2..].to_vec());
    assert_eq!(logs(&api, &key, &endpoint, &format!("?starting_after={}", ids[2])).await, Vec::<Value>::new());
    assert_eq!(logs(&api, &key, &endpoint, "").await, entries, "default page");
    let path = format!("/webhooks/{}/logs", id(&endpoint));
    for cursor in [uuid::Uuid::new_v4().to_string(), uuid::Uuid::now_v7().to_string(), "nope".to_owned()] {
        let answer = api.get(&format!("{path}?starting_after={cursor}"), &key).await;
        answer.expect_error_at(400, "invalid", "query", "starting_after");
    }
    for bad in ["0", "101", "x"] {
        api.get(&format!("{path}?limit={bad}"), &key).await.expect_error_at(400, "invalid", "query", "limit");
    }
    // Another endpoint's log id is no cursor here either.
    let other = active_endpoint(&api, &key, &api.receiver().await.url()).await;
    let answer = api.get(&format!("/webhooks/{}/logs?starting_after={}", id(&other), ids[0]), &key).await;
    answer.expect_error_at(400, "invalid", "query", "starting_after");

    assert_eq!(receiver.count(), 3, "a delivered event was attempted again: {:?}", received_ids(&receiver));
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_delivery_waiting_for_its_retry_is_upcoming_and_send_delivers_it_now() {
    let api = TestApi::start_with(schedule("1h")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::status(503)]);
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "customer", 1).await;
    receiver.wait_for(1).await.unwrap();
    let entries = wait_for_logs(&api, &key, &endpoint, 1).await;
    assert_eq!(field(&entries, "status"), [503]);
    assert_eq!(upcoming_ids(&api, &key, &endpoint).await, vec![event_id(&event)], "a retrying delivery is upcoming");

    assert_sent(&send(&api, &key, &endpoint, &event_id(&event)).await);
    let requests = receiver.wait_for(2).await.unwrap();
    assert_delivery(&requests[1], &event);
    verify_all(&receiver, &endpoint);
    let entries = wait_for_logs(&api, &key, &endpoint, 2).await;
    assert_eq!(field(&entries, "status"), [200, 503], "{entries:?}");
    assert_eq!(field(&entries, "attempt"), [1, 1], "send restarts the schedule (README): {entries:?}");
    wait_upcoming(&api, &key, &endpoint, &event_id(&event), false).await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_delivery_fails_after_its_last_attempt_and_send_still_delivers_it() {
    let api = TestApi::start_with(schedule("1s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    receiver.wait_for(2).await.unwrap();
    // Failed is not upcoming.
    wait_upcoming(&api, &key, &endpoint, &event_id(&event), false).await;
    let entries = wait_for_logs(&api, &key, &endpoint, 2).await;
    assert_eq!(field(&entries, "attempt"), [2, 1], "{entries:?}");
    assert_eq!(field(&entries, "status"), [500, 500], "{entries:?}");
    // Twice the whole schedule: no third attempt comes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.count(), 2, "attempts after the last one: {:?}", received_ids(&receiver));
    assert_eq!(logs(&api, &key, &endpoint, "").await.len(), 2);

    // Later, the receiver is fixed and the developer sends the event again.
    receiver.reply_always(Reply::ok());
    assert_sent(&send(&api, &key, &endpoint, &event_id(&event)).await);
    let requests = receiver.wait_for(3).await.unwrap();
    assert_delivery(&requests[2], &event);
    verify_all(&receiver, &endpoint);
    let entries = wait_for_logs(&api, &key, &endpoint, 3).await;
    assert_eq!(field(&entries, "status"), [200, 500, 500], "{entries:?}");
    assert_eq!(entries[0]["attempt"], 1, "send restarts the schedule (README): {}", entries[0]);
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty());

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn deleting_an_endpoint_cancels_its_retries() {
    let api = TestApi::start_with(schedule("1s,1s,1s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let (doomed_rx, barrier_rx) = (api.receiver().await, api.receiver().await);
    doomed_rx.reply_always(Reply::status(500));
    let doomed = active_endpoint(&api, &key, &doomed_rx.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    doomed_rx.wait_for(1).await.unwrap();
    let deleted = api.delete(&format!("/webhooks/{}", id(&doomed)), &key).await;
    assert_eq!(deleted.expect(200)["status"], "deleted");

    // The barrier: an event to a new endpoint that fails twice, so its third
    // attempt comes through the same retry queue behind the deleted
    // endpoint's retry, a whole round later.
    barrier_rx.reply_sequence([Reply::status(500), Reply::status(500)]);
    let barrier = active_endpoint(&api, &key, &barrier_rx.url()).await;
    let later = ingest(&api, key.developer_id(), "transfer", 2).await;
    let requests = barrier_rx.wait_for(3).await.unwrap();
    assert!(requests.iter().all(|r| r.header("x-webhook-id") == later["event_id"].as_str()));
    verify_all(&barrier_rx, &barrier);

    assert_eq!(doomed_rx.count(), 1, "a deleted endpoint was attempted again: {:?}", received_ids(&doomed_rx));
    assert_delivery(&doomed_rx.requests()[0], &event);
    verify_all(&doomed_rx, &doomed);
    for path in ["", "/events", "/logs"] {
        api.get(&format!("/webhooks/{}{path}", id(&doomed)), &key).await.expect_error(404, "not_found");
    }
    send(&api, &key, &doomed, &event_id(&event)).await.expect_error(404, "not_found");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_longer_retry_after_on_503_is_honoured() {
    // The schedule would retry after at most 500 ms; the receiver asks for 2 s.
    let api = TestApi::start_with(schedule("500ms,5s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::status(503).header("Retry-After", "2")]);
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    let requests = receiver.wait_for(2).await.unwrap();
    for request in &requests {
        assert_delivery(request, &event);
    }
    let waited = requests[1].received_at_ms() - requests[0].received_at_ms();
    assert!(waited >= 1900, "the retry came {waited} ms after a 503 asking for 2 s");
    let entries = wait_for_logs(&api, &key, &endpoint, 2).await;
    assert_eq!(field(&entries, "status"), [200, 503], "{entries:?}");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_send_overtakes_a_scheduled_retry_which_then_delivers_nothing() {
    let api = TestApi::start_with(schedule("10s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::status(500).body("not yet")]);
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    let first = wait_for_logs(&api, &key, &endpoint, 1).await;
    assert_eq!(first[0]["status"], 500, "{first:?}");
    let listed = upcoming(&api, &key, &endpoint, "").await;
    assert_eq!(listed.len(), 1, "a failed first attempt with a retry due is upcoming: {listed:?}");

    // The developer does not wait for the retry due in 9 to 10 s.
    assert_eq!(receiver.count(), 1, "the retry came before the send: {:?}", received_ids(&receiver));
    assert_sent(&send(&api, &key, &endpoint, &event_id(&event)).await);
    receiver.wait_for(2).await.unwrap();
    wait_upcoming(&api, &key, &endpoint, &event_id(&event), false).await;

    match api.is_standalone() {
        // The retry scheduled before the send comes due and is dropped unsent.
        false => {
            let superseded = "webhooks_dispatcher_deliveries_total{outcome=\"superseded\"}";
            eventually("the overtaken retry is dropped", WAIT, async || {
                let text = metrics(&api.client, dispatcher.addr).await;
                if sample(&text, superseded) == Some(1.0) { Ok(()) } else { Err(text) }
            })
            .await;
        }
        // The delivery is its own queue entry: the send re-armed it, and once
        // it succeeded nothing is left to come due.
        true => assert_eq!(api.delivery_table().next_due_at(true).await.unwrap(), None, "a delivery is still due"),
    }
    assert_eq!(receiver.count(), 2, "the overtaken retry was delivered: {:?}", received_ids(&receiver));
    let entries = logs(&api, &key, &endpoint, "").await;
    assert_eq!(field(&entries, "status"), [200, 500], "{entries:?}");
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty(), "the delivery is settled");
    verify_all(&receiver, &endpoint);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn send_forces_one_attempt_and_its_retries_wait_while_the_endpoint_is_disabled() {
    let api = TestApi::start_with(schedule("1s,1s")).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500).body("down"));
    let endpoint = create(&api, &key, serde_json::json!({ "url": receiver.url() })).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;

    // The endpoint is disabled: send makes one attempt all the same.
    assert_sent(&send(&api, &key, &endpoint, &event_id(&event)).await);
    receiver.wait_for(1).await.unwrap();
    // Its retry comes due a second later and is held, not sent.
    let held = "webhooks_dispatcher_deliveries_total{outcome=\"held\"}";
    eventually("the retry of the sent event is held", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        if sample(&text, held) == Some(1.0) { Ok(()) } else { Err(text) }
    })
    .await;
    assert_eq!(receiver.count(), 1, "a retry reached a disabled endpoint: {:?}", received_ids(&receiver));
    assert_eq!(upcoming_ids(&api, &key, &endpoint).await, vec![event_id(&event)], "it waits as upcoming");
    let entries = logs(&api, &key, &endpoint, "").await;
    assert_eq!(field(&entries, "status"), [500], "{entries:?}");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
