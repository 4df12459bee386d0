//! Searches you can afford (API.md §8.12), in the distributed system over a
//! long history: every log filter and their combinations are served by an
//! index, a search that runs past `DATABASE_STATEMENT_TIMEOUT` answers 503
//! and frees its connection at once, and one developer's slow searches
//! leave another's calls quick and free of 5xx. (The figures, p99 of each
//! filter on two million entries, are the benchmark's: docs/benchmarks.md.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tests::{ApiOptions, DeveloperKey, TestApi};

/// A history of `n` log entries for `endpoint`, a hundred a second up to now: one
/// event in a hundred of type `transfer.created` (the rest
/// `transfer.updated`), one entry in a hundred `failed`, or every one when
/// `all_failed` (then a search for what succeeded reads the whole history).
async fn fill_history(api: &TestApi, developer: &DeveloperKey, endpoint: &Value, n: u64, all_failed: bool) {
    let failed = if all_failed { "true" } else { "g % 100 = 0" };
    let sql = format!(
        "WITH made AS (
             SELECT g, clock_timestamp() - make_interval(secs => ({n} - g) / 100.0) AS at FROM generate_series(1, {n}) g),
         ids AS (
             SELECT g, at, lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') AS ms FROM made),
         ev AS (
             INSERT INTO events (id, developer_id, sequence, category, body, created_at, event_type)
             SELECT 'wh_' || ms || '7000' || lpad(to_hex(g), 16, '0'), '{developer}', 1000000 + g, 'transfer', '{{}}',
                    at, CASE WHEN g % 100 = 7 THEN 'transfer.created' ELSE 'transfer.updated' END
               FROM ids RETURNING id, created_at, event_type, sequence),
         dl AS (
             INSERT INTO deliveries (event_id, endpoint_id, state, attempts, event_created_at, event_sequence)
             SELECT id, '{endpoint}', 'succeeded', 1, created_at, sequence FROM ev
             RETURNING id, event_id, event_created_at, event_sequence)
         INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, duration_ms,
                                        created_at, event_type)
         SELECT (lpad(to_hex(floor(extract(epoch FROM dl.event_created_at) * 1000)::bigint), 12, '0') || '7000'
                 || '8' || lpad(to_hex(dl.id), 15, '0'))::uuid,
                dl.id, '{endpoint}', dl.event_id, 1,
                CASE WHEN {failed} THEN 500 ELSE 200 END, 3, dl.event_created_at,
                CASE WHEN (dl.event_sequence - 1000000) % 100 = 7 THEN 'transfer.created' ELSE 'transfer.updated' END
           FROM dl",
        developer = developer.developer_id(),
        endpoint = id(endpoint),
        failed = failed.replace('g', "(dl.event_sequence - 1000000)"),
    );
    sqlx::raw_sql(&sql).execute(api.pool()).await.unwrap();
    // The API analyzes what changed too (on a server without autovacuum):
    // the two may meet on a partition, and one of them then tries again.
    for table in ["events", "deliveries", "delivery_attempts"] {
        let mut tries = 0;
        while let Err(error) = sqlx::query(&format!("ANALYZE {table}")).execute(api.pool()).await {
            tries += 1;
            assert!(tries < 5, "ANALYZE {table}: {error}");
        }
    }
}

/// Log entries read sequentially so far, and index scans, of the delivery
/// log's partitions that hold entries (as the last `ANALYZE` counted them:
/// the empty ones of the days ahead may be scanned, there being nothing to
/// read).
async fn log_scans(api: &TestApi) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(sum(seq_tup_read), 0)::int8, coalesce(sum(idx_scan), 0)::int8 FROM pg_stat_user_tables
          WHERE relname LIKE 'delivery_attempts_p%' AND n_live_tup > 0",
    )
    .fetch_one(api.pool())
    .await
    .unwrap()
}

/// Every filter of the log, and every combination of them, is answered
/// from an index of the delivery log, never a scan of it: on a history of a
/// hundred thousand entries, no search reads a partition sequentially.
#[tokio::test(flavor = "multi_thread")]
async fn every_log_filter_is_served_by_an_index() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    fill_history(&api, &key, &endpoint, 100_000, false).await;
    let some: Vec<Value> = logs(&api, &key, &endpoint, "?limit=100").await;
    let (event, cursor) = (some[50]["event_id"].as_str().unwrap(), some[10]["id"].as_str().unwrap());
    let since = webhooks_model::time::format(&(chrono::Utc::now() - chrono::Duration::hours(1)));
    let until = webhooks_model::time::format(&(chrono::Utc::now() - chrono::Duration::minutes(10)));

    // The counters the server keeps reach the statistics views a moment
    // after a statement: wait for the first searches to show.
    let before = log_scans(&api).await;
    let filters = [
        "status=failed".to_owned(),
        "status=succeeded".to_owned(),
        "event_type=transfer.created".to_owned(),
        format!("event_id={event}"),
        format!("since={since}"),
        format!("since={since}&until={until}"),
        "event_type=transfer.created&status=failed".to_owned(),
        "event_type=transfer.updated&status=succeeded".to_owned(),
        format!("event_type=transfer.updated&event_id={event}&status=succeeded"),
        format!("status=failed&since={since}&until={until}"),
        format!("event_type=transfer.created&since={since}&until={until}"),
    ];
    for filter in &filters {
        for page in ["", "&starting_after="] {
            let query = if page.is_empty() {
                format!("?limit=50&{filter}")
            } else {
                format!("?limit=50&{filter}{page}{cursor}")
            };
            let response = api.get(&format!("/webhooks/{}/logs{query}", id(&endpoint)), &key).await;
            assert_eq!(response.status, 200, "{query}: {}", response.text());
        }
    }
    let after = eventually("the searches are counted", Duration::from_secs(30), async || {
        let now = log_scans(&api).await;
        if now.1 > before.1 { Ok(now) } else { Err(format!("{now:?}")) }
    })
    .await;
    // What was counted by then is every search (they ran before it).
    tokio::time::sleep(Duration::from_secs(11)).await;
    let after = log_scans(&api).await.max(after);
    let tables: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, seq_scan, seq_tup_read, coalesce(idx_scan, 0) FROM pg_stat_user_tables
          WHERE relname LIKE 'delivery_attempts%' ORDER BY 1",
    )
    .fetch_all(api.pool())
    .await
    .unwrap();
    assert_eq!(after.0, before.0, "a search read the delivery log sequentially ({before:?} → {after:?}): {tables:?}");
    api.shutdown().await.unwrap();
}

/// A search that runs past the statement timeout is cancelled by the
/// database: the call answers 503 with `Retry-After`, and the connection it
/// held is free at once (nothing of it still runs on the server).
#[tokio::test(flavor = "multi_thread")]
async fn a_search_that_runs_too_long_answers_503_and_frees_its_connection() {
    let options = ApiOptions {
        extra_args: ["--database-statement-timeout", "50ms"].map(String::from).to_vec(),
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    // Everything failed: a search for what succeeded reads it all.
    fill_history(&api, &key, &endpoint, 300_000, true).await;
    let path = format!("/webhooks/{}/logs?limit=100&status=succeeded", id(&endpoint));
    let response = api.get(&path, &key).await;
    let body = response.expect_error(503, "unavailable");
    assert!(response.headers.get("retry-after").is_some(), "{body}");
    // Uncancelled, it would run for half a second: watch that long for it
    // running past three times its timeout.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(600) {
        let running: Vec<String> = sqlx::query_scalar(
            "SELECT query FROM pg_stat_activity
              WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
                AND query LIKE '%FROM delivery_attempts a%' AND clock_timestamp() - query_start > interval '150 ms'",
        )
        .fetch_all(api.pool())
        .await
        .unwrap();
        assert!(running.is_empty(), "the timed-out search ({body}) still runs on the server: {running:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The process's connections serve the next calls at once.
    for _ in 0..20 {
        api.get("/webhooks", &key).await.expect(200);
    }
    api.shutdown().await.unwrap();
}

/// One developer starts ten slow searches at once: three run, the others
/// answer 429 with `Retry-After`; meanwhile another developer's calls never
/// wait for them (each takes less than half the quickest of the searches
/// that ran: one that waited for a connection would take about as long)
/// and none answers 5xx.
#[tokio::test(flavor = "multi_thread")]
async fn ten_slow_searches_by_one_developer_leave_anothers_calls_quick() {
    // The default pool: four of its connections for expensive reads.
    let api = TestApi::start_with(ApiOptions { database_max_connections: 10, ..ApiOptions::default() }).await.unwrap();
    let (heavy, light) = (api.new_developer().await, api.new_developer().await);
    let receiver = api.receiver().await;
    let heavy_endpoint = active_endpoint(&api, &heavy, &receiver.url()).await;
    let light_endpoint = active_endpoint(&api, &light, &receiver.url()).await;
    fill_history(&api, &heavy, &heavy_endpoint, 300_000, true).await;
    let slow = format!("/webhooks/{}/logs?limit=100&status=succeeded", id(&heavy_endpoint));

    let searches: Vec<_> = (0..10)
        .map(|_| {
            let (api, heavy, slow) = (&api, &heavy, slow.clone());
            async move {
                let started = Instant::now();
                let answer = api.get(&slow, heavy).await;
                (answer, started.elapsed())
            }
        })
        .collect();
    let others = async {
        let mut slowest = (Duration::ZERO, String::new(), Duration::ZERO);
        let begun = Instant::now();
        let deadline = begun + Duration::from_secs(2);
        let mut calls = 0;
        while Instant::now() < deadline {
            for path in ["/webhooks".to_owned(), format!("/webhooks/{}/logs?limit=10", id(&light_endpoint))] {
                let started = Instant::now();
                let response = api.get(&path, &light).await;
                if started.elapsed() > slowest.0 {
                    slowest = (started.elapsed(), path.clone(), started - begun);
                }
                assert!(response.status < 500, "{path}: {} {}", response.status, response.text());
                calls += 1;
            }
        }
        (slowest, calls)
    };
    let (answers, (slowest, calls)) = tokio::join!(futures::future::join_all(searches), others);
    let quickest_search = answers.iter().filter(|(a, _)| a.status == 200).map(|(_, took)| *took).min().unwrap();
    let answers: Vec<_> = answers.into_iter().map(|(answer, _)| answer).collect();
    let limited = answers.iter().filter(|a| a.status == 429).count();
    assert!(
        answers.iter().all(|a| a.status == 200 || a.status == 429),
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert!(limited >= 7, "at most three of a developer's searches at once: {limited} refused");
    assert!(answers.iter().filter(|a| a.status == 429).all(|a| a.headers.get("retry-after").is_some()));
    assert!(
        slowest.0 < quickest_search / 2,
        "another developer's call took {slowest:?} ({calls} calls), the quickest search {quickest_search:?}"
    );
    api.shutdown().await.unwrap();
}
