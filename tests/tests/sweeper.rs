//! Nothing stranded (docs/architecture.md, "Nothing stranded, nothing looping"), in the
//! distributed system: deliveries whose messages the broker lost are found by
//! the sweeper and still arrive, once; concurrent sweepers queue each once,
//! and give up after the limit; `webhooks-api dead-letters list|replay` shows
//! and replays what `{p}.dead` holds. Standalone mode has no broker to lose
//! messages: its queue is the deliveries table. Parking is in `parking.rs`.

mod common;

use std::{process::Stdio, time::Duration};

use common::*;
use lapin::{
    Channel, Connection,
    options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions},
    types::FieldTable,
};
use serde_json::Value;
use tests::{ApiOptions, DeveloperKey, Reply, TestApi, WAIT};
use webhooks_model::Lane;
use webhooks_queue::DeliveryMessage;
use webhooks_queue::amqp as broker;

/// The shortest sweep interval the API takes with the default
/// `DELIVERY_TIMEOUT` (10 s).
const SWEEP: &str = "15s";

/// Long enough for a sweep to find a stranded delivery and for it to arrive:
/// two sweep intervals, plus the retry delay, plus slack.
const SWEPT_WITHIN: Duration = Duration::from_secs(60);

fn options(retry_schedule: &str, sweep: bool) -> ApiOptions {
    let mut extra_args = Vec::new();
    if sweep {
        extra_args = vec!["--sweep-interval".into(), SWEEP.into()];
    }
    ApiOptions { retry_schedule: Some(retry_schedule.into()), extra_args, ..ApiOptions::default() }
}

async fn channel(api: &TestApi) -> (Connection, Channel) {
    let connection = broker::connect(&api.amqp_url, "sweeper test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    (connection, channel)
}

/// Messages ready in `queue`.
async fn depth(channel: &Channel, queue: &str) -> u32 {
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.into(), passive, FieldTable::default()).await.unwrap().message_count()
}

/// Waits until every delivery of `endpoint` is recorded settled.
async fn wait_nothing_upcoming(api: &TestApi, key: &DeveloperKey, endpoint: &Value) {
    eventually("every delivery is recorded", WAIT, async || {
        let upcoming = upcoming_ids(api, key, endpoint).await;
        if upcoming.is_empty() { Ok(()) } else { Err(format!("{upcoming:?}")) }
    })
    .await;
}

/// Waits until `queue` counts `n` ready messages: messages a closed channel
/// held go back to a quorum queue shortly after the close, not with it.
async fn wait_depth(channel: &Channel, queue: &str, n: u32, what: &str) {
    eventually(what, WAIT, async || {
        let ready = depth(channel, queue).await;
        if ready == n { Ok(()) } else { Err(format!("{queue} holds {ready}")) }
    })
    .await;
}

async fn outbox_rows(api: &TestApi) -> i64 {
    let pool = api.pool();
    sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(pool).await.unwrap()
}

/// Waits until the relay published everything and `queue` holds `n` messages.
async fn wait_queued(api: &TestApi, channel: &Channel, queue: &str, n: u32) {
    eventually(&format!("{queue} holds {n} messages"), WAIT, async || {
        let (rows, ready) = (outbox_rows(api).await, depth(channel, queue).await);
        if rows == 0 && ready == n { Ok(()) } else { Err(format!("outbox {rows}, {queue} {ready}")) }
    })
    .await;
}

/// Runs `webhooks-api dead-letters <args> --json` against the instance's broker.
pub fn dead_letters(api: &TestApi, args: &[&str]) -> Value {
    let delays = api.config.common.retry_schedule.delays();
    let schedule: Vec<String> = delays.iter().map(|d| format!("{}ms", d.as_millis())).collect();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_api-process"))
        .arg("dead-letters")
        .args(args)
        .arg("--json")
        .env_clear()
        .env("AMQP_URL", &api.amqp_url)
        .env("QUEUE_PREFIX", &api.prefix)
        .env("RETRY_SCHEDULE", schedule.join(","))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "dead-letters {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("dead-letters {args:?} printed no JSON ({e}): {:?}", output.stdout))
}

async fn publish(channel: &Channel, queue: &str, payload: &[u8]) {
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    channel
        .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), payload, broker::persistent_json())
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_of_a_purged_work_queue_still_arrive_once() {
    let api = TestApi::start_with(options("1s", true)).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let events = ingest_many(&api, key.developer_id(), "transfer", 20, 4).await;
    let ids: Vec<String> = events.iter().map(event_id).collect();

    // With no dispatcher running, the broker holds the only messages: lose them.
    let (connection, channel) = channel(&api).await;
    let queue = format!("{}.deliveries", api.prefix);
    wait_queued(&api, &channel, &queue, 20).await;
    channel.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.unwrap();
    assert_eq!(depth(&channel, &queue).await, 0);

    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&receiver, &ids, SWEPT_WITHIN).await;
    verify_all(&receiver, &endpoint);
    // Swept once each: nothing sent twice, every delivery settled.
    wait_nothing_upcoming(&api, &key, &endpoint).await;
    // A second copy would come within the same sweep, well inside this wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 20, "{:?}", received_ids(&receiver));
    let entries = logs(&api, &key, &endpoint, "?limit=100").await;
    assert_eq!(entries.len(), 20);
    assert!(entries.iter().all(|l| l["attempt"] == 1 && l["status"] == 200), "{entries:?}");

    let _ = connection.close(200, "done".into()).await;
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// An outbox row the relay publishes long after its delivery fell due (the
/// relay was away) moves the delivery's due time up to the publish, so the
/// sweeper does not take its message, still waiting in the queue, for lost;
/// it arrives once, unswept.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_published_late_from_the_outbox_is_due_from_its_publish() {
    let api = TestApi::start_with(options("1s", true)).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let ids: Vec<String> = ingest_many(&api, key.developer_id(), "transfer", 5, 5).await.iter().map(event_id).collect();
    let (connection, channel) = channel(&api).await;
    let queue = format!("{}.deliveries", api.prefix);
    wait_queued(&api, &channel, &queue, 5).await;
    channel.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.unwrap();

    // Rows written an hour ago, published only now.
    let pool = api.pool();
    let written: i64 = sqlx::query_scalar(
        "WITH due AS (UPDATE deliveries SET next_attempt_at = now() - interval '1 hour'
                       WHERE endpoint_id = $1 RETURNING id, generation, lane),
              rows AS (INSERT INTO outbox (exchange, routing_key, lane, delivery_id, generation, force)
                       SELECT '', '', lane, id, generation, false FROM due RETURNING 1)
         SELECT count(*) FROM rows",
    )
    .bind(id(&endpoint))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(written, 5);
    wait_queued(&api, &channel, &queue, 5).await;
    let stale: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND next_attempt_at < now() - interval '1 minute'",
    )
    .bind(id(&endpoint))
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(stale, 0, "the relay moved every due time up to its publish");

    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&receiver, &ids, WAIT).await;
    wait_nothing_upcoming(&api, &key, &endpoint).await;
    assert_eq!(receiver.count(), 5, "{:?}", received_ids(&receiver));
    let generations: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT generation FROM deliveries").fetch_all(pool).await.unwrap();
    assert_eq!(generations, [0], "no delivery was swept");

    let _ = connection.close(200, "done".into()).await;
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_behind_a_saturated_endpoint_is_not_swept() {
    // One attempt at a time to an endpoint that takes 2 s per event: twelve
    // events take half a minute, and the waiting ones are parked again and
    // again meanwhile, for longer than two sweep intervals. A parked delivery
    // is owed later, not stranded: nothing is swept, nothing sent twice. (The
    // endpoint answers a first event before: one that has not answered yet
    // when it fills up counts as hung, and its backlog is set aside instead,
    // see scheduler.rs.)
    let mut options = options("1s", true);
    options.delivery_args =
        ["--dispatcher-endpoint-concurrency", "1", "--endpoint-slot-wait", "100ms"].map(String::from).to_vec();
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok().after(Duration::from_secs(2)));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    ingest(&api, key.developer_id(), "transfer", 12).await;
    wait_for_logs(&api, &key, &endpoint, 1).await;
    let events = ingest_many(&api, key.developer_id(), "transfer", 12, 4).await;
    let ids: Vec<String> = events.iter().map(event_id).collect();

    wait_for_events(&receiver, &ids, SWEPT_WITHIN).await;
    assert_eq!(receiver.count(), 13, "{:?}", received_ids(&receiver));
    let pool = api.pool();
    let generations: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT generation FROM deliveries").fetch_all(pool).await.unwrap();
    assert_eq!(generations, [0], "no delivery was swept");
    let text = metrics(&api.client, dispatcher.addr).await;
    let deferred = sample(&text, "webhooks_dispatcher_deliveries_total{outcome=\"deferred\"}").unwrap_or(0.0);
    assert!(deferred >= 12.0, "the backlog was parked while the endpoint was busy: {text}");
    wait_nothing_upcoming(&api, &key, &endpoint).await;

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_in_a_deleted_retry_queue_still_arrives_as_the_next_attempt() {
    // The retry waits 15 s in `{p}.retry.15000ms`: long enough to delete it.
    let api = TestApi::start_with(options("15s", true)).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::status(500).body("not yet")]);
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_logs(&api, &key, &endpoint, 1).await;

    let (connection, channel) = channel(&api).await;
    let retry_queue = format!("{}.retry.15000ms", api.prefix);
    eventually("the retry is parked in its queue", WAIT, async || {
        if depth(&channel, &retry_queue).await == 1 { Ok(()) } else { Err("not yet".to_owned()) }
    })
    .await;
    channel.queue_delete(retry_queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();

    let entries = eventually("the second attempt is logged", SWEPT_WITHIN + Duration::from_secs(15), async || {
        let entries = logs(&api, &key, &endpoint, "").await;
        if entries.len() == 2 { Ok(entries) } else { Err(format!("{entries:?}")) }
    })
    .await;
    let attempts: Vec<_> = entries.iter().map(|l| (l["attempt"].clone(), l["status"].clone())).collect();
    assert_eq!(attempts, [(2.into(), 200.into()), (1.into(), 500.into())], "the schedule went on where it was");
    assert_eq!(received_ids(&receiver), [event_id(&event), event_id(&event)]);
    verify_all(&receiver, &endpoint);
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty(), "the delivery succeeded");

    // Later retries find the queue again: the dispatcher declares it anew.
    receiver.reply_sequence([Reply::status(500)]);
    let second = ingest(&api, key.developer_id(), "transfer", 2).await;
    eventually("the next retry is parked in a declared queue", WAIT, async || {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let (_c, fresh) = self::channel(&api).await;
        match fresh.queue_declare(retry_queue.as_str().into(), passive, FieldTable::default()).await {
            Ok(queue) if queue.message_count() == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(received_ids(&receiver).last(), Some(&event_id(&second)));

    let _ = connection.close(200, "done".into()).await;
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_and_replayed_and_other_messages_kept() {
    let api = TestApi::start_with(options("1s", false)).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok());
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;

    // The delivery's message moves from the work queue to `{p}.dead`, as a
    // dispatcher giving up would leave it, beside a message nobody can read.
    let (connection, channel) = channel(&api).await;
    let (work, dead) = (format!("{}.deliveries", api.prefix), format!("{}.dead", api.prefix));
    wait_queued(&api, &channel, &work, 1).await;
    channel.queue_purge(work.as_str().into(), QueuePurgeOptions::default()).await.unwrap();
    let pool = api.pool();
    let (delivery_id, generation): (i64, i32) =
        sqlx::query_as("SELECT id, generation FROM deliveries WHERE event_id = $1")
            .bind(event_id(&event))
            .fetch_one(pool)
            .await
            .unwrap();
    let message = DeliveryMessage::from(webhooks_store::DueDelivery {
        delivery_id,
        event_id: event_id(&event),
        endpoint_id: id(&endpoint),
        developer_id: key.developer_id(),
        attempt: 1,
        force: false,
        generation: Some(generation),
        parks: 10,
        failures: 10,
        pace_ticket: None,
        lane: Default::default(),
        body: event.to_string(),
        event_created_at: event["event_created_at"].as_str().unwrap().parse().unwrap(),
    });
    publish(&channel, &dead, &webhooks_queue::message::encode_delivery(&message)).await;
    publish(&channel, &dead, b"not json").await;

    let listed = dead_letters(&api, &["list"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["delivery_id"], delivery_id, "{listed:?}");
    assert_eq!(listed[0]["parks"], 10, "{listed:?}");
    assert!(listed[1]["delivery_id"].is_null(), "{listed:?}");
    wait_depth(&channel, &dead, 2, "listing leaves them there").await;

    let replayed = dead_letters(&api, &["replay"]);
    assert_eq!((replayed["replayed"].as_u64(), replayed["kept"].as_u64()), (Some(1), Some(1)), "{replayed}");
    wait_depth(&channel, &dead, 1, "the unreadable message stays").await;
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&receiver, &[event_id(&event)], WAIT).await;
    verify_all(&receiver, &endpoint);
    wait_upcoming(&api, &key, &endpoint, &event_id(&event), false).await;
    assert_eq!(receiver.count(), 1);

    let _ = connection.close(200, "done".into()).await;
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// Makes every owed delivery of the instance look stranded: due long ago, no
/// outbox row (the relay has nothing to publish, nothing is consumed).
async fn strand_all(api: &TestApi) {
    let pool = api.pool();
    sqlx::query("DELETE FROM outbox WHERE delivery_id IS NOT NULL").execute(pool).await.unwrap();
    sqlx::query(
        "UPDATE deliveries SET next_attempt_at = now() - interval '1 hour' WHERE state IN ('pending', 'retrying')",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_sweeps_queue_each_delivery_once_and_give_up_after_the_limit() {
    let api = TestApi::start_with(options("1s", false)).await.unwrap();
    let key = api.new_developer().await;
    let endpoint = active_endpoint(&api, &key, &api.receiver().await.url()).await;
    let events = ingest_many(&api, key.developer_id(), "transfer", 50, 4).await;
    let store = api.outbox().clone();
    let pool = api.pool().clone();
    // Everything due before now has been handed out of the default lane.
    let owed = chrono::Utc::now();

    // Four sweepers at once, as four API processes: each delivery once.
    strand_all(&api).await;
    let sweeps =
        futures::future::join_all((0..4).map(|_| store.sweep_stranded(Lane::Default, false, owed, 7, 5))).await;
    let mut queued: u64 = sweeps.iter().map(|s| s.as_ref().unwrap().queued).sum();
    while let swept = store.sweep_stranded(Lane::Default, false, owed, 500, 5).await.unwrap()
        && swept.queued > 0
    {
        queued += swept.queued;
    }
    assert_eq!(queued, 50);
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT delivery_id) FROM outbox WHERE delivery_id IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    // The API's relay may have published, and deleted, some of them
    // already; those left are one per delivery.
    assert!(rows <= 50 && rows == distinct, "one outbox row per delivery: {rows} rows, {distinct} deliveries");
    let generations: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT generation FROM deliveries").fetch_all(&pool).await.unwrap();
    assert_eq!(generations, [1], "each moved to a new generation once");
    // Nothing is due any more: a sweep right after finds nothing. What a
    // sweep queues again waits in the swept queue, and keeps its lane for
    // its retries.
    for lane in [Lane::Default, Lane::Bulk] {
        for swept in [false, true] {
            assert_eq!(store.sweep_stranded(lane, swept, owed, 500, 5).await.unwrap().queued, 0);
        }
    }
    let lanes: Vec<(String, bool)> =
        sqlx::query_as("SELECT DISTINCT lane, swept FROM deliveries").fetch_all(&pool).await.unwrap();
    assert_eq!(lanes, [("default".to_owned(), true)]);

    // Swept four more times in vain (five in all), the sixth sweep gives up.
    for _ in 0..4 {
        strand_all(&api).await;
        assert_eq!(store.sweep_stranded(Lane::Default, true, owed, 500, 5).await.unwrap().queued, 50);
    }
    strand_all(&api).await;
    let last = store.sweep_stranded(Lane::Default, true, owed, 500, 5).await.unwrap();
    assert_eq!((last.queued, last.failed), (0, 50));
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty(), "failed deliveries are not upcoming");
    let entries = logs(&api, &key, &endpoint, "?limit=100").await;
    assert_eq!(entries.len(), 50);
    assert!(
        entries
            .iter()
            .all(|l| l["status"].is_null() && l["error"].as_str().is_some_and(|e| e.contains("never processed"))),
        "{entries:?}"
    );
    // `send` still delivers one.
    assert_sent(&send(&api, &key, &endpoint, &event_id(&events[0])).await);

    api.shutdown().await.unwrap();
}

/// A delivery set aside behind a hung endpoint (no message carries it) is
/// queued again as soon as it is due, without the margin stranded ones wait,
/// and doing so never counts towards the sweep limit: a backlog behind an
/// endpoint hung for hours is not failed for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_set_aside_delivery_is_queued_again_once_due_and_never_failed_for_it() {
    let api = TestApi::start_with(options("1s", false)).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    active_endpoint(&api, &key, &receiver.url()).await;
    ingest(&api, key.developer_id(), "transfer", 1).await;
    let store = api.outbox();
    let pool = api.pool();
    eventually("the first attempt is published", WAIT, async || {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(pool).await.unwrap();
        if rows == 0 { Ok(()) } else { Err(format!("{rows} outbox rows")) }
    })
    .await;
    let state = async || -> (i32, i32, bool) {
        sqlx::query_as("SELECT generation, sweeps, set_aside FROM deliveries").fetch_one(pool).await.unwrap()
    };

    // Due a second ago, already swept as often as the limit allows.
    sqlx::query("UPDATE deliveries SET set_aside = true, sweeps = 5, next_attempt_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .unwrap();
    // Set-aside deliveries are swept once due, whatever the lanes' progress.
    let swept = store.sweep_set_aside(100).await.unwrap();
    assert_eq!((swept.queued, swept.returned, swept.failed), (0, 1, 0));
    assert_eq!(state().await, (1, 5, false), "a new generation, the sweeps as they were");
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE generation = 1").fetch_one(pool).await.unwrap();
    assert_eq!(queued, 1, "a message of the new generation is on its way");

    // The same delivery, not set aside (and now in the bulk lane): stranded
    // only once its lane's watermark is past it, and failed at the limit.
    sqlx::query("DELETE FROM outbox").execute(pool).await.unwrap();
    sqlx::query("UPDATE deliveries SET next_attempt_at = now() - interval '1 second'").execute(pool).await.unwrap();
    let behind = chrono::Utc::now() - chrono::Duration::minutes(10);
    let swept = store.sweep_stranded(Lane::Bulk, false, behind, 100, 5).await.unwrap();
    assert_eq!((swept.queued, swept.returned, swept.failed), (0, 0, 0), "behind the lane's watermark");
    assert_eq!(store.sweep_set_aside(100).await.unwrap(), Default::default(), "not set aside");
    let now = chrono::Utc::now();
    assert_eq!(
        store.sweep_stranded(Lane::Default, false, now, 100, 5).await.unwrap(),
        Default::default(),
        "another lane"
    );
    let swept = store.sweep_stranded(Lane::Bulk, false, now, 100, 5).await.unwrap();
    assert_eq!((swept.queued, swept.returned, swept.failed), (0, 0, 1), "at the limit");

    api.shutdown().await.unwrap();
}

/// Within two sweep intervals, whatever another developer's backlog holds:
/// B's deliveries that no queue holds arrive, each once, while A's backlog
/// keeps the bulk lane full. Once they are lost by a purge of the default
/// lane, once they are never published (the API drops its first attempts, as
/// one killed between its commit and the broker's confirm would). A's
/// backlog, behind in its lane, is never taken for stranded.
#[tokio::test(flavor = "multi_thread")]
async fn stranded_deliveries_arrive_within_two_intervals_beside_a_backlog() {
    let two_intervals = 2 * Duration::from_secs(15);
    let mut options = options("1s", true);
    // A's events past its first twenty wait in the bulk lane, which a
    // dispatcher of four handlers (and a small window) gives three of them.
    options.extra_args.extend(["--fair-share-per-second", "1", "--fair-share-burst", "20"].map(String::from));
    options.delivery_args = ["--dispatcher-concurrency", "4", "--dispatcher-prefetch", "8"].map(String::from).to_vec();
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let (connection, channel) = channel(&api).await;
    let (default, bulk) = (format!("{}.deliveries", api.prefix), format!("{}.deliveries.bulk", api.prefix));

    // A: half a second per delivery, three at a time: a backlog of minutes.
    let a = api.new_developer().await;
    let slow = api.receiver().await;
    slow.reply_always(Reply::ok().after(Duration::from_millis(500)));
    let a_endpoint = active_endpoint(&api, &a, &slow.url()).await;
    ingest_many(&api, a.developer_id(), "transfer", 600, 8).await;
    eventually("A's default-lane events are delivered, its backlog waits in bulk", WAIT, async || {
        let owed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND lane = 'default' AND state <> 'succeeded'",
        )
        .bind(id(&a_endpoint))
        .fetch_one(api.pool())
        .await
        .unwrap();
        let ready_bulk = depth(&channel, &bulk).await;
        if owed == 0 && ready_bulk > 400 {
            Ok(())
        } else {
            Err(format!("{owed} owed in default, {ready_bulk} in bulk"))
        }
    })
    .await;

    // B, within its share: the default lane.
    let b = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &b, &receiver.url()).await;

    // Lost by a purge while no dispatcher consumes.
    dispatcher.stop().await.unwrap();
    let purged: Vec<String> =
        ingest_many(&api, b.developer_id(), "transfer", 10, 4).await.iter().map(event_id).collect();
    wait_queued(&api, &channel, &default, 10).await;
    channel.queue_purge(default.as_str().into(), QueuePurgeOptions::default()).await.unwrap();
    let stranded_at = tokio::time::Instant::now();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    wait_for_events(&receiver, &purged, two_intervals).await;
    let took = stranded_at.elapsed();
    assert!(took < two_intervals, "purged deliveries arrived after {took:?}");
    assert!(depth(&channel, &bulk).await > 0, "A's backlog is gone: the test proves nothing");

    // Never published.
    api.config.faults.lose_first_attempts(true);
    let lost: Vec<String> = ingest_many(&api, b.developer_id(), "transfer", 10, 4).await.iter().map(event_id).collect();
    api.config.faults.lose_first_attempts(false);
    let stranded_at = tokio::time::Instant::now();
    wait_for_events(&receiver, &lost, two_intervals).await;
    let took = stranded_at.elapsed();
    assert!(took < two_intervals, "unpublished deliveries arrived after {took:?}");
    assert!(depth(&channel, &bulk).await > 0, "A's backlog is gone: the test proves nothing");

    // Each once, and nothing of A's queued again.
    wait_nothing_upcoming(&api, &b, &endpoint).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 20, "{:?}", received_ids(&receiver));
    verify_all(&receiver, &endpoint);
    let swept: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND generation > 0")
        .bind(id(&a_endpoint))
        .fetch_one(api.pool())
        .await
        .unwrap();
    assert_eq!(swept, 0, "A's backlog was taken for stranded");

    let _ = connection.close(200, "done".into()).await;
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// The stalled-turn net reaches every ordered endpoint with waiting
/// deliveries, however many are blocked legitimately: with two endpoints per
/// statement (`SWEEP_BATCH`) and six blocked endpoints waiting longer, the
/// one whose head was failed behind the net's back (as the sweep limit
/// fails one) still has its next events released and delivered, in order.
#[tokio::test(flavor = "multi_thread")]
async fn every_stalled_turn_is_released_however_many_endpoints_are_blocked() {
    let mut options = options("1h", true);
    options.max_endpoints = 10;
    options.extra_args.extend(["--sweep-batch", "2"].map(String::from));
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let blocked = api.receiver().await;
    blocked.reply_always(Reply::status(500));
    let ordered = |url: String| serde_json::json!({ "url": url, "ordering": "ordered" });
    let mut waiting = Vec::new();
    for _ in 0..6 {
        waiting.push(active_endpoint_with(&api, &key, ordered(blocked.url())).await);
    }
    let stalled_receiver = api.receiver().await;
    stalled_receiver.reply_always(Reply::status(500));
    let stalled = active_endpoint_with(&api, &key, ordered(stalled_receiver.url())).await;
    // The first event fails everywhere and waits an hour for its retry; the
    // next two wait for their turn, the stalled endpoint's last. The failed
    // attempts must be recorded before a head is failed below: a record
    // arriving after it would set the head retrying again.
    let first = ingest(&api, key.developer_id(), "transfer", 0).await;
    ingest_many(&api, key.developer_id(), "transfer", 2, 1).await;
    let pool = api.pool();
    eventually("every head retries and the later events wait for their turn", WAIT, async || {
        let (waiting, retrying): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'waiting'),
                    count(*) FILTER (WHERE state = 'retrying' AND attempts = 1)
               FROM deliveries",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if (waiting, retrying) == (14, 7) { Ok(()) } else { Err(format!("{waiting} waiting, {retrying} retrying")) }
    })
    .await;
    sqlx::query("UPDATE deliveries SET updated_at = now() WHERE endpoint_id = $1")
        .bind(id(&stalled))
        .execute(pool)
        .await
        .unwrap();
    // The stalled endpoint's head is failed for good, and nothing handed the
    // turn on.
    stalled_receiver.reply_always(Reply::ok());
    sqlx::query(
        "UPDATE deliveries SET state = 'failed', next_attempt_at = NULL WHERE endpoint_id = $1 AND event_id = $2",
    )
    .bind(id(&stalled))
    .bind(event_id(&first))
    .execute(pool)
    .await
    .unwrap();

    let requests = stalled_receiver.wait_for(3).await.unwrap();
    let sequences: Vec<i64> = requests
        .iter()
        .filter(|r| r.answered == 200)
        .map(|r| r.json().unwrap()["event_sequence"].as_i64().unwrap())
        .collect();
    let head = first["event_sequence"].as_i64().unwrap();
    assert_eq!(sequences, [head + 1, head + 2], "released in order");
    for endpoint in &waiting {
        assert_eq!(upcoming_ids(&api, &key, endpoint).await.len(), 3, "a blocked endpoint's turn was released");
    }

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
