//! The fault run: the system as processes under a steady stream of events
//! while things break, then an accounting of what arrived.
//!
//! - **Distributed**: `webhooks-api serve`, several `webhooks-dispatcher`s,
//!   four endpoints of two developers (with and without category filters),
//!   each an HTTPS [`Tally`]. While events go in at a steady rate, a
//!   dispatcher is SIGKILLed every few seconds and replaced, RabbitMQ is
//!   stopped and started once (`rabbitmqctl stop_app` / `start_app`) and
//!   PostgreSQL is restarted once (`pg_ctlcluster … restart`).
//! - **Standalone**: the one `webhooks-api standalone` process is SIGKILLed
//!   every few seconds and started again on the same `DATA_DIR`.
//!
//! The producer retries what fails with the same `Idempotency-Key`; an event
//! is accepted when it got a 2xx. The run then waits (up to a deadline)
//! until every (accepted event, endpoint) pair the contract names has
//! arrived, and reports: accepted, expected, arrived, lost, duplicates, and
//! whatever arrived that must not (bad signatures, another developer's or
//! category's event). A process that exits on its own is started again and
//! reported, with the end of its log.
//!
//! It stops RabbitMQ and restarts PostgreSQL, which every other user of
//! them on the machine notices: run it alone. Whatever happens, it starts
//! RabbitMQ again (and PostgreSQL, when it stopped it).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command as StdCommand,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use webhooks_model::Category;

use crate::{
    Backend,
    procs::{Proc, Programs, Stack, StackOptions},
    producer::{self, Accepted, Account, Endpoint, Produced, Producer, Progress},
    random_suffix,
    tally::Tally,
};

/// What a fault run does.
#[derive(Debug, Clone)]
pub struct FaultOptions {
    pub backend: Backend,
    /// Events offered.
    pub events: u64,
    /// Events per second.
    pub rate: f64,
    /// Dispatcher processes kept running (distributed).
    pub dispatchers: usize,
    /// A SIGKILL (of a dispatcher, or of standalone) this often while
    /// events go in.
    pub kill_every: Duration,
    /// How long RabbitMQ stays stopped (distributed); `None`: not stopped.
    pub broker_outage: Option<Duration>,
    /// Whether PostgreSQL is restarted (distributed).
    pub restart_database: bool,
    /// How long, after the last event and fault, everything may take to arrive.
    pub settle: Duration,
    /// Every n-th request a receiver gets is answered 503 (0: none), so
    /// retries run during the faults too.
    pub receiver_fail_every: u64,
    /// Keep the processes' logs even when nothing went wrong.
    pub keep_logs: bool,
    /// Progress lines on stderr.
    pub verbose: bool,
    pub programs: Programs,
}

impl FaultOptions {
    /// The defaults of `webhooks-faults` for `backend`, running `programs`.
    pub fn new(backend: Backend, programs: Programs) -> FaultOptions {
        FaultOptions {
            backend,
            events: 10_000,
            rate: 100.0,
            dispatchers: 3,
            kill_every: Duration::from_secs(4),
            broker_outage: Some(Duration::from_secs(5)),
            restart_database: true,
            settle: Duration::from_secs(180),
            receiver_fail_every: 50,
            keep_logs: false,
            verbose: true,
            programs,
        }
    }
}

/// What a fault run saw.
#[derive(Debug)]
pub struct FaultReport {
    pub backend: Backend,
    pub events: u64,
    pub rate: f64,
    /// Events answered 2xx.
    pub accepted: u64,
    /// Events the producer gave up, with the last failure of the first few.
    pub abandoned: u64,
    pub abandoned_samples: Vec<String>,
    /// Requests sent again, and 2xx answers that were replays.
    pub retried: u64,
    pub replayed: u64,
    /// The most requests one accepted event took.
    pub most_tries: u32,
    pub total: Account,
    pub per_endpoint: Vec<(String, Account)>,
    /// What the receivers found wrong, the first few.
    pub problem_samples: Vec<String>,
    /// SIGKILLs sent.
    pub kills: u64,
    /// How long RabbitMQ was down, and how long the PostgreSQL restart took.
    pub broker_down: Option<Duration>,
    pub database_restart: Option<Duration>,
    /// Faults that could not be made (no `rabbitmqctl`, …).
    pub skipped: Vec<String>,
    /// Processes that exited without being killed, and the like.
    pub incidents: Vec<String>,
    /// Delivery states in the store at the end.
    pub states: BTreeMap<String, i64>,
    pub outbox_rows: Option<i64>,
    /// Deliveries the sweeper had to queue again (their message was lost).
    pub swept: Option<i64>,
    pub dead_letters: Option<u32>,
    /// Offering the events, from the first request to the last answer.
    pub ingest_time: Duration,
    /// From the end of ingest and faults until everything had arrived (or
    /// the deadline).
    pub settle_time: Duration,
    pub total_time: Duration,
    pub log_dir: Option<PathBuf>,
}

impl FaultReport {
    /// Nothing lost, nothing arrived that must not.
    pub fn passed(&self) -> bool {
        self.total.lost == 0 && self.total.violations() == 0
    }

    /// The report, for people.
    pub fn summary(&self) -> String {
        let backend = match self.backend {
            Backend::Distributed => "distributed",
            Backend::Standalone => "standalone",
        };
        let mut s = String::new();
        let t = &self.total;
        let _ = writeln!(s, "== webhooks-faults, {backend}: {} events offered at {}/s", self.events, self.rate);
        let mut faults = vec![format!("{} SIGKILLs", self.kills)];
        if let Some(down) = self.broker_down {
            faults.push(format!("RabbitMQ down {:.1}s", down.as_secs_f64()));
        }
        if let Some(restart) = self.database_restart {
            faults.push(format!("PostgreSQL restarted (took {:.1}s)", restart.as_secs_f64()));
        }
        let _ = writeln!(s, "faults:       {}", faults.join(", "));
        for skipped in &self.skipped {
            let _ = writeln!(s, "skipped:      {skipped}");
        }
        let _ = writeln!(
            s,
            "events:       accepted {}, abandoned {} (requests retried {}, replayed {}, most tries for one event {})",
            self.accepted, self.abandoned, self.retried, self.replayed, self.most_tries
        );
        for sample in &self.abandoned_samples {
            let _ = writeln!(s, "  abandoned:  {sample}");
        }
        let _ = writeln!(
            s,
            "pairs:        expected {}, arrived {}, lost {}, duplicates {}",
            t.expected, t.arrived, t.lost, t.duplicates
        );
        let _ = writeln!(
            s,
            "receivers:    refused on purpose {}, unaccepted events delivered {}, bad signatures {}, misrouted {}, before the endpoint {}",
            t.refused, t.unaccepted, t.bad_signature, t.misrouted, t.unexpected_early
        );
        for (name, a) in &self.per_endpoint {
            let _ = writeln!(
                s,
                "  {name:<24} expected {:>6}, arrived {:>6}, lost {:>4}, duplicates {:>4}",
                a.expected, a.arrived, a.lost, a.duplicates
            );
        }
        for sample in &self.problem_samples {
            let _ = writeln!(s, "  problem:    {sample}");
        }
        let states: Vec<String> = self.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ =
            write!(s, "store:        deliveries {}", if states.is_empty() { "?".into() } else { states.join(", ") });
        if let Some(rows) = self.outbox_rows {
            let _ = write!(s, "; outbox rows {rows}");
        }
        if let Some(swept) = self.swept {
            let _ = write!(s, "; swept again {swept}");
        }
        if let Some(dead) = self.dead_letters {
            let _ = write!(s, "; dead letters {dead}");
        }
        let _ = writeln!(s);
        for incident in &self.incidents {
            let _ = writeln!(s, "incident:     {incident}");
        }
        let _ = writeln!(
            s,
            "time:         ingest {:.1}s, settle {:.1}s, total {:.1}s",
            self.ingest_time.as_secs_f64(),
            self.settle_time.as_secs_f64(),
            self.total_time.as_secs_f64()
        );
        if let Some(dir) = &self.log_dir {
            let _ = writeln!(s, "logs:         {}", dir.display());
        }
        let _ = writeln!(
            s,
            "result:       {} (lost {}, duplicates {})",
            if self.passed() { "PASS" } else { "FAIL" },
            t.lost,
            t.duplicates
        );
        s
    }
}

/// Whether `rabbitmqctl` answers here, with the rights to stop the app.
pub fn can_restart_broker() -> bool {
    service_command("rabbitmqctl", &["status"]).output().is_ok_and(|o| o.status.success())
}

/// Closes every inherited descriptor above 2, then runs the command.
const CLOSE_FDS: &str = r#"for fd in /proc/self/fd/*; do n=${fd##*/}; if [ "$n" -gt 2 ]; then eval "exec $n>&-" 2>/dev/null; fi; done; exec "$@""#;

/// `program args` with no inherited descriptor but the standard three.
///
/// `pg_ctlcluster restart` starts the PostgreSQL server, which lives on: it
/// must not inherit what this process inherited. Run as `flock LOCK
/// webhooks-faults`, the lock's descriptor is open here (flock(1) passes it
/// on unless `-o`), and a server holding it would hold the lock for ever.
fn service_command(program: &str, args: &[&str]) -> StdCommand {
    if Path::new("/bin/bash").exists() {
        let mut command = StdCommand::new("/bin/bash");
        command.args(["-c", CLOSE_FDS, "webhooks-faults"]).arg(program).args(args);
        command
    } else {
        let mut command = StdCommand::new(program);
        command.args(args);
        command
    }
}

async fn run_command(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = tokio::process::Command::from(service_command(program, args))
        .output()
        .await
        .with_context(|| format!("run {program} {}", args.join(" ")))?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {}: {}\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Starts RabbitMQ again when dropped, unless disarmed.
struct BrokerGuard {
    armed: bool,
}

impl Drop for BrokerGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = service_command("rabbitmqctl", &["start_app"]).output();
        }
    }
}

/// The PostgreSQL cluster of the tests (`pg_lsclusters`, by the port of
/// `TEST_DATABASE_ADMIN_URL`): its version and name, for `pg_ctlcluster`.
pub fn database_cluster() -> Option<(String, String)> {
    let port = url::Url::parse(&crate::db::admin_url()).ok()?.port().unwrap_or(5432).to_string();
    let listed = StdCommand::new("pg_lsclusters").arg("--no-header").output().ok()?;
    String::from_utf8_lossy(&listed.stdout).lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&port.as_str())).then(|| (fields[0].to_owned(), fields[1].to_owned()))
    })
}

/// Whether this machine can restart the tests' PostgreSQL from here.
pub fn can_restart_database() -> bool {
    database_cluster().is_some()
}

fn pg_ctlcluster_args<'a>(cluster: &'a (String, String), action: &'a str) -> [&'a str; 4] {
    ["--skip-systemctl-redirect", &cluster.0, &cluster.1, action]
}

/// Starts PostgreSQL when dropped, unless disarmed.
struct DatabaseGuard {
    cluster: (String, String),
    armed: bool,
}

impl Drop for DatabaseGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = service_command("pg_ctlcluster", &pg_ctlcluster_args(&self.cluster, "start")).output();
        }
    }
}

/// What the broker and database faults did.
#[derive(Debug, Default)]
struct ServiceFaults {
    broker_down: Option<Duration>,
    database_restart: Option<Duration>,
    skipped: Vec<String>,
    errors: Vec<String>,
}

fn say(verbose: bool, started: Instant, line: &str) {
    if verbose {
        eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    }
}

/// Stops RabbitMQ at `broker_at` for `outage`, then restarts PostgreSQL at
/// `database_at` (at least 3 s after the broker is back), both counted from
/// `from`; progress lines are timed from `started`.
async fn service_faults(
    options: FaultOptions,
    started: Instant,
    from: Instant,
    broker_at: Duration,
    database_at: Duration,
) -> ServiceFaults {
    let mut done = ServiceFaults::default();
    let verbose = options.verbose;
    if let Some(outage) = options.broker_outage {
        if can_restart_broker() {
            tokio::time::sleep_until((from + broker_at).into()).await;
            let mut guard = BrokerGuard { armed: true };
            let down = Instant::now();
            say(verbose, started, "rabbitmqctl stop_app");
            match run_command("rabbitmqctl", &["stop_app"]).await {
                Ok(()) => {
                    tokio::time::sleep(outage).await;
                    say(verbose, started, "rabbitmqctl start_app");
                    match run_command("rabbitmqctl", &["start_app"]).await {
                        Ok(()) => guard.armed = false,
                        Err(error) => done.errors.push(format!("{error:#}")),
                    }
                    done.broker_down = Some(down.elapsed());
                    say(verbose, started, "RabbitMQ is back");
                }
                Err(error) => done.errors.push(format!("{error:#}")),
            }
            drop(guard);
        } else {
            done.skipped
                .push("RabbitMQ outage: rabbitmqctl does not answer here (needs RabbitMQ's CLI, as root)".into());
        }
    }
    if options.restart_database {
        match database_cluster() {
            Some(cluster) => {
                let at = (from + database_at).max(Instant::now() + Duration::from_secs(3));
                tokio::time::sleep_until(at.into()).await;
                let mut guard = DatabaseGuard { cluster: cluster.clone(), armed: true };
                let args = pg_ctlcluster_args(&cluster, "restart");
                say(verbose, started, &format!("pg_ctlcluster {}", args.join(" ")));
                let began = Instant::now();
                match run_command("pg_ctlcluster", &args).await {
                    Ok(()) => {
                        guard.armed = false;
                        done.database_restart = Some(began.elapsed());
                        say(verbose, started, "PostgreSQL is back");
                    }
                    Err(error) => done.errors.push(format!("{error:#}")),
                }
                drop(guard);
            }
            None => done.skipped.push("PostgreSQL restart: no pg_lsclusters cluster on the tests' port".into()),
        }
    }
    done
}

/// The last `n` lines of a process's log.
fn log_tail(stack: &Stack, name: &str, n: usize) -> String {
    let text = std::fs::read_to_string(stack.log_dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n    ")
}

/// Starts again whatever process of `stack` exited without being killed,
/// and notes it in `incidents` with the end of its log.
pub async fn supervise(stack: &mut Stack, incidents: &mut Vec<String>) -> anyhow::Result<()> {
    let mut exited = Vec::new();
    let mut i = 0;
    while i < stack.dispatchers.len() {
        if let Some(status) = stack.dispatchers[i].exited() {
            exited.push((stack.dispatchers.remove(i), status));
        } else {
            i += 1;
        }
    }
    for (proc, status) in exited {
        incidents.push(format!(
            "{} (pid {}) exited on its own after {:.1}s: {status}; its log ends:\n    {}",
            proc.name,
            proc.pid,
            proc.started.elapsed().as_secs_f64(),
            log_tail(stack, &proc.name, 6)
        ));
        let replacement = stack.spawn_dispatcher()?;
        stack.dispatchers.push(replacement);
    }
    let api_exit = stack.api.as_mut().and_then(|api| api.exited().map(|status| (api.name.clone(), api.pid, status)));
    if let Some((name, pid, status)) = api_exit {
        incidents.push(format!(
            "{name} (pid {pid}) exited on its own: {status}; its log ends:\n    {}",
            log_tail(stack, &name, 6)
        ));
        stack.respawn_api()?;
    }
    Ok(())
}

/// One SIGKILL: the oldest dispatcher, replaced at once (distributed), or
/// the standalone process, started again on its `DATA_DIR`.
async fn kill_one(stack: &mut Stack) -> anyhow::Result<String> {
    match stack.backend {
        Backend::Distributed => {
            anyhow::ensure!(!stack.dispatchers.is_empty(), "no dispatcher to kill");
            let victim: Proc = stack.dispatchers.remove(0);
            let name = victim.name.clone();
            victim.kill().await?;
            let replacement = stack.spawn_dispatcher()?;
            let line = format!("SIGKILL {name}; started {}", replacement.name);
            stack.dispatchers.push(replacement);
            Ok(line)
        }
        Backend::Standalone => {
            let victim = stack.api.take().context("standalone is not running")?;
            let down = Instant::now();
            victim.kill().await?;
            stack.start_api().await?;
            Ok(format!("SIGKILL standalone; ready again after {:.2}s", down.elapsed().as_secs_f64()))
        }
    }
}

/// The endpoints of a run: developer A with everything and transfers only,
/// developer B with everything and customer + kyc_link.
pub const ENDPOINTS: [(&str, usize, &[Category]); 4] = [
    ("A: every category", 0, &[]),
    ("A: transfer", 0, &[Category::Transfer]),
    ("B: every category", 1, &[]),
    ("B: customer, kyc_link", 1, &[Category::Customer, Category::KycLink]),
];

/// The categories of the events, in turn.
pub const CATEGORIES: [Category; 3] = [Category::Transfer, Category::Customer, Category::KycLink];

/// Runs the fault run `options` describes and reports what it saw; an `Err`
/// is a run that could not be made (a process would not start, …), not a
/// loss.
pub async fn run(options: FaultOptions) -> anyhow::Result<FaultReport> {
    let started = Instant::now();
    let verbose = options.verbose;
    let mut stack_options = StackOptions::new(options.backend, "webhooks-faults");
    // Room for the API beside up to a handful of dispatchers.
    stack_options.database_max_connections = 4;
    let log_dir = stack_options.log_dir.clone();
    say(verbose, started, &format!("logs in {}", log_dir.display()));
    let mut stack = Stack::start(options.programs.clone(), stack_options).await?;
    if options.backend == Backend::Distributed {
        for _ in 0..options.dispatchers.max(1) {
            stack.start_dispatcher().await?;
        }
    }
    let mut developers = Vec::new();
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (key, developer) = stack.create_key(None).await?;
        developers.push(developer);
        keys.push(key);
    }
    let mut endpoints = Vec::new();
    for (name, developer, categories) in ENDPOINTS {
        let tally = Tally::start(&stack.ca, options.receiver_fail_every).await?;
        let webhook = stack.active_endpoint(&keys[developer], &tally.url(), categories).await?;
        tally.serve_endpoint(&webhook, developers[developer], categories)?;
        endpoints.push(Endpoint { name: name.into(), developer, categories: categories.to_vec(), tally });
    }
    say(verbose, started, &format!("ready: {} dispatchers, {} endpoints", stack.dispatchers.len(), endpoints.len()));

    let producer = Producer {
        ingest_urls: vec![stack.ingest_url()],
        token: None,
        developers,
        categories: CATEGORIES.to_vec(),
        run_id: format!("faults-{}", random_suffix()),
        give_up_after: Duration::from_secs(90),
        request_timeout: Duration::from_secs(15),
    };
    let progress = Arc::new(Progress::default());
    let stop = CancellationToken::new();
    let ingest_started = Instant::now();
    let mut producing = tokio::spawn({
        let (producer, progress, stop) = (producer.clone(), progress.clone(), stop.clone());
        let (events, rate) = (options.events, options.rate);
        async move { producer.run(events, rate, progress, stop).await }
    });
    let ingest_span = Duration::from_secs_f64(options.events as f64 / options.rate.max(0.001));
    let mut services = match options.backend {
        Backend::Distributed => Some(tokio::spawn(service_faults(
            options.clone(),
            started,
            ingest_started,
            ingest_span.mul_f64(0.2),
            ingest_span.mul_f64(0.6),
        ))),
        Backend::Standalone => None,
    };

    // Faults while events go in, and until the broker and database faults are over.
    let mut incidents = Vec::new();
    let mut kills = 0u64;
    let mut next_kill = Instant::now() + options.kill_every;
    let mut next_progress = Instant::now() + Duration::from_secs(5);
    let mut produced: Option<Produced> = None;
    let mut service_done = None;
    while produced.is_none() || (services.is_some() && service_done.is_none()) {
        tokio::select! {
            done = &mut producing, if produced.is_none() => {
                produced = Some(done.context("the producer panicked")?);
                say(verbose, started, "every event offered has settled");
            }
            done = async { services.as_mut().expect("guarded").await }, if services.is_some() && service_done.is_none() => {
                service_done = Some(done.context("the fault task panicked")?);
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if Instant::now() >= next_kill && produced.is_none() {
            match kill_one(&mut stack).await {
                Ok(line) => {
                    kills += 1;
                    say(verbose, started, &line);
                }
                Err(error) => incidents.push(format!("a kill went wrong: {error:#}")),
            }
            next_kill = Instant::now() + options.kill_every;
        }
        supervise(&mut stack, &mut incidents).await?;
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(5);
            say(verbose, started, &progress_line(&progress, &endpoints));
        }
    }
    let produced = produced.unwrap_or_default();
    let services = service_done.unwrap_or_default();
    incidents.extend(services.errors.iter().map(|e| format!("a fault went wrong: {e}")));
    let ingest_time = produced.elapsed;

    // Settle: wait until every expected pair arrived, or the deadline.
    let settle_started = Instant::now();
    let deadline = settle_started + options.settle;
    let mut next_progress = Instant::now() + Duration::from_secs(10);
    loop {
        supervise(&mut stack, &mut incidents).await?;
        let missing = producer::missing(&produced.accepted, &endpoints);
        if missing == 0 {
            say(verbose, started, "every expected pair has arrived");
            break;
        }
        if Instant::now() > deadline {
            say(verbose, started, &format!("deadline: {missing} pairs still missing"));
            break;
        }
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(10);
            say(verbose, started, &format!("settling: {missing} pairs still missing"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let settle_time = settle_started.elapsed();
    // Late duplicates (a message redelivered after a kill) have a moment to come.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (per_endpoint, total) = producer::account(&produced.accepted, &endpoints);
    let problem_samples: Vec<String> = endpoints
        .iter()
        .flat_map(|e| e.tally.counts().samples.into_iter().map(|s| format!("{}: {s}", e.name)))
        .take(10)
        .collect();
    if total.lost > 0 {
        incidents.extend(lost_samples(&produced.accepted, &endpoints));
    }
    let states = stack.delivery_states().await.unwrap_or_else(|error| {
        incidents.push(format!("delivery states unreadable: {error:#}"));
        BTreeMap::new()
    });
    let outbox_rows = stack.outbox_rows().await.unwrap_or(None);
    let swept = stack.swept_deliveries().await.unwrap_or(None);
    let dead_letters = stack.dead_letters().await.unwrap_or(None);
    stack.shutdown(Duration::from_secs(10)).await;

    let report = FaultReport {
        backend: options.backend,
        events: options.events,
        rate: options.rate,
        accepted: produced.accepted.len() as u64,
        abandoned: produced.abandoned.len() as u64,
        abandoned_samples: produced
            .abandoned
            .iter()
            .take(5)
            .map(|a| format!("event {} after {} tries: {}", a.n, a.tries, a.last))
            .collect(),
        retried: progress.retried.load(std::sync::atomic::Ordering::Relaxed),
        replayed: progress.replayed.load(std::sync::atomic::Ordering::Relaxed),
        most_tries: produced.accepted.iter().map(|a| a.tries).max().unwrap_or(0),
        total,
        per_endpoint: endpoints.iter().map(|e| e.name.clone()).zip(per_endpoint).collect(),
        problem_samples,
        kills,
        broker_down: services.broker_down,
        database_restart: services.database_restart,
        skipped: {
            for skipped in &services.skipped {
                crate::skip(skipped);
            }
            services.skipped
        },
        incidents,
        states,
        outbox_rows,
        swept,
        dead_letters,
        ingest_time,
        settle_time,
        total_time: started.elapsed(),
        log_dir: Some(log_dir.clone()),
    };
    let keep = options.keep_logs || !report.passed() || !report.incidents.is_empty();
    if !keep {
        let _ = std::fs::remove_dir_all(&log_dir);
        return Ok(FaultReport { log_dir: None, ..report });
    }
    Ok(report)
}

fn progress_line(progress: &Progress, endpoints: &[Endpoint]) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let arrived: usize = endpoints.iter().map(|e| e.tally.distinct()).sum();
    format!(
        "offered {}, accepted {}, retried requests {}, abandoned {}; distinct deliveries {arrived}",
        progress.offered.load(Relaxed),
        progress.accepted.load(Relaxed),
        progress.retried.load(Relaxed),
        progress.abandoned.load(Relaxed),
    )
}

/// A few of the pairs that never arrived, for the report.
fn lost_samples(accepted: &[Accepted], endpoints: &[Endpoint]) -> Vec<String> {
    let mut lines = Vec::new();
    for endpoint in endpoints {
        let lost: Vec<String> = accepted
            .iter()
            .filter(|e| endpoint.wants(e) && !endpoint.tally.has(e.id))
            .take(5)
            .map(|e| format!("wh_{:032x} (event {}, {} tries)", e.id, e.n, e.tries))
            .collect();
        if !lost.is_empty() {
            lines.push(format!("lost at {}: {}", endpoint.name, lost.join(", ")));
        }
    }
    lines
}
