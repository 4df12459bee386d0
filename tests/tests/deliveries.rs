//! Who gets an event, and what it looks like on arrival (API.md §5 delivery
//! rules 1, 2, 5 and 8; §6): active endpoints of the event's developer and
//! categories only, the `Event` as body, the headers, a signature that
//! verifies, no redirect followed; and deliveries stop soon after an endpoint
//! is disabled, also under load.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tests::{ApiOptions, Reply, TestApi, WAIT};

#[tests::test]
async fn an_event_reaches_active_endpoints_only_as_a_signed_event() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let (active_receiver, disabled_receiver) = (api.receiver().await, api.receiver().await);
    let active = active_endpoint(&api, &key, &active_receiver.url()).await;
    let disabled = create(&api, &key, json!({ "url": disabled_receiver.url() })).await;
    assert_eq!(disabled["status"], "disabled");

    let mut events = Vec::new();
    for (n, category) in ["transfer", "customer", "transfer"].into_iter().enumerate() {
        events.push(ingest(&api, key.developer_id(), category, n).await);
    }
    for pair in events.windows(2) {
        assert_eq!(
            pair[1]["event_sequence"].as_i64(),
            pair[0]["event_sequence"].as_i64().map(|s| s + 1),
            "event_sequence grows by one per event of a developer: {} then {}",
            pair[0],
            pair[1]
        );
    }
    let ids: Vec<String> = events.iter().map(event_id).collect();

    wait_for_events(&active_receiver, &ids, WAIT).await;
    for request in active_receiver.requests() {
        let id = request.header("x-webhook-id").expect("X-Webhook-Id");
        let event = events.iter().find(|e| e["event_id"] == id).unwrap_or_else(|| panic!("unknown event {id}"));
        assert_delivery(&request, event);
    }
    verify_all(&active_receiver, &active);

    // The disabled endpoint got nothing and keeps every event as upcoming,
    // exactly as delivered elsewhere, oldest first.
    assert_eq!(disabled_receiver.count(), 0, "{:?}", disabled_receiver.requests());
    assert_eq!(upcoming(&api, &key, &disabled, "").await, events);
    // The active one has nothing left to come once delivered.
    eventually("the active endpoint's upcoming list empties", WAIT, async || {
        let ids = upcoming_ids(&api, &key, &active).await;
        if ids.is_empty() { Ok(()) } else { Err(format!("{ids:?}")) }
    })
    .await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_endpoint_gets_only_its_categories_and_no_categories_means_all() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let (transfer_rx, pair_rx, all_rx, absent_rx) =
        (api.receiver().await, api.receiver().await, api.receiver().await, api.receiver().await);
    let transfer_only =
        active_endpoint_with(&api, &key, json!({ "url": transfer_rx.url(), "event_categories": ["transfer"] })).await;
    let pair =
        active_endpoint_with(&api, &key, json!({ "url": pair_rx.url(), "event_categories": ["customer", "transfer"] }))
            .await;
    let all = active_endpoint_with(&api, &key, json!({ "url": all_rx.url(), "event_categories": [] })).await;
    let absent = active_endpoint(&api, &key, &absent_rx.url()).await;

    let categories = ["customer", "transfer", "kyc_link", "customer", "transfer", "card_transaction"];
    let mut events = Vec::new();
    for (n, category) in categories.into_iter().enumerate() {
        events.push(ingest(&api, key.developer_id(), category, n).await);
    }
    let of = |wanted: &[&str]| -> Vec<String> {
        events.iter().filter(|e| wanted.iter().any(|c| e["event_category"] == *c)).map(event_id).collect()
    };
    let every: Vec<String> = events.iter().map(event_id).collect();

    // The endpoints of every category get everything: once they have, the
    // others have had every chance to get what they should not.
    wait_for_events(&all_rx, &every, WAIT).await;
    wait_for_events(&absent_rx, &every, WAIT).await;
    wait_for_events(&transfer_rx, &of(&["transfer"]), WAIT).await;
    wait_for_events(&pair_rx, &of(&["customer", "transfer"]), WAIT).await;

    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids.dedup();
        ids
    };
    assert_eq!(sorted(received_ids(&transfer_rx)), sorted(of(&["transfer"])), "transfer-only endpoint");
    assert_eq!(sorted(received_ids(&pair_rx)), sorted(of(&["customer", "transfer"])), "customer+transfer endpoint");
    for (receiver, webhook) in
        [(&transfer_rx, &transfer_only), (&pair_rx, &pair), (&all_rx, &all), (&absent_rx, &absent)]
    {
        verify_all(receiver, webhook);
    }

    // An event of another category is not meant for the endpoint: not
    // upcoming, and send refuses it.
    let customer = &of(&["customer"])[0];
    eventually("the transfer-only endpoint has nothing upcoming", WAIT, async || {
        let ids = upcoming_ids(&api, &key, &transfer_only).await;
        if ids.is_empty() { Ok(()) } else { Err(format!("{ids:?}")) }
    })
    .await;
    send(&api, &key, &transfer_only, customer).await.expect_error_at(400, "invalid", "body", "event_id");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn another_developers_events_are_never_delivered_listed_or_sendable() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (a, b) = (api.new_developer().await, api.new_developer().await);
    let (a_rx, b_rx, b_disabled_rx) = (api.receiver().await, api.receiver().await, api.receiver().await);
    let a_endpoint = active_endpoint(&api, &a, &a_rx.url()).await;
    let b_endpoint = active_endpoint(&api, &b, &b_rx.url()).await;

    let mut a_events = Vec::new();
    for n in 0..3 {
        a_events.push(ingest(&api, a.developer_id(), "transfer", n).await);
    }
    // Made after A's events, and it lists a developer's earlier events: only B's may show.
    let b_history = create(&api, &b, json!({ "url": b_disabled_rx.url(), "event_epoch": "beginning_of_time" })).await;
    let b_event = ingest(&api, b.developer_id(), "transfer", 9).await;
    assert_eq!(a_events[0]["event_sequence"], b_event["event_sequence"], "each developer counts its own events");

    let a_ids: Vec<String> = a_events.iter().map(event_id).collect();
    wait_for_events(&a_rx, &a_ids, WAIT).await;
    wait_for_events(&b_rx, std::slice::from_ref(&event_id(&b_event)), WAIT).await;

    assert_eq!(distinct_ids(&b_rx), [event_id(&b_event)].into(), "B's endpoint got only B's event");
    assert_eq!(distinct_ids(&a_rx), a_ids.iter().cloned().collect(), "A's endpoint got only A's events");
    assert_eq!(b_disabled_rx.count(), 0);
    verify_all(&a_rx, &a_endpoint);
    verify_all(&b_rx, &b_endpoint);

    assert_eq!(upcoming_ids(&api, &b, &b_history).await, vec![event_id(&b_event)]);
    let b_listed: Vec<String> = webhook_events(&api, &b, "").await.iter().map(event_id).collect();
    assert_eq!(b_listed, vec![event_id(&b_event)], "B's /webhook_events");
    let a_listed = webhook_events(&api, &a, "").await;
    assert_eq!(a_listed.len(), 3, "A's /webhook_events: {a_listed:?}");
    for endpoint in [&b_endpoint, &b_history] {
        send(&api, &b, endpoint, &a_ids[0]).await.expect_error(404, "not_found");
    }
    // Nor does it serve as a cursor in B's list (README: 400).
    api.get(&format!("/webhook_events?starting_after={}", a_ids[0]), &b).await.expect_error(400, "invalid");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_disabled_endpoint_gets_nothing_and_keeps_the_event_upcoming() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let (switched_rx, barrier_rx) = (api.receiver().await, api.receiver().await);
    let switched = active_endpoint(&api, &key, &switched_rx.url()).await;
    let barrier = active_endpoint(&api, &key, &barrier_rx.url()).await;

    // Disabled before the event exists.
    set_status(&api, &key, &switched, "disabled").await;
    let first = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_events(&barrier_rx, &[event_id(&first)], WAIT).await;

    // Disabled while the event waits for a dispatcher: the dispatcher must
    // re-check the endpoint at delivery.
    set_status(&api, &key, &switched, "active").await;
    dispatcher.stop().await.unwrap();
    let second = ingest(&api, key.developer_id(), "transfer", 2).await;
    set_status(&api, &key, &switched, "disabled").await;
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&barrier_rx, &[event_id(&second)], WAIT).await;
    // The barrier endpoint got a later event too, so anything for the
    // disabled one has been handled by now.
    let third = ingest(&api, key.developer_id(), "transfer", 3).await;
    wait_for_events(&barrier_rx, &[event_id(&third)], WAIT).await;

    assert_eq!(switched_rx.count(), 0, "a disabled endpoint got {:?}", received_ids(&switched_rx));
    let expected = vec![event_id(&first), event_id(&second), event_id(&third)];
    eventually("the disabled endpoint lists all three as upcoming", WAIT, async || {
        let ids = upcoming_ids(&api, &key, &switched).await;
        if ids == expected { Ok(()) } else { Err(format!("{ids:?}")) }
    })
    .await;
    verify_all(&barrier_rx, &barrier);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_redirect_is_not_followed_and_is_logged_as_such() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let target = api.receiver().await;
    let (found_rx, temporary_rx) = (api.receiver().await, api.receiver().await);
    found_rx.reply_always(Reply::redirect(302, &target.url()));
    temporary_rx.reply_always(Reply::redirect(307, &target.url()));
    let found = active_endpoint(&api, &key, &found_rx.url()).await;
    let temporary = active_endpoint(&api, &key, &temporary_rx.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    for (webhook, status) in [(&found, 302), (&temporary, 307)] {
        let entries = wait_for_logs(&api, &key, webhook, 1).await;
        let first = entries.last().unwrap();
        assert_eq!(first["event_id"], event["event_id"], "{first}");
        assert_eq!(first["attempt"], 1, "{first}");
        assert_eq!(first["status"], status, "{first}");
        assert_eq!(first["error"], "redirect", "{first}");
    }
    assert_eq!(target.count(), 0, "a redirect was followed: {:?}", target.requests());
    for (receiver, webhook) in [(&found_rx, &found), (&temporary_rx, &temporary)] {
        assert_delivery(&receiver.requests()[0], &event);
        verify_all(receiver, webhook);
    }
    // Not a success: it stays upcoming, waiting for its retry.
    assert!(upcoming_ids(&api, &key, &found).await.contains(&event_id(&event)));

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_receiver_answering_nul_bytes_and_a_huge_body_is_logged_and_harms_no_one_else() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (odd_key, other_key) = (api.new_developer().await, api.new_developer().await);
    let (odd_rx, other_rx) = (api.receiver().await, api.receiver().await);
    let mut body = b"ok\0".to_vec();
    body.extend("é".repeat(40_000).as_bytes());
    odd_rx.reply_always(Reply::ok().body(body));
    let odd = active_endpoint(&api, &odd_key, &odd_rx.url()).await;
    let other = active_endpoint(&api, &other_key, &other_rx.url()).await;

    let odd_event = ingest(&api, odd_key.developer_id(), "transfer", 1).await;
    let other_event = ingest(&api, other_key.developer_id(), "transfer", 2).await;
    wait_for_events(&other_rx, &[event_id(&other_event)], WAIT).await;
    verify_all(&other_rx, &other);

    let entries = wait_for_logs(&api, &odd_key, &odd, 1).await;
    let entry = &entries[0];
    assert_eq!(entry["event_id"], odd_event["event_id"], "{entry}");
    assert_eq!(entry["status"], 200, "{entry}");
    let logged = entry["response_body"].as_str().expect("response_body");
    assert!(logged.starts_with("ok"), "{logged:.40}");
    assert!(!logged.contains('\0'));
    assert!(logged.len() <= 4096, "the log keeps at most 4 KiB, kept {}", logged.len());
    // A success: nothing left to come, and it was delivered exactly once.
    eventually("the odd endpoint's upcoming list empties", WAIT, async || {
        let ids = upcoming_ids(&api, &odd_key, &odd).await;
        if ids.is_empty() { Ok(()) } else { Err(format!("{ids:?}")) }
    })
    .await;
    assert_eq!(odd_rx.count(), 1, "{:?}", odd_rx.requests().len());

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn deliveries_stop_soon_after_an_endpoint_is_disabled_under_load() {
    let options = ApiOptions {
        delivery_args: ["--dispatcher-endpoint-concurrency", "8"].map(String::from).to_vec(),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok().after(Duration::from_millis(500)));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    // A backlog, queued before delivery starts.
    let total = 600;
    ingest_many(&api, key.developer_id(), "transfer", total, 16).await;
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_distinct(&receiver, 40, WAIT).await;
    // Changes while deliveries run: each drops the cached endpoint, so loads
    // and invalidations interleave (a load overtaken by one must not stick).
    let path = format!("/webhooks/{}", id(&endpoint));
    for n in 0..20 {
        let categories = if n % 2 == 0 { json!(["transfer"]) } else { json!([]) };
        api.put(&path, &key, &json!({ "event_categories": categories })).await.expect(200);
    }
    set_status(&api, &key, &endpoint, "disabled").await;
    let at_disable = receiver.count();

    // Every queued event is handled: delivered before the change took, or held.
    let (succeeded, held) = (
        "webhooks_dispatcher_deliveries_total{outcome=\"succeeded\"}",
        "webhooks_dispatcher_deliveries_total{outcome=\"held\"}",
    );
    eventually("every queued event delivered or held", Duration::from_secs(120), async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        let handled = sample(&text, succeeded).unwrap_or(0.0) + sample(&text, held).unwrap_or(0.0);
        if handled >= total as f64 { Ok(()) } else { Err(format!("{handled} of {total}")) }
    })
    .await;
    // What arrives after the 200 is what was in flight (8 at a time) and what
    // started before the change reached delivery; far from the backlog.
    let after = receiver.count() - at_disable;
    assert!(after <= 100, "{after} deliveries arrived after the endpoint was disabled");
    assert!(receiver.count() < total / 2, "the backlog kept going to a disabled endpoint");
    verify_all(&receiver, &endpoint);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
