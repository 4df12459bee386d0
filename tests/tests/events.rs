//! What an endpoint has coming and how a developer gets it (API.md §4, §5
//! delivery rules 2–4): upcoming events, `send`, the epoch of an endpoint, and
//! the developer's event list with its cursors.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use tests::{TestApi, WAIT};

#[tests::test]
async fn what_a_disabled_endpoint_missed_stays_upcoming_until_sent() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = create(&api, &key, json!({ "url": receiver.url() })).await;

    let mut missed = Vec::new();
    for n in 0..12 {
        missed.push(ingest(&api, key.developer_id(), "transfer", n).await);
    }
    let missed_ids: Vec<String> = missed.iter().map(event_id).collect();

    // Upcoming: oldest first, 10 by default, at most 100.
    assert_eq!(upcoming(&api, &key, &endpoint, "").await, missed[..10].to_vec(), "default page");
    assert_eq!(upcoming(&api, &key, &endpoint, "?limit=3").await, missed[..3].to_vec());
    assert_eq!(upcoming(&api, &key, &endpoint, "?limit=100").await, missed);
    let path = format!("/webhooks/{}/events", id(&endpoint));
    for bad in ["0", "101", "ten"] {
        api.get(&format!("{path}?limit={bad}"), &key).await.expect_error_at(400, "invalid", "query", "limit");
    }
    assert_eq!(receiver.count(), 0, "a disabled endpoint got {:?}", received_ids(&receiver));

    // Activation delivers what comes next, and replays nothing.
    set_status(&api, &key, &endpoint, "active").await;
    let next = ingest(&api, key.developer_id(), "transfer", 100).await;
    wait_for_events(&receiver, &[event_id(&next)], WAIT).await;
    assert_delivery(&receiver.requests()[0], &next);
    assert_eq!(received_ids(&receiver), vec![event_id(&next)], "activation replayed missed events");
    wait_upcoming(&api, &key, &endpoint, &event_id(&next), false).await;
    assert_eq!(upcoming_ids(&api, &key, &endpoint).await, missed_ids, "what it missed stays upcoming");

    // Send delivers a missed event now.
    let sent = send(&api, &key, &endpoint, &missed_ids[0]).await;
    assert_sent(&sent);
    wait_for_events(&receiver, &missed_ids[..1], WAIT).await;
    wait_upcoming(&api, &key, &endpoint, &missed_ids[0], false).await;

    // ... also to a disabled endpoint.
    set_status(&api, &key, &endpoint, "disabled").await;
    assert_sent(&send(&api, &key, &endpoint, &missed_ids[1]).await);
    wait_for_events(&receiver, &missed_ids[1..2], WAIT).await;
    wait_upcoming(&api, &key, &endpoint, &missed_ids[1], false).await;
    assert_eq!(upcoming_ids(&api, &key, &endpoint).await, missed_ids[2..].to_vec());

    for request in receiver.requests() {
        let id = request.header("x-webhook-id").unwrap_or_default().to_owned();
        let event = missed.iter().chain([&next]).find(|e| e["event_id"] == id.as_str()).expect("a known event");
        assert_delivery(&request, event);
    }
    verify_all(&receiver, &endpoint);
    let mut got = received_ids(&receiver);
    got.sort();
    got.dedup();
    let mut expected = vec![event_id(&next), missed_ids[0].clone(), missed_ids[1].clone()];
    expected.sort();
    assert_eq!(got, expected, "only the new event and the two sent ones arrived");

    // Send's errors.
    send(&api, &key, &endpoint, &unknown_event_id()).await.expect_error(404, "not_found");
    let without_key = api
        .send(
            api.request(Method::POST, &format!("/webhooks/{}/send", id(&endpoint)), &key)
                .json(&json!({ "event_id": missed_ids[2] })),
        )
        .await;
    without_key.expect_error_at(400, "required", "header", "Idempotency-Key");
    assert!(upcoming_ids(&api, &key, &endpoint).await.contains(&missed_ids[2]), "a refused send queued the event");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn only_a_beginning_of_time_endpoint_lists_and_sends_earlier_events() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let (history_rx, recent_rx) = (api.receiver().await, api.receiver().await);

    let earlier = [
        ingest(&api, key.developer_id(), "transfer", 1).await,
        ingest(&api, key.developer_id(), "customer", 2).await,
        ingest(&api, key.developer_id(), "transfer", 3).await,
    ];
    let history = create(
        &api,
        &key,
        json!({ "url": history_rx.url(), "event_epoch": "beginning_of_time", "event_categories": ["transfer"] }),
    )
    .await;
    assert_eq!(history["event_epoch"], "beginning_of_time");
    let recent = create(&api, &key, json!({ "url": recent_rx.url() })).await;
    assert_eq!(recent["event_epoch"], "webhook_creation", "the default epoch");

    // beginning_of_time: the earlier events of its categories, oldest first.
    assert_eq!(upcoming(&api, &key, &history, "").await, vec![earlier[0].clone(), earlier[2].clone()]);
    assert_eq!(upcoming(&api, &key, &history, "?limit=1").await, vec![earlier[0].clone()]);
    // webhook_creation: none of them.
    assert_eq!(upcoming(&api, &key, &recent, "").await, Vec::<Value>::new());

    // An earlier event can be sent to the first (disabled as it is), not to the second.
    assert_sent(&send(&api, &key, &history, &event_id(&earlier[0])).await);
    wait_for_events(&history_rx, &[event_id(&earlier[0])], WAIT).await;
    assert_delivery(&history_rx.requests()[0], &earlier[0]);
    verify_all(&history_rx, &history);
    wait_upcoming(&api, &key, &history, &event_id(&earlier[0]), false).await;
    assert_eq!(upcoming_ids(&api, &key, &history).await, vec![event_id(&earlier[2])]);
    for event in &earlier {
        send(&api, &key, &recent, &event_id(event)).await.expect_error_at(400, "invalid", "body", "event_id");
    }
    // Outside its categories, even beginning_of_time refuses.
    send(&api, &key, &history, &event_id(&earlier[1])).await.expect_error_at(400, "invalid", "body", "event_id");

    // A later event is upcoming for both.
    let later = ingest(&api, key.developer_id(), "transfer", 4).await;
    assert_eq!(upcoming_ids(&api, &key, &history).await, vec![event_id(&earlier[2]), event_id(&later)]);
    assert_eq!(upcoming_ids(&api, &key, &recent).await, vec![event_id(&later)]);
    assert_sent(&send(&api, &key, &recent, &event_id(&later)).await);
    wait_for_events(&recent_rx, &[event_id(&later)], WAIT).await;
    verify_all(&recent_rx, &recent);
    assert_eq!(received_ids(&history_rx), vec![event_id(&earlier[0])]);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_event_list_is_newest_first_filtered_and_paged_by_cursors() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let categories = ["transfer", "customer", "transfer", "customer", "transfer", "kyc_link", "transfer"];
    let mut events = Vec::new();
    for (n, category) in categories.into_iter().enumerate() {
        events.push(ingest(&api, key.developer_id(), category, n).await);
    }
    let e: Vec<String> = events.iter().map(event_id).collect();
    let ids =
        async |query: &str| -> Vec<String> { webhook_events(&api, &key, query).await.iter().map(event_id).collect() };
    let pick = |indices: &[usize]| -> Vec<String> { indices.iter().map(|&i| e[i].clone()).collect() };
    let newest_first: Vec<Value> = events.iter().rev().cloned().collect();

    assert_eq!(webhook_events(&api, &key, "").await, newest_first, "the whole list, as the events were accepted");
    assert_eq!(ids("?category=transfer").await, pick(&[6, 4, 2, 0]));
    assert_eq!(ids("?category=customer&limit=1").await, pick(&[3]));
    assert_eq!(ids("?category=card_account").await, Vec::<String>::new());
    assert_eq!(ids("?limit=1").await, pick(&[6]));
    assert_eq!(ids("?limit=3").await, pick(&[6, 5, 4]));

    // starting_after walks towards older events ...
    assert_eq!(ids(&format!("?limit=3&starting_after={}", e[4])).await, pick(&[3, 2, 1]));
    assert_eq!(ids(&format!("?limit=3&starting_after={}", e[1])).await, pick(&[0]));
    assert_eq!(ids(&format!("?starting_after={}", e[0])).await, Vec::<String>::new());
    assert_eq!(ids(&format!("?category=transfer&starting_after={}", e[4])).await, pick(&[2, 0]));
    // ... ending_before towards newer ones: the page just before the cursor.
    assert_eq!(ids(&format!("?limit=3&ending_before={}", e[1])).await, pick(&[4, 3, 2]));
    assert_eq!(ids(&format!("?ending_before={}", e[4])).await, pick(&[6, 5]));
    assert_eq!(ids(&format!("?ending_before={}", e[6])).await, Vec::<String>::new());
    assert_eq!(ids(&format!("?starting_after={}&ending_before={}", e[6], e[2])).await, pick(&[5, 4, 3]));

    // has_more: whether the next page in the direction read has more.
    let more = async |query: &str| -> bool {
        let answer = api.get(&format!("/webhook_events{query}"), &key).await;
        answer.expect(200)["has_more"].as_bool().expect("has_more")
    };
    assert!(more("?limit=6").await);
    assert!(!more("?limit=7").await);
    assert!(more(&format!("?limit=3&starting_after={}", e[5])).await);
    assert!(!more(&format!("?limit=3&starting_after={}", e[3])).await);
    assert!(more(&format!("?limit=2&ending_before={}", e[2])).await);
    assert!(!more(&format!("?limit=4&ending_before={}", e[2])).await);
    assert_eq!(ids(&format!("?limit=2&ending_before={}", e[2])).await, pick(&[4, 3]));

    for bad in ["limit=0", "limit=501", "limit=-1", "limit=many"] {
        api.get(&format!("/webhook_events?{bad}"), &key).await.expect_error_at(400, "invalid", "query", "limit");
    }
    for bad in ["category=nope", "category=TRANSFER", "category="] {
        api.get(&format!("/webhook_events?{bad}"), &key).await.expect_error_at(400, "invalid", "query", "category");
    }
    for cursor in ["starting_after", "ending_before"] {
        let answer = api.get(&format!("/webhook_events?{cursor}={}", unknown_event_id()), &key).await;
        answer.expect_error(400, "invalid");
    }

    // 100 by default, up to 500.
    let busy = api.new_developer().await;
    let many = ingest_many(&api, busy.developer_id(), "transfer", 101, 8).await;
    assert_eq!(webhook_events(&api, &busy, "").await.len(), 100);
    let all = webhook_events(&api, &busy, "?limit=500").await;
    assert_eq!(all.len(), 101);
    let sequences: Vec<i64> = all.iter().map(|e| e["event_sequence"].as_i64().unwrap()).collect();
    let mut sorted = sequences.clone();
    sorted.sort_unstable();
    assert!(sorted.windows(2).all(|w| w[1] == w[0] + 1), "concurrent ingest still counts by one: {sorted:?}");
    assert_eq!(all.len(), many.len());
    let created: Vec<String> = all.iter().map(|e| e["event_created_at"].as_str().unwrap().to_owned()).collect();
    assert!(created.windows(2).all(|w| w[0] >= w[1]), "not newest first: {created:?}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn upcoming_entries_carry_their_delivery_and_pages_say_when_more_come() {
    let api = TestApi::start_with(tests::ApiOptions { retry_schedule: Some("1h".into()), ..Default::default() })
        .await
        .unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(tests::Reply::status(500));
    let failing =
        active_endpoint_with(&api, &key, json!({ "url": receiver.url(), "event_categories": ["transfer"] })).await;
    let disabled = create(&api, &key, json!({ "url": receiver.url() })).await;
    let first = ingest(&api, key.developer_id(), "transfer", 0).await;
    wait_for_logs(&api, &key, &failing, 1).await;

    // Retrying after one failed attempt, with its next time; held where disabled.
    let entries = upcoming_entries(&api, &key, &failing, "").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let delivery = &entries[0]["delivery"];
    assert_eq!((delivery["state"].as_str(), delivery["attempts"].as_i64()), (Some("retrying"), Some(1)), "{delivery}");
    tests::expect::timestamp(&delivery["next_attempt_at"]);
    let held = upcoming_entries(&api, &key, &disabled, "").await;
    assert_eq!(held[0]["delivery"]["state"], "held", "{held:?}");
    assert!(held[0]["delivery"]["next_attempt_at"].is_null());
    assert_eq!(upcoming(&api, &key, &disabled, "").await, vec![first.clone()]);

    // An earlier event of a beginning_of_time endpoint has no delivery yet.
    let earlier = create(&api, &key, json!({ "url": receiver.url(), "event_epoch": "beginning_of_time" })).await;
    let never = upcoming_entries(&api, &key, &earlier, "").await;
    assert!(never[0]["delivery"].is_null(), "{never:?}");

    // has_more on upcoming events and on logs.
    ingest(&api, key.developer_id(), "customer", 1).await;
    let page = api.get(&format!("/webhooks/{}/events?limit=1", id(&disabled)), &key).await;
    assert_eq!(page.expect(200)["has_more"], true);
    let page = api.get(&format!("/webhooks/{}/events?limit=2", id(&disabled)), &key).await;
    assert_eq!(page.expect(200)["has_more"], false);
    let logs = api.get(&format!("/webhooks/{}/logs?limit=1", id(&failing)), &key).await;
    assert_eq!(logs.expect(200)["has_more"], false);
    let all = api.get("/webhooks", &key).await;
    assert_eq!(all.expect(200)["has_more"], false);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn narrowing_the_categories_drops_the_upcoming_events_no_longer_wanted() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let transfer = ingest(&api, key.developer_id(), "transfer", 0).await;
    let customer = ingest(&api, key.developer_id(), "customer", 1).await;
    assert_eq!(upcoming(&api, &key, &webhook, "").await, vec![transfer.clone(), customer.clone()]);

    let path = format!("/webhooks/{}", id(&webhook));
    api.put(&path, &key, &json!({ "event_categories": ["transfer"] })).await.expect(200);
    assert_eq!(upcoming(&api, &key, &webhook, "").await, vec![transfer.clone()]);
    // Widening again does not bring back what was dropped; new events come.
    api.put(&path, &key, &json!({ "event_categories": [] })).await.expect(200);
    let later = ingest(&api, key.developer_id(), "customer", 2).await;
    assert_eq!(upcoming(&api, &key, &webhook, "").await, vec![transfer, later]);
    // The dropped event can still be sent on request.
    assert_sent(&send(&api, &key, &webhook, &event_id(&customer)).await);

    api.shutdown().await.unwrap();
}
