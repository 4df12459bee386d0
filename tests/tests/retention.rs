//! Retention (README "Retention"): events, their deliveries and delivery logs
//! older than `RETENTION` are deleted while ingest and delivery go on, and
//! what is newer stays; an event still being delivered stays until its
//! delivery settles; a deleted endpoint loses its private key at once, and a
//! delivery still queued for it is cancelled instead of going round for ever.

mod common;

use std::{
    collections::HashSet,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};

use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, Reply, TestApi, WAIT};

/// What was made less than this before a list was read must be in it:
/// `RETENTION` (15 s) less a margin for the sweep's clock and a loaded machine.
const SURELY_KEPT: Duration = Duration::from_millis(12_500);

fn short_retention() -> ApiOptions {
    ApiOptions {
        extra_args: ["--retention", "15s", "--retention-interval", "200ms"].map(String::from).to_vec(),
        ..ApiOptions::default()
    }
}

/// The event ids of a list of `Event`s.
fn ids(events: &[Value]) -> HashSet<String> {
    events.iter().map(event_id).collect()
}

/// The event ids a delivery log names.
fn logged(entries: &[Value]) -> HashSet<String> {
    entries.iter().map(|e| e["event_id"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Events ingested so far: when they were made (as the API says) and their ids.
type Made = Mutex<Vec<(DateTime<Utc>, String)>>;

/// Reads a list with `read` and asserts that it holds every event of `made`
/// whose ingest was answered before the read and which was made less than
/// [`SURELY_KEPT`] before the read ended: no sweep can have deleted those
/// yet. Returns the ids listed.
async fn keeps_the_recent(what: &str, made: &Made, read: impl AsyncFnOnce() -> HashSet<String>) -> HashSet<String> {
    let before = made.lock().unwrap().clone();
    let listed = read().await;
    let since = Utc::now() - chrono::Duration::from_std(SURELY_KEPT).unwrap();
    let missing: Vec<&str> =
        before.iter().filter(|(at, id)| *at > since && !listed.contains(id)).map(|(_, id)| id.as_str()).collect();
    assert!(missing.is_empty(), "recent events were deleted ({what}): {missing:?}");
    listed
}

#[tests::test]
async fn old_events_deliveries_and_logs_go_while_new_ones_stay() {
    let api = TestApi::start_with(short_retention()).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let delivering = active_endpoint(&api, &key, &receiver.url()).await;
    // A disabled endpoint holds every event as upcoming.
    let holding = create(&api, &key, json!({ "url": receiver.url() })).await;

    // The old events: listed, upcoming at the disabled endpoint, delivered
    // and logged at the active one.
    let mut old = HashSet::new();
    for n in 0..5 {
        old.insert(event_id(&ingest(&api, key.developer_id(), "transfer", n).await));
    }
    let old_ids: Vec<String> = old.iter().cloned().collect();
    assert!(old.is_subset(&ids(&webhook_events(&api, &key, "?limit=100").await)));
    assert!(old.is_subset(&ids(&upcoming(&api, &key, &holding, "?limit=100").await)));
    wait_for_events(&receiver, &old_ids, WAIT).await;
    eventually("the old events are logged", WAIT, async || {
        let entries = logs(&api, &key, &delivering, "?limit=100").await;
        if old.is_subset(&logged(&entries)) { Ok(()) } else { Err(format!("{entries:?}")) }
    })
    .await;

    // Ingest goes on, an event every 300 ms (so what is kept fits one page of
    // each list), while the old ones expire.
    let made: Made = Mutex::default();
    let done = AtomicBool::new(false);
    let ingesting = async {
        let mut n = 100;
        while !done.load(Ordering::Relaxed) {
            let event = ingest(&api, key.developer_id(), "transfer", n).await;
            let at = event["event_created_at"].as_str().and_then(|at| at.parse().ok()).expect("event_created_at");
            made.lock().unwrap().push((at, event_id(&event)));
            n += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let checking = async {
        eventually("the old events, their deliveries and their logs are deleted", 2 * WAIT, async || {
            let listed =
                keeps_the_recent("listed", &made, async || ids(&webhook_events(&api, &key, "?limit=100").await)).await;
            let upcoming =
                keeps_the_recent("upcoming", &made, async || ids(&upcoming(&api, &key, &holding, "?limit=100").await))
                    .await;
            let logged = logged(&logs(&api, &key, &delivering, "?limit=100").await);
            let left: Vec<&str> = [("listed", &listed), ("upcoming", &upcoming), ("logged", &logged)]
                .into_iter()
                .filter(|(_, ids)| !ids.is_disjoint(&old))
                .map(|(what, _)| what)
                .collect();
            if left.is_empty() { Ok(()) } else { Err(format!("old events still {left:?}")) }
        })
        .await;
        done.store(true, Ordering::Relaxed);
    };
    tokio::join!(ingesting, checking);

    // Delivery went on too: the latest event arrives and is logged.
    let made = made.into_inner().unwrap();
    assert!(made.len() >= 5, "ingest went on: {} events", made.len());
    let (_, last) = made.last().cloned().expect("events were ingested");
    wait_for_events(&receiver, std::slice::from_ref(&last), WAIT).await;
    eventually("the latest event is logged", WAIT, async || {
        let entries = logs(&api, &key, &delivering, "?limit=100").await;
        if logged(&entries).contains(&last) { Ok(()) } else { Err(format!("{entries:?}")) }
    })
    .await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_event_still_being_retried_stays_until_its_delivery_settles() {
    let options = ApiOptions { retry_schedule: Some("1h".into()), ..short_retention() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = event_id(&ingest(&api, key.developer_id(), "transfer", 1).await);
    wait_for_logs(&api, &key, &endpoint, 1).await;

    // The failed attempt's log entry expires, made after the event: a sweep
    // has run since the event was old enough to go, and it stayed, its retry
    // due in an hour.
    eventually("the log entry of the failed attempt is deleted", 2 * WAIT, async || {
        let entries = logs(&api, &key, &endpoint, "?limit=100").await;
        if entries.is_empty() { Ok(()) } else { Err(format!("{entries:?}")) }
    })
    .await;
    assert!(ids(&webhook_events(&api, &key, "?limit=100").await).contains(&event), "the event was deleted");
    assert_eq!(
        upcoming_ids(&api, &key, &endpoint).await,
        std::slice::from_ref(&event),
        "its delivery is still upcoming"
    );

    // Delivered, it settles, and the event goes with its delivery and log.
    receiver.reply_always(Reply::ok());
    assert_sent(&send(&api, &key, &endpoint, &event).await);
    receiver.wait_for(2).await.unwrap();
    eventually("the settled old event is deleted", 2 * WAIT, async || {
        let listed = ids(&webhook_events(&api, &key, "?limit=100").await);
        let entries = logs(&api, &key, &endpoint, "?limit=100").await;
        if listed.contains(&event) || !entries.is_empty() { Err(format!("{listed:?} {entries:?}")) } else { Ok(()) }
    })
    .await;
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty());
    assert_eq!(send(&api, &key, &endpoint, &event).await.status, 404, "a deleted event cannot be sent");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_deleted_endpoint_loses_its_key_and_what_was_queued_for_it_is_cancelled() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let (doomed_receiver, other_receiver) = (api.receiver().await, api.receiver().await);
    let doomed = active_endpoint(&api, &key, &doomed_receiver.url()).await;
    let other = active_endpoint(&api, &key, &other_receiver.url()).await;

    // Queued for both, with no dispatcher yet to take it.
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    let stored = api.store.load_endpoint(&id(&doomed)).await.unwrap().expect("the endpoint is stored");
    assert!(!stored.private_key.is_empty(), "an endpoint keeps its key while it exists");

    api.delete(&format!("/webhooks/{}", id(&doomed)), &key).await.expect(200);
    let stored = api.store.load_endpoint(&id(&doomed)).await.unwrap().expect("a deleted endpoint stays stored");
    assert_eq!(stored.status, webhooks_model::EndpointStatus::Deleted);
    assert!(stored.private_key.is_empty(), "a deleted endpoint kept its private key");
    let kept = api.store.load_endpoint(&id(&other)).await.unwrap().expect("the other endpoint");
    assert!(!kept.private_key.is_empty(), "the other endpoint lost its key");

    // The other endpoint's delivery of the same event comes through; the
    // deleted one's is cancelled, not parked to come back for ever.
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&other_receiver, &[event_id(&event)], WAIT).await;
    let outcome = |text: &str, name: &str| {
        sample(text, &format!("webhooks_dispatcher_deliveries_total{{outcome=\"{name}\"}}")).unwrap_or(0.0)
    };
    // In the distributed system the message was in the queue before the
    // delete: the dispatcher drops it unsent, as `superseded` when the
    // store's answer at admission already says the delete cancelled it, or
    // as `cancelled` when it finds the endpoint gone. In standalone mode the deliveries table is the
    // queue and the delete cancelled the row itself: nothing reaches the
    // dispatcher to drop.
    let dropped = if api.is_standalone() { 0.0 } else { 1.0 };
    let text = eventually("both deliveries are settled", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        let unsent = outcome(&text, "cancelled") + outcome(&text, "superseded");
        let settled = outcome(&text, "succeeded") == 1.0 && unsent == dropped;
        if settled { Ok(text) } else { Err(text) }
    })
    .await;
    assert_eq!(outcome(&text, "parked"), 0.0, "a message was parked: {text}");
    assert_eq!(doomed_receiver.count(), 0, "the deleted endpoint got a delivery");
    assert_eq!(api.get(&format!("/webhooks/{}/events", id(&doomed)), &key).await.status, 404);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
