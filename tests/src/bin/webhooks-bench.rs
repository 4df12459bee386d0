//! The benchmark: starts the real `webhooks-api` and `webhooks-dispatcher`
//! release binaries against the local PostgreSQL and RabbitMQ and a local HTTPS
//! receiver, drives them, and prints what it measured.
//!
//! ```sh
//! cargo build --release --workspace --bins && ./target/release/webhooks-bench
//! ```
//!
//! Phases (each on the same fresh database and queue prefix):
//! 1. one core's RSA-2048 signatures per second, for comparison;
//! 2. ingest: events/s accepted by `POST /internal/events` with the dispatcher
//!    stopped (so the queue fills);
//! 3. drain: a dispatcher started on the full queue; deliveries/s and
//!    dispatcher CPU seconds per 1,000 deliveries;
//! 4. end to end: ingest as fast as possible with the dispatcher running;
//!    events/s received and CPU seconds of the whole stack (API, dispatcher,
//!    PostgreSQL, RabbitMQ) per 1,000 events;
//! 5. latency at a fixed rate: ingest request start → received, p50/p99;
//! 6. standalone mode (`webhooks-api standalone` on a fresh `DATA_DIR`): end
//!    to end events/s with its CPU per 1,000 events, and the same latency.
//!
//! Knobs (environment): `BENCH_EVENTS` (10000), `BENCH_RATE` (200 events/s),
//! `BENCH_LATENCY_SECS` (15), `BENCH_CONCURRENCY` (32), and
//! `BENCH_DISPATCHER_THREADS` (the dispatcher's tokio worker threads; default:
//! one per core).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tests::{TestCa, broker::random_prefix, db::TestDatabase};
use tokio::{
    net::TcpListener,
    process::{Child, Command},
};

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Arrivals at the receiver, keyed by `X-Webhook-Id`.
#[derive(Default)]
struct Arrivals {
    count: AtomicU64,
    at: Mutex<HashMap<String, Instant>>,
}

async fn start_receiver(ca: &TestCa) -> anyhow::Result<(u16, Arc<Arrivals>)> {
    let tls = tokio_rustls::TlsAcceptor::from(ca.issue(&["localhost"]).server_config()?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let arrivals = Arc::new(Arrivals::default());
    let shared = arrivals.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let tls = tls.clone();
            let arrivals = shared.clone();
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(stream).await else { return };
                let service = service_fn(move |request: Request<Incoming>| {
                    let arrivals = arrivals.clone();
                    async move {
                        let id = request
                            .headers()
                            .get("x-webhook-id")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                            .unwrap_or_default();
                        let _ = request.into_body().collect().await;
                        let now = Instant::now();
                        if arrivals
                            .at
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(id, now)
                            .is_none()
                        {
                            arrivals.count.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((port, arrivals))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32, ticks: f64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return 0.0 };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (field(11) + field(12)) / ticks
}

/// CPU seconds of every process whose name is one of `names`.
fn cpu_of_named(names: &[&str], ticks: f64) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| names.contains(&comm.trim()))
        })
        .map(|pid| cpu_seconds(pid, ticks))
        .sum()
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

struct Stack {
    bin: PathBuf,
    env: Vec<(String, String)>,
    api_url: String,
    internal_url: String,
}

impl Stack {
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))).stdin(Stdio::null()).kill_on_drop(true);
        command
    }

    async fn spawn_dispatcher(&self) -> anyhow::Result<Child> {
        let port = free_port()?;
        let child = self
            .command("webhooks-dispatcher")
            .env("DISPATCHER_LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .envs(
                std::env::var("BENCH_DISPATCHER_THREADS")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .map(|n| ("TOKIO_WORKER_THREADS", n)),
            )
            .spawn()
            .context("start webhooks-dispatcher")?;
        wait_ready(&format!("http://127.0.0.1:{port}/readyz")).await?;
        Ok(child)
    }
}

async fn wait_ready(url: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if client.get(url).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} not ready within 60s")
}

async fn stop(mut child: Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    }
    let _ = tokio::time::timeout(Duration::from_secs(40), child.wait()).await;
    let _ = child.kill().await;
}

/// The HTTP client of the bench: many connections to one host, dropped
/// before the API's `HEADER_READ_TIMEOUT` closes them idle.
fn bench_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().pool_max_idle_per_host(64).pool_idle_timeout(Duration::from_secs(5)).build()?)
}

/// Registers the receiver at `receiver_port` as an endpoint of `key` at
/// `api_url` and switches it on.
async fn active_endpoint(client: &reqwest::Client, api_url: &str, key: &str, receiver_port: u16) -> anyhow::Result<()> {
    let endpoint: Value = client
        .post(format!("{api_url}/webhooks"))
        .header("Api-Key", key)
        .header("Idempotency-Key", "bench-endpoint")
        .json(&json!({"url": format!("https://localhost:{receiver_port}/hook")}))
        .send()
        .await?
        .json()
        .await?;
    let endpoint_id = endpoint["id"].as_str().context("endpoint id")?;
    client
        .put(format!("{api_url}/webhooks/{endpoint_id}"))
        .header("Api-Key", key)
        .json(&json!({"status": "active"}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

fn event_body(developer_id: &str, n: u64) -> Value {
    json!({
        "developer_id": developer_id,
        "event_category": "transfer",
        "event_type": "transfer.updated.status_transitioned",
        "event_object_id": format!("tr_{n}"),
        "event_object_status": "payment_processed",
        "event_object": {"id": format!("tr_{n}"), "amount": "100.00", "currency": "usd", "state": "payment_processed"},
        "event_object_changes": {"state": ["pending", "payment_processed"]},
    })
}

/// Ingests `count` events with `concurrency` requests in flight; returns the
/// (request start, event id) of each.
async fn ingest(
    client: &reqwest::Client,
    url: &str,
    developer_id: &str,
    count: u64,
    concurrency: u64,
) -> anyhow::Result<Vec<(Instant, String)>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, developer_id, next) = (client.clone(), url.to_owned(), developer_id.to_owned(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return Ok::<_, anyhow::Error>(sent);
                }
                let started = Instant::now();
                let response = client.post(&url).json(&event_body(&developer_id, n)).send().await?;
                if response.status() != 201 {
                    bail!("ingest answered {}", response.status());
                }
                let event: Value = response.json().await?;
                sent.push((started, event["event_id"].as_str().unwrap_or_default().to_owned()));
            }
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    Ok(all)
}

async fn wait_count(arrivals: &Arrivals, target: u64, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while arrivals.count.load(Ordering::Relaxed) < target {
        if Instant::now() > deadline {
            bail!("only {} of {target} deliveries arrived", arrivals.count.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

type Sent = Mutex<Vec<(Instant, Instant, String)>>;

/// Milliseconds from ingest request start, and from the 201, to arrival.
fn latencies(arrivals: &Arrivals, sent: &Sent) -> (Vec<f64>, Vec<f64>) {
    let at = arrivals.at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let sent = sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1000.0;
    sent.iter()
        .filter_map(|(started, accepted, id)| {
            at.get(id).map(|received| (ms(*started, *received), ms(*accepted, *received)))
        })
        .unzip()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn signatures_per_second() -> anyhow::Result<f64> {
    let pair = shared::keys::generate_rsa_2048()?;
    let signer = shared::signing::Signer::from_pkcs8_der(&pair.private_pkcs8_der)?;
    let body = event_body("00000000-0000-0000-0000-000000000000", 1).to_string();
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        std::hint::black_box(signer.sign(1_700_000_000_000, body.as_bytes()));
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn out(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let events = knob("BENCH_EVENTS", 10_000);
    let rate = knob("BENCH_RATE", 200);
    let latency_secs = knob("BENCH_LATENCY_SECS", 15);
    let concurrency = knob("BENCH_CONCURRENCY", 32);
    let ticks = clock_ticks();
    let bin = std::env::current_exe()?.parent().map(Path::to_path_buf).context("binary directory")?;
    for program in ["webhooks-api", "webhooks-dispatcher"] {
        if !bin.join(program).exists() {
            bail!("{} is missing: run `cargo build --release --workspace --bins` first", bin.join(program).display());
        }
    }

    let signatures = tokio::task::spawn_blocking(signatures_per_second).await??;
    out(&format!("rsa-2048 signatures/s (one core):      {signatures:.0}  ({:.3} ms each)", 1000.0 / signatures));

    let database = TestDatabase::create().await?;
    let ca = TestCa::new()?;
    let (receiver_port, arrivals) = start_receiver(&ca).await?;
    let prefix = random_prefix();
    let (api_port, internal_port) = (free_port()?, free_port()?);
    let stack = Stack {
        bin,
        env: vec![
            ("DATABASE_URL".into(), database.url().to_owned()),
            ("DATABASE_MAX_CONNECTIONS".into(), "20".into()),
            ("QUEUE_PREFIX".into(), prefix.clone()),
            ("TLS_EXTRA_ROOTS".into(), ca.pem_path().display().to_string()),
            ("TARGET_ALLOW_PRIVATE".into(), "true".into()),
            ("API_LISTEN_ADDR".into(), format!("127.0.0.1:{api_port}")),
            ("INTERNAL_LISTEN_ADDR".into(), format!("127.0.0.1:{internal_port}")),
            ("RUST_LOG".into(), "warn".into()),
        ],
        api_url: format!("http://127.0.0.1:{api_port}/v0"),
        internal_url: format!("http://127.0.0.1:{internal_port}"),
    };
    let api = stack.command("webhooks-api").arg("serve").spawn().context("start webhooks-api")?;
    let api_pid = api.id().unwrap_or_default();
    wait_ready(&format!("{}/readyz", stack.internal_url)).await?;

    let created = stack.command("webhooks-api").args(["keys", "create", "--name", "bench"]).output().await?;
    let created: Value = serde_json::from_slice(&created.stdout).context("keys create output")?;
    let key = created["key"].as_str().context("key")?.to_owned();
    let developer_id = created["api_key"]["owner_id"].as_str().context("owner_id")?.to_owned();
    let client = bench_client()?;
    active_endpoint(&client, &stack.api_url, &key, receiver_port).await?;
    let ingest_url = format!("{}/internal/events", stack.internal_url);

    // 2. Ingest with no dispatcher: the queue fills.
    let started = Instant::now();
    ingest(&client, &ingest_url, &developer_id, events, concurrency).await?;
    let ingest_rate = events as f64 / started.elapsed().as_secs_f64();
    out(&format!("ingest events/s ({concurrency} in flight):        {ingest_rate:.0}"));
    let pool = sqlx::PgPool::connect(database.url()).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox").fetch_one(&pool).await? > 0 {
        if Instant::now() > deadline {
            bail!("outbox did not drain");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 3. Drain the full queue with one dispatcher.
    let dispatcher = stack.spawn_dispatcher().await?;
    let dispatcher_pid = dispatcher.id().unwrap_or_default();
    wait_count(&arrivals, 1, Duration::from_secs(60)).await?;
    let (t0, cpu0) = (Instant::now(), cpu_seconds(dispatcher_pid, ticks));
    let n0 = arrivals.count.load(Ordering::Relaxed);
    wait_count(&arrivals, events, Duration::from_secs(600)).await?;
    let (elapsed, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds(dispatcher_pid, ticks) - cpu0);
    let drained = (events - n0) as f64;
    out(&format!("deliveries/s sustained (one dispatcher): {:.0}", drained / elapsed));
    let per_delivery_ms = cpu / drained * 1000.0;
    out(&format!(
        "dispatcher CPU s per 1,000 deliveries:  {:.3}  ({:.2} x one signature)",
        per_delivery_ms,
        per_delivery_ms / (1000.0 / signatures)
    ));

    // 4. End to end, as fast as ingest goes.
    let stack_cpu = || {
        [
            cpu_seconds(api_pid, ticks),
            cpu_seconds(dispatcher_pid, ticks),
            cpu_of_named(&["postgres"], ticks),
            cpu_of_named(&["beam.smp"], ticks),
        ]
    };
    let (t0, cpu0) = (Instant::now(), stack_cpu());
    ingest(&client, &ingest_url, &developer_id, events, concurrency).await?;
    wait_count(&arrivals, 2 * events, Duration::from_secs(600)).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let per_1000: Vec<f64> =
        stack_cpu().iter().zip(cpu0).map(|(after, before)| (after - before) / events as f64 * 1000.0).collect();
    out(&format!("end to end events/s:                    {:.0}", events as f64 / elapsed));
    out(&format!(
        "whole stack CPU s per 1,000 events:     {:.3}  (api {:.3}, dispatcher {:.3}, postgres {:.3}, rabbitmq {:.3})",
        per_1000.iter().sum::<f64>(),
        per_1000[0],
        per_1000[1],
        per_1000[2],
        per_1000[3]
    ));

    // 5. Latency at a fixed rate.
    let done = 2 * events;
    let (from_start, from_accept) =
        latency(&client, &ingest_url, &developer_id, &arrivals, done, rate, rate * latency_secs).await?;
    print_latency(rate, &from_start, &from_accept);

    stop(dispatcher).await;
    stop(api).await;
    pool.close().await;
    database.remove().await;

    // 6. Standalone mode: the same end to end and latency, one process.
    let load = Load { events, concurrency, rate, latency_secs, ticks };
    standalone(&ca, receiver_port, &arrivals, done + rate * latency_secs, &load).await?;
    Ok(())
}

/// Ingests `total` events at `rate` per second and waits for them to arrive
/// (after `done` earlier arrivals); returns the milliseconds from each
/// request's start, and from its 201, to its arrival, sorted.
async fn latency(
    client: &reqwest::Client,
    ingest_url: &str,
    developer_id: &str,
    arrivals: &Arrivals,
    done: u64,
    rate: u64,
    total: u64,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let sent: Arc<Sent> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut requests = Vec::with_capacity(total as usize);
    for n in 0..total {
        ticker.tick().await;
        let (client, url, developer_id, sent) =
            (client.clone(), ingest_url.to_owned(), developer_id.to_owned(), sent.clone());
        requests.push(tokio::spawn(async move {
            let started = Instant::now();
            let response = client.post(&url).json(&event_body(&developer_id, n)).send().await?;
            let accepted = Instant::now();
            let event: Value = response.json().await?;
            let id = event["event_id"].as_str().unwrap_or_default().to_owned();
            sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((started, accepted, id));
            Ok::<_, anyhow::Error>(())
        }));
    }
    for request in requests {
        request.await??;
    }
    wait_count(arrivals, done + total, Duration::from_secs(120)).await?;
    let (mut from_start, mut from_accept) = latencies(arrivals, &sent);
    from_start.sort_by(f64::total_cmp);
    from_accept.sort_by(f64::total_cmp);
    Ok((from_start, from_accept))
}

fn print_latency(rate: u64, from_start: &[f64], from_accept: &[f64]) {
    out(&format!(
        "latency at {rate} events/s, ingest start -> received: p50 {:.2} ms, p99 {:.2} ms",
        percentile(from_start, 50.0),
        percentile(from_start, 99.0)
    ));
    out(&format!(
        "latency at {rate} events/s, 201 -> received:          p50 {:.2} ms, p99 {:.2} ms",
        percentile(from_accept, 50.0),
        percentile(from_accept, 99.0)
    ));
}

/// What the phases send, and the clock to read CPU time by.
#[derive(Clone, Copy)]
struct Load {
    events: u64,
    concurrency: u64,
    rate: u64,
    latency_secs: u64,
    ticks: f64,
}

/// Phase 6: `webhooks-api standalone` on a fresh `DATA_DIR`, delivering to the
/// same receiver (which has seen `done` events so far).
async fn standalone(
    ca: &TestCa,
    receiver_port: u16,
    arrivals: &Arrivals,
    done: u64,
    load: &Load,
) -> anyhow::Result<()> {
    let Load { events, concurrency, rate, latency_secs, ticks } = *load;
    use tokio::io::AsyncBufReadExt;
    let bin = std::env::current_exe()?.parent().map(Path::to_path_buf).context("binary directory")?;
    let data_dir = std::env::temp_dir().join(format!("webhooks-bench-{}", random_prefix()));
    let (api_port, internal_port) = (free_port()?, free_port()?);
    let mut process = Command::new(bin.join("webhooks-api"))
        .arg("standalone")
        .env("DATA_DIR", &data_dir)
        .env("TLS_EXTRA_ROOTS", ca.pem_path())
        .env("TARGET_ALLOW_PRIVATE", "true")
        .env("API_LISTEN_ADDR", format!("127.0.0.1:{api_port}"))
        .env("INTERNAL_LISTEN_ADDR", format!("127.0.0.1:{internal_port}"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start webhooks-api standalone")?;
    let pid = process.id().unwrap_or_default();
    let stdout = process.stdout.take().context("stdout")?;
    let mut first = String::new();
    tokio::io::BufReader::new(stdout).read_line(&mut first).await?;
    let created: Value = serde_json::from_str(&first).context("the first start's key")?;
    let key = created["key"].as_str().context("key")?.to_owned();
    let developer_id = created["api_key"]["owner_id"].as_str().context("owner_id")?.to_owned();
    let (api_url, internal_url) =
        (format!("http://127.0.0.1:{api_port}/v0"), format!("http://127.0.0.1:{internal_port}"));
    wait_ready(&format!("{internal_url}/readyz")).await?;
    let client = bench_client()?;
    active_endpoint(&client, &api_url, &key, receiver_port).await?;
    let ingest_url = format!("{internal_url}/internal/events");

    let (t0, cpu0) = (Instant::now(), cpu_seconds(pid, ticks));
    ingest(&client, &ingest_url, &developer_id, events, concurrency).await?;
    wait_count(arrivals, done + events, Duration::from_secs(600)).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_seconds(pid, ticks) - cpu0) / events as f64 * 1000.0;
    out(&format!("standalone end to end events/s:         {:.0}", events as f64 / elapsed));
    out(&format!("standalone CPU s per 1,000 events:      {cpu:.3}"));
    let (from_start, from_accept) =
        latency(&client, &ingest_url, &developer_id, arrivals, done + events, rate, rate * latency_secs).await?;
    out("standalone:");
    print_latency(rate, &from_start, &from_accept);

    stop(process).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}
