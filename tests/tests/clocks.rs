//! One clock (DESIGN.md, "One clock"; API.md §8.6), in the distributed
//! system: processes whose host clocks are an hour ahead and an hour
//! behind stamp the database's time, so no retry comes early, no backlog is
//! failed, nothing goes twice, every signature is fresh, and no watermark
//! is ever past the database's now; a delivery an API process lost when it
//! died, in a lane that holds a backlog, still arrives within two sweep
//! intervals. Standalone mode has one process, whose store is on its host:
//! one clock by construction.

mod common;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::*;
use serde_json::Value;
use tests::{
    Backend, Receiver, RecordedRequest, Reply, WAIT,
    procs::{Programs, Stack, StackOptions},
};
use uuid::Uuid;

/// `SWEEP_INTERVAL` of the stack.
const SWEEP_INTERVAL: Duration = Duration::from_secs(15);

fn programs() -> Programs {
    Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"))
}

async fn ingest_to(stack: &Stack, url: &str, developer: Uuid, n: usize) -> Value {
    let response = stack.client.post(url).json(&event_input(developer, "transfer", n)).send().await.unwrap();
    assert_eq!(response.status(), 201, "ingest");
    response.json().await.unwrap()
}

/// Waits until a process exports a `clock_offset_seconds` within 5 s of
/// `expected`.
async fn offset_near(stack: &Stack, addr: std::net::SocketAddr, program: &str, expected: f64) {
    eventually(&format!("{program} at {addr} measures its host {expected} s off"), WAIT, async || {
        let text = metrics(&stack.client, addr).await;
        match sample(&text, &format!("webhooks_{program}_clock_offset_seconds")) {
            Some(offset) if (offset - expected).abs() < 5.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Watches the stored watermarks and queue marks every 200 ms until
/// stopped, and returns every one it saw past the database's now.
fn watch_watermarks(pool: sqlx::PgPool, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ahead = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let rows: Vec<(String, f64)> = sqlx::query_as(
                "SELECT 'lane_watermarks ' || lane, extract(epoch FROM received_through - now())::float8
                   FROM lane_watermarks WHERE received_through > now()
                 UNION ALL
                 SELECT 'queue_marks ' || queue, extract(epoch FROM started_through - now())::float8
                   FROM queue_marks WHERE started_through > now()",
            )
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
            ahead.extend(rows.into_iter().map(|(what, by)| format!("{what} {by:.3} s ahead")));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ahead
    })
}

/// The requests of each event id, in arrival order.
fn by_event(requests: &[RecordedRequest]) -> HashMap<String, Vec<RecordedRequest>> {
    let mut by_event: HashMap<String, Vec<RecordedRequest>> = HashMap::new();
    for request in requests {
        let id = request.header("x-webhook-id").unwrap_or_default().to_owned();
        by_event.entry(id).or_default().push(request.clone());
    }
    by_event
}

/// The API an hour ahead, one dispatcher an hour ahead and one an hour
/// behind: every process says how far off its host is, retries keep their
/// schedule, a minute's backlog is delivered (not failed), each event once,
/// signatures verify with the receiver's ten-minute window, and no
/// watermark is ever stored past the database's now.
#[tokio::test(flavor = "multi_thread")]
async fn hosts_an_hour_ahead_and_behind_change_nothing_that_is_stamped() {
    const RETRIED: usize = 20;
    const BACKLOG: usize = 600;
    let step = Duration::from_secs(20);
    let mut options = StackOptions::new(Backend::Distributed, "clocks");
    options.retry_schedule = "20s".into();
    options.env = vec![
        ("FAULT_CLOCK_SKEW".into(), "1h".into()),
        ("DISPATCHER_CONCURRENCY".into(), "2".into()),
        ("DISPATCHER_PREFETCH".into(), "20".into()),
    ];
    let mut stack = Stack::start(programs(), options).await.unwrap();
    stack.start_dispatcher().await.unwrap();
    stack.set_env("FAULT_CLOCK_SKEW", "-1h");
    stack.start_dispatcher().await.unwrap();
    let pool = sqlx::PgPool::connect(stack.database_url().unwrap()).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let watching = watch_watermarks(pool.clone(), stop.clone());

    offset_near(&stack, stack.api.as_ref().unwrap().addr, "api", 3600.0).await;
    offset_near(&stack, stack.dispatchers[0].addr, "dispatcher", 3600.0).await;
    offset_near(&stack, stack.dispatchers[1].addr, "dispatcher", -3600.0).await;

    // Each event's first attempt fails; its retry is due a step later.
    let (key, developer) = stack.create_key(None).await.unwrap();
    let flaky = Receiver::start(&stack.ca).await.unwrap();
    flaky.reply_with(|request: &RecordedRequest, before: &[RecordedRequest]| {
        let seen = before.iter().any(|b| b.header("x-webhook-id") == request.header("x-webhook-id"));
        if seen { Reply::ok() } else { Reply::status(500) }
    });
    let flaky_endpoint = stack.active_endpoint(&key, &flaky.url(), &[]).await.unwrap();
    for n in 0..RETRIED {
        ingest_to(&stack, &stack.ingest_url(), developer, n).await;
    }
    // Another developer's backlog: a minute of deliveries at 300 ms each,
    // two at a time per dispatcher.
    let (other_key, other) = stack.create_key(None).await.unwrap();
    let slow = Receiver::start(&stack.ca).await.unwrap();
    slow.reply_always(Reply::ok().after(Duration::from_millis(300)));
    let slow_endpoint = stack.active_endpoint(&other_key, &slow.url(), &[]).await.unwrap();
    for n in 0..BACKLOG {
        ingest_to(&stack, &stack.ingest_url(), other, n).await;
    }

    let retried = flaky.wait_for_within(2 * RETRIED, Duration::from_secs(120)).await.unwrap();
    let backlog = wait_for_distinct(&slow, BACKLOG, Duration::from_secs(240)).await;
    assert_eq!(backlog.len(), BACKLOG);
    // Late duplicates would come within a sweep.
    tokio::time::sleep(SWEEP_INTERVAL).await;
    stop.store(true, Ordering::Relaxed);
    let ahead_seen = watching.await.unwrap();
    assert!(ahead_seen.is_empty(), "stored past the database's now: {ahead_seen:?}");

    let retried = by_event(&retried);
    assert_eq!(retried.len(), RETRIED);
    for (event, requests) in &retried {
        assert_eq!(requests.len(), 2, "{event}: a failure, then its retry, nothing more");
        let gap = requests[1].received_at.duration_since(requests[0].received_at).unwrap();
        // The schedule's step, less its jitter (at most a tenth).
        assert!(gap >= step.mul_f64(0.9) - Duration::from_millis(200), "{event}: retried after {gap:?}");
    }
    assert_eq!(flaky.count(), 2 * RETRIED, "nothing sent twice");
    assert_eq!(slow.count(), BACKLOG, "nothing sent twice");
    // Signed with the database's time: fresh by the receiver's clock.
    flaky.verify_with(&pem(&flaky_endpoint)).unwrap();
    slow.verify_with(&pem(&slow_endpoint)).unwrap();
    let (failed, swept): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'failed'), count(*) FILTER (WHERE generation > 0 OR swept)
           FROM deliveries",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((failed, swept), (0, 0), "no delivery failed or was taken for stranded");
    // Nothing went through the swept queue, and a dispatcher confirms no
    // first attempts: no process claims progress it never made (a claim of
    // "through now" would let the sweeper take a backlog for stranded).
    let claimed: Vec<String> = sqlx::query_scalar(
        "SELECT 'confirmed_through of a dispatcher' FROM processes
          WHERE kind = 'dispatcher' AND confirmed_through IS NOT NULL
         UNION ALL
         SELECT 'started_through of ' || queue FROM queue_marks
          WHERE queue = 'swept' AND started_through IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(claimed.is_empty(), "progress claimed where none was made: {claimed:?}");

    pool.close().await;
    stack.shutdown(Duration::from_secs(10)).await;
}

/// An API process killed between its commits and the broker's confirms
/// leaves deliveries that no queue holds, in a lane whose backlog keeps the
/// watermark far behind them: they arrive within two sweep intervals of
/// the kill, each once, and the backlog is not taken for lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_lost_ahead_of_its_own_lanes_backlog_arrives_within_two_intervals() {
    const LOST: usize = 5;
    let mut options = StackOptions::new(Backend::Distributed, "lost-process");
    options.retry_schedule = "1s".into();
    options.env = vec![
        // Every event in the default lane: the lost ones wait behind the
        // backlog in the same lane.
        ("FAIR_SHARE_PER_SECOND".into(), "0".into()),
        ("DISPATCHER_CONCURRENCY".into(), "3".into()),
        ("DISPATCHER_PREFETCH".into(), "6".into()),
    ];
    let mut stack = Stack::start(programs(), options).await.unwrap();
    stack.start_dispatcher().await.unwrap();
    let pool = sqlx::PgPool::connect(stack.database_url().unwrap()).await.unwrap();
    let (key, developer) = stack.create_key(None).await.unwrap();

    // A backlog of minutes: half a second per delivery, three at a time.
    let slow = Receiver::start(&stack.ca).await.unwrap();
    slow.reply_always(Reply::ok().after(Duration::from_millis(500)));
    let slow_endpoint = stack.active_endpoint(&key, &slow.url(), &[]).await.unwrap();
    for n in 0..400 {
        ingest_to(&stack, &stack.ingest_url(), developer, n).await;
    }
    slow.wait_for(10).await.unwrap();
    // Past the allowance, so the backlog is not in the lost process's window.
    tokio::time::sleep(Duration::from_secs(6)).await;

    // Another API process commits events and publishes none of their first
    // attempts, then dies.
    let fast = Receiver::start(&stack.ca).await.unwrap();
    let fast_endpoint = stack.active_endpoint(&key, &fast.url(), &[]).await.unwrap();
    let doomed = stack.start_another_api("doomed-api", &[("FAULT_LOSE_FIRST_ATTEMPTS", "true")]).await.unwrap();
    let doomed_ingest = format!("http://{}/internal/events", doomed.addr);
    let mut lost = Vec::new();
    for n in 0..LOST {
        lost.push(event_id(&ingest_to(&stack, &doomed_ingest, developer, 1000 + n).await));
    }
    doomed.kill().await.unwrap();
    let killed = tokio::time::Instant::now();

    let two_intervals = 2 * SWEEP_INTERVAL;
    let arrived = fast.wait_for_within(LOST, two_intervals).await;
    let took = killed.elapsed();
    assert!(arrived.is_ok(), "lost deliveries did not arrive within {two_intervals:?}: {arrived:?}");
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND state = 'pending'")
            .bind(id(&slow_endpoint))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(waiting > 100, "the backlog drained ({waiting} left): the test proves nothing");
    eprintln!("lost deliveries arrived {took:?} after the kill, {waiting} of the backlog still waiting");

    // Each once; the backlog never taken for lost.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let received = received_ids(&fast);
    assert_eq!(received.len(), LOST, "each once: {received:?}");
    for id in &lost {
        assert!(received.contains(id), "{id} never arrived");
    }
    verify_all(&fast, &fast_endpoint);
    let touched: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND (swept OR generation > 0)")
            .bind(id(&slow_endpoint))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(touched, 0, "the backlog was queued again");

    pool.close().await;
    stack.shutdown(Duration::from_secs(10)).await;
}
