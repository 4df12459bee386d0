//! History by day (DESIGN.md, "History"), in the distributed system: a new
//! installation keeps its events, deliveries and delivery log in day
//! partitions; retention drops whole days (and keeps a day whose delivery
//! is still owed); an installation with history converts online while
//! events flow, losing nothing and answering no 5xx. Standalone mode keeps
//! its history in one SQLite table each (docs/operations.md).

mod common;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{Days, Utc};
use common::*;
use serde_json::Value;
use tests::{
    ApiOptions, Backend, Receiver, TestApi, WAIT,
    procs::{Programs, Stack, StackOptions},
};

/// The partitions of `table`, by name.
async fn partitions(pool: &sqlx::PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = to_regclass($1) ORDER BY 1",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn day_name(table: &str, days_from_today: i64) -> String {
    let day = Utc::now().date_naive() + chrono::Duration::days(days_from_today);
    format!("{table}_p{}", day.format("%Y%m%d"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_installation_keeps_its_history_in_day_partitions() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 0).await;
    receiver.wait_for(1).await.unwrap();
    wait_for_logs(&api, &key, &endpoint, 1).await;

    let pool = api.pool();
    for table in ["events", "deliveries", "delivery_attempts"] {
        let names = partitions(pool, table).await;
        for day in -1..=3 {
            assert!(names.contains(&day_name(table, day)), "{table}: {names:?} lacks the day {day}");
        }
    }
    // Today's event, its delivery and its log entry are in today's partitions.
    let (events, deliveries, attempts): (String, String, String) = sqlx::query_as(
        "SELECT (SELECT tableoid::regclass::text FROM events WHERE id = $1),
                (SELECT tableoid::regclass::text FROM deliveries WHERE event_id = $1),
                (SELECT tableoid::regclass::text FROM delivery_attempts WHERE event_id = $1)",
    )
    .bind(event_id(&event))
    .fetch_one(pool)
    .await
    .unwrap();
    let today = |table| day_name(table, 0);
    // The id is made at the event's time on the one clock: just before
    // midnight the event may be in the next day's partition.
    assert!([today("events"), day_name("events", 1)].contains(&events), "{events}");
    assert_eq!(deliveries.replace("deliveries", ""), events.replace("events", ""));
    assert!([today("delivery_attempts"), day_name("delivery_attempts", 1)].contains(&attempts), "{attempts}");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// Old history, as a benchmark or an earlier month leaves it: one event a
/// day for `days` days ending `ending` days ago, each delivered to
/// `endpoint` (the oldest one still retrying), with its log entry.
fn old_history(developer: &str, endpoint: &str, days: u64, ending: u64) -> String {
    format!(
        "WITH days AS (
             SELECT n, date_trunc('day', now()) - make_interval(days => {ending} + n) + interval '12 hours' AS at
               FROM generate_series(0, {last}) n),
         made AS (
             SELECT n, at, 'wh_' || lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
                    || '7000' || lpad(to_hex(n), 16, '0') AS id
               FROM days),
         ev AS (
             INSERT INTO events (id, developer_id, sequence, category, body, created_at, event_type)
             SELECT id, '{developer}', 100000 + n, 'transfer', '{{}}', at, 'transfer.created' FROM made RETURNING id),
         dl AS (
             INSERT INTO deliveries (event_id, endpoint_id, state, attempts, event_created_at, event_sequence,
                                     next_attempt_at)
             SELECT id, '{endpoint}', CASE WHEN n = {last} THEN 'retrying' ELSE 'succeeded' END, 1, at, 100000 + n,
                    CASE WHEN n = {last} THEN now() + interval '1 day' END
               FROM made RETURNING id, event_id, event_created_at)
         INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, duration_ms, created_at,
                                        event_type)
         SELECT (lpad(to_hex(floor(extract(epoch FROM event_created_at) * 1000)::bigint), 12, '0') || '7000'
                 || '8' || lpad(to_hex(id), 15, '0'))::uuid,
                id, '{endpoint}', event_id, 1, 200, 3, event_created_at, 'transfer.created'
           FROM dl",
        last = days - 1,
    )
}

/// With a retention of thirty days, the days wholly older go at the next
/// round, by their partitions (nothing deleted row by row), the younger stay;
/// the oldest day stays while its delivery is owed, and goes once settled.
#[tokio::test(flavor = "multi_thread")]
async fn retention_drops_whole_days_and_keeps_a_day_still_owed() {
    let options = ApiOptions {
        extra_args: ["--retention", "30d", "--retention-interval", "500ms"].map(String::from).to_vec(),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let pool = api.pool();
    let today = Utc::now().date_naive();
    // Forty days ago to ten days ago.
    let first = today.checked_sub_days(Days::new(40)).unwrap();
    api.store.partition_days(first, today.checked_sub_days(Days::new(10)).unwrap()).await.unwrap();
    sqlx::raw_sql(&old_history(&key.developer_id().to_string(), &id(&endpoint), 31, 10)).execute(pool).await.unwrap();
    let kept_day = |ago: i64| day_name("events", -ago);

    // Days 31 to 39 ago are wholly older than thirty days: they go. Day 40
    // holds the owed delivery and stays, and day 30 (partly younger) too.
    eventually("the days older than the retention are dropped", WAIT, async || {
        let names = partitions(pool, "events").await;
        let gone = (31..40).all(|ago| !names.contains(&kept_day(ago)));
        if gone { Ok(names) } else { Err(format!("{names:?}")) }
    })
    .await;
    // A pass interrupted between its steps leaves a day's table detached:
    // a later pass drops it.
    let left = day_name("delivery_attempts", -38);
    sqlx::query(&format!("CREATE TABLE {left} (LIKE delivery_attempts)")).execute(pool).await.unwrap();
    eventually("a table left detached is dropped", WAIT, async || {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&left)
            .fetch_one(pool)
            .await
            .map_err(|e| e.to_string())?;
        if exists { Err(format!("{left} is still there")) } else { Ok(()) }
    })
    .await;
    let names = partitions(pool, "events").await;
    assert!(names.contains(&kept_day(40)), "a day with an owed delivery was dropped: {names:?}");
    for ago in [10, 20, 30] {
        assert!(names.contains(&kept_day(ago)), "day {ago} was dropped: {names:?}");
    }
    for table in ["deliveries", "delivery_attempts"] {
        let names = partitions(pool, table).await;
        assert!(!names.contains(&day_name(table, -35)), "{table}: {names:?}");
        assert!(names.contains(&day_name(table, -20)), "{table}: {names:?}");
    }
    // What is kept is listed; what went is not.
    let listed = list(api.get("/webhook_events?limit=500", &key).await);
    assert_eq!(listed.len(), 22, "days 10 to 30 ago, and day 40: {}", listed.len());

    // Settled, the owed day goes too.
    sqlx::query("UPDATE deliveries SET state = 'succeeded', next_attempt_at = NULL WHERE state = 'retrying'")
        .execute(pool)
        .await
        .unwrap();
    eventually("the settled day is dropped", WAIT, async || {
        let names = partitions(pool, "events").await;
        if names.contains(&kept_day(40)) { Err(format!("{names:?}")) } else { Ok(()) }
    })
    .await;
    api.shutdown().await.unwrap();
}

/// An installation with history from before partitioning (an event of it
/// keeps its tables unpartitioned at start) converts online: events flow
/// through the conversion, every one is answered 201 and delivered, and
/// what was there before is still listed, looked up and logged.
#[tokio::test(flavor = "multi_thread")]
async fn a_filled_installation_converts_online_while_events_flow() {
    let programs = Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"));
    let mut options = StackOptions::new(Backend::Distributed, "partition-history");
    options.seed = Some(
        "INSERT INTO events (id, developer_id, sequence, category, body, created_at)
         VALUES ('wh_00000000000070000000000000000000', gen_random_uuid(), 1, 'transfer', '{}', now())"
            .into(),
    );
    let mut stack = Stack::start(programs, options).await.unwrap();
    stack.start_dispatcher().await.unwrap();
    let pool = sqlx::PgPool::connect(stack.database_url().unwrap()).await.unwrap();
    let partitioned = async |pool: &sqlx::PgPool| -> bool {
        sqlx::query_scalar("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('events')")
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert!(!partitioned(&pool).await, "an installation with history is not converted at start");

    let (key, developer) = stack.create_key(None).await.unwrap();
    let receiver = Receiver::start(&stack.ca).await.unwrap();
    let endpoint = stack.active_endpoint(&key, &receiver.url(), &[]).await.unwrap();
    // History from before the conversion: delivered, and logged.
    let mut before = Vec::new();
    for n in 0..200 {
        let response = stack.client.post(stack.ingest_url()).json(&event_input(developer, "transfer", n)).send().await;
        before.push(event_id(&response.unwrap().json::<Value>().await.unwrap()));
    }
    wait_for_distinct(&receiver, before.len(), WAIT).await;

    // Events flow at a steady rate through the conversion.
    let flowing = Arc::new(AtomicBool::new(true));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let producer = {
        let (client, url) = (stack.client.clone(), stack.ingest_url());
        let (flowing, accepted, refused) = (flowing.clone(), accepted.clone(), refused.clone());
        tokio::spawn(async move {
            let mut n = 1000;
            while flowing.load(Ordering::Relaxed) {
                let sent = client.post(&url).json(&event_input(developer, "transfer", n)).send().await;
                match sent {
                    Ok(response) if response.status() == 201 => {
                        let event: Value = response.json().await.unwrap();
                        accepted.lock().unwrap().push(event_id(&event));
                    }
                    Ok(response) => refused.lock().unwrap().push(response.status().to_string()),
                    Err(error) => refused.lock().unwrap().push(error.to_string()),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let converted = stack.command(&["migrate", "--partition-history"]).output().await.unwrap();
    assert!(converted.status.success(), "the conversion failed: {}", String::from_utf8_lossy(&converted.stderr));
    tokio::time::sleep(Duration::from_secs(3)).await;
    flowing.store(false, Ordering::Relaxed);
    producer.await.unwrap();

    assert!(partitioned(&pool).await, "converted");
    let refused = refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "ingest refused during the conversion: {refused:?}");
    let accepted = accepted.lock().unwrap().clone();
    assert!(accepted.len() > 100, "too few events flowed: {}", accepted.len());
    let mut every: Vec<String> = before.clone();
    every.extend(accepted.iter().cloned());
    let arrived = wait_for_distinct(&receiver, every.len(), Duration::from_secs(60)).await;
    for id in &every {
        assert!(arrived.contains(id), "{id} never arrived");
    }

    // The history from before is where it was: listed, looked up, logged,
    // and searchable by type.
    let api = stack.api_url();
    let get = async |path: String| -> Value {
        let response = stack.client.get(format!("{api}{path}")).header("Api-Key", &key).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        response.json().await.unwrap()
    };
    let looked_up = get(format!("/webhook_events/{}", before[0])).await;
    assert_eq!(looked_up["event_id"], before[0].as_str());
    let logs = get(format!("/webhooks/{}/logs?limit=100&event_id={}", id(&endpoint), before[3])).await;
    assert_eq!(logs["data"].as_array().unwrap().len(), 1, "{logs}");
    let typed =
        get(format!("/webhooks/{}/logs?limit=100&event_type=transfer.updated.status_transitioned", id(&endpoint)))
            .await;
    assert_eq!(typed["data"].as_array().unwrap().len(), 100, "{typed}");
    let legacy: Vec<String> =
        partitions(&pool, "events").await.into_iter().filter(|n| n.ends_with("_legacy")).collect();
    assert_eq!(legacy, ["events_legacy"]);

    // From the cutover on (next midnight at the earliest, so written here
    // by hand) the tables take rows: the check that proves the legacy
    // partition's bounds is that partition's alone.
    let cutover: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT legacy_before FROM history_layout").fetch_one(&pool).await.unwrap();
    let later = cutover + chrono::Duration::hours(1);
    let event = webhooks_model::ids::new_event_id_at(later);
    let attempt = webhooks_model::ids::new_v7_at(later);
    sqlx::raw_sql(&format!(
        "INSERT INTO events (id, developer_id, sequence, category, body, created_at)
         VALUES ('{event}', '{developer}', 1000000, 'transfer', '{{}}', '{later}');
         INSERT INTO deliveries (event_id, endpoint_id, state, event_created_at, event_sequence)
         VALUES ('{event}', '{endpoint}', 'succeeded', '{later}', 1000000);
         INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, duration_ms, created_at)
         SELECT '{attempt}', id, endpoint_id, event_id, 1, 200, 1, '{later}' FROM deliveries WHERE event_id = '{event}'",
        endpoint = id(&endpoint),
        later = later.to_rfc3339(),
    ))
    .execute(&pool)
    .await
    .unwrap();

    pool.close().await;
    stack.shutdown(Duration::from_secs(10)).await;
}
