//! Recovery of a time window (API.md §8.6 `recover`): every failed or
//! upcoming delivery of the window is queued again in one call, answered 202
//! at once, and no event is queued twice for the endpoint.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, DeveloperKey, Receiver, Reply, TestApi, WAIT, expect};

/// Recovers `window` and returns how many deliveries it queues: as the call
/// answered, or, when the count was not known yet (`queued: null`), as
/// `GET …/recover` shows it once known.
async fn recover(api: &TestApi, key: &DeveloperKey, webhook: &Value, window: Value) -> u64 {
    let path = format!("/webhooks/{}/recover", id(webhook));
    let answer = api.post(&path, key, &window).await;
    let body = answer.expect(202).clone();
    if let Some(queued) = body["queued"].as_u64() {
        if queued == 0 {
            assert!(body["reason"].as_str().is_some_and(|r| !r.is_empty()), "nothing queued, and no reason: {body}");
        }
        return queued;
    }
    assert!(body["queued"].is_null(), "{body}");
    eventually("the recovery is counted", WAIT, async || {
        let shown = api.get(&path, key).await.expect(200).clone();
        match (shown["id"] == body["id"], shown["total"].as_u64()) {
            (true, Some(total)) => Ok(total),
            _ => Err(shown.to_string()),
        }
    })
    .await
}

/// The recovery `GET {path}` shows, once it is done.
async fn finished(api: &TestApi, key: &DeveloperKey, path: &str) -> Value {
    eventually("the recovery is done", WAIT, async || {
        let shown = api.get(path, key).await.expect(200).clone();
        if shown["status"] == "done" { Ok(shown) } else { Err(shown.to_string()) }
    })
    .await
}

/// Starts a dispatcher and waits until each of `events` has reached
/// `receiver`; then nothing else may come: no event twice, no other event.
async fn each_delivered_once(api: &TestApi, receiver: &Receiver, events: &[Value], wait: Duration) {
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let ids: Vec<String> = events.iter().map(event_id).collect();
    wait_for_events(receiver, &ids, wait).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), events.len(), "an event came twice, or one not in the window");
    dispatcher.stop().await.unwrap();
}

fn at(event: &Value) -> chrono::DateTime<chrono::Utc> {
    expect::timestamp(&event["event_created_at"])
}

#[tests::test]
async fn failed_and_upcoming_deliveries_of_the_window_are_queued_once() {
    let options = ApiOptions { retry_schedule: Some("500ms".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;

    // Three events fail for good (two attempts each), one is missed while disabled.
    let mut failed = Vec::new();
    for n in 0..3 {
        failed.push(ingest(&api, key.developer_id(), "transfer", n).await);
    }
    wait_for_logs(&api, &key, &webhook, 6).await;
    for event in &failed {
        wait_upcoming(&api, &key, &webhook, &event_id(event), false).await;
    }
    set_status(&api, &key, &webhook, "disabled").await;
    let missed = ingest(&api, key.developer_id(), "transfer", 3).await;
    // `until` is `later`'s time as shown, in milliseconds: keep them apart.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let later = ingest(&api, key.developer_id(), "transfer", 4).await;
    wait_upcoming(&api, &key, &webhook, &event_id(&later), true).await;
    let requests = receiver.count();
    receiver.reply_always(Reply::ok());

    // A window before everything queues nothing, nor does one that ends
    // before it starts.
    let before = at(&failed[0]) - chrono::Duration::hours(1);
    let empty = json!({ "since": webhooks_model::time::format(&(before - chrono::Duration::hours(1))),
                        "until": webhooks_model::time::format(&before) });
    assert_eq!(recover(&api, &key, &webhook, empty).await, 0);
    let backwards =
        json!({ "since": webhooks_model::time::format(&at(&later)), "until": webhooks_model::time::format(&before) });
    assert_eq!(recover(&api, &key, &webhook, backwards).await, 0);

    // The window holds the failed three and the missed one, not `later`.
    let window = json!({ "since": webhooks_model::time::format(&at(&failed[0])),
                         "until": webhooks_model::time::format(&at(&later)) });
    assert_eq!(recover(&api, &key, &webhook, window.clone()).await, 4);
    let mut wanted: Vec<String> = failed.iter().map(event_id).collect();
    wanted.push(event_id(&missed));
    // The failed ones reached the receiver before (with a 500): count anew.
    receiver.wait_for(requests + 4).await.unwrap();
    let mut recovered: Vec<String> = received_ids(&receiver).split_off(requests);
    recovered.sort();
    wanted.sort();
    assert_eq!(recovered, wanted, "each event of the window once");
    wait_upcoming(&api, &key, &webhook, &event_id(&missed), false).await;
    wait_upcoming(&api, &key, &webhook, &event_id(&later), true).await;

    // Once delivered, the same window has nothing left to queue.
    eventually("the recovered deliveries succeed", WAIT, async || {
        let answer = api.post(&format!("/webhooks/{}/recover", id(&webhook)), &key, &window).await;
        match (answer.status, answer.json["queued"].as_u64()) {
            (202, Some(0)) => Ok(()),
            (status, _) => Err(format!("{status}: {}", answer.text())),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), requests + 4, "{:?}", received_ids(&receiver));

    // Scope and ownership as for every endpoint call.
    let reader = api.key_for(key.developer_id(), &[webhooks_model::Scope::WebhooksRead]).await;
    api.post(&format!("/webhooks/{}/recover", id(&webhook)), &reader, &window).await.expect_error(403, "forbidden");
    let stranger = api.new_developer().await;
    api.post(&format!("/webhooks/{}/recover", id(&webhook)), &stranger, &window).await.expect_error(404, "not_found");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_recovery_queues_only_the_event_types_the_endpoint_takes_now() {
    let options = ApiOptions { retry_schedule: Some("500ms".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;

    // A transfer and a customer event fail for good; then the endpoint
    // narrows to transfers' type.
    let transfer = ingest(&api, key.developer_id(), "transfer", 0).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let customer = ingest(&api, key.developer_id(), "customer", 1).await;
    wait_for_logs(&api, &key, &webhook, 4).await;
    for event in [&transfer, &customer] {
        wait_upcoming(&api, &key, &webhook, &event_id(event), false).await;
    }
    let narrowed = json!({ "event_types": [transfer["event_type"]] });
    api.put(&format!("/webhooks/{}", id(&webhook)), &key, &narrowed).await.expect(200);
    let requests = receiver.count();
    receiver.reply_always(Reply::ok());

    let until = at(&customer) + chrono::Duration::milliseconds(1);
    let window = json!({ "since": webhooks_model::time::format(&at(&transfer)),
                         "until": webhooks_model::time::format(&until) });
    assert_eq!(recover(&api, &key, &webhook, window).await, 1, "only the transfer is the endpoint's now");
    receiver.wait_for(requests + 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(received_ids(&receiver).split_off(requests), vec![event_id(&transfer)]);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// A `beginning_of_time` endpoint made after its developer's events has no
/// delivery for them, yet they are upcoming for it: a recovery counts and
/// queues those of its categories, and no other.
#[tests::test]
async fn a_recovery_queues_the_earlier_events_a_beginning_of_time_endpoint_never_had() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let started = webhooks_model::time::now();
    let mut transfers = Vec::new();
    for n in 0..3 {
        transfers.push(ingest(&api, key.developer_id(), "transfer", n).await);
    }
    ingest(&api, key.developer_id(), "customer", 3).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let webhook = create(
        &api,
        &key,
        json!({ "url": receiver.url(), "event_epoch": "beginning_of_time", "event_categories": ["transfer"] }),
    )
    .await;

    assert_eq!(recover(&api, &key, &webhook, since(started)).await, 3, "the three earlier transfers");
    each_delivered_once(&api, &receiver, &transfers, WAIT).await;
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn thousands_of_events_are_recovered_in_the_background_each_once() {
    const EVENTS: usize = 2_000;
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let started = webhooks_model::time::now();
    let events = ingest_many(&api, key.developer_id(), "customer", EVENTS, 16).await;
    assert_eq!(events.len(), EVENTS);
    // No dispatcher yet: the recovery answers before anything is delivered.
    let window = json!({ "since": webhooks_model::time::format(&(started - chrono::Duration::seconds(1))) });
    assert_eq!(recover(&api, &key, &webhook, window).await, EVENTS as u64);
    each_delivered_once(&api, &receiver, &events, WAIT * 4).await;
    api.shutdown().await.unwrap();
}

/// The recovery window from a second before `started` up to now.
fn since(started: chrono::DateTime<chrono::Utc>) -> Value {
    json!({ "since": webhooks_model::time::format(&(started - chrono::Duration::seconds(1))) })
}

/// Recoveries queueing ten deliveries per batch, whatever the default.
fn batches_of_ten() -> ApiOptions {
    ApiOptions { extra_args: vec!["--recovery-batch".into(), "10".into()], ..ApiOptions::default() }
}

/// One recovery runs per endpoint: a second call while it runs answers 409
/// naming it, and `GET …/recover` shows how far it got, then that it is done.
#[tests::test]
async fn one_recovery_runs_per_endpoint_and_its_progress_is_shown() {
    let api = TestApi::start_with(batches_of_ten()).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let path = format!("/webhooks/{}/recover", id(&webhook));
    api.get(&path, &key).await.expect_error(404, "not_found");
    let started = webhooks_model::time::now();
    ingest_many(&api, key.developer_id(), "customer", 300, 16).await;

    assert_eq!(recover(&api, &key, &webhook, since(started)).await, 300);
    let running = api.get(&path, &key).await.expect(200).clone();
    assert_eq!((running["status"].as_str(), running["total"].as_i64()), (Some("running"), Some(300)), "{running}");
    let refused = api.post(&path, &key, &since(started)).await;
    let body = refused.expect_error(409, "invalid_state");
    let named = running["id"].as_str().unwrap();
    assert!(body["message"].as_str().is_some_and(|m| m.contains(named)), "the running recovery is not named: {body}");

    let done = finished(&api, &key, &path).await;
    assert_eq!((done["id"].as_str(), done["queued"].as_i64()), (Some(named), Some(300)), "{done}");
    assert!(done["finished_at"].is_string(), "{done}");
    // Queued and not delivered yet (no dispatcher): nothing left to recover.
    assert_eq!(recover(&api, &key, &webhook, since(started)).await, 0);
    let reader = api.key_for(key.developer_id(), &[webhooks_model::Scope::WebhooksRead]).await;
    api.get(&path, &reader).await.expect(200);
    api.get(&path, &api.new_developer().await).await.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

/// A recovery the API stops in the middle of (as on SIGTERM) goes on after
/// its restart from where it was, and queues every delivery it counted once.
#[tests::test]
async fn a_recovery_cut_by_a_restart_goes_on_and_queues_each_delivery_once() {
    const EVENTS: usize = 500;
    let mut api = TestApi::start_with(batches_of_ten()).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let started = webhooks_model::time::now();
    let events = ingest_many(&api, key.developer_id(), "customer", EVENTS, 16).await;

    assert_eq!(recover(&api, &key, &webhook, since(started)).await, EVENTS as u64);
    api.stop().await.unwrap();
    let cut = api.store.latest_recovery(&id(&webhook)).await.unwrap().unwrap();
    assert!(cut.running && cut.queued < EVENTS as i64, "the stop came after the recovery: {cut:?}");

    api.restart().await.unwrap();
    let path = format!("/webhooks/{}/recover", id(&webhook));
    let done = finished(&api, &key, &path).await;
    assert_eq!(done["queued"].as_i64(), Some(EVENTS as i64), "{done}");
    each_delivered_once(&api, &receiver, &events, WAIT).await;
    api.shutdown().await.unwrap();
}

/// A batch takes at most `RECOVERY_BATCH` deliveries from a slice of ten
/// events for each, and ends at the last one it took: where the endpoint's
/// events are mixed with others it does not take, and a few of its own
/// were queued already, every upcoming one is queued once and nothing else
/// goes out.
#[tests::test]
async fn batches_that_fill_mid_slice_queue_every_upcoming_delivery_once() {
    const ROUNDS: usize = 150;
    let api = TestApi::start_with(batches_of_ten()).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url(), "event_categories": ["transfer"] })).await;
    let started = webhooks_model::time::now();
    // Transfers and customer events in turn: half the slice is not the
    // endpoint's.
    let mut transfers = Vec::new();
    for n in 0..ROUNDS {
        transfers.push(ingest(&api, key.developer_id(), "transfer", n).await);
        ingest(&api, key.developer_id(), "customer", n).await;
    }
    // Three of them sent already: pending, so not the recovery's.
    for event in [&transfers[3], &transfers[40], &transfers[77]] {
        assert_sent(&send(&api, &key, &webhook, &event_id(event)).await);
    }

    assert_eq!(recover(&api, &key, &webhook, since(started)).await, (ROUNDS - 3) as u64);
    let path = format!("/webhooks/{}/recover", id(&webhook));
    let done = finished(&api, &key, &path).await;
    assert_eq!(done["queued"].as_i64(), Some((ROUNDS - 3) as i64), "{done}");
    // The three sent, then the recovered: each transfer once, no customer
    // event.
    each_delivered_once(&api, &receiver, &transfers, WAIT).await;
    api.shutdown().await.unwrap();
}

/// `RECOVERY_RATE` paces what recoveries queue: 100 deliveries at 50 a
/// second take at least two seconds, whatever the batches could do.
#[tests::test]
async fn a_recovery_keeps_to_its_rate() {
    let options = ApiOptions {
        extra_args: vec!["--recovery-batch".into(), "10".into(), "--recovery-rate".into(), "50".into()],
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let started = webhooks_model::time::now();
    ingest_many(&api, key.developer_id(), "customer", 100, 16).await;

    let asked = std::time::Instant::now();
    assert_eq!(recover(&api, &key, &webhook, since(started)).await, 100);
    let path = format!("/webhooks/{}/recover", id(&webhook));
    let done = finished(&api, &key, &path).await;
    assert_eq!(done["queued"].as_i64(), Some(100), "{done}");
    // Ten batches of ten, each followed by a pause of 10 / 50 s.
    assert!(asked.elapsed() >= Duration::from_millis(1800), "done in {:?}", asked.elapsed());
    api.shutdown().await.unwrap();
}

/// A recovery whose range of event sequences is cleared and cursor reset
/// halfway (as an older API, during a rolling upgrade, stores a job) gets
/// its range again at its next batch: it queues its window's deliveries,
/// each once, and walks no further than the window's last event, though
/// the developer has events after it.
#[tests::test]
async fn a_recovery_stored_without_its_range_gets_it_and_queues_its_window_once() {
    const BEFORE: usize = 20;
    const EVENTS: usize = 200;
    let mut api = TestApi::start_with(batches_of_ten()).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let earlier = ingest_many(&api, key.developer_id(), "customer", BEFORE, 8).await;
    let since = webhooks_model::time::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let events = ingest_many(&api, key.developer_id(), "customer", EVENTS, 8).await;
    assert!(earlier.iter().all(|event| at(event) < since), "an earlier event is in the window");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let until = webhooks_model::time::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let later = ingest_many(&api, key.developer_id(), "customer", BEFORE, 8).await;
    assert!(later.iter().all(|event| at(event) >= until), "a later event is in the window");
    let sequence = |event: &Value| event["event_sequence"].as_i64().expect("event_sequence");
    let last_in_window = events.iter().map(sequence).max().unwrap();

    let window = json!({
        "since": webhooks_model::time::format(&since),
        "until": webhooks_model::time::format(&until),
    });
    assert_eq!(recover(&api, &key, &webhook, window).await, EVENTS as u64);
    api.stop().await.unwrap();
    let cut = api.store.latest_recovery(&id(&webhook)).await.unwrap().unwrap();
    assert!(cut.running && cut.queued < EVENTS as i64, "the stop came after the recovery: {cut:?}");
    // As an older API leaves its row: no range, the cursor at the start.
    api.execute_sql(
        "UPDATE recoveries SET until_sequence = NULL, after_sequence = 0 WHERE endpoint_id = $1",
        &id(&webhook),
    )
    .await;

    api.restart().await.unwrap();
    let path = format!("/webhooks/{}/recover", id(&webhook));
    finished(&api, &key, &path).await;
    let done = api.store.latest_recovery(&id(&webhook)).await.unwrap().unwrap();
    assert_eq!(done.after_sequence, last_in_window, "the walk went past the window: {done:?}");
    each_delivered_once(&api, &receiver, &events, WAIT).await;
    api.shutdown().await.unwrap();
}
