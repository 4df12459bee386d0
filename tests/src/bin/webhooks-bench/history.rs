//! The history phase (`BENCH_PHASES=history`): the same measures on a fresh
//! database and on one holding thirty days of history, side by side.
//!
//! The history is made inside the database, one statement a day, two days
//! at a time (`fill.sql`): `BENCH_HISTORY_DELIVERIES` (20,000,000)
//! deliveries over 31 days, 100 developers and 2,000 endpoints. One
//! developer's events go to one endpoint alone, which so holds a tenth of
//! them (2,000,000 entries in its delivery log); every other developer's
//! event goes to four of its twenty endpoints. One delivery in a hundred
//! failed for good after three attempts, the others succeeded at the first.
//! The oldest day is older than the thirty days of `RETENTION`, so one
//! retention pass has a day to drop.
//!
//! Each database then gets, with the PostgreSQL settings printed at the
//! start: end to end with wrk and the latency at a fixed rate to nginx, the
//! fairness phase, the recovery phase, each log filter of the big endpoint
//! (a first page and a page twenty days deep), the event lookup, a recover
//! of the whole month (its answer, and when its count is known), and one
//! retention pass (its time, and the dead rows it leaves).

use super::*;

/// The statement that makes one day of history (see the module's doc).
const FILL_DAY: &str = include_str!("fill.sql");

/// Days of history made: thirty, and one past `RETENTION`.
const DAYS: i64 = 31;

/// Developers and endpoints of the history.
const DEVELOPERS: usize = 100;
const ENDPOINTS_EACH: usize = 20;

/// The log searches measured, as query strings (`{deep}` is a log id twenty
/// days old, `{event}` an event of the endpoint's, `{since}` and `{until}`
/// a window a week wide ten days ago).
const SEARCHES: [(&str, &str); 9] = [
    ("no filter", ""),
    ("status=failed", "&status=failed"),
    ("status=succeeded", "&status=succeeded"),
    ("event_type", "&event_type=transfer.created"),
    ("event_id", "&event_id={event}"),
    ("since and until", "&since={since}&until={until}"),
    ("event_type and status=failed", "&event_type=transfer.created&status=failed"),
    ("status=failed, since and until", "&status=failed&since={since}&until={until}"),
    ("event_type, since and until", "&event_type=transfer.created&since={since}&until={until}"),
];

/// What the shared parts of the bench give the phase.
pub(crate) struct Shared<'a> {
    pub(crate) bin: &'a Path,
    pub(crate) ca: &'a TestCa,
    pub(crate) receiver_port: u16,
    pub(crate) in_process_arrivals: &'a Arc<Arrivals>,
    pub(crate) nginx: &'a Nginx,
}

/// The figures of one database.
#[derive(Default)]
struct Figures {
    e2e_per_s: f64,
    p50: f64,
    p99: f64,
    fair_p50: f64,
    fair_p99: f64,
    recovery_p99_ratio: f64,
    /// Per search: first page p50 and p99, deep page p50 and p99 (ms).
    searches: Vec<(String, [f64; 4])>,
    lookup: [f64; 2],
    recover_answer_ms: f64,
    recover_counted_ms: f64,
    retention_ms: f64,
    retention_days: usize,
    /// Rows the pass deleted one by one (each left for vacuum).
    rows_deleted: u64,
}

/// Runs the phase: the fresh database, then the filled one; adds the rows.
pub(crate) async fn run(bench: &mut Bench, context: &Shared<'_>) -> anyhow::Result<()> {
    let settings = production_settings().await?;
    out(&format!("history: PostgreSQL as it ran: {settings}"));
    let measured = async {
        let empty = measure(bench, context, false).await?;
        let filled = measure(bench, context, true).await?;
        Ok::<_, anyhow::Error>((empty, filled))
    }
    .await;
    restore_settings().await?;
    let (empty, filled) = measured?;
    rows(bench, &empty, &filled);
    Ok(())
}

/// The settings docs/operations.md ("PostgreSQL settings") recommends, for
/// this run: set with `ALTER SYSTEM`, reset by [`restore_settings`].
const SETTINGS: [(&str, &str); 6] = [
    ("autovacuum", "on"),
    ("autovacuum_naptime", "10s"),
    ("autovacuum_vacuum_scale_factor", "0.05"),
    ("autovacuum_analyze_scale_factor", "0.02"),
    ("max_wal_size", "4GB"),
    ("synchronous_commit", "on"),
];

async fn admin() -> anyhow::Result<sqlx::PgConnection> {
    use sqlx::Connection;
    Ok(sqlx::PgConnection::connect(&tests::db::admin_url()).await?)
}

async fn production_settings() -> anyhow::Result<String> {
    let mut admin = admin().await?;
    for (name, value) in SETTINGS {
        sqlx::query(&format!("ALTER SYSTEM SET {name} = '{value}'")).execute(&mut admin).await?;
    }
    sqlx::query("SELECT pg_reload_conf()").execute(&mut admin).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut shown = Vec::new();
    for name in SETTINGS.map(|(name, _)| name).into_iter().chain(["shared_buffers", "work_mem", "max_connections"]) {
        let value: String = sqlx::query_scalar(&format!("SHOW {name}")).fetch_one(&mut admin).await?;
        shown.push(format!("{name}={value}"));
    }
    Ok(shown.join(", "))
}

async fn restore_settings() -> anyhow::Result<()> {
    let mut admin = admin().await?;
    for (name, _) in SETTINGS {
        sqlx::query(&format!("ALTER SYSTEM RESET {name}")).execute(&mut admin).await?;
    }
    sqlx::query("SELECT pg_reload_conf()").execute(&mut admin).await?;
    Ok(())
}

/// One database's figures: a fresh one, or one `filled` with history.
async fn measure(bench: &mut Bench, context: &Shared<'_>, filled: bool) -> anyhow::Result<Figures> {
    let which = if filled { "history, 30 days" } else { "history, empty" };
    let database = TestDatabase::create().await?;
    let prefix = random_prefix();
    let schedule: webhooks_model::RetrySchedule =
        webhooks_model::DEFAULT_RETRY_SCHEDULE.parse().map_err(anyhow::Error::msg)?;
    let queues = QueueCleanup::new(&amqp_url(), &prefix, &schedule);
    let (api_port, internal_port) = (free_port()?, free_port()?);
    let stack = Stack {
        bin: context.bin.to_path_buf(),
        env: vec![
            ("DATABASE_URL".into(), database.url().to_owned()),
            ("DATABASE_MAX_CONNECTIONS".into(), "20".into()),
            ("QUEUE_PREFIX".into(), prefix.clone()),
            ("TLS_EXTRA_ROOTS".into(), context.ca.pem_path().display().to_string()),
            ("TARGET_ALLOW_PRIVATE".into(), "true".into()),
            ("API_LISTEN_ADDR".into(), format!("127.0.0.1:{api_port}")),
            ("INTERNAL_LISTEN_ADDR".into(), format!("127.0.0.1:{internal_port}")),
            ("RUST_LOG".into(), "warn".into()),
            ("MAX_ENDPOINTS_PER_DEVELOPER".into(), "64".into()),
            // The searches follow each other as fast as they answer.
            ("RATE_LIMIT_PER_SECOND".into(), "0".into()),
            ("RETENTION".into(), "30d".into()),
            // The retention pass is the bench's to make and time.
            ("RETENTION_INTERVAL".into(), "24h".into()),
        ],
        api_url: format!("http://127.0.0.1:{api_port}/v0"),
        internal_url: format!("http://127.0.0.1:{internal_port}"),
    };
    let api = stack.command("webhooks-api").arg("serve").spawn().context("start webhooks-api")?;
    wait_ready(&format!("{}/readyz", stack.internal_url)).await?;
    let client = bench_client()?;
    let pool = sqlx::PgPool::connect(database.url()).await?;
    let ingest_url = format!("{}/internal/events", stack.internal_url);

    // The big endpoint, at nginx: its history is searched and recovered.
    let (big_key, big_developer) = create_key(stack.command("webhooks-api"), "bench-history").await?;
    let big = active_endpoint(&client, &stack.api_url, &big_key, &hook(context.nginx.port())).await?;
    if filled {
        fill(database.url(), &pool, (&big_developer, &big)).await?;
    } else {
        // A short log of its own to search.
        let started = Instant::now();
        let dispatcher = stack.spawn_dispatchers(1).await?;
        let base = context.nginx.arrivals().count();
        ingest(&client, &ingest_url, &big_developer, 200, 16).await?;
        wait_count(&context.nginx.arrivals(), base + 200, Duration::from_secs(120)).await?;
        for child in dispatcher {
            stop(child).await;
        }
        out(&format!(
            "{which}: 200 events delivered to the searched endpoint in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }

    let (key, developer_id) = create_key(stack.command("webhooks-api"), "bench").await?;
    active_endpoint(&client, &stack.api_url, &key, &hook(context.receiver_port)).await?;
    let (nginx_key, nginx_developer_id) = create_key(stack.command("webhooks-api"), "bench-nginx").await?;
    active_endpoint(&client, &stack.api_url, &nginx_key, &hook(context.nginx.port())).await?;
    let in_process = Target {
        side: Side::InProcess,
        arrivals: context.in_process_arrivals.clone(),
        developer_id,
        pid: std::process::id(),
    };
    let to_nginx = Target {
        side: Side::Nginx,
        arrivals: context.nginx.arrivals(),
        developer_id: nginx_developer_id,
        pid: context.nginx.pid(),
    };
    let system =
        Distributed { stack: &stack, database: database.name(), client: &client, ingest_url: &ingest_url, pool: &pool };
    let mut figures = Figures::default();
    let label = format!("{which}: ");

    // End to end and latency, one dispatcher.
    let dispatcher = stack.spawn_dispatchers(1).await?.pop().context("a dispatcher")?;
    let (api_pid, dispatcher_pid) = (api.id().unwrap_or_default(), dispatcher.id().unwrap_or_default());
    let ticks = bench.ticks;
    let read = || {
        vec![
            cpu_seconds(api_pid, ticks),
            cpu_seconds(dispatcher_pid, ticks),
            cpu_of_postgres(database.name(), ticks),
            cpu_of_named(&["beam.smp"], ticks),
            to_nginx.cpu(ticks),
        ]
    };
    let names = ["api", "dispatcher", "postgres", "rabbitmq", "receiver"];
    let parts = Parts { names: &names, dispatcher: 1, read: &read, pool: Some(&pool) };
    figures.e2e_per_s = wrk_end_to_end(bench, &label, &ingest_url, &to_nginx, &parts).await?.per_s;
    let latency_ng = latency(&label, bench.fixed_rate(), &client, &ingest_url, &to_nginx).await?;
    (figures.p50, figures.p99) = (percentile(&latency_ng.total, 50.0), percentile(&latency_ng.total, 99.0));

    // The searches and the lookup, the dispatcher still running.
    searches(&client, &stack, &pool, (&big_key, &big), &mut figures).await?;
    stop(dispatcher).await;

    // Fairness and recoveries, each with its own dispatcher.
    let backlog = knob("BENCH_BACKLOG", 50_000).max(1);
    let rate = knob("BENCH_FAIR_RATE", 20).max(1);
    let fair = fairness(
        &system,
        (backlog, bench.concurrency, Backlog::Live),
        (rate, bench.latency_secs),
        &in_process,
        &to_nginx,
    )
    .await?;
    (figures.fair_p50, figures.fair_p99) = (percentile(&fair.quiet.total, 50.0), percentile(&fair.quiet.total, 99.0));
    let recovering = Recovering {
        stack: &stack,
        endpoints: knob("BENCH_RECOVERIES", 20).clamp(1, 64),
        window: knob("BENCH_RECOVERY_EVENTS", 100_000).max(1),
        receiver_port: context.receiver_port,
    };
    let recovered = recovery(&system, &recovering, (rate, bench.latency_secs), bench.concurrency, &to_nginx).await?;
    figures.recovery_p99_ratio = percentile(&recovered.beside.ingest, 99.0) / percentile(&recovered.alone.ingest, 99.0);

    // A recover of the whole month, then one retention pass.
    recover_month(&client, &stack, (&big_key, &big), &mut figures).await?;
    retention_pass(&database, &mut figures).await?;
    out(&format!(
        "{label}recover of 30 days answered in {:.1} ms, counted after {:.0} ms; retention pass dropped {} day(s) in {:.0} ms, deleting {} rows one by one",
        figures.recover_answer_ms,
        figures.recover_counted_ms,
        figures.retention_days,
        figures.retention_ms,
        figures.rows_deleted
    ));

    stop(api).await;
    pool.close().await;
    database.remove().await;
    queues.remove().await;
    Ok(figures)
}

/// Makes the history: the other developers' endpoints (copies of `big`'s
/// row), the days' partitions, then the days, two at a time.
async fn fill(database_url: &str, pool: &sqlx::PgPool, (big_developer, big): (&str, &str)) -> anyhow::Result<()> {
    let deliveries = knob("BENCH_HISTORY_DELIVERIES", 20_000_000).max(DAYS as u64 * 100);
    // A third of the events are the big developer's, each one delivery;
    // every other event makes four: about 2.0 deliveries an event.
    let per_day = i64::try_from(deliveries).unwrap_or(i64::MAX) / DAYS * 100 / 307;
    let started = Instant::now();
    let developers: Vec<uuid::Uuid> =
        std::iter::once(big_developer.parse()?).chain((1..DEVELOPERS).map(|_| uuid::Uuid::new_v4())).collect();
    let mut endpoints = vec![big.to_owned()];
    endpoints.extend((1..DEVELOPERS * ENDPOINTS_EACH).map(|_| format!("wep_{}", uuid::Uuid::new_v4().simple())));
    // Endpoint i belongs to developer i / ENDPOINTS_EACH.
    sqlx::query(
        "INSERT INTO endpoints (id, developer_id, url, status, event_epoch, event_categories, public_key_pem,
                                private_key, created_at, updated_at, signature_scheme)
         SELECT e.id, (($2::uuid[])[1 + (e.n - 1) / $3]), b.url, 'active', b.event_epoch, b.event_categories,
                b.public_key_pem, b.private_key, now() - interval '40 days', now(), b.signature_scheme
           FROM unnest($1::text[]) WITH ORDINALITY AS e(id, n), endpoints b
          WHERE b.id = $4 AND e.id <> $4",
    )
    .bind(&endpoints)
    .bind(&developers)
    .bind(i64::try_from(ENDPOINTS_EACH).unwrap_or(20))
    .bind(big)
    .execute(pool)
    .await?;
    let (store, _) = webhooks_store::open::distributed(&common(database_url)?).await?;
    let today = chrono::Utc::now().date_naive();
    store.partition_days(today - chrono::Duration::days(DAYS), today).await?;
    store.close().await;
    out(&format!(
        "history, 30 days: {DEVELOPERS} developers, {} endpoints; filling {DAYS} days of {per_day} events each",
        endpoints.len()
    ));
    let days: Vec<i64> = (1..=DAYS).collect();
    for pair in days.chunks(2) {
        let mut fills = Vec::new();
        for day in pair {
            let (pool, developers, endpoints) = (pool.clone(), developers.clone(), endpoints.clone());
            let day = *day;
            fills.push(tokio::spawn(async move {
                let mut connection = pool.acquire().await?;
                sqlx::Executor::execute(&mut *connection, "SET statement_timeout = 0").await?;
                sqlx::query(FILL_DAY)
                    .bind(day)
                    .bind(per_day)
                    .bind(&developers)
                    .bind(&endpoints)
                    .execute(&mut *connection)
                    .await?;
                Ok::<_, anyhow::Error>(())
            }));
        }
        for fill in fills {
            fill.await??;
        }
    }
    // As a month-old database is: vacuumed and analyzed (else the first
    // measures run beside autovacuum's first pass over all of it).
    let mut connection = pool.acquire().await?;
    sqlx::Executor::execute(&mut *connection, "SET statement_timeout = 0").await?;
    sqlx::Executor::execute(&mut *connection, "VACUUM (ANALYZE)").await?;
    drop(connection);
    let (events, delivered, attempts, size): (i64, i64, i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM deliveries),
                (SELECT count(*) FROM delivery_attempts), pg_size_pretty(pg_database_size(current_database()))",
    )
    .fetch_one(pool)
    .await?;
    let big_log: i64 = sqlx::query_scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = $1")
        .bind(big)
        .fetch_one(pool)
        .await?;
    out(&format!(
        "history, 30 days: {events} events, {delivered} deliveries, {attempts} log entries ({big_log} of the big endpoint), {size}, made in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Each search of [`SEARCHES`], a first page and a deep page, and the event
/// lookup, each `BENCH_HISTORY_SEARCHES` (30) times: p50 and p99 of each.
async fn searches(
    client: &reqwest::Client,
    stack: &Stack,
    pool: &sqlx::PgPool,
    (key, endpoint): (&str, &str),
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let times = knob("BENCH_HISTORY_SEARCHES", 30).max(2);
    let deep: Option<String> = sqlx::query_scalar(
        "SELECT id::text FROM delivery_attempts WHERE endpoint_id = $1 AND created_at < now() - interval '20 days'
          ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .bind(endpoint)
    .fetch_optional(pool)
    .await?;
    let deep = match deep {
        Some(id) => id,
        None => sqlx::query_scalar(
            "SELECT id::text FROM delivery_attempts WHERE endpoint_id = $1 ORDER BY created_at, id LIMIT 1 OFFSET 100",
        )
        .bind(endpoint)
        .fetch_optional(pool)
        .await?
        .unwrap_or_default(),
    };
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM deliveries WHERE endpoint_id = $1 AND event_created_at > now() - interval '29 days'
          ORDER BY event_created_at LIMIT $2",
    )
    .bind(endpoint)
    .bind(i64::try_from(times).unwrap_or(30))
    .fetch_all(pool)
    .await?;
    let event = events.first().cloned().unwrap_or_default();
    let format = |at: chrono::DateTime<chrono::Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let now = chrono::Utc::now();
    let (since, until) = (format(now - chrono::Duration::days(17)), format(now - chrono::Duration::days(10)));
    let timed = async |url: String| -> anyhow::Result<f64> {
        let started = Instant::now();
        let response = client.get(&url).header("Api-Key", key).send().await?;
        let status = response.status();
        let _ = response.bytes().await?;
        if status != 200 {
            bail!("{url} answered {status}");
        }
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    };
    for (name, query) in SEARCHES {
        let query = query.replace("{event}", &event).replace("{since}", &since).replace("{until}", &until);
        let mut first = Vec::new();
        let mut paged = Vec::new();
        for _ in 0..times {
            first.push(timed(format!("{}/webhooks/{endpoint}/logs?limit=100{query}", stack.api_url)).await?);
            paged.push(
                timed(format!("{}/webhooks/{endpoint}/logs?limit=100{query}&starting_after={deep}", stack.api_url))
                    .await?,
            );
        }
        first.sort_by(f64::total_cmp);
        paged.sort_by(f64::total_cmp);
        let cell =
            [percentile(&first, 50.0), percentile(&first, 99.0), percentile(&paged, 50.0), percentile(&paged, 99.0)];
        out(&format!(
            "    log search {name}: first page p50 {:.2} ms, p99 {:.2} ms; deep page p50 {:.2} ms, p99 {:.2} ms",
            cell[0], cell[1], cell[2], cell[3]
        ));
        figures.searches.push((name.to_owned(), cell));
    }
    let mut lookups = Vec::new();
    for event in &events {
        lookups.push(timed(format!("{}/webhook_events/{event}", stack.api_url)).await?);
    }
    lookups.sort_by(f64::total_cmp);
    figures.lookup = [percentile(&lookups, 50.0), percentile(&lookups, 99.0)];
    out(&format!("    event lookup: p50 {:.2} ms, p99 {:.2} ms", figures.lookup[0], figures.lookup[1]));
    Ok(())
}

/// `POST …/recover` of the whole month on the big endpoint: how long the
/// answer took, and when `GET …/recover` showed the count.
async fn recover_month(
    client: &reqwest::Client,
    stack: &Stack,
    (key, endpoint): (&str, &str),
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let since = (chrono::Utc::now() - chrono::Duration::days(30)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let path = format!("{}/webhooks/{endpoint}/recover", stack.api_url);
    let started = Instant::now();
    let response = client
        .post(&path)
        .header("Api-Key", key)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&json!({ "since": since }))
        .send()
        .await?;
    figures.recover_answer_ms = started.elapsed().as_secs_f64() * 1000.0;
    let status = response.status();
    let answer: Value = response.json().await?;
    if status != 202 {
        bail!("recover answered {status}: {answer}");
    }
    loop {
        let shown: Value = client.get(&path).header("Api-Key", key).send().await?.json().await?;
        if shown["id"] == answer["id"] && !shown["total"].is_null() {
            figures.recover_counted_ms = started.elapsed().as_secs_f64() * 1000.0;
            out(&format!("    recover of 30 days: {} deliveries counted", shown["total"]));
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the recovery was not counted within 120 s: {shown}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Switched off, so what it queues goes nowhere while the rest runs.
    client.delete(format!("{}/webhooks/{endpoint}", stack.api_url)).header("Api-Key", key).send().await?;
    Ok(())
}

/// One retention pass, as the API makes it: the days wholly older than
/// thirty days dropped, and what else expired deleted. Its time, and the
/// rows it deleted one by one (each a dead row for vacuum).
async fn retention_pass(database: &TestDatabase, figures: &mut Figures) -> anyhow::Result<()> {
    let (store, _) = webhooks_store::open::distributed(&common(database.url())?).await?;
    let cutoff = webhooks_store::retention_cutoff(Duration::from_secs(30 * 86_400));
    let started = Instant::now();
    let kept = store.maintain_history(cutoff).await?;
    let mut purged = webhooks_store::Purged::default();
    if let Some(cutoff) = cutoff {
        loop {
            let batch = store.purge_expired(cutoff, webhooks_store::RETENTION_BATCH).await?;
            purged.add(batch);
            if !batch.full(webhooks_store::RETENTION_BATCH) {
                break;
            }
        }
    }
    figures.retention_ms = started.elapsed().as_secs_f64() * 1000.0;
    figures.retention_days = kept.dropped;
    figures.rows_deleted = purged.events + purged.deliveries + purged.logs + purged.delivery_logs;
    store.close().await;
    Ok(())
}

/// The settings of a process on `database_url`, the rest their defaults.
fn common(database_url: &str) -> anyhow::Result<webhooks_config::CommonConfig> {
    use clap::Parser;
    #[derive(Parser)]
    struct Settings {
        #[command(flatten)]
        common: webhooks_config::CommonConfig,
    }
    Ok(Settings::try_parse_from(["webhooks-bench", "--database-url", database_url])?.common)
}

/// The rows of the summary: the fresh database on the left, the filled one
/// on the right, each target judged on the filled one.
fn rows(bench: &mut Bench, empty: &Figures, filled: &Figures) {
    bench.section("history (left: a fresh database; right: 30 days of history, 20M deliveries)");
    let within = |base: f64, higher_is_better: bool| {
        move |v: f64| if higher_is_better { v >= base * 0.9 } else { v <= base * 1.1 }
    };
    bench.row_with_goal(
        "  end to end, wrk to nginx: events/s",
        format!("{:.0}", empty.e2e_per_s),
        format!("{:.0}", filled.e2e_per_s),
        goal(">= 90% of empty", filled.e2e_per_s, within(empty.e2e_per_s, true)),
    );
    bench.row_with_goal(
        "  latency to nginx, p50",
        format!("{:.2} ms", empty.p50),
        format!("{:.2} ms", filled.p50),
        goal("<= 110% of empty", filled.p50, within(empty.p50, false)),
    );
    bench.row_with_goal(
        "    p99",
        format!("{:.2} ms", empty.p99),
        format!("{:.2} ms", filled.p99),
        goal("<= 110% of empty", filled.p99, within(empty.p99, false)),
    );
    bench.row(
        "  fairness: B's p50 / p99",
        format!("{:.2} / {:.2} ms", empty.fair_p50, empty.fair_p99),
        format!("{:.2} / {:.2} ms", filled.fair_p50, filled.fair_p99),
    );
    bench.row(
        "  recovery: B's ingest p99 beside recoveries / alone",
        format!("{:.2} x", empty.recovery_p99_ratio),
        format!("{:.2} x", filled.recovery_p99_ratio),
    );
    for ((name, e), (_, f)) in empty.searches.iter().zip(&filled.searches) {
        let worst = f[1].max(f[3]);
        bench.row_with_goal(
            format!("  log search, {name}: p99 first / deep page"),
            format!("{:.1} / {:.1} ms", e[1], e[3]),
            format!("{:.1} / {:.1} ms", f[1], f[3]),
            goal("<= 50 ms", worst, |v| v <= 50.0),
        );
    }
    bench.row("  event lookup p99", format!("{:.1} ms", empty.lookup[1]), format!("{:.1} ms", filled.lookup[1]));
    bench.row_with_goal(
        "  recover of 30 days: answered in",
        format!("{:.1} ms", empty.recover_answer_ms),
        format!("{:.1} ms", filled.recover_answer_ms),
        goal("<= 200 ms", filled.recover_answer_ms, |v| v <= 200.0),
    );
    bench.row(
        "    counted after",
        format!("{:.0} ms", empty.recover_counted_ms),
        format!("{:.0} ms", filled.recover_counted_ms),
    );
    bench.row_with_goal(
        "  retention pass: one day of 30 dropped in",
        format!("{:.0} ms ({} days)", empty.retention_ms, empty.retention_days),
        format!("{:.0} ms ({} days)", filled.retention_ms, filled.retention_days),
        goal("< 1 s", filled.retention_ms, |v| v < 1000.0),
    );
    bench.row_with_goal(
        "    rows it deleted one by one (left to vacuum)",
        empty.rows_deleted.to_string(),
        filled.rows_deleted.to_string(),
        goal("none", filled.rows_deleted as f64, |v| v == 0.0),
    );
}
