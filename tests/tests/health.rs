//! Endpoint health (API.md §8.3): `health` on the endpoint, and the service
//! disabling an endpoint whose deliveries all failed for
//! `AUTO_DISABLE_AFTER` on three different days, keeping what it misses as
//! upcoming. Days pass on the instance's clock, which the test moves.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, Backend, DeveloperKey, Reply, TestApi, WAIT, expect};
use webhooks_model::ChangeKind;

const DAY: Duration = Duration::from_secs(86_400);

async fn show(api: &TestApi, key: &DeveloperKey, webhook: &Value) -> Value {
    api.get(&format!("/webhooks/{}", id(webhook)), key).await.expect(200).clone()
}

/// Ingests an event and waits until the endpoint's log has one more entry.
async fn attempt_once(api: &TestApi, key: &DeveloperKey, webhook: &Value, n: usize) -> Value {
    let before = logs(api, key, webhook, "?limit=100").await.len();
    let event = ingest(api, key.developer_id(), "transfer", n).await;
    wait_for_logs(api, key, webhook, before + 1).await;
    event
}

#[tests::test]
async fn an_endpoint_failing_on_three_days_is_disabled_and_keeps_what_it_misses() {
    let options = ApiOptions {
        // One retry a day away: each failure below is the event's own first attempt.
        retry_schedule: Some("24h".into()),
        extra_args: vec!["--auto-disable-after".into(), "2d".into()],
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let tap = match api.backend {
        Backend::Distributed => Some(api.lifecycle_tap().await),
        Backend::Standalone => None,
    };
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;
    assert_eq!(webhook["health"], json!({ "last_success_at": null, "last_failure_at": null, "failing_since": null }));

    // Day 0: the first failure starts the streak.
    attempt_once(&api, &key, &webhook, 0).await;
    let shown = show(&api, &key, &webhook).await;
    let since = expect::timestamp(&shown["health"]["failing_since"]);
    expect::timestamp(&shown["health"]["last_failure_at"]);
    assert!(shown["health"]["last_success_at"].is_null(), "{shown}");

    // Three days on, past AUTO_DISABLE_AFTER, but failures on two days only: still active.
    api.clock.advance(3 * DAY);
    attempt_once(&api, &key, &webhook, 1).await;
    tokio::time::sleep(Duration::from_secs(5)).await; // more than two housekeeping rounds
    let shown = show(&api, &key, &webhook).await;
    assert_eq!(shown["status"], "active", "disabled after failures on two days: {shown}");
    assert_eq!(expect::timestamp(&shown["health"]["failing_since"]), since);

    // A third day of failures: disabled by the service, with its reason.
    api.clock.advance(DAY);
    attempt_once(&api, &key, &webhook, 2).await;
    let disabled = eventually("the endpoint is disabled", WAIT, async || {
        let shown = show(&api, &key, &webhook).await;
        if shown["status"] == "disabled" { Ok(shown) } else { Err(shown.to_string()) }
    })
    .await;
    assert_eq!(disabled["disabled_reason"], "failing", "{disabled}");
    if let Some(tap) = &tap {
        let message = tap.wait_for(ChangeKind::AutoDisabled, &id(&webhook)).await.unwrap();
        assert_eq!(message.endpoint_changed().unwrap().api_key_id, None, "{:?}", message.raw);
    }

    // What it misses stays upcoming and is not sent.
    let missed = ingest(&api, key.developer_id(), "transfer", 3).await;
    wait_upcoming(&api, &key, &webhook, &event_id(&missed), true).await;
    let requests = receiver.count();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.count(), requests, "a disabled endpoint got a delivery");

    // Activation clears the reason and the streak; the missed event is sendable.
    receiver.reply_always(Reply::ok());
    let active = set_status(&api, &key, &webhook, "active").await;
    assert!(active.get("disabled_reason").is_none(), "{active}");
    assert!(active["health"]["failing_since"].is_null(), "{active}");
    assert_sent(&send(&api, &key, &webhook, &event_id(&missed)).await);
    wait_for_events(&receiver, &[event_id(&missed)], WAIT).await;
    eventually("the success shows in health", WAIT, async || {
        let shown = show(&api, &key, &webhook).await;
        if shown["health"]["last_success_at"].is_string() { Ok(()) } else { Err(shown.to_string()) }
    })
    .await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_success_ends_the_streak_and_zero_switches_auto_disable_off() {
    let options = ApiOptions {
        retry_schedule: Some("24h".into()),
        extra_args: vec!["--auto-disable-after".into(), "0".into()],
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(503));
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;
    for day in 0..4 {
        attempt_once(&api, &key, &webhook, day).await;
        api.clock.advance(DAY);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let shown = show(&api, &key, &webhook).await;
    assert_eq!(shown["status"], "active", "AUTO_DISABLE_AFTER=0 disabled it: {shown}");
    assert!(shown["health"]["failing_since"].is_string(), "{shown}");

    receiver.reply_always(Reply::ok());
    attempt_once(&api, &key, &webhook, 9).await;
    let healthy = eventually("the streak ends", WAIT, async || {
        let shown = show(&api, &key, &webhook).await;
        if shown["health"]["failing_since"].is_null() { Ok(shown) } else { Err(shown.to_string()) }
    })
    .await;
    let last_success = expect::timestamp(&healthy["health"]["last_success_at"]);
    assert!(last_success > expect::timestamp(&healthy["health"]["last_failure_at"]), "{healthy}");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// An edit during a failing streak restarts it rather than switching
/// auto-disable off: the endpoint is still disabled once it has failed for
/// `AUTO_DISABLE_AFTER`, on three days, after the edit.
#[tests::test]
async fn an_edit_restarts_the_streak_and_auto_disable_still_comes() {
    let options = ApiOptions {
        retry_schedule: Some("24h".into()),
        extra_args: vec!["--auto-disable-after".into(), "2d".into()],
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;

    attempt_once(&api, &key, &webhook, 0).await;
    api.clock.advance(DAY);
    let edited = api.put(&format!("/webhooks/{}", id(&webhook)), &key, &json!({ "rate_limit_per_second": 40 })).await;
    let edited = edited.expect(200);
    assert!(edited["health"]["failing_since"].is_null(), "the edit restarts the streak: {edited}");

    for n in 1..=3 {
        attempt_once(&api, &key, &webhook, n).await;
        api.clock.advance(DAY);
    }
    attempt_once(&api, &key, &webhook, 4).await;
    let disabled = eventually("the edited endpoint is disabled", WAIT, async || {
        let shown = show(&api, &key, &webhook).await;
        if shown["status"] == "disabled" { Ok(shown) } else { Err(shown.to_string()) }
    })
    .await;
    assert_eq!(disabled["disabled_reason"], "failing", "{disabled}");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
