//! The benchmark: starts the real `webhooks-api` and `webhooks-dispatcher`
//! release binaries against the local PostgreSQL and RabbitMQ, drives them,
//! and prints what it measured, ending with a summary table.
//!
//! ```sh
//! cargo build --release --workspace --bins && ./target/release/webhooks-bench
//! ```
//!
//! Two receivers take the deliveries, each the one HTTPS endpoint of its own
//! developer: one in the bench's process ("in-process"), and nginx
//! (`nginx.conf` written to a temporary directory: one worker,
//! `return 200 "ok"`, a certificate of the test CA, an access log of
//! `$msec $http_x_webhook_id $status` that the bench reads arrivals from).
//! wrk drives the saturated end-to-end runs, with a Lua script that makes
//! every request a new event. nginx and wrk are installed with apt-get
//! (`nginx-light` or `nginx`, `wrk`) when missing. The services trust the test
//! CA through `TLS_EXTRA_ROOTS` and may deliver to loopback
//! (`TARGET_ALLOW_PRIVATE`).
//!
//! Times are wall-clock (`SystemTime`, the clock of nginx's `$msec`), checked
//! at start against nginx with a few requests of the bench's own. An arrival
//! at nginx is the `$msec` of its log line: millisecond resolution.
//!
//! Phases (distributed: one fresh database and queue prefix):
//! 1. one core's RSA-2048 signatures per second (per CPU second of the
//!    signing thread, so a busy machine does not lower it), for comparison;
//! 2. drain, per receiver, with one dispatcher and then two: ingest
//!    `BENCH_EVENTS` with `POST /internal/events` while no dispatcher runs
//!    (ingest events/s), then start the dispatchers on the full queue:
//!    deliveries/s and dispatcher CPU per delivery (× one signature);
//! 3. end to end with one dispatcher: the bench's own producer
//!    (`BENCH_CONCURRENCY` requests in flight) to the in-process receiver,
//!    then wrk (`BENCH_WRK_SECS`) to each receiver; events/s = events
//!    received ÷ (first request → last arrival), and CPU seconds per 1,000
//!    events of the API, dispatcher, PostgreSQL (the server's own processes
//!    and the backends of the bench's database, not those of other
//!    databases), RabbitMQ (`beam.smp`) and receiver (nginx's master and
//!    worker; for the in-process receiver the bench's own process, which
//!    does nothing else during a wrk run), from `/proc/<pid>/stat`;
//! 4. latency at a fixed rate (`BENCH_RATE`) to each receiver: ingest request
//!    start → received (p50, p90, p99, max), the ingest call alone, and
//!    answer → received;
//! 5. fairness, one dispatcher running: developer A sends `BENCH_BACKLOG`
//!    events as fast as the API takes them (faster than they are delivered,
//!    so a backlog builds) while developer B sends `BENCH_FAIR_RATE`
//!    events/s to nginx for `BENCH_LATENCY_SECS`: B's request start →
//!    received (p50, p99), A's deliveries/s (and ÷ the one-dispatcher
//!    drain), and how many of A's still waited when B's last event arrived;
//!    then again with A's whole backlog sent before the dispatcher starts
//!    (`backlog`: one built up during an outage);
//! 6. isolation: a developer with `BENCH_ISOLATION_ENDPOINTS` endpoints at
//!    the in-process receiver drains `BENCH_EVENTS` deliveries with a fresh
//!    dispatcher, alone, then beside as many deliveries for a developer with
//!    as many endpoints that hang until `DELIVERY_TIMEOUT` (10 s): healthy
//!    deliveries/s each time and their ratio, how often the hanging
//!    endpoints' messages were parked in a retry queue or set aside in the
//!    store, and the attempts they got;
//! 7. pace: `BENCH_PACE` × 10 deliveries to one endpoint paced at
//!    `BENCH_PACE` per second (50), sent before two dispatchers start on them
//!    together: the rate the receiver sees from its first arrival to its last
//!    (and its error against the limit), the most arrivals within any one
//!    second, and the messages put back to wait for their start or a slot;
//! 8. scale-out: each process in a cgroup of its own capped to
//!    `BENCH_SCALE_MILLICORES` (100) of a core, like a small machine (needs
//!    root): one backlog of `BENCH_EVENTS` drained by 1, 2 and 4 dispatchers,
//!    and ingest through 1 and 2 API processes; each run shows the cores
//!    PostgreSQL and RabbitMQ used, which says which shared part saturates;
//! 9. recovery: a developer's `BENCH_RECOVERIES` (20) endpoints, disabled
//!    while `BENCH_RECOVERY_EVENTS` (100000) events arrive, are switched on
//!    and recovered at once, one dispatcher running, while developer B sends
//!    `BENCH_FAIR_RATE` events/s to nginx: B's ingest call p99 beside the
//!    recoveries against the same run just before them;
//! 10. standalone mode (`webhooks-api standalone` on a fresh `DATA_DIR`): end to
//!     end with the bench's producer to the in-process receiver and with wrk to
//!     nginx (CPU: the one process and nginx), and the latency to each;
//! 11. history, only when `BENCH_PHASES` names it (it fills a database for
//!     many minutes): the end-to-end, latency, fairness and recovery
//!     measures, the log searches, a recover of thirty days and a retention
//!     pass, on a fresh database and on one holding
//!     `BENCH_HISTORY_DELIVERIES` (20,000,000) deliveries of thirty days,
//!     side by side (see `history.rs`).
//!
//! Throughputs are also shown ÷ one core's signatures/s, to compare runs on
//! a noisy machine. Targets (judged on the nginx figures): latency p50 ≤ 2 ms
//! and p99 ≤ 5 ms, end to end ≥ 3,000 events/s, whole stack ≤ 0.6 CPU s per
//! 1,000 events, dispatcher ≤ 1.3 signatures' CPU per delivery, two
//! dispatchers drain at least as fast as one; with a backlog elsewhere, B's
//! p50 ≤ 50 ms and p99 ≤ 1 s; beside hanging endpoints, healthy ones keep
//! ≥ 90% of their deliveries/s; beside 20 recoveries, B's ingest p99 stays
//! within 2× of its figure alone.
//!
//! Knobs (environment): `BENCH_PHASES` (`drain,e2e,latency,fairness,backlog,isolation,pace,scale,recovery,standalone`: the
//! phases to run, for a profile of one of them; `history` runs only when named), `BENCH_EVENTS` (10000), `BENCH_RATE` (200 events/s),
//! `BENCH_LATENCY_SECS` (15), `BENCH_CONCURRENCY` (32), `BENCH_WRK_SECS` (20),
//! `BENCH_WRK_THREADS` (2), `BENCH_WRK_CONNECTIONS` (32) and
//! `BENCH_DISPATCHER_THREADS` (the dispatcher's tokio worker threads; default:
//! one per core), `BENCH_BACKLOG` (50000), `BENCH_FAIR_RATE` (20 events/s) and
//! `BENCH_ISOLATION_ENDPOINTS` (8 healthy and 8 hanging), `BENCH_PACE` (50 per second),
//! `BENCH_RECOVERIES` (20) and `BENCH_RECOVERY_EVENTS` (100000), `BENCH_HISTORY_DELIVERIES`
//! (20000000) and `BENCH_HISTORY_SEARCHES` (30 of each), `BENCH_SCHEME` (the endpoints'
//! `signature_scheme`: `platform`, RSA-2048, or `standard`, Ed25519).

use std::{
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
use tests::{
    TestCa,
    broker::{QueueCleanup, amqp_url, random_prefix},
    db::TestDatabase,
    outside::{self, Arrivals, Installer, Nginx, TempDir, WrkLoad, wall_ms},
};
use tokio::{
    net::TcpListener,
    process::{Child, Command},
};
use webhooks_model::SignatureScheme;

mod history;

/// Whether `BENCH_PHASES` (default: every phase but `history`) names `phase`.
fn phase(phase: &str) -> bool {
    std::env::var("BENCH_PHASES").map_or(true, |phases| phases.split(',').any(|p| p.trim() == phase))
}

/// Whether `BENCH_PHASES` names `phase`: a phase that runs only when asked
/// for (the history phase fills a database for many minutes).
fn phase_named(phase: &str) -> bool {
    std::env::var("BENCH_PHASES").is_ok_and(|phases| phases.split(',').any(|p| p.trim() == phase))
}

/// The endpoints' `signature_scheme`: `BENCH_SCHEME`, `platform` when unset;
/// `main` refuses a value that names no scheme before anything starts.
fn scheme() -> Result<SignatureScheme, String> {
    match std::env::var("BENCH_SCHEME") {
        Ok(name) => name.parse().map_err(|_| format!("BENCH_SCHEME={name}: neither platform nor standard")),
        Err(_) => Ok(SignatureScheme::default()),
    }
}

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The in-process receiver: HTTPS on a loopback port, arrivals by wall clock.
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
                        // The endpoints of one developer's fan-out (the
                        // isolation phase) each count: `/hook/...` paths.
                        let key = match request.uri().path() {
                            "/hook" => id,
                            path => format!("{id}@{path}"),
                        };
                        let _ = request.into_body().collect().await;
                        arrivals.record(key, wall_ms());
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
    cpu_of_stat(&format!("/proc/{pid}/stat"), ticks)
}

/// CPU seconds (user + system) in a `/proc/…/stat` file.
fn cpu_of_stat(path: &str, ticks: f64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return 0.0 };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (field(11) + field(12)) / ticks
}

/// CPU seconds of a process and every process below it.
fn cpu_of_tree(pid: u32, ticks: f64) -> f64 {
    cpu_seconds(pid, ticks) + outside::descendants(pid).into_iter().map(|child| cpu_seconds(child, ticks)).sum::<f64>()
}

/// CPU seconds of PostgreSQL's processes that work for `database`: its own
/// (postmaster, checkpointer, writers, launchers) and the backends and
/// autovacuum workers of `database`, but not those of other databases on
/// the same server (other programs' tests), whose exits would also make the
/// sum go down.
fn cpu_of_postgres(database: &str, ticks: f64) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres"))
        .filter(|pid| {
            let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let title = String::from_utf8_lossy(&title);
            let serves_a_database =
                title.contains('(') || title.contains("[local]") || title.contains("autovacuum worker");
            !serves_a_database || title.split([' ', '\0']).any(|word| word == database)
        })
        .map(|pid| cpu_seconds(pid, ticks))
        .sum()
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

    /// Starts `count` dispatchers together, then waits until each is ready.
    async fn spawn_dispatchers(&self, count: usize) -> anyhow::Result<Vec<Child>> {
        Ok(self.spawn_dispatchers_at(count).await?.into_iter().map(|(child, _)| child).collect())
    }

    /// [`Stack::spawn_dispatchers`], with the port of each one's metrics.
    async fn spawn_dispatchers_at(&self, count: usize) -> anyhow::Result<Vec<(Child, u16)>> {
        let mut started = Vec::new();
        for _ in 0..count {
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
            started.push((child, port));
        }
        for (_, port) in &started {
            wait_ready(&format!("http://127.0.0.1:{port}/readyz")).await?;
        }
        Ok(started)
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

/// Runs `webhooks-api keys create` (prepared in `command`); returns the key
/// and its developer.
async fn create_key(mut command: Command, name: &str) -> anyhow::Result<(String, String)> {
    let output = command.args(["keys", "create", "--name", name]).output().await.context("run keys create")?;
    let (key, developer_id) = tests::procs::created_key(&output)?;
    Ok((key, developer_id.to_string()))
}

/// The HTTP client of the bench: many connections to one host, dropped
/// before the API's `HEADER_READ_TIMEOUT` closes them idle.
fn bench_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().pool_max_idle_per_host(64).pool_idle_timeout(Duration::from_secs(5)).build()?)
}

/// The URL of a receiver's endpoint on this machine.
fn hook(port: u16) -> String {
    format!("https://localhost:{port}/hook")
}

/// Registers `url` as an endpoint of `key` at `api_url`, signing with the
/// scheme `BENCH_SCHEME` names (`platform`), and switches it on; returns the
/// endpoint's id.
async fn active_endpoint(client: &reqwest::Client, api_url: &str, key: &str, url: &str) -> anyhow::Result<String> {
    let body = json!({ "url": url, "signature_scheme": scheme().map_err(anyhow::Error::msg)?.as_str() });
    let endpoint = tests::procs::active_endpoint_of(client, api_url, key, body).await?;
    endpoint["id"].as_str().map(str::to_owned).context("no endpoint id")
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

/// Ingests `count` events with `concurrency` requests in flight.
async fn ingest(
    client: &reqwest::Client,
    url: &str,
    developer_id: &str,
    count: u64,
    concurrency: u64,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, developer_id, next) = (client.clone(), url.to_owned(), developer_id.to_owned(), next.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return Ok::<_, anyhow::Error>(());
                }
                let response = client.post(&url).json(&event_body(&developer_id, n)).send().await?;
                if response.status() != 201 {
                    bail!("ingest answered {}", response.status());
                }
                let _ = response.bytes().await?;
            }
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

async fn wait_count(arrivals: &Arrivals, target: u64, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while arrivals.count() < target {
        if Instant::now() > deadline {
            bail!("only {} of {target} deliveries arrived", arrivals.count());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// After the deliveries a phase waited for: waits until no more arrive for
/// a second (at most 15 s), for the requests a producer had in flight when
/// it stopped.
async fn settle(arrivals: &Arrivals) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut seen, mut quiet_since) = (arrivals.count(), Instant::now());
    while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if arrivals.count() != seen {
            (seen, quiet_since) = (arrivals.count(), Instant::now());
        }
    }
}

async fn wait_outbox_empty(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox").fetch_one(pool).await? > 0 {
        if Instant::now() > deadline {
            bail!("outbox did not drain");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// RSA-2048 signatures for 2 s on this thread: per second of the thread's
/// CPU time (one core's rate, even on a busy machine), and per second of
/// wall-clock time.
fn signatures_per_second(ticks: f64) -> anyhow::Result<(f64, f64)> {
    let pair = webhooks_keys::generate_rsa_2048()?;
    let signer = webhooks_signature::platform::Signer::from_pkcs8_der(&pair.private_pkcs8_der)?;
    let body = event_body("00000000-0000-0000-0000-000000000000", 1).to_string();
    let (started, cpu0) = (Instant::now(), cpu_of_stat("/proc/thread-self/stat", ticks));
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        std::hint::black_box(signer.sign(1_700_000_000_000, body.as_bytes()));
        n += 1;
    }
    let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_of_stat("/proc/thread-self/stat", ticks) - cpu0);
    let per_wall_second = n as f64 / wall;
    // CPU time comes in clock ticks: without a useful reading, wall time.
    let per_cpu_second = if cpu >= 0.5 { n as f64 / cpu } else { per_wall_second };
    Ok((per_cpu_second, per_wall_second))
}

fn out(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
}

/// The receivers, as the phases address them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    InProcess,
    Nginx,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::InProcess => "in-process receiver",
            Side::Nginx => "nginx",
        }
    }
}

/// One receiver with the developer whose only endpoint it is.
struct Target {
    side: Side,
    arrivals: Arc<Arrivals>,
    developer_id: String,
    /// The process whose CPU is the receiver's in a wrk run.
    pid: u32,
}

impl Target {
    /// CPU seconds of the receiver so far: nginx's master and worker, or the
    /// bench's own process (not its children: the services and wrk).
    fn cpu(&self, ticks: f64) -> f64 {
        match self.side {
            Side::InProcess => cpu_seconds(self.pid, ticks),
            Side::Nginx => cpu_of_tree(self.pid, ticks),
        }
    }
}

/// A figure's target, judged on the nginx figure.
struct Goal {
    text: &'static str,
    met: bool,
}

fn goal(text: &'static str, value: f64, ok: impl Fn(f64) -> bool) -> Option<Goal> {
    Some(Goal { text, met: !value.is_nan() && ok(value) })
}

/// A row of the table; a row without figures heads a section.
struct Row {
    name: String,
    in_process: String,
    nginx: String,
    goal: Option<Goal>,
}

/// The figures for the final table, with the settings every phase shares.
struct Bench {
    signatures: f64,
    ticks: f64,
    events: u64,
    concurrency: u64,
    rate: u64,
    latency_secs: u64,
    wrk: PathBuf,
    wrk_load: WrkLoad,
    dir: TempDir,
    rows: Vec<Row>,
}

impl Bench {
    /// The latency phases' rate and duration.
    fn fixed_rate(&self) -> (u64, u64) {
        (self.rate, self.latency_secs)
    }

    fn ms_per_signature(&self) -> f64 {
        1000.0 / self.signatures
    }

    /// `rate` and its ratio to one core's signatures/s.
    fn rate(&self, rate: f64) -> String {
        format!("{rate:.0} ({:.2} sig)", rate / self.signatures)
    }

    fn section(&mut self, name: &str) {
        self.row(name, "", "");
    }

    fn row(&mut self, name: impl Into<String>, in_process: impl Into<String>, nginx: impl Into<String>) {
        self.rows.push(Row { name: name.into(), in_process: in_process.into(), nginx: nginx.into(), goal: None });
    }

    fn row_with_goal(&mut self, name: impl Into<String>, in_process: String, nginx: String, goal: Option<Goal>) {
        self.rows.push(Row { name: name.into(), in_process, nginx, goal });
    }

    fn summary(&self) {
        let width = |f: &dyn Fn(&Row) -> usize| self.rows.iter().map(f).max().unwrap_or(0);
        let name_w = width(&|r: &Row| r.name.len()).max(6);
        let in_w = width(&|r: &Row| r.in_process.len()).max("in-process".len());
        let ng_w = width(&|r: &Row| r.nginx.len()).max("nginx".len());
        out("");
        let scheme = scheme().unwrap_or_default();
        out(&format!(
            "summary  (endpoints sign with `{scheme}`; N sig = the figure ÷ one core's RSA-2048 signatures/s; nginx \
             arrival times have ms resolution)"
        ));
        out(&format!(
            "{:name_w$}  {:>in_w$}  {:>ng_w$}  target (on the nginx figure where there is one)",
            "figure", "in-process", "nginx"
        ));
        for row in &self.rows {
            let goal = match &row.goal {
                Some(goal) => format!("{}: {}", goal.text, if goal.met { "met" } else { "not met" }),
                None => String::new(),
            };
            out(format!("{:name_w$}  {:>in_w$}  {:>ng_w$}  {goal}", row.name, row.in_process, row.nginx).trim_end());
        }
    }
}

/// Figures of one drain: ingest into a stopped system, then dispatchers on
/// the full queue.
struct Drain {
    ingest_per_s: f64,
    per_s: f64,
    cpu_ms_per_delivery: f64,
    /// The cores PostgreSQL and RabbitMQ used meanwhile, as text.
    shared: String,
}

/// The settings a phase of the distributed stack needs.
struct Distributed<'a> {
    stack: &'a Stack,
    /// The bench's database, whose PostgreSQL processes are counted.
    database: &'a str,
    client: &'a reqwest::Client,
    ingest_url: &'a str,
    pool: &'a sqlx::PgPool,
}

/// `quota`: each dispatcher capped to that many cores ([`CpuCap`]).
async fn drain(
    bench: &Bench,
    system: &Distributed<'_>,
    target: &Target,
    (dispatchers, quota): (usize, Option<f64>),
) -> anyhow::Result<Drain> {
    let (events, ticks) = (bench.events, bench.ticks);
    let base = target.arrivals.count();
    let started = Instant::now();
    ingest(system.client, system.ingest_url, &target.developer_id, events, bench.concurrency).await?;
    let ingest_per_s = events as f64 / started.elapsed().as_secs_f64();
    wait_outbox_empty(system.pool).await?;
    let children = system.stack.spawn_dispatchers_at(dispatchers).await?;
    let pids: Vec<u32> = children.iter().filter_map(|(child, _)| child.id()).collect();
    let caps = match quota {
        Some(cores) => pids.iter().map(|pid| CpuCap::new(*pid, cores)).collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let cpu = || pids.iter().map(|pid| cpu_seconds(*pid, ticks)).sum::<f64>();
    let shared = || (cpu_of_postgres(system.database, ticks), cpu_of_named(&["beam.smp"], ticks));
    wait_count(&target.arrivals, base + 1, Duration::from_secs(60)).await?;
    let (t0, cpu0, shared0, n0) = (Instant::now(), cpu(), shared(), target.arrivals.count());
    wait_count(&target.arrivals, base + events, Duration::from_secs(1800)).await?;
    let (elapsed, cpu, (pg, mq)) = (t0.elapsed().as_secs_f64(), cpu() - cpu0, shared());
    let shared =
        format!("postgres {:.2} cores, rabbitmq {:.2} cores", (pg - shared0.0) / elapsed, (mq - shared0.1) / elapsed);
    let drained = (base + events).saturating_sub(n0) as f64;
    // Messages put back rather than attempted: a drain should have none.
    let mut put_back = 0.0;
    for (child, port) in children {
        for outcome in ["deferred", "set_aside", "parked"] {
            put_back += dispatcher_outcome(system.client, port, outcome).await?;
        }
        stop(child).await;
    }
    drop(caps);
    let per = |x: f64| if drained > 0.0 { x / drained } else { f64::NAN };
    let drain = Drain { ingest_per_s, per_s: drained / elapsed, cpu_ms_per_delivery: per(cpu) * 1000.0, shared };
    let capped = quota.map(|cores| format!(" of {cores} core")).unwrap_or_default();
    out(&format!(
        "drain, {dispatchers} dispatcher(s){capped}, to {}: {:.0} deliveries/s ({:.2} sig), dispatcher CPU {:.3} ms per delivery = {:.2} x one signature; {put_back} messages put back; {}",
        target.side.name(),
        drain.per_s,
        drain.per_s / bench.signatures,
        drain.cpu_ms_per_delivery,
        drain.cpu_ms_per_delivery / bench.ms_per_signature(),
        drain.shared
    ));
    Ok(drain)
}

/// A dispatcher's count of messages that ended with `outcome`, from its
/// metrics at `port`.
async fn dispatcher_outcome(client: &reqwest::Client, port: u16, outcome: &str) -> anyhow::Result<f64> {
    let text = client.get(format!("http://127.0.0.1:{port}/metrics")).send().await?.text().await?;
    let name = format!("webhooks_dispatcher_deliveries_total{{outcome=\"{outcome}\"}}");
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(name.as_str()).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0))
}

/// Figures of the fairness phase.
struct Fairness {
    /// Developer B's request start → received.
    quiet: Latency,
    /// Developer A's backlog, deliveries/s.
    backlog_per_s: f64,
    /// A's deliveries still waiting when B's last event arrived.
    backlog_left: u64,
}

/// When developer A's backlog is sent in the fairness phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backlog {
    /// While B sends, with the dispatcher running.
    Live,
    /// All of it before the dispatcher starts (a backlog built during an
    /// outage), then B sends.
    Before,
}

/// Fairness: with one dispatcher running, developer A sends `backlog`
/// events as fast as the API takes them (faster than they can be
/// delivered, so most wait in the queue) while developer B sends `rate`
/// events/s for `secs`; or A's backlog waits in full when the dispatcher
/// starts. B's latency, and how fast A's backlog drains.
async fn fairness(
    system: &Distributed<'_>,
    (backlog, concurrency, when): (u64, u64, Backlog),
    (rate, secs): (u64, u64),
    busy: &Target,
    quiet: &Target,
) -> anyhow::Result<Fairness> {
    let base = busy.arrivals.count();
    let label = match when {
        Backlog::Live => "fairness: ",
        Backlog::Before => {
            ingest(system.client, system.ingest_url, &busy.developer_id, backlog, concurrency).await?;
            wait_outbox_empty(system.pool).await?;
            "fairness, backlog first: "
        }
    };
    let dispatcher = system.stack.spawn_dispatchers(1).await?;
    let started = Instant::now();
    let send_backlog = async {
        match when {
            Backlog::Live => ingest(system.client, system.ingest_url, &busy.developer_id, backlog, concurrency).await,
            Backlog::Before => Ok(()),
        }
    };
    let (_, quiet) =
        tokio::try_join!(send_backlog, latency(label, (rate, secs), system.client, system.ingest_url, quiet))?;
    let backlog_left = (base + backlog).saturating_sub(busy.arrivals.count());
    wait_count(&busy.arrivals, base + backlog, Duration::from_secs(1200)).await?;
    let backlog_per_s = backlog as f64 / started.elapsed().as_secs_f64();
    for child in dispatcher {
        stop(child).await;
    }
    out(&format!(
        "{label}A's {backlog} events delivered at {backlog_per_s:.0}/s, {backlog_left} waiting when B's last event arrived"
    ));
    Ok(Fairness { quiet, backlog_per_s, backlog_left })
}

/// Figures of the isolation phase.
struct Isolation {
    alone_per_s: f64,
    beside_hanging_per_s: f64,
    /// Messages for the hanging endpoints parked (deferred) in a retry queue
    /// during the run, per such message.
    parks_each: f64,
    /// Messages for the hanging endpoints set aside in the store, per such
    /// message.
    aside_each: f64,
    /// Attempts the hanging endpoints received (each hung to the timeout).
    hanging_attempts: usize,
}

/// The healthy half of the isolation phase: a developer whose `endpoints`
/// all lead to the in-process receiver.
struct Healthy<'a> {
    arrivals: &'a Arrivals,
    developer_id: &'a str,
    endpoints: u64,
}

/// Isolation: the healthy developer's deliveries drain alone, then again
/// beside as many for a developer whose endpoints all hang until
/// `DELIVERY_TIMEOUT`, each time with a fresh dispatcher on the full queue.
async fn isolation(
    bench: &Bench,
    system: &Distributed<'_>,
    healthy: &Healthy<'_>,
    hanging_developer: &str,
    hanging: &tests::Receiver,
) -> anyhow::Result<Isolation> {
    let events = (bench.events / healthy.endpoints).max(1);
    let deliveries = events * healthy.endpoints;
    let run = async |beside: bool| -> anyhow::Result<(f64, f64, f64)> {
        let base = healthy.arrivals.count();
        let others = async {
            match beside {
                true => ingest(system.client, system.ingest_url, hanging_developer, events, bench.concurrency).await,
                false => Ok(()),
            }
        };
        tokio::try_join!(
            ingest(system.client, system.ingest_url, healthy.developer_id, events, bench.concurrency),
            others
        )?;
        wait_outbox_empty(system.pool).await?;
        let mut dispatcher = system.stack.spawn_dispatchers_at(1).await?;
        let (child, port) = dispatcher.pop().context("a dispatcher")?;
        wait_count(healthy.arrivals, base + 1, Duration::from_secs(60)).await?;
        let (t0, n0) = (Instant::now(), healthy.arrivals.count());
        wait_count(healthy.arrivals, base + deliveries, Duration::from_secs(600)).await?;
        let per_s = (base + deliveries).saturating_sub(n0) as f64 / t0.elapsed().as_secs_f64();
        let parked = dispatcher_outcome(system.client, port, "deferred").await?;
        let aside = dispatcher_outcome(system.client, port, "set_aside").await?;
        stop(child).await;
        Ok((per_s, parked, aside))
    };
    let (alone_per_s, _, _) = run(false).await?;
    let (beside_hanging_per_s, parked, aside) = run(true).await?;
    let isolation = Isolation {
        alone_per_s,
        beside_hanging_per_s,
        parks_each: parked / deliveries as f64,
        aside_each: aside / deliveries as f64,
        hanging_attempts: hanging.count(),
    };
    out(&format!(
        "isolation: {} healthy endpoints, {deliveries} deliveries: {alone_per_s:.0}/s alone, {beside_hanging_per_s:.0}/s beside {} hanging ones ({:.2} of alone); hanging endpoints got {} attempts, their messages were parked {:.2} and set aside {:.2} times each",
        healthy.endpoints,
        healthy.endpoints,
        beside_hanging_per_s / alone_per_s,
        isolation.hanging_attempts,
        isolation.parks_each,
        isolation.aside_each
    ));
    Ok(isolation)
}

/// Figures of the pace phase.
struct Pace {
    /// Deliveries per second from the first arrival to the last.
    per_s: f64,
    /// How far that is from the limit, in percent.
    error_pct: f64,
    /// The most deliveries that arrived within any one second.
    busiest: usize,
}

/// Pace: `events` deliveries to one endpoint paced at `limit` per second,
/// all sent before two dispatchers start on them together: the rate the
/// receiver sees, and its busiest second.
async fn pace(
    system: &Distributed<'_>,
    receiver: &tests::Receiver,
    developer_id: &str,
    (limit, events, concurrency): (u64, u64, u64),
) -> anyhow::Result<Pace> {
    ingest(system.client, system.ingest_url, developer_id, events, concurrency).await?;
    wait_outbox_empty(system.pool).await?;
    let dispatchers = system.stack.spawn_dispatchers_at(2).await?;
    let expected = usize::try_from(events)?;
    let requests = receiver.wait_for_within(expected, Duration::from_secs(events / limit * 3 + 60)).await?;
    // Messages put back to wait for their start, or for a slot.
    let (mut paced, mut deferred) = (0.0, 0.0);
    for (child, port) in dispatchers {
        paced += dispatcher_outcome(system.client, port, "paced").await?;
        deferred += dispatcher_outcome(system.client, port, "deferred").await?;
        stop(child).await;
    }
    let mut at: Vec<i64> = requests.iter().map(tests::RecordedRequest::received_at_ms).collect();
    at.sort_unstable();
    let span_s = (at[at.len() - 1] - at[0]) as f64 / 1000.0;
    let per_s = (at.len() - 1) as f64 / span_s;
    let busiest = (0..at.len()).map(|i| at[i..].partition_point(|&t| t < at[i] + 1000)).max().unwrap_or(0);
    let error_pct = (per_s / limit as f64 - 1.0) * 100.0;
    out(&format!(
        "pace: one endpoint at {limit}/s, two dispatchers, {} deliveries: {per_s:.1}/s from first to last ({error_pct:+.1}% of the limit), at most {busiest} within one second; {paced} messages put back to wait for their start, {deferred} for a slot",
        at.len()
    ));
    Ok(Pace { per_s, error_pct, busiest })
}

/// Figures of a saturated end-to-end run.
struct EndToEnd {
    per_s: f64,
    /// CPU seconds per 1,000 events, by part, as `parts` names them.
    cpu_per_1000: Vec<f64>,
    /// The dispatcher's (or standalone's) CPU per delivery, ÷ one signature.
    dispatcher_signatures: f64,
}

impl EndToEnd {
    fn stack_cpu(&self) -> f64 {
        self.cpu_per_1000.iter().sum()
    }
}

/// CPU seconds so far of the processes of a stack, by part.
struct Parts<'a> {
    names: &'a [&'a str],
    /// Which part is the dispatcher (or standalone's one process).
    dispatcher: usize,
    read: &'a dyn Fn() -> Vec<f64>,
    /// The database of the distributed stack, whose work per event is counted.
    pool: Option<&'a sqlx::PgPool>,
}

/// PostgreSQL's counters so far: transactions committed in the bench's
/// database, and the server's WAL bytes and WAL flushes (`pg_stat_wal`).
struct PgCounters {
    commits: f64,
    wal_bytes: f64,
    wal_syncs: f64,
}

async fn pg_counters(pool: Option<&sqlx::PgPool>) -> anyhow::Result<Option<PgCounters>> {
    let Some(pool) = pool else { return Ok(None) };
    let (commits, wal_bytes, wal_syncs): (f64, f64, f64) = sqlx::query_as(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::float8,
                wal_bytes::float8, wal_sync::float8 FROM pg_stat_wal",
    )
    .fetch_one(pool)
    .await?;
    Ok(Some(PgCounters { commits, wal_bytes, wal_syncs }))
}

/// Runs wrk against `ingest_url` for `target`'s developer, waits for every
/// accepted event to arrive, and prints events/s and CPU per 1,000 events.
async fn wrk_end_to_end(
    bench: &Bench,
    label: &str,
    ingest_url: &str,
    target: &Target,
    parts: &Parts<'_>,
) -> anyhow::Result<EndToEnd> {
    let base = target.arrivals.count();
    let cpu0 = (parts.read)();
    let pg0 = pg_counters(parts.pool).await?;
    let tag = tests::random_suffix();
    let run =
        outside::wrk(&bench.wrk, bench.dir.path(), ingest_url, &target.developer_id, &tag, bench.wrk_load).await?;
    if run.accepted == 0 {
        bail!("wrk got no event accepted ({} other answers): {}", run.refused, run.summary.join("; "));
    }
    let limit = Duration::from_secs(600);
    wait_count(&target.arrivals, base + run.accepted, limit)
        .await
        .with_context(|| format!("after wrk ({} accepted)", run.accepted))?;
    let cpu1 = (parts.read)();
    let counted = target.arrivals.count() - base;
    settle(&target.arrivals).await;
    // After a second without arrivals: PostgreSQL has published its
    // backends' statistics (at most a second old) by now.
    let pg1 = pg_counters(parts.pool).await?;
    let received = target.arrivals.count() - base;
    let last_ms = target.arrivals.last_ms().unwrap_or(f64::NAN);
    let per_s = received as f64 / ((last_ms - run.started_ms) / 1000.0);
    let cpu_per_1000: Vec<f64> =
        cpu1.iter().zip(&cpu0).map(|(after, before)| (after - before) / counted as f64 * 1000.0).collect();
    let e2e = EndToEnd {
        per_s,
        dispatcher_signatures: cpu_per_1000[parts.dispatcher] / bench.ms_per_signature(),
        cpu_per_1000,
    };
    let by_part: Vec<String> = parts.names.iter().zip(&e2e.cpu_per_1000).map(|(n, c)| format!("{n} {c:.3}")).collect();
    out(&format!(
        "{label}end to end, wrk ({}s, {} threads, {} connections) to {}: {} accepted, {} refused; {received} received; {:.0} events/s ({:.2} sig)",
        bench.wrk_load.secs,
        bench.wrk_load.threads,
        bench.wrk_load.connections,
        target.side.name(),
        run.accepted,
        run.refused,
        e2e.per_s,
        e2e.per_s / bench.signatures
    ));
    out(&format!("    wrk: {}", run.summary.join("; ")));
    out(&format!(
        "    CPU s per 1,000 events: {:.3} ({}); {} per delivery = {:.2} x one signature",
        e2e.stack_cpu(),
        by_part.join(", "),
        parts.names[parts.dispatcher],
        e2e.dispatcher_signatures
    ));
    if let (Some(before), Some(after)) = (pg0, pg1) {
        let per_event = |a: f64, b: f64| (a - b) / received as f64;
        out(&format!(
            "    PostgreSQL per event: {:.2} commits, {:.2} WAL flushes, {:.0} WAL bytes",
            per_event(after.commits, before.commits),
            per_event(after.wal_syncs, before.wal_syncs),
            per_event(after.wal_bytes, before.wal_bytes),
        ));
    }
    Ok(e2e)
}

/// Latencies of a fixed-rate run, milliseconds, each sorted.
struct Latency {
    /// Ingest request start → received.
    total: Vec<f64>,
    /// Ingest request start → its answer.
    ingest: Vec<f64>,
    /// Answer → received.
    after: Vec<f64>,
}

/// One ingest request of a fixed-rate run: its start and its answer by wall
/// clock, its duration by the monotonic clock, and the event it made.
struct Sent {
    started_ms: f64,
    answered_ms: f64,
    call_ms: f64,
    id: String,
}

/// Ingests `rate` events per second for `secs` and waits for
/// them to arrive at `target`.
async fn latency(
    label: &str,
    (rate, secs): (u64, u64),
    client: &reqwest::Client,
    ingest_url: &str,
    target: &Target,
) -> anyhow::Result<Latency> {
    let total = rate * secs;
    let base = target.arrivals.count();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut requests = Vec::with_capacity(total as usize);
    for n in 0..total {
        ticker.tick().await;
        let (client, url, developer_id, sent) =
            (client.clone(), ingest_url.to_owned(), target.developer_id.clone(), sent.clone());
        requests.push(tokio::spawn(async move {
            let (started_ms, started) = (wall_ms(), Instant::now());
            let response = client.post(&url).json(&event_body(&developer_id, n)).send().await?;
            let (call_ms, answered_ms) = (started.elapsed().as_secs_f64() * 1000.0, wall_ms());
            if response.status() != 201 {
                bail!("ingest answered {}", response.status());
            }
            let event: Value = response.json().await?;
            let id = event["event_id"].as_str().context("event_id in the ingest answer")?.to_owned();
            sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Sent {
                started_ms,
                answered_ms,
                call_ms,
                id,
            });
            Ok::<_, anyhow::Error>(())
        }));
    }
    for request in requests {
        request.await??;
    }
    wait_count(&target.arrivals, base + total, Duration::from_secs(120)).await?;
    let sent = sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut latency = Latency { total: Vec::new(), ingest: Vec::new(), after: Vec::new() };
    target.arrivals.with(|at| {
        for sent in sent.iter() {
            if let Some(received) = at.get(&sent.id) {
                latency.total.push(received - sent.started_ms);
                latency.ingest.push(sent.call_ms);
                latency.after.push(received - sent.answered_ms);
            }
        }
    });
    for list in [&mut latency.total, &mut latency.ingest, &mut latency.after] {
        list.sort_by(f64::total_cmp);
    }
    let p = |list: &[f64], q: f64| percentile(list, q);
    out(&format!(
        "{label}latency at {rate} events/s to {}: start -> received p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        target.side.name(),
        p(&latency.total, 50.0),
        p(&latency.total, 90.0),
        p(&latency.total, 99.0),
        p(&latency.total, 100.0),
    ));
    out(&format!(
        "    ingest call p50 {:.2} ms, p99 {:.2} ms; answer -> received p50 {:.2} ms, p99 {:.2} ms{}",
        p(&latency.ingest, 50.0),
        p(&latency.ingest, 99.0),
        p(&latency.after, 50.0),
        p(&latency.after, 99.0),
        if target.side == Side::Nginx { " (arrivals: nginx $msec, ms resolution)" } else { "" }
    ));
    Ok(latency)
}

/// The latency rows of the table, for the in-process receiver and nginx.
fn latency_rows(bench: &mut Bench, in_process: &Latency, nginx: &Latency) {
    let cell = |list: &[f64], q: f64| format!("{:.2} ms", percentile(list, q));
    let rate = bench.rate;
    let (p50, p99) = (percentile(&nginx.total, 50.0), percentile(&nginx.total, 99.0));
    bench.row_with_goal(
        format!("  latency at {rate}/s, start -> received p50"),
        cell(&in_process.total, 50.0),
        cell(&nginx.total, 50.0),
        goal("<= 2 ms", p50, |v| v <= 2.0),
    );
    bench.row("    p90", cell(&in_process.total, 90.0), cell(&nginx.total, 90.0));
    bench.row_with_goal(
        "    p99",
        cell(&in_process.total, 99.0),
        cell(&nginx.total, 99.0),
        goal("<= 5 ms", p99, |v| v <= 5.0),
    );
    bench.row("    max", cell(&in_process.total, 100.0), cell(&nginx.total, 100.0));
    for (name, q) in [("p50", 50.0), ("p99", 99.0)] {
        bench.row(format!("    ingest call {name}"), cell(&in_process.ingest, q), cell(&nginx.ingest, q));
    }
    for (name, q) in [("p50", 50.0), ("p99", 99.0)] {
        bench.row(format!("    answer -> received {name}"), cell(&in_process.after, q), cell(&nginx.after, q));
    }
}

/// The rows of the wrk runs; `dispatcher` names the process whose CPU per
/// delivery is shown.
fn wrk_rows(bench: &mut Bench, dispatcher: &str, in_process: Option<&EndToEnd>, nginx: &EndToEnd) {
    let or_blank = |e: Option<&EndToEnd>, f: &dyn Fn(&EndToEnd) -> String| e.map(f).unwrap_or_default();
    let in_rate = or_blank(in_process, &|e| bench.rate(e.per_s));
    bench.row_with_goal(
        "  end to end, wrk: events/s",
        in_rate,
        bench.rate(nginx.per_s),
        goal(">= 3,000/s", nginx.per_s, |v| v >= 3000.0),
    );
    bench.row_with_goal(
        "    whole stack CPU s per 1,000 events",
        or_blank(in_process, &|e| format!("{:.3}", e.stack_cpu())),
        format!("{:.3}", nginx.stack_cpu()),
        goal("<= 0.6 s", nginx.stack_cpu(), |v| v <= 0.6),
    );
    bench.row(
        format!("    {dispatcher} CPU per delivery"),
        or_blank(in_process, &|e| format!("{:.2} x sig", e.dispatcher_signatures)),
        format!("{:.2} x sig", nginx.dispatcher_signatures),
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    scheme().map_err(anyhow::Error::msg)?;
    let events = knob("BENCH_EVENTS", 10_000);
    let concurrency = knob("BENCH_CONCURRENCY", 32);
    let wrk_load = WrkLoad {
        secs: knob("BENCH_WRK_SECS", 20).max(1),
        threads: knob("BENCH_WRK_THREADS", 2).max(1),
        connections: knob("BENCH_WRK_CONNECTIONS", 32).max(1),
    };
    let ticks = clock_ticks();
    let bin = std::env::current_exe()?.parent().map(Path::to_path_buf).context("binary directory")?;
    for program in ["webhooks-api", "webhooks-dispatcher"] {
        if !bin.join(program).exists() {
            bail!("{} is missing: run `cargo build --release --workspace --bins` first", bin.join(program).display());
        }
    }

    // The outside parts: installed first, so a failure shows before the long phases.
    let mut installer = Installer::default();
    let nginx_bin = installer.ensure("nginx", &["nginx-light", "nginx"], &out).await?;
    let wrk = installer.ensure("wrk", &["wrk"], &out).await?;

    let (signatures, per_wall_second) = tokio::task::spawn_blocking(move || signatures_per_second(ticks)).await??;
    out(&format!(
        "rsa-2048 signatures/s (one core):      {signatures:.0}  ({:.3} ms each; per CPU second of the signing thread, {per_wall_second:.0} per wall second)",
        1000.0 / signatures
    ));
    let mut bench = Bench {
        signatures,
        ticks,
        events,
        concurrency,
        rate: knob("BENCH_RATE", 200).max(1),
        latency_secs: knob("BENCH_LATENCY_SECS", 15).max(1),
        wrk,
        wrk_load,
        dir: TempDir::new("webhooks-bench")?,
        rows: Vec::new(),
    };
    bench.row("rsa-2048 signatures/s, one core", format!("{signatures:.0} ({:.3} ms each)", 1000.0 / signatures), "");

    let database = TestDatabase::create().await?;
    let ca = TestCa::new()?;
    let (receiver_port, in_process_arrivals) = start_receiver(&ca).await?;
    let nginx = Nginx::start(&nginx_bin, &ca, &bench.dir.path().join("nginx")).await?;
    let clock = nginx.clock_check(&ca, 20).await?;
    out(&format!(
        "{} on 127.0.0.1:{}; clock check, {} requests: $msec - request start from {:.2} to {:.2} ms, {} outside [start - 1 ms, answer + 1 ms]",
        nginx.version(),
        nginx.port(),
        clock.probes,
        clock.min_ms,
        clock.max_ms,
        clock.outside
    ));
    if clock.outside > 0 {
        out("    warning: nginx's $msec and the bench's wall clock disagree: its latencies are not to be trusted");
    }

    let prefix = random_prefix();
    // Its queues go at the end, or when the bench fails: a left-over backlog
    // in a quorum queue would weigh on every later run.
    let schedule: webhooks_model::RetrySchedule =
        webhooks_model::DEFAULT_RETRY_SCHEDULE.parse().map_err(anyhow::Error::msg)?;
    let queues = QueueCleanup::new(&amqp_url(), &prefix, &schedule);
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
            // The isolation phase's developers have more endpoints than the default allows.
            ("MAX_ENDPOINTS_PER_DEVELOPER".into(), "64".into()),
        ],
        api_url: format!("http://127.0.0.1:{api_port}/v0"),
        internal_url: format!("http://127.0.0.1:{internal_port}"),
    };
    let api = stack.command("webhooks-api").arg("serve").spawn().context("start webhooks-api")?;
    let api_pid = api.id().unwrap_or_default();
    wait_ready(&format!("{}/readyz", stack.internal_url)).await?;

    let client = bench_client()?;
    let (key, developer_id) = create_key(stack.command("webhooks-api"), "bench").await?;
    active_endpoint(&client, &stack.api_url, &key, &hook(receiver_port)).await?;
    let (nginx_key, nginx_developer_id) = create_key(stack.command("webhooks-api"), "bench-nginx").await?;
    active_endpoint(&client, &stack.api_url, &nginx_key, &hook(nginx.port())).await?;
    let in_process =
        Target { side: Side::InProcess, arrivals: in_process_arrivals.clone(), developer_id, pid: std::process::id() };
    let to_nginx =
        Target { side: Side::Nginx, arrivals: nginx.arrivals(), developer_id: nginx_developer_id, pid: nginx.pid() };
    let ingest_url = format!("{}/internal/events", stack.internal_url);
    let pool = sqlx::PgPool::connect(database.url()).await?;
    let system =
        Distributed { stack: &stack, database: database.name(), client: &client, ingest_url: &ingest_url, pool: &pool };

    // 2. Drain: ingest with no dispatcher (the queue fills), then one or two
    // dispatchers on the full queue.
    bench.section("distributed: api, dispatcher(s), PostgreSQL, RabbitMQ");
    let mut drained_alone = None;
    if phase("drain") {
        let one_in = drain(&bench, &system, &in_process, (1, None)).await?;
        drained_alone = Some(one_in.per_s);
        out(&format!(
            "ingest events/s ({concurrency} in flight):        {:.0}  ({:.2} sig)",
            one_in.ingest_per_s,
            one_in.ingest_per_s / signatures
        ));
        let one_ng = drain(&bench, &system, &to_nginx, (1, None)).await?;
        let two_in = drain(&bench, &system, &in_process, (2, None)).await?;
        let two_ng = drain(&bench, &system, &to_nginx, (2, None)).await?;
        out(&format!(
            "two dispatchers / one: {:.2} to the in-process receiver, {:.2} to nginx",
            two_in.per_s / one_in.per_s,
            two_ng.per_s / one_ng.per_s
        ));
        bench.row(
            format!("  ingest events/s ({concurrency} in flight)"),
            bench.rate(one_in.ingest_per_s),
            bench.rate(one_ng.ingest_per_s),
        );
        bench.row("  drain, one dispatcher: deliveries/s", bench.rate(one_in.per_s), bench.rate(one_ng.per_s));
        let ms_per_signature = bench.ms_per_signature();
        let signatures_each = |d: &Drain| d.cpu_ms_per_delivery / ms_per_signature;
        bench.row_with_goal(
            "    dispatcher CPU per delivery",
            format!("{:.3} ms = {:.2} x sig", one_in.cpu_ms_per_delivery, signatures_each(&one_in)),
            format!("{:.3} ms = {:.2} x sig", one_ng.cpu_ms_per_delivery, signatures_each(&one_ng)),
            goal("<= 1.3 x sig", signatures_each(&one_ng), |v| v <= 1.3),
        );
        bench.row("  drain, two dispatchers: deliveries/s", bench.rate(two_in.per_s), bench.rate(two_ng.per_s));
        bench.row(
            "    dispatcher CPU per delivery",
            format!("{:.2} x sig", signatures_each(&two_in)),
            format!("{:.2} x sig", signatures_each(&two_ng)),
        );
        let (ratio_in, ratio_ng) = (two_in.per_s / one_in.per_s, two_ng.per_s / one_ng.per_s);
        bench.row_with_goal(
            "    two / one",
            format!("{ratio_in:.2}"),
            format!("{ratio_ng:.2}"),
            goal("two >= one", ratio_ng, |v| v >= 1.0),
        );
    }

    // 3. End to end with one dispatcher: the bench's producer, then wrk.
    let dispatcher = stack.spawn_dispatchers(1).await?.pop().context("a dispatcher")?;
    let dispatcher_pid = dispatcher.id().unwrap_or_default();
    let service_cpu = || {
        vec![
            cpu_seconds(api_pid, ticks),
            cpu_seconds(dispatcher_pid, ticks),
            cpu_of_postgres(database.name(), ticks),
            cpu_of_named(&["beam.smp"], ticks),
        ]
    };
    if phase("e2e") {
        let base = in_process.arrivals.count();
        let (t0, cpu0) = (Instant::now(), service_cpu());
        ingest(&client, &ingest_url, &in_process.developer_id, events, concurrency).await?;
        wait_count(&in_process.arrivals, base + events, Duration::from_secs(600)).await?;
        let elapsed = t0.elapsed().as_secs_f64();
        let per_1000: Vec<f64> =
            service_cpu().iter().zip(cpu0).map(|(after, before)| (after - before) / events as f64 * 1000.0).collect();
        let own_rate = events as f64 / elapsed;
        let own_cpu = per_1000.iter().sum::<f64>();
        out(&format!("end to end events/s:                    {own_rate:.0}  ({:.2} sig)", own_rate / signatures));
        out(&format!(
            "whole stack CPU s per 1,000 events:     {own_cpu:.3}  (api {:.3}, dispatcher {:.3}, postgres {:.3}, rabbitmq {:.3})",
            per_1000[0], per_1000[1], per_1000[2], per_1000[3]
        ));
        bench.row("  end to end, bench's producer: events/s", bench.rate(own_rate), "");
        bench.row("    CPU s per 1,000 events, no receiver", format!("{own_cpu:.3}"), "");

        let names = ["api", "dispatcher", "postgres", "rabbitmq", "receiver"];
        let with_receiver = |target: &Target| {
            let mut parts = service_cpu();
            parts.push(target.cpu(ticks));
            parts
        };
        let read_in = || with_receiver(&in_process);
        let read_ng = || with_receiver(&to_nginx);
        let e2e_in = wrk_end_to_end(
            &bench,
            "",
            &ingest_url,
            &in_process,
            &Parts { names: &names, dispatcher: 1, read: &read_in, pool: Some(&pool) },
        )
        .await?;
        let e2e_ng = wrk_end_to_end(
            &bench,
            "",
            &ingest_url,
            &to_nginx,
            &Parts { names: &names, dispatcher: 1, read: &read_ng, pool: Some(&pool) },
        )
        .await?;
        wrk_rows(&mut bench, "dispatcher", Some(&e2e_in), &e2e_ng);
    }

    // 4. Latency at a fixed rate.
    if phase("latency") {
        let latency_in = latency("", bench.fixed_rate(), &client, &ingest_url, &in_process).await?;
        let latency_ng = latency("", bench.fixed_rate(), &client, &ingest_url, &to_nginx).await?;
        latency_rows(&mut bench, &latency_in, &latency_ng);
    }

    stop(dispatcher).await;

    // 5. Fairness: one developer's backlog, another's events at a low rate.
    for (name, when) in [("fairness", Backlog::Live), ("backlog", Backlog::Before)] {
        if !phase(name) {
            continue;
        }
        let backlog = knob("BENCH_BACKLOG", 50_000).max(1);
        let rate = knob("BENCH_FAIR_RATE", 20).max(1);
        let sizes = (backlog, concurrency, when);
        let fair = fairness(&system, sizes, (rate, bench.latency_secs), &in_process, &to_nginx).await?;
        let (p50, p99) = (percentile(&fair.quiet.total, 50.0), percentile(&fair.quiet.total, 99.0));
        let how = match when {
            Backlog::Live => "beside A's backlog of",
            Backlog::Before => "beside A's backlog, all sent first, of",
        };
        bench.row_with_goal(
            format!("  fairness: B at {rate}/s {how} {backlog}, p50"),
            String::new(),
            format!("{p50:.2} ms"),
            goal("<= 50 ms", p50, |v| v <= 50.0),
        );
        bench.row_with_goal("    p99", String::new(), format!("{p99:.2} ms"), goal("<= 1 s", p99, |v| v <= 1000.0));
        let full_speed = drained_alone.map(|alone| format!(" = {:.2} x drain", fair.backlog_per_s / alone));
        bench.row(
            "    A's backlog, deliveries/s",
            format!("{}{}", bench.rate(fair.backlog_per_s), full_speed.unwrap_or_default()),
            "",
        );
        bench.row("    A's deliveries waiting at B's last arrival", fair.backlog_left.to_string(), "");
    }

    // 6. Isolation: healthy endpoints beside as many hanging ones.
    if phase("isolation") {
        let endpoints = knob("BENCH_ISOLATION_ENDPOINTS", 8).clamp(1, 50);
        let (healthy_key, healthy_developer) = create_key(stack.command("webhooks-api"), "bench-healthy").await?;
        let (hanging_key, hanging_developer) = create_key(stack.command("webhooks-api"), "bench-hanging").await?;
        let hanging = tests::Receiver::start(&ca).await?;
        for n in 0..endpoints {
            let healthy_url = format!("{}/h{n}", hook(receiver_port));
            active_endpoint(&client, &stack.api_url, &healthy_key, &healthy_url).await?;
            let hanging_url = format!("{}/x{n}", hook(hanging.port()));
            active_endpoint(&client, &stack.api_url, &hanging_key, &hanging_url).await?;
        }
        // Registered while it answered; from now on it never does.
        hanging.reply_always(tests::Reply::hang());
        let healthy = Healthy { arrivals: &in_process_arrivals, developer_id: &healthy_developer, endpoints };
        let isolated = isolation(&bench, &system, &healthy, &hanging_developer, &hanging).await?;
        let kept = isolated.beside_hanging_per_s / isolated.alone_per_s;
        bench.row(
            format!("  isolation: {endpoints} healthy endpoints alone, deliveries/s"),
            bench.rate(isolated.alone_per_s),
            "",
        );
        bench.row(format!("    beside {endpoints} hanging endpoints"), bench.rate(isolated.beside_hanging_per_s), "");
        bench.row_with_goal("    kept", format!("{kept:.2}"), String::new(), goal(">= 0.90", kept, |v| v >= 0.9));
        bench.row("    parks per hanging delivery", format!("{:.2}", isolated.parks_each), "");
        bench.row("    set aside per hanging delivery", format!("{:.2}", isolated.aside_each), "");
        bench.row("    attempts the hanging endpoints got", isolated.hanging_attempts.to_string(), "");
    }

    // 7. Pace: one paced endpoint, two dispatchers.
    if phase("pace") {
        let limit = knob("BENCH_PACE", 50).max(1);
        let (paced_key, paced_developer) = create_key(stack.command("webhooks-api"), "bench-paced").await?;
        let paced = tests::Receiver::start(&ca).await?;
        let endpoint_id = active_endpoint(&client, &stack.api_url, &paced_key, &paced.url()).await?;
        client
            .put(format!("{}/webhooks/{endpoint_id}", stack.api_url))
            .header("Api-Key", &paced_key)
            .json(&json!({"rate_limit_per_second": limit}))
            .send()
            .await?
            .error_for_status()?;
        let paced = pace(&system, &paced, &paced_developer, (limit, limit * 10, concurrency)).await?;
        bench.row(
            format!("  pace: one endpoint at {limit}/s, two dispatchers, deliveries/s"),
            format!("{:.1} ({:+.1}%)", paced.per_s, paced.error_pct),
            "",
        );
        bench.row("    most within one second", paced.busiest.to_string(), "");
    }

    // 8. Scale-out: dispatchers and API processes, each capped to a small
    // CPU quota like a small machine, against the shared PostgreSQL and
    // RabbitMQ.
    if phase("scale") {
        let quota = knob("BENCH_SCALE_MILLICORES", 100).clamp(10, 4000) as f64 / 1000.0;
        let scale = Scale { stack: &stack, database: database.name(), quota, ticks };
        let mut alone = None;
        for dispatchers in [1, 2, 4] {
            let run = drain(&bench, &system, &in_process, (dispatchers, Some(quota))).await?;
            let one = *alone.get_or_insert(run.per_s);
            let ratio = run.per_s / one;
            let (target, ok): (&'static str, fn(f64) -> bool) = match dispatchers {
                2 => (">= 1.8 x one", |v| v >= 1.8),
                4 => (">= 3.4 x one", |v| v >= 3.4),
                _ => ("", |_| true),
            };
            bench.row_with_goal(
                format!("  scale-out: {dispatchers} dispatcher(s) of {quota} core, deliveries/s"),
                format!("{:.0} = {ratio:.2} x one; {}", run.per_s, run.shared),
                String::new(),
                if target.is_empty() { None } else { goal(target, ratio, ok) },
            );
        }
        let mut alone = None;
        for apis in [1, 2] {
            let run = scale.ingest(&system, &in_process, events, concurrency, apis).await?;
            let one = *alone.get_or_insert(run.per_s);
            let ratio = run.per_s / one;
            bench.row_with_goal(
                format!("  scale-out: {apis} API process(es) of {quota} core, ingest events/s"),
                format!("{:.0} = {ratio:.2} x one; {}", run.per_s, run.shared),
                String::new(),
                if apis == 2 { goal(">= 1.7 x one", ratio, |v| v >= 1.7) } else { None },
            );
        }
    }

    // 9. Recoveries: another developer's ingest beside many recoveries.
    if phase("recovery") {
        let endpoints = knob("BENCH_RECOVERIES", 20).clamp(1, 64);
        let window = knob("BENCH_RECOVERY_EVENTS", 100_000).max(1);
        let rate_secs = (knob("BENCH_FAIR_RATE", 20).max(1), bench.latency_secs);
        let recovering = Recovering { stack: &stack, endpoints, window, receiver_port };
        let figures = recovery(&system, &recovering, rate_secs, concurrency, &to_nginx).await?;
        let cell = |list: &[f64]| format!("{:.2} ms", percentile(list, 99.0));
        let ratio = percentile(&figures.beside.ingest, 99.0) / percentile(&figures.alone.ingest, 99.0);
        bench.row(
            format!("  recovery: B's ingest call p99 at {}/s, alone", rate_secs.0),
            String::new(),
            cell(&figures.alone.ingest),
        );
        bench.row_with_goal(
            format!("    beside {endpoints} recoveries of a {window}-event window"),
            String::new(),
            format!("{} = {ratio:.2} x", cell(&figures.beside.ingest)),
            goal("<= 2 x alone", ratio, |v| v <= 2.0),
        );
        bench.row("    B's start -> received p99 beside them", String::new(), cell(&figures.beside.total));
        bench.row("    deliveries the recoveries queued meanwhile", figures.queued.to_string(), "");
    }

    stop(api).await;
    pool.close().await;
    database.remove().await;
    queues.remove().await;

    // 11. History, when named: a fresh database and thirty days of history.
    if phase_named("history") {
        let context = history::Shared {
            bin: &stack.bin,
            ca: &ca,
            receiver_port,
            in_process_arrivals: &in_process_arrivals,
            nginx: &nginx,
        };
        history::run(&mut bench, &context).await?;
    }

    // 10. Standalone mode: the same end to end and latency, one process.
    if phase("standalone") {
        standalone(&mut bench, &ca, receiver_port, &in_process_arrivals, &nginx).await?;
    }

    if nginx.other_status() > 0 {
        out(&format!("warning: nginx logged {} requests with another status than 200", nginx.other_status()));
    }
    nginx.stop().await;
    bench.summary();
    Ok(())
}

/// What the recovery phase recovers: `endpoints` endpoints of one
/// developer, each missing the same `window` events.
struct Recovering<'a> {
    stack: &'a Stack,
    endpoints: u64,
    window: u64,
    receiver_port: u16,
}

/// Figures of the recovery phase: developer B's latencies alone and beside
/// the recoveries, and how many deliveries these queued while B sent.
struct Recoveries {
    alone: Latency,
    beside: Latency,
    queued: u64,
}

/// Recoveries: developer R's endpoints are disabled while `window` events
/// arrive for each (they wait, upcoming), then switched on and recovered all
/// at once, with one dispatcher running, while developer B sends `rate`
/// events/s to nginx for `secs`: B's ingest call and start -> received,
/// against the same run before the recoveries. The endpoints are deleted at
/// the end, which ends their recoveries and drops what they queued.
async fn recovery(
    system: &Distributed<'_>,
    recovering: &Recovering<'_>,
    (rate, secs): (u64, u64),
    concurrency: u64,
    quiet: &Target,
) -> anyhow::Result<Recoveries> {
    let Recovering { stack, endpoints, window, receiver_port } = *recovering;
    let client = system.client;
    let (key, developer_id) = create_key(stack.command("webhooks-api"), "bench-recovering").await?;
    let mut ids = Vec::new();
    for n in 0..endpoints {
        let url = format!("{}/r{n}", hook(receiver_port));
        let id = active_endpoint(client, &stack.api_url, &key, &url).await?;
        client
            .put(format!("{}/webhooks/{id}", stack.api_url))
            .header("Api-Key", &key)
            .json(&json!({"status": "disabled"}))
            .send()
            .await?
            .error_for_status()?;
        ids.push(id);
    }
    let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let started = Instant::now();
    ingest(client, system.ingest_url, &developer_id, window, concurrency).await?;
    wait_outbox_empty(system.pool).await?;
    out(&format!(
        "recovery: {window} events for {endpoints} disabled endpoints ingested in {:.0} s",
        started.elapsed().as_secs_f64()
    ));

    let dispatcher = stack.spawn_dispatchers(1).await?;
    let alone = latency("recovery, B alone: ", (rate, secs), client, system.ingest_url, quiet).await?;
    let queued_before = queued_deliveries(system.pool, &ids).await?;
    for id in &ids {
        client
            .put(format!("{}/webhooks/{id}", stack.api_url))
            .header("Api-Key", &key)
            .json(&json!({"status": "active"}))
            .send()
            .await?
            .error_for_status()?;
    }
    let recover = |id: String| {
        let (client, url, key, since) =
            (client.clone(), format!("{}/webhooks/{id}/recover", stack.api_url), key.clone(), since.clone());
        async move {
            // One count of a developer's at a time: the others are told
            // when to come back, as any client is.
            loop {
                let response = client
                    .post(&url)
                    .header("Api-Key", &key)
                    .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                    .json(&json!({"since": since}))
                    .send()
                    .await?;
                match response.status().as_u16() {
                    202 => return Ok::<_, anyhow::Error>(()),
                    429 => {
                        let wait = response
                            .headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                            .unwrap_or(1);
                        tokio::time::sleep(Duration::from_secs(wait)).await;
                    }
                    status => bail!("recover answered {status}: {}", response.text().await?),
                }
            }
        }
    };
    futures::future::try_join_all(ids.iter().cloned().map(recover)).await?;
    let beside = latency("recovery, B beside the recoveries: ", (rate, secs), client, system.ingest_url, quiet).await?;
    let queued = queued_deliveries(system.pool, &ids).await?.saturating_sub(queued_before);
    for id in &ids {
        client
            .delete(format!("{}/webhooks/{id}", stack.api_url))
            .header("Api-Key", &key)
            .send()
            .await?
            .error_for_status()?;
    }
    for child in dispatcher {
        stop(child).await;
    }
    out(&format!("recovery: {queued} deliveries queued by the recoveries while B sent"));
    Ok(Recoveries { alone, beside, queued })
}

/// Deliveries to `endpoints` that have been queued or attempted.
async fn queued_deliveries(pool: &sqlx::PgPool, endpoints: &[String]) -> anyhow::Result<u64> {
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM deliveries WHERE endpoint_id = ANY ($1) AND state NOT IN ('held', 'cancelled')",
    )
    .bind(endpoints)
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(count).unwrap_or_default())
}

/// A CPU quota of its own for a process: a cgroup (v1, `cpu` controller)
/// under `/sys/fs/cgroup/cpu`, removed on drop. Needs root.
struct CpuCap {
    dir: PathBuf,
}

impl CpuCap {
    fn new(pid: u32, cores: f64) -> anyhow::Result<CpuCap> {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/cpu/webhooks-bench-{}-{pid}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("create {} (the scale phase needs root and cgroup v1's cpu)", dir.display()))?;
        let period = 100_000u64;
        std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), ((cores * period as f64) as u64).to_string())?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        // Its threads follow: cgroup.procs moves the whole process.
        Ok(CpuCap { dir })
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The scale-out phase's settings.
struct Scale<'a> {
    stack: &'a Stack,
    database: &'a str,
    quota: f64,
    ticks: f64,
}

/// One scale-out run: its rate, and what the shared parts used meanwhile.
struct ScaleRun {
    per_s: f64,
    shared: String,
}

impl Scale<'_> {
    /// What PostgreSQL and RabbitMQ use over `f`, in cores, as text.
    async fn shared_use<T>(
        &self,
        f: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(T, String)> {
        let read = || (cpu_of_postgres(self.database, self.ticks), cpu_of_named(&["beam.smp"], self.ticks));
        let (t0, (pg0, mq0)) = (Instant::now(), read());
        let value = f.await?;
        let (elapsed, (pg, mq)) = (t0.elapsed().as_secs_f64(), read());
        Ok((value, format!("postgres {:.2} cores, rabbitmq {:.2} cores", (pg - pg0) / elapsed, (mq - mq0) / elapsed)))
    }

    /// Ingests `events` through `apis` API processes (the bench's own and
    /// more on ports of their own), each capped to the quota, with
    /// `concurrency` requests in flight split among them.
    async fn ingest(
        &self,
        system: &Distributed<'_>,
        target: &Target,
        events: u64,
        concurrency: u64,
        apis: usize,
    ) -> anyhow::Result<ScaleRun> {
        let mut children = Vec::new();
        let mut urls = Vec::new();
        for _ in 0..apis {
            let (public, internal) = (free_port()?, free_port()?);
            let child = self
                .stack
                .command("webhooks-api")
                .arg("serve")
                .env("API_LISTEN_ADDR", format!("127.0.0.1:{public}"))
                .env("INTERNAL_LISTEN_ADDR", format!("127.0.0.1:{internal}"))
                .spawn()
                .context("start another webhooks-api")?;
            wait_ready(&format!("http://127.0.0.1:{internal}/readyz")).await?;
            urls.push(format!("http://127.0.0.1:{internal}/internal/events"));
            children.push(child);
        }
        let caps: Vec<CpuCap> =
            children.iter().filter_map(Child::id).map(|pid| CpuCap::new(pid, self.quota)).collect::<Result<_, _>>()?;
        let each = events / apis as u64;
        let per_api = (concurrency / apis as u64).max(1);
        let started = Instant::now();
        let ((), shared) = self
            .shared_use(async {
                futures::future::try_join_all(
                    urls.iter().map(|url| ingest(system.client, url, &target.developer_id, each, per_api)),
                )
                .await?;
                Ok(())
            })
            .await?;
        let per_s = (each * apis as u64) as f64 / started.elapsed().as_secs_f64();
        for child in children {
            stop(child).await;
        }
        drop(caps);
        // The deliveries of these events go to the in-process receiver with
        // the next dispatcher; wait for the outbox so the next run starts empty.
        wait_outbox_empty(system.pool).await?;
        out(&format!("scale-out: {apis} API process(es) of {} core: {per_s:.0} events/s; {shared}", self.quota));
        Ok(ScaleRun { per_s, shared })
    }
}

/// Phase 10: `webhooks-api standalone` on a fresh `DATA_DIR`, delivering to the
/// same receivers.
async fn standalone(
    bench: &mut Bench,
    ca: &TestCa,
    receiver_port: u16,
    arrivals: &Arc<Arrivals>,
    nginx: &Nginx,
) -> anyhow::Result<()> {
    let (events, concurrency, ticks, signatures) = (bench.events, bench.concurrency, bench.ticks, bench.signatures);
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
    active_endpoint(&client, &api_url, &key, &hook(receiver_port)).await?;
    // A second developer for nginx: `keys create` on the same DATA_DIR.
    let mut command = Command::new(bin.join("webhooks-api"));
    command.env("DATA_DIR", &data_dir).env_remove("DATABASE_URL").env("RUST_LOG", "warn").stdin(Stdio::null());
    let (nginx_key, nginx_developer_id) = create_key(command, "bench-nginx").await?;
    active_endpoint(&client, &api_url, &nginx_key, &hook(nginx.port())).await?;
    let in_process =
        Target { side: Side::InProcess, arrivals: arrivals.clone(), developer_id, pid: std::process::id() };
    let to_nginx =
        Target { side: Side::Nginx, arrivals: nginx.arrivals(), developer_id: nginx_developer_id, pid: nginx.pid() };
    let ingest_url = format!("{internal_url}/internal/events");

    let base = arrivals.count();
    let (t0, cpu0) = (Instant::now(), cpu_seconds(pid, ticks));
    ingest(&client, &ingest_url, &in_process.developer_id, events, concurrency).await?;
    wait_count(arrivals, base + events, Duration::from_secs(600)).await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_seconds(pid, ticks) - cpu0) / events as f64 * 1000.0;
    let own_rate = events as f64 / elapsed;
    out(&format!("standalone end to end events/s:         {own_rate:.0}  ({:.2} sig)", own_rate / signatures));
    out(&format!("standalone CPU s per 1,000 events:      {cpu:.3}"));
    bench.section("standalone: webhooks-api standalone (SQLite)");
    bench.row("  end to end, bench's producer: events/s", bench.rate(own_rate), "");
    bench.row("    CPU s per 1,000 events, no receiver", format!("{cpu:.3}"), "");

    let names = ["standalone", "receiver"];
    let read = || vec![cpu_seconds(pid, ticks), to_nginx.cpu(ticks)];
    let e2e_ng = wrk_end_to_end(
        bench,
        "standalone: ",
        &ingest_url,
        &to_nginx,
        &Parts { names: &names, dispatcher: 0, read: &read, pool: None },
    )
    .await?;
    wrk_rows(bench, "standalone", None, &e2e_ng);

    let latency_in = latency("standalone: ", bench.fixed_rate(), &client, &ingest_url, &in_process).await?;
    let latency_ng = latency("standalone: ", bench.fixed_rate(), &client, &ingest_url, &to_nginx).await?;
    latency_rows(bench, &latency_in, &latency_ng);

    stop(process).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}
