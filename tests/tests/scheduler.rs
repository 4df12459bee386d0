//! Delivery controls per endpoint (API.md §8.5): `rate_limit_per_second`
//! keeps deliveries under a pace across every dispatcher, slowed by a 429 and
//! never failing a delivery for it; `ordering: ordered` delivers in
//! `event_sequence` order, a failing event holding back its own endpoint only;
//! a hanging endpoint holds a few of a dispatcher's slots, not all.

mod common;

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use tests::{
    ApiOptions, Backend, Receiver, RecordedRequest, Reply, TestApi, TestDispatcher, WAIT,
    procs::{Programs, Stack, StackOptions},
};

/// The `event_sequence` of a delivered event.
fn sequence(request: &RecordedRequest) -> i64 {
    request.json().ok().and_then(|body| body["event_sequence"].as_i64()).expect("a delivered event")
}

/// Two dispatchers competing for the messages (one in standalone mode,
/// which delivers in-process).
async fn competing_dispatchers(api: &TestApi) -> Vec<TestDispatcher> {
    let mut dispatchers = vec![api.start_dispatcher().await.unwrap()];
    if Backend::current() == Backend::Distributed {
        dispatchers.push(api.start_dispatcher().await.unwrap());
    }
    dispatchers
}

async fn stop_all(dispatchers: Vec<TestDispatcher>) {
    for mut dispatcher in dispatchers {
        dispatcher.stop().await.unwrap();
    }
}

/// Flags of delivery for a dispatcher with eight slots, all of which one
/// endpoint may take, then `more`.
fn eight_slots(more: &[&str]) -> Vec<String> {
    ["--dispatcher-concurrency", "8", "--dispatcher-endpoint-concurrency", "8"]
        .iter()
        .chain(more)
        .map(|flag| (*flag).to_owned())
        .collect()
}

fn succeeded(request: &RecordedRequest) -> bool {
    (200..300).contains(&request.answered)
}

/// Fails the first attempt of every third event, by its sequence.
fn fail_every_third_first_attempt(receiver: &Receiver) {
    receiver.reply_with(|request, before| {
        let seen = before.iter().any(|b| b.header("x-webhook-id") == request.header("x-webhook-id"));
        if !seen && sequence(request) % 3 == 0 { Reply::status(500) } else { Reply::ok() }
    });
}

/// Asserts that each request to `receiver` came only after every event
/// before it (of `sequences`) settled: its first success, or its last try
/// when it never succeeded. A repeat of an event (after a crash) is allowed.
#[track_caller]
fn assert_in_turn(name: &str, receiver: &Receiver, sequences: &[i64]) {
    let requests = receiver.requests();
    let settled_at = |s: i64| {
        let tries: Vec<usize> = (0..requests.len()).filter(|i| sequence(&requests[*i]) == s).collect();
        tries.iter().copied().find(|i| succeeded(&requests[*i])).or(tries.last().copied())
    };
    let answers: Vec<(i64, u16)> = requests.iter().map(|r| (sequence(r), r.answered)).collect();
    for (i, request) in requests.iter().enumerate() {
        let s = sequence(request);
        for earlier in sequences.iter().copied().take_while(|e| *e < s) {
            assert!(
                settled_at(earlier).is_some_and(|at| at < i),
                "{name}: event {s} was sent before event {earlier} settled: {answers:?}"
            );
        }
    }
}

#[tests::test]
async fn the_controls_are_shown_changed_and_checked() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    let plain = create(&api, &key, json!({ "url": receiver.url() })).await;
    assert_eq!((&plain["rate_limit_per_second"], &plain["ordering"]), (&Value::Null, &json!("none")), "{plain}");

    let body = json!({ "url": receiver.url(), "rate_limit_per_second": 20, "ordering": "ordered" });
    let controlled = create(&api, &key, body).await;
    assert_eq!((&controlled["rate_limit_per_second"], &controlled["ordering"]), (&json!(20), &json!("ordered")));
    let path = format!("/webhooks/{}", id(&controlled));
    assert_eq!(api.get(&path, &key).await.expect(200), &controlled);

    // JSON's 30.0 is the integer 30.
    let whole = api.put(&path, &key, &json!({ "rate_limit_per_second": 30.0 })).await;
    assert_eq!(whole.expect(200)["rate_limit_per_second"], 30);

    // Absent leaves a control alone; null removes the limit.
    let renamed = api.put(&path, &key, &json!({ "event_categories": ["transfer"] })).await;
    assert_eq!(renamed.expect(200)["rate_limit_per_second"], 30);
    let changed = api.put(&path, &key, &json!({ "rate_limit_per_second": 500, "ordering": "none" })).await;
    let changed = changed.expect(200);
    assert_eq!((&changed["rate_limit_per_second"], &changed["ordering"]), (&json!(500), &json!("none")));
    let unlimited = api.put(&path, &key, &json!({ "rate_limit_per_second": null })).await;
    assert_eq!(unlimited.expect(200)["rate_limit_per_second"], Value::Null);

    for bad in [json!(0), json!(10_001), json!(-1), json!(2.5), json!("20")] {
        let create = api.post("/webhooks", &key, &json!({ "url": receiver.url(), "rate_limit_per_second": bad })).await;
        create.expect_error_at(400, "invalid", "body", "rate_limit_per_second");
        let put = api.put(&path, &key, &json!({ "rate_limit_per_second": bad })).await;
        put.expect_error_at(400, "invalid", "body", "rate_limit_per_second");
    }
    for bad in [json!("random"), json!(true)] {
        let put = api.put(&path, &key, &json!({ "ordering": bad })).await;
        put.expect_error_at(400, "invalid", "body", "ordering");
    }
    // A refused change changed nothing.
    assert_eq!(api.get(&path, &key).await.expect(200)["rate_limit_per_second"], Value::Null);

    api.shutdown().await.unwrap();
}

/// An ordered endpoint whose receiver fails every third event's first
/// attempt, and another whose receiver refuses one event for good: each
/// gets its events in sequence, every one once with success, and the second
/// holds only its own later events while its failing one is retried.
#[tests::test]
async fn an_ordered_endpoint_gets_its_events_in_sequence_through_failures() {
    let options = ApiOptions { retry_schedule: Some("200ms,200ms".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatchers = competing_dispatchers(&api).await;
    let key = api.new_developer().await;

    let flaky = api.receiver().await;
    fail_every_third_first_attempt(&flaky);
    let stuck = api.receiver().await;
    let ordered = |url: String| json!({ "url": url, "ordering": "ordered" });
    let a = active_endpoint_with(&api, &key, ordered(flaky.url())).await;
    let b = active_endpoint_with(&api, &key, ordered(stuck.url())).await;
    // Unordered, beside them: never held by either.
    let free = api.receiver().await;
    active_endpoint(&api, &key, &free.url()).await;

    let first = ingest(&api, key.developer_id(), "transfer", 0).await;
    let refused = first["event_sequence"].as_i64().unwrap() + 2;
    stuck.reply_with(move |request, _| if sequence(request) == refused { Reply::status(500) } else { Reply::ok() });
    let mut events = vec![first];
    events.extend(ingest_many(&api, key.developer_id(), "transfer", 29, 8).await);
    let mut sequences: Vec<i64> = events.iter().map(|e| e["event_sequence"].as_i64().unwrap()).collect();
    sequences.sort_unstable();

    // In the middle, a dispatcher stops and another takes over.
    flaky.wait_for(10).await.unwrap();
    dispatchers.remove(0).stop().await.unwrap();
    dispatchers.push(api.start_dispatcher().await.unwrap());

    wait_for_distinct(&free, 30, WAIT).await;
    for (receiver, name, count) in [(&flaky, "flaky", 30), (&stuck, "stuck", 29)] {
        eventually(&format!("{name}: every event delivered"), WAIT, async || {
            let delivered: HashSet<i64> = receiver.requests().iter().filter(|r| succeeded(r)).map(sequence).collect();
            if delivered.len() == count { Ok(()) } else { Err(format!("{} of {count}", delivered.len())) }
        })
        .await;
    }

    for (receiver, name) in [(&flaky, "flaky"), (&stuck, "stuck")] {
        assert_in_turn(name, receiver, &sequences);
        let requests = receiver.requests();
        let delivered: Vec<i64> = requests.iter().filter(|r| succeeded(r)).map(sequence).collect();
        let expected: Vec<i64> = sequences.iter().copied().filter(|s| !(name == "stuck" && *s == refused)).collect();
        assert_eq!(delivered, expected, "{name}: each event delivered once, in sequence");
    }
    // The refused event was tried three times (the schedule), then failed.
    assert_eq!(stuck.requests().iter().filter(|r| sequence(r) == refused).count(), 3);
    eventually("the refused event is failed", WAIT, async || {
        let upcoming = upcoming_ids(&api, &key, &b).await;
        if upcoming.is_empty() { Ok(()) } else { Err(format!("{upcoming:?}")) }
    })
    .await;
    assert!(upcoming_ids(&api, &key, &a).await.is_empty());

    stop_all(dispatchers).await;
    api.shutdown().await.unwrap();
}

/// An endpoint switched to ordered while a burst is on its way, by a change
/// no dispatcher has heard of yet (written behind their backs, as a lost or
/// late lifecycle message leaves it): whether a delivery takes its turn is
/// read from the store at the attempt, so every retry after the switch goes
/// in `event_sequence` order.
#[tests::test]
async fn an_endpoint_switched_to_ordered_mid_burst_gets_the_rest_in_sequence() {
    let options = ApiOptions {
        retry_schedule: Some("1s,1s,1s".into()),
        delivery_args: eight_slots(&["--endpoint-cache-ttl", "1h"]),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatchers = competing_dispatchers(&api).await;
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    // Every first attempt fails: what succeeds is a retry, made after the switch.
    receiver.reply_with(|request, before| {
        let seen = before.iter().any(|b| b.header("x-webhook-id") == request.header("x-webhook-id"));
        if seen { Reply::ok() } else { Reply::status(500) }
    });
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let events = ingest_many(&api, key.developer_id(), "transfer", 20, 8).await;
    api.execute_sql("UPDATE endpoints SET ordering = 'ordered' WHERE id = $1", &id(&endpoint)).await;
    let mut sequences: Vec<i64> = events.iter().map(|e| e["event_sequence"].as_i64().unwrap()).collect();
    sequences.sort_unstable();

    eventually("every event delivered", WAIT, async || {
        let delivered: HashSet<i64> = receiver.requests().iter().filter(|r| succeeded(r)).map(sequence).collect();
        if delivered.len() == 20 { Ok(()) } else { Err(format!("{} of 20", delivered.len())) }
    })
    .await;
    let delivered: Vec<i64> = receiver.requests().iter().filter(|r| succeeded(r)).map(sequence).collect();
    assert_eq!(delivered, sequences, "the retries came out of sequence");

    stop_all(std::mem::take(&mut dispatchers)).await;
    api.shutdown().await.unwrap();
}

/// Receivers that answer 429 to every request beyond `limit` in the last
/// second: the pace, set higher, comes down to what the receiver takes, and
/// every event is delivered (none fails for being throttled).
#[tests::test]
async fn a_throttling_receiver_sets_the_pace_and_nothing_fails() {
    const LIMIT: usize = 20;
    const EVENTS: usize = 200;
    let options = ApiOptions { retry_schedule: Some("1s,1s,1s,1s,1s,1s,1s,1s,1s,1s".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let dispatchers = competing_dispatchers(&api).await;
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_with(|request, before| {
        let second_ago = request.received_at - Duration::from_secs(1);
        let recent = before.iter().rev().take_while(|b| b.received_at > second_ago).filter(|b| succeeded(b)).count();
        if recent >= LIMIT { Reply::status(429) } else { Reply::ok() }
    });
    let webhook = active_endpoint_with(&api, &key, json!({ "url": receiver.url(), "rate_limit_per_second": 40 })).await;

    let started = SystemTime::now();
    ingest_many(&api, key.developer_id(), "transfer", EVENTS, 16).await;
    let delivered = eventually("every event delivered", Duration::from_secs(60), async || {
        let ok: Vec<RecordedRequest> = receiver.requests().into_iter().filter(succeeded).collect();
        if ok.len() >= EVENTS { Ok(ok) } else { Err(format!("{} of {EVENTS}", ok.len())) }
    })
    .await;
    let distinct: HashSet<i64> = delivered.iter().map(sequence).collect();
    assert_eq!((delivered.len(), distinct.len()), (EVENTS, EVENTS), "each event delivered once");

    let requests = receiver.requests();
    let throttled = requests.iter().filter(|r| r.answered == 429).count();
    let span = delivered.last().unwrap().received_at.duration_since(started).unwrap().as_secs_f64();
    let rate = EVENTS as f64 / span;
    eprintln!(
        "{EVENTS} events in {span:.1} s: {rate:.1}/s against a receiver taking {LIMIT}/s; \
         {throttled} of {} requests throttled",
        requests.len()
    );
    // Close to what the receiver takes: no slower than half of it, and the
    // pace came down rather than hammering (most requests were accepted).
    assert!(rate >= LIMIT as f64 / 2.0, "{rate:.1}/s is far below {LIMIT}/s");
    assert!(throttled * 3 < requests.len(), "{throttled} of {} requests throttled", requests.len());
    // Nothing failed for good: nothing is upcoming, every log entry is a
    // success or a 429.
    assert!(upcoming_ids(&api, &key, &webhook).await.is_empty());

    stop_all(dispatchers).await;
    api.shutdown().await.unwrap();
}

/// The pace holds across dispatchers: at 10 per second, 40 events take about
/// four seconds, and no second sees more than the limit (and one of slack
/// for a start on the second's edge).
#[tests::test]
async fn the_pace_holds_across_dispatchers() {
    const RATE: usize = 10;
    const EVENTS: usize = 40;
    let api = TestApi::start().await.unwrap();
    let dispatchers = competing_dispatchers(&api).await;
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    active_endpoint_with(&api, &key, json!({ "url": receiver.url(), "rate_limit_per_second": RATE })).await;

    ingest_many(&api, key.developer_id(), "transfer", EVENTS, 16).await;
    let requests = receiver.wait_for_within(EVENTS, Duration::from_secs(30)).await.unwrap();
    assert_eq!(distinct_ids(&receiver).len(), EVENTS);
    let times: Vec<i64> = requests.iter().map(RecordedRequest::received_at_ms).collect();
    let span = (times[EVENTS - 1] - times[0]) as f64 / 1000.0;
    let busiest = times.iter().map(|t| times.iter().filter(|u| **u >= *t && **u < t + 1000).count()).max().unwrap_or(0);
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!(
        "{EVENTS} events at {RATE}/s: {span:.2} s from first to last; at most {busiest} in one second; gaps {gaps:?}"
    );
    assert!(busiest <= RATE + 1, "{busiest} deliveries within one second at a limit of {RATE}");
    assert!(span >= (EVENTS - RATE - 1) as f64 / RATE as f64, "{EVENTS} deliveries in {span:.2} s");

    stop_all(dispatchers).await;
    api.shutdown().await.unwrap();
}

/// While one developer has a backlog a dispatcher needs seconds to drain,
/// another's events arrive at once: the backlog, beyond its developer's fair
/// share, waits in the bulk lane, which never takes every slot. Then the
/// backlog drains whole.
#[tests::test]
async fn one_developers_backlog_does_not_hold_up_another() {
    const BACKLOG: usize = 600;
    // A's fair-share burst; B's 20 events stay well within theirs.
    const BURST: usize = 30;
    let options = ApiOptions {
        extra_args: ["--fair-share-per-second", "2", "--fair-share-burst", &BURST.to_string()]
            .map(String::from)
            .to_vec(),
        delivery_args: eight_slots(&[]),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (a, b) = (api.new_developer().await, api.new_developer().await);
    let busy = api.receiver().await;
    // A's receiver takes 200 ms an answer: the bulk lane's six slots (of
    // eight) drain at most 30 of A's events a second, so the backlog lasts
    // nearly 20 s, far longer than ingesting it and measuring B take even
    // on a machine busy with other tests.
    busy.reply_always(Reply::ok().after(Duration::from_millis(200)));
    let quiet = api.receiver().await;
    active_endpoint(&api, &a, &busy.url()).await;
    active_endpoint(&api, &b, &quiet.url()).await;

    // A's fair-share burst goes out in the default lane ahead of B's
    // events, as it should; B is measured against the rest of A's backlog,
    // which waits in the bulk lane (and the few events A's share refills
    // to meanwhile, at 2 a second).
    ingest_many(&api, a.developer_id(), "transfer", BURST, 16).await;
    busy.wait_for(BURST).await.unwrap();
    ingest_many(&api, a.developer_id(), "transfer", BACKLOG - BURST, 16).await;
    let mut latencies = Vec::new();
    for n in 0..20 {
        let sent = SystemTime::now();
        let event = ingest(&api, b.developer_id(), "transfer", n).await;
        let arrived = eventually("B's event arrives", WAIT, async || {
            let found = quiet.requests().into_iter().find(|r| r.header("x-webhook-id") == event["event_id"].as_str());
            found.ok_or_else(|| "not yet".to_owned())
        })
        .await;
        latencies.push(arrived.received_at.duration_since(sent).unwrap_or_default());
    }
    let waiting = BACKLOG.saturating_sub(distinct_ids(&busy).len());
    latencies.sort();
    let (p50, worst) = (latencies[latencies.len() / 2], latencies[latencies.len() - 1]);
    eprintln!("B's events with {waiting} of A's still waiting: p50 {p50:?}, slowest {worst:?}");
    assert!(waiting > 100, "A's backlog drained before B was measured ({waiting} left): no contention shown");
    assert!(worst < Duration::from_secs(1), "B waited {worst:?} behind A's backlog");

    // A's backlog is not starved: all of it arrives, each once.
    wait_for_distinct(&busy, BACKLOG, Duration::from_secs(120)).await;
    assert_eq!(busy.count(), BACKLOG);
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// A hanging endpoint (every attempt runs to the timeout) is tried a few
/// attempts at a time, not with every slot the dispatcher has, so another
/// developer's events go out while its first attempts still hang (docs/architecture.md,
/// "Scheduling": adaptive slots). With a fixed share of slots, the hanging
/// endpoint would take all eight here and the other events would wait for
/// its timeouts.
#[tests::test]
async fn a_hanging_endpoint_holds_few_slots_and_the_others_go_on() {
    let options = ApiOptions {
        delivery_timeout: "25s".into(),
        // Stopping does not wait for the hung attempts.
        delivery_args: eight_slots(&["--shutdown-timeout", "1s"]),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (a, b) = (api.new_developer().await, api.new_developer().await);
    let hanging = api.receiver().await;
    let healthy = api.receiver().await;
    let stuck = active_endpoint(&api, &a, &hanging.url()).await;
    active_endpoint(&api, &b, &healthy.url()).await;
    // Registered while it answered; from now on it never does.
    hanging.reply_always(Reply::hang());

    ingest_many(&api, a.developer_id(), "transfer", 20, 4).await;
    hanging.wait_for(1).await.unwrap();
    let mut events = Vec::new();
    for n in 0..10 {
        events.push(event_id(&ingest(&api, b.developer_id(), "transfer", n).await));
    }
    wait_for_events(&healthy, &events, WAIT).await;

    // None of the hanging endpoint's attempts has ended: B's events did not
    // wait for its timeouts.
    assert!(logs(&api, &a, &stuck, "").await.is_empty(), "an attempt to the hanging endpoint ended first");
    let tried = hanging.count();
    assert!(tried <= 4, "{tried} attempts at once to an endpoint that never answered");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// A hung endpoint's backlog waits aside (in the distributed mode in the
/// store, with no broker message behind it; in standalone mode, due later
/// in the deliveries table), stays listed as upcoming, and all goes out once
/// the endpoint answers again. The sweep interval is far longer than the
/// test: in the distributed mode the endpoint's first success releases what
/// was set aside, not the sweeper.
#[tests::test]
async fn a_hung_endpoints_backlog_waits_aside_and_goes_once_it_answers() {
    const EVENTS: usize = 30;
    // The first attempts hang for the delivery timeout (5 s): the other
    // events, ingested meanwhile, find the endpoint full.
    let options = ApiOptions {
        retry_schedule: Some("1s,1s,1s,1s,1s,1s,1s,1s".into()),
        extra_args: vec!["--sweep-interval".into(), "10m".into()],
        delivery_args: eight_slots(&["--shutdown-timeout", "1s"]),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let developer = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = active_endpoint(&api, &developer, &receiver.url()).await;
    // Registered while it answered; from now on it hangs.
    receiver.reply_always(Reply::hang());

    let mut events: Vec<String> =
        ingest_many(&api, developer.developer_id(), "transfer", EVENTS, 4).await.iter().map(event_id).collect();
    let aside = eventually("the backlog set aside", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        let aside = sample(&text, r#"webhooks_dispatcher_deliveries_total{outcome="set_aside"}"#).unwrap_or(0.0);
        if aside >= (EVENTS - 4) as f64 { Ok(aside) } else { Err(format!("{aside} set aside")) }
    })
    .await;
    let tried = receiver.count();
    assert!(tried <= 4, "{tried} attempts at once to an endpoint that never answered ({aside} set aside)");
    if !api.is_standalone() {
        eventually("the API's gauge shows them set aside", WAIT, async || {
            let text = api.send(api.internal_request(Method::GET, "/metrics")).await;
            let text = String::from_utf8_lossy(&text.body).into_owned();
            let shown = sample(&text, "webhooks_api_deliveries_set_aside").unwrap_or(0.0);
            if shown >= aside { Ok(()) } else { Err(format!("{shown} shown, {aside} set aside")) }
        })
        .await;
    }
    let mut upcoming = upcoming_ids(&api, &developer, &webhook).await;
    upcoming.sort_unstable();
    events.sort_unstable();
    assert_eq!(upcoming, events, "every event of the hung endpoint is still upcoming");

    // The endpoint answers again (the attempts under way still hang to the
    // timeout); their retries, a new event and, in standalone mode, a
    // delivery come due find it answering.
    receiver.reply_always(Reply::ok());
    events.push(event_id(&ingest(&api, developer.developer_id(), "transfer", EVENTS).await));
    wait_for_events(&receiver, &events, WAIT).await;
    wait_upcoming(&api, &developer, &webhook, &events[0], false).await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// The order holds when processes die mid-delivery: dispatchers (or the
/// standalone process) are killed with SIGKILL and replaced while an ordered
/// endpoint's events go out, every third failing its first attempt.
#[tests::test]
async fn the_order_holds_through_kill_9() {
    const EVENTS: usize = 40;
    let backend = Backend::current();
    let programs = Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"));
    let options = StackOptions { retry_schedule: "300ms,300ms,300ms".into(), ..StackOptions::new(backend, "ordering") };
    let mut stack = Stack::start(programs, options).await.unwrap();
    if backend == Backend::Distributed {
        stack.start_dispatcher().await.unwrap();
        stack.start_dispatcher().await.unwrap();
    }
    let (key, developer) = stack.create_key(None).await.unwrap();
    let receiver = Receiver::start(&stack.ca).await.unwrap();
    // Slow enough that kills land while attempts are in flight.
    let flaky = |request: &RecordedRequest, before: &[RecordedRequest]| {
        let seen = before.iter().any(|b| b.header("x-webhook-id") == request.header("x-webhook-id"));
        let reply = if !seen && sequence(request) % 3 == 0 { Reply::status(500) } else { Reply::ok() };
        reply.after(Duration::from_millis(40))
    };
    receiver.reply_with(flaky);
    let webhook = stack.active_endpoint(&key, &receiver.url(), &[]).await.unwrap();
    let path = format!("{}/webhooks/{}", stack.api_url(), id(&webhook));
    let ordered = stack.client.put(&path).header("Api-Key", &key).json(&json!({ "ordering": "ordered" }));
    assert_eq!(ordered.send().await.unwrap().status(), 200);

    let mut sequences = Vec::new();
    for n in 0..EVENTS {
        let response = stack.client.post(stack.ingest_url()).json(&event_input(developer, "transfer", n));
        let event: Value = response.send().await.unwrap().json().await.unwrap();
        sequences.push(event["event_sequence"].as_i64().expect("an accepted event"));
    }
    sequences.sort_unstable();

    // Three kills, each once a few more events have arrived.
    for kill in 1..=3 {
        receiver.wait_for(kill * EVENTS / 5).await.unwrap();
        match backend {
            Backend::Distributed => {
                let victim = stack.dispatchers.remove(0);
                victim.kill().await.unwrap();
                stack.start_dispatcher().await.unwrap();
            }
            Backend::Standalone => {
                stack.api.take().expect("standalone runs").kill().await.unwrap();
                stack.start_api().await.unwrap();
            }
        }
    }
    eventually("every event delivered", Duration::from_secs(90), async || {
        let delivered: HashSet<i64> = receiver.requests().iter().filter(|r| succeeded(r)).map(sequence).collect();
        if delivered.len() == EVENTS { Ok(()) } else { Err(format!("{} of {EVENTS}", delivered.len())) }
    })
    .await;
    assert_in_turn("killed", &receiver, &sequences);
    let mut firsts: Vec<i64> = Vec::new();
    for request in receiver.requests().iter().filter(|r| succeeded(r)) {
        if !firsts.contains(&sequence(request)) {
            firsts.push(sequence(request));
        }
    }
    assert_eq!(firsts, sequences, "each event's first success in sequence");
    stack.shutdown(Duration::from_secs(10)).await;
}

/// While an ordered endpoint's first event keeps failing, the next one waits
/// (listed upcoming, not sent); `send` delivers it out of turn at once.
#[tests::test]
async fn send_skips_an_ordered_endpoints_turn() {
    let options = ApiOptions { retry_schedule: Some("1h".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = active_endpoint_with(&api, &key, json!({ "url": receiver.url(), "ordering": "ordered" })).await;
    receiver.reply_always(Reply::status(500));
    let first = ingest(&api, key.developer_id(), "transfer", 0).await;
    receiver.wait_for(1).await.unwrap();
    receiver.reply_always(Reply::ok());
    let second = ingest(&api, key.developer_id(), "transfer", 1).await;

    // Held back behind the retrying first event, and listed as upcoming.
    // Marked waiting where a dispatcher took the message; standalone's queue
    // simply leaves it pending. (The first is recorded retrying once its
    // attempt's outcome is written, a moment after the receiver saw it.)
    let expected = if Backend::current() == Backend::Distributed { "waiting" } else { "pending" };
    eventually("the first event retries and the second waits its turn", WAIT, async || {
        let entries = upcoming_entries(&api, &key, &webhook, "").await;
        let states: Vec<&str> = entries.iter().filter_map(|e| e["delivery"]["state"].as_str()).collect();
        let ids: Vec<&str> = entries.iter().filter_map(|e| e["event_id"].as_str()).collect();
        let wanted = [first["event_id"].as_str(), second["event_id"].as_str()];
        if states == ["retrying", expected] && ids.iter().map(|i| Some(*i)).eq(wanted) {
            Ok(())
        } else {
            Err(format!("{entries:?}"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 1, "the second event went before the first settled");

    assert_sent(&send(&api, &key, &webhook, &event_id(&second)).await);
    let requests = receiver.wait_for(2).await.unwrap();
    assert_eq!(requests[1].header("x-webhook-id"), second["event_id"].as_str());
    assert!(upcoming_ids(&api, &key, &webhook).await.contains(&event_id(&first)), "the first is still owed");
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// The API's backlog gauges, as an operator alerts on them: an ordered
/// endpoint whose first event keeps failing holds the rest waiting (counted
/// in `deliveries_waiting`, never as due), and, with no dispatcher running,
/// an event due for delivery ages in `oldest_due_seconds` of its lane.
#[tests::test]
async fn the_backlog_gauges_show_what_waits_and_for_how_long() {
    let options = ApiOptions { retry_schedule: Some("1h".into()), ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let refusing = api.receiver().await;
    refusing.reply_always(Reply::status(500));
    active_endpoint_with(&api, &key, json!({ "url": refusing.url(), "ordering": "ordered" })).await;

    ingest(&api, key.developer_id(), "transfer", 0).await;
    refusing.wait_for(1).await.unwrap();
    ingest_many(&api, key.developer_id(), "transfer", 4, 4).await;
    let gauges = async || {
        let text = api.send(api.internal_request(Method::GET, "/metrics")).await;
        let text = String::from_utf8_lossy(&text.body).into_owned();
        let waiting = sample(&text, "webhooks_api_deliveries_waiting");
        let due = sample(&text, r#"webhooks_api_oldest_due_seconds{lane="default"}"#);
        (waiting, due)
    };
    let due = eventually("four deliveries waiting for the failing one", WAIT, async || match gauges().await {
        (Some(4.0), Some(due)) => Ok(due),
        other => Err(format!("waiting, oldest due: {other:?}")),
    })
    .await;
    assert_eq!(due, 0.0, "nothing is due: the failing event waits an hour, the others their turn");
    assert_eq!(refusing.count(), 1, "the waiting events were not sent");

    if !api.is_standalone() {
        dispatcher.stop().await.unwrap();
        let idle = api.receiver().await;
        active_endpoint(&api, &key, &idle.url()).await;
        ingest(&api, key.developer_id(), "transfer", 5).await;
        eventually("the undelivered event ages as due", WAIT, async || match gauges().await {
            (_, Some(due)) if due >= 1.0 => Ok(()),
            other => Err(format!("waiting, oldest due: {other:?}")),
        })
        .await;
        assert_eq!(idle.count(), 0);

        // Every series the shipped alerting rules read is one the API exports.
        let text = api.send(api.internal_request(Method::GET, "/metrics")).await;
        let text = String::from_utf8_lossy(&text.body).into_owned();
        let rules = include_str!("../../deploy/prometheus/alerts.yaml");
        let mut names: Vec<&str> = rules
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("webhooks_api_") && word.len() > "webhooks_api_".len())
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() >= 6, "the rules name the API's series: {names:?}");
        for name in names {
            let exported = text.lines().any(|line| line.split([' ', '{']).next() == Some(name));
            assert!(exported, "alerts.yaml reads {name}, which /metrics does not export");
        }
    } else {
        dispatcher.stop().await.unwrap();
    }
    api.shutdown().await.unwrap();
}
