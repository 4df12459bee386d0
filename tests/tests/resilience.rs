//! The pipeline under strain (API.md §5 rules 6–7, §7): a hanging receiver
//! does not hold back others, dispatchers share the work, and a dispatcher
//! killed mid-run loses nothing.

mod common;

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Stdio,
    time::Duration,
};

use common::*;
use tests::{ApiOptions, Reply, TestApi, WAIT};
use tokio::process::{Child, Command};

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_receiver_does_not_hold_back_a_healthy_one() {
    // A small window, so that without per-endpoint limits the hanging
    // endpoint's attempts would take every slot.
    let delivery_args = ["--dispatcher-concurrency", "16", "--dispatcher-endpoint-concurrency", "8"];
    let options = ApiOptions {
        delivery_timeout: "2s".into(),
        delivery_args: delivery_args.map(String::from).to_vec(),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (a, b) = (api.new_developer().await, api.new_developer().await);
    let (hanging, healthy) = (api.receiver().await, api.receiver().await);
    hanging.reply_always(Reply::hang());
    let a_endpoint = active_endpoint(&api, &a, &hanging.url()).await;
    let b_endpoint = active_endpoint(&api, &b, &healthy.url()).await;

    ingest_many(&api, a.developer_id(), "transfer", 30, 4).await;
    hanging.wait_for(1).await.unwrap();
    let b_events = ingest_many(&api, b.developer_id(), "transfer", 50, 4).await;
    let b_ids: Vec<String> = b_events.iter().map(event_id).collect();
    wait_for_events(&healthy, &b_ids, Duration::from_secs(90)).await;
    verify_all(&healthy, &b_endpoint);
    assert!(healthy.count() >= 50);

    // Meanwhile A's attempts ran out of time, and say so.
    let entry = eventually("a timed-out attempt in A's log", WAIT, async || {
        let entries = logs(&api, &a, &a_endpoint, "?limit=100").await;
        entries.iter().find(|e| e["error"] == "timeout").cloned().ok_or_else(|| format!("{entries:?}"))
    })
    .await;
    assert!(entry["status"].is_null(), "a timed-out attempt has no status: {entry}");
    verify_all(&hanging, &a_endpoint);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_dispatchers_share_the_work_and_deliver_every_event() {
    let api = TestApi::start().await.unwrap();
    let mut first = api.start_dispatcher().await.unwrap();
    let mut second = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let events = ingest_many(&api, key.developer_id(), "transfer", 1000, 16).await;
    let distinct = wait_for_distinct(&receiver, 1000, Duration::from_secs(180)).await;
    let expected: std::collections::HashSet<String> = events.iter().map(event_id).collect();
    assert_eq!(distinct, expected);
    verify_all(&receiver, &endpoint);

    for (name, dispatcher) in [("first", &first), ("second", &second)] {
        let text = metrics(&api.client, dispatcher.addr).await;
        let succeeded = sample(&text, "webhooks_dispatcher_deliveries_total{outcome=\"succeeded\"}");
        assert!(succeeded.is_some_and(|n| n > 0.0), "the {name} dispatcher delivered nothing:\n{text}");
    }

    first.stop().await.unwrap();
    second.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// The `webhooks-dispatcher` program to run: `WEBHOOKS_DISPATCHER_BIN` (to
/// test a shipped binary), else the same program as built by `cargo test` for
/// this package (`tests/src/bin/dispatcher-process.rs`).
fn dispatcher_binary() -> PathBuf {
    std::env::var_os("WEBHOOKS_DISPATCHER_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_dispatcher-process")), PathBuf::from)
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A `webhooks-dispatcher` process beside `api`, configured by environment
/// variables as an operator would; ready when this returns.
async fn spawn_dispatcher(api: &TestApi) -> (Child, SocketAddr) {
    let common = &api.config.common;
    let schedule: Vec<String> = common.retry_schedule.delays().iter().map(|d| format!("{}ms", d.as_millis())).collect();
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let mut command = Command::new(dispatcher_binary());
    command
        .env("DATABASE_URL", common.database_url())
        .env("DATABASE_MAX_CONNECTIONS", "4")
        .env("AMQP_URL", &common.amqp_url)
        .env("QUEUE_PREFIX", &common.queue_prefix)
        .env("TLS_EXTRA_ROOTS", common.tls_extra_roots.as_ref().expect("the test CA"))
        .env("TARGET_ALLOW_PRIVATE", "true")
        .env("DELIVERY_TIMEOUT", format!("{}ms", common.delivery_timeout.as_millis()))
        .env("RETRY_SCHEDULE", schedule.join(","))
        .env("DISPATCHER_LISTEN_ADDR", addr.to_string())
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start webhooks-dispatcher");
    let ready = eventually("the dispatcher process answers /readyz", Duration::from_secs(60), async || {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            panic!("webhooks-dispatcher exited before it was ready: {status}");
        }
        match api.client.get(format!("http://{addr}/readyz")).send().await {
            Ok(response) if response.status() == 200 => Ok(()),
            Ok(response) => Err(format!("{}", response.status())),
            Err(error) => Err(error.to_string()),
        }
    });
    ready.await;
    (child, addr)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatcher_killed_mid_run_loses_nothing() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    // Slow answers, so the kill lands while much is still in flight or queued.
    receiver.reply_always(Reply::ok().after(Duration::from_millis(100)));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    // Queued before any dispatcher runs, so the kill comes with most of them to go.
    let events = ingest_many(&api, key.developer_id(), "transfer", 500, 16).await;

    let (mut child, addr) = spawn_dispatcher(&api).await;
    wait_for_distinct(&receiver, 100, Duration::from_secs(90)).await;
    // SIGKILL: no chance to finish, ack or hand anything back.
    child.start_kill().expect("SIGKILL the dispatcher");
    let status = child.wait().await.expect("the killed dispatcher's status");
    assert!(!status.success(), "{status}");
    assert!(api.client.get(format!("http://{addr}/healthz")).send().await.is_err(), "the process is gone");
    let before = distinct_ids(&receiver).len();

    let mut successor = api.start_dispatcher().await.unwrap();
    let distinct = wait_for_distinct(&receiver, 500, Duration::from_secs(120)).await;
    let expected: std::collections::HashSet<String> = events.iter().map(event_id).collect();
    assert_eq!(distinct, expected);
    verify_all(&receiver, &endpoint);
    eprintln!(
        "{before} distinct events had arrived when the dispatcher was killed; {} requests in all",
        receiver.count()
    );

    successor.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// The database ends every connection of the services (a failover, an
/// operator's `pg_terminate_backend`) between two events: the next ingest
/// is answered 201 at once, not with an error for the connection the writer
/// kept, and every event arrives, each once.
#[tokio::test(flavor = "multi_thread")]
async fn ingest_and_delivery_go_on_when_the_database_ends_their_connections() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    // The first event makes the ingest writer and the dispatcher's
    // admission checks take the connections they keep; its attempt is
    // recorded before the connections end, so it is not sent again.
    let mut events = vec![event_id(&ingest(&api, key.developer_id(), "transfer", 0).await)];
    wait_for_events(&receiver, &events, WAIT).await;
    let recorded = wait_for_logs(&api, &key, &endpoint, 1).await;
    assert_eq!(recorded[0]["status"], 200, "{recorded:?}");
    // An event for a developer with no endpoint uses the writer's connection
    // again just before it ends: the next ingest finds it kept, not due for
    // a check.
    let other = api.new_developer().await;
    ingest(&api, other.developer_id(), "transfer", 0).await;

    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'webhooks'",
    )
    .fetch_all(api.pool())
    .await
    .unwrap();
    assert!(ended.len() >= 2, "the API and the dispatcher had {} connections", ended.len());

    for n in 1..=5 {
        let answer = api.ingest(&event_input(key.developer_id(), "transfer", n)).await;
        events.push(event_id(answer.expect(201)));
    }
    wait_for_events(&receiver, &events, WAIT).await;
    assert_eq!(distinct_ids(&receiver).len(), events.len());
    assert_eq!(receiver.count(), events.len(), "an event was delivered twice");
    verify_all(&receiver, &endpoint);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
