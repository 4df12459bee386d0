//! The production topology under faults, on the hosts `deploy/hosts/net`
//! makes: two APIs, three dispatchers, a PostgreSQL host, a three-node
//! RabbitMQ cluster and this program on the receiver host, every process in
//! its own network namespace, talking over the hosts' addresses with
//! internal tokens. `deploy/hosts/run` builds the hosts and runs this inside
//! host `recv`; see there.
//!
//! ```text
//! webhooks-hosts --hosts deploy/hosts --bin target/release --work DIR
//!                [--events N] [--rate R] [--quota CORES] [--settle SECS]
//! ```
//!
//! Events go in at a steady rate through both APIs (a retry goes to the
//! other, as behind a load balancer) for four HTTPS endpoints of two
//! developers, each a counting receiver on this host that checks every
//! signature. Meanwhile, at fixed times from the first event: a dispatcher
//! and an API are SIGKILLed and started again, the broker node listed first
//! is SIGKILLed and started again, a dispatcher is cut off the network for
//! 20 s, an API is cut off PostgreSQL for 10 s, and PostgreSQL restarts.
//! Then it waits until every accepted event has arrived at every endpoint
//! that is due it, and prints what was accepted, delivered, lost and
//! duplicated, and the longest time in which nothing was delivered. Exits 1
//! when anything was lost or arrived that must not.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use tests::{
    TestCa,
    faults::{CATEGORIES, ENDPOINTS},
    flags::{Flags, out},
    producer::{self, Endpoint, Producer, Progress},
    random_suffix,
    tally::Tally,
};

const USAGE: &str = "\
webhooks-hosts --hosts DIR --bin DIR --work DIR [--events N] [--rate R]
               [--quota CORES] [--settle SECS]

  --hosts   the folder of net, pg and mq (deploy/hosts)
  --bin     the folder of webhooks-api and webhooks-dispatcher
  --work    where logs and the CA go
  --events  events offered (default 12000; the faults need 110 s of them)
  --rate    events per second (default 100)
  --quota   CPU cores of each service host, as CPU_QUOTA of net exec
            (default none)
  --settle  seconds everything may take to arrive after the last event
            (default 180)";

/// The faults, in seconds from the first event.
const KILL_DISPATCHER: u64 = 10;
const KILL_API: u64 = 20;
const KILL_BROKER: u64 = 30;
const BROKER_BACK: u64 = 50;
const CUT_DISPATCHER: u64 = 60;
const CUT_DISPATCHER_FOR: u64 = 20;
const CUT_API_FROM_DATABASE: u64 = 85;
const CUT_API_FOR: u64 = 10;
const RESTART_DATABASE: u64 = 100;
/// A killed process is started again after this long, as a supervisor would.
const RESTART_AFTER: Duration = Duration::from_secs(3);

struct Hosts {
    dir: PathBuf,
}

impl Hosts {
    /// Runs `deploy/hosts/<script> args` and returns what it printed.
    async fn run(&self, script: &str, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(self.dir.join(script))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("run {script}"))?;
        if !output.status.success() {
            bail!("{script} {}: {}: {}", args.join(" "), output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    async fn addr(&self, host: &str) -> anyhow::Result<IpAddr> {
        self.run("net", &["addr", host]).await?.parse().with_context(|| format!("the address of {host}"))
    }
}

/// A service process on one host.
struct Service {
    name: String,
    host: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Its internal listener, for `/readyz`.
    probe: String,
    child: Option<Child>,
    starts: u32,
}

struct System {
    hosts: Hosts,
    work: PathBuf,
    quota: Option<String>,
    services: Vec<Service>,
    client: reqwest::Client,
}

impl System {
    fn service(&mut self, name: &str) -> &mut Service {
        self.services.iter_mut().find(|s| s.name == name).expect("a service of the run")
    }

    /// Starts `name` in its host's namespace (and CPU quota), its standard
    /// error appended to `<work>/logs/<name>.log`.
    fn spawn(&mut self, name: &str) -> anyhow::Result<()> {
        let net = self.hosts.dir.join("net");
        let logs = self.work.join("logs");
        let quota = self.quota.clone();
        let service = self.service(name);
        let log = std::fs::File::options().create(true).append(true).open(logs.join(format!("{name}.log")))?;
        let mut command = Command::new(net);
        command
            .args(["exec", &service.host, "--"])
            .arg(&service.program)
            .args(&service.args)
            .env_clear()
            .envs(service.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        for pass in ["PATH", "HOME"] {
            if let Some(value) = std::env::var_os(pass) {
                command.env(pass, value);
            }
        }
        if let Some(quota) = quota {
            command.env("CPU_QUOTA", quota);
        }
        service.child = Some(command.spawn().with_context(|| format!("start {name}"))?);
        service.starts += 1;
        Ok(())
    }

    async fn ready(&mut self, name: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let url = format!("{}/readyz", self.service(name).probe);
        loop {
            if let Some(status) = self.service(name).child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("{name} exited before it was ready: {status} (log: {}/logs/{name}.log)", self.work.display());
            }
            if self.client.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} was not ready within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let service = self.service(name);
        let mut child = service.child.take().with_context(|| format!("{name} is not running"))?;
        child.start_kill()?;
        child.wait().await?;
        Ok(())
    }

    /// Services that exited without being killed: started again, and named.
    fn supervise(&mut self) -> anyhow::Result<Vec<String>> {
        let mut exited = Vec::new();
        for service in &mut self.services {
            if let Some(status) = service.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                exited.push((service.name.clone(), status));
                service.child = None;
            }
        }
        let mut incidents = Vec::new();
        for (name, status) in exited {
            incidents.push(format!("{name} exited by itself ({status}); started again"));
            self.spawn(&name)?;
        }
        Ok(incidents)
    }

    async fn stop_all(&mut self) {
        for service in &mut self.services {
            if let Some(child) = &mut service.child
                && let Some(pid) = child.id()
            {
                let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
            }
        }
        for service in &mut self.services {
            if let Some(mut child) = service.child.take()
                && tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err()
            {
                let _ = child.start_kill();
            }
        }
    }
}

fn say(started: Instant, line: &str) {
    eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
}

/// 64 random hex digits: a token, or a key-encryption key (of a throwaway run).
fn secret() -> String {
    format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

async fn create_key(system: &mut System, common: &[(String, String)]) -> anyhow::Result<(String, Uuid)> {
    let net = system.hosts.dir.join("net");
    let api = system.service("api1").program.clone();
    let output = Command::new(net)
        .args(["exec", "api1", "--"])
        .arg(api)
        .args(["keys", "create", "--name", "hosts run"])
        .env_clear()
        .envs(common.iter().map(|(k, v)| (k, v)))
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .output()
        .await?;
    tests::procs::created_key(&output)
}

/// One fault of the schedule, done by a task of its own so that the
/// accounting goes on meanwhile.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillDispatcher,
    KillApi,
    KillBroker,
    BrokerBack,
    CutDispatcher,
    CutApiFromDatabase,
    RestartDatabase,
}

const SCHEDULE: [(u64, Fault); 7] = [
    (KILL_DISPATCHER, Fault::KillDispatcher),
    (KILL_API, Fault::KillApi),
    (KILL_BROKER, Fault::KillBroker),
    (BROKER_BACK, Fault::BrokerBack),
    (CUT_DISPATCHER, Fault::CutDispatcher),
    (CUT_API_FROM_DATABASE, Fault::CutApiFromDatabase),
    (RESTART_DATABASE, Fault::RestartDatabase),
];

impl Fault {
    fn describe(self) -> String {
        match self {
            Fault::KillDispatcher => "kill -9 dispatcher disp1 (started again after 3 s)".into(),
            Fault::KillApi => "kill -9 API api1 (started again after 3 s)".into(),
            Fault::KillBroker => "kill -9 broker node mq1".into(),
            Fault::BrokerBack => "broker node mq1 started again".into(),
            Fault::CutDispatcher => format!("dispatcher disp2 cut off the network for {CUT_DISPATCHER_FOR} s"),
            Fault::CutApiFromDatabase => format!("API api2 cut off PostgreSQL for {CUT_API_FOR} s"),
            Fault::RestartDatabase => "PostgreSQL restarted".into(),
        }
    }
}

/// Starts `fault`: a kill at once (the process is started again by the
/// loop after [`RESTART_AFTER`]), the rest as a task of its own, so that
/// sampling goes on while a node starts or the database restarts.
async fn inflict(
    system: &mut System,
    fault: Fault,
) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    let script = |script: &'static str, args: Vec<String>| {
        let hosts = Hosts { dir: system.hosts.dir.clone() };
        Some(tokio::spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            hosts.run(script, &args).await.map(drop)
        }))
    };
    Ok(match fault {
        Fault::KillDispatcher => {
            system.kill("disp1").await?;
            None
        }
        Fault::KillApi => {
            system.kill("api1").await?;
            None
        }
        Fault::KillBroker => script("mq", vec!["kill".into(), "1".into()]),
        Fault::BrokerBack => script("mq", vec!["start".into(), "1".into()]),
        Fault::CutDispatcher => script("net", vec!["cut".into(), "disp2".into(), CUT_DISPATCHER_FOR.to_string()]),
        Fault::CutApiFromDatabase => {
            script("net", vec!["cut".into(), "api2".into(), "--from".into(), "pg".into(), CUT_API_FOR.to_string()])
        }
        Fault::RestartDatabase => script("pg", vec!["restart".into()]),
    })
}

/// Deliveries so far, sampled, for the longest gap.
struct Sample {
    at: Duration,
    delivered: usize,
}

/// The longest stretch, and where it began, in which no new delivery
/// arrived, between `from` and the last sample.
fn longest_gap(samples: &[Sample], from: Duration) -> (Duration, Duration) {
    let mut last_change = from;
    let mut previous = None;
    let mut longest = (Duration::ZERO, from);
    for sample in samples.iter().filter(|s| s.at >= from) {
        if previous.is_some_and(|p| sample.delivered > p) {
            if sample.at - last_change > longest.0 {
                longest = (sample.at - last_change, last_change);
            }
            last_change = sample.at;
        }
        previous = Some(sample.delivered);
    }
    longest
}

struct Options {
    hosts: PathBuf,
    bin: PathBuf,
    work: PathBuf,
    events: u64,
    rate: f64,
    quota: Option<String>,
    settle: Duration,
}

async fn run(options: Options) -> anyhow::Result<bool> {
    let started = Instant::now();
    std::fs::create_dir_all(options.work.join("logs"))?;
    let hosts = Hosts { dir: options.hosts.clone() };
    let my_ip = hosts.addr("recv").await?;
    let pg_url = hosts.run("pg", &["url"]).await?;
    let amqp_urls = hosts.run("mq", &["urls"]).await?;

    // A database of its own, so that a kept cluster can run it again.
    let database = format!("webhooks_{}", random_suffix().to_lowercase());
    let admin = sqlx::PgPool::connect(&pg_url).await.context("connect to PostgreSQL on host pg")?;
    sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await?;
    admin.close().await;
    let database_url = match pg_url.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{database}"),
        None => bail!("pg url printed {pg_url:?}"),
    };

    let ca = TestCa::new()?;
    let ca_pem = options.work.join("ca.pem");
    std::fs::write(&ca_pem, ca.pem())?;
    let token = secret();
    let common: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), database_url.clone()),
        ("DATABASE_MAX_CONNECTIONS".into(), "8".into()),
        ("AMQP_URL".into(), amqp_urls.clone()),
        ("QUEUE_PREFIX".into(), format!("hosts{}", random_suffix().to_lowercase())),
        ("INTERNAL_TOKEN".into(), token.clone()),
        ("KEY_ENCRYPTION_KEY".into(), secret()),
        ("TLS_EXTRA_ROOTS".into(), ca_pem.to_str().context("work folder is not UTF-8")?.into()),
        ("TARGET_ALLOW_PRIVATE".into(), "true".into()),
        ("RETRY_SCHEDULE".into(), "1s,2s,5s,10s,10s,20s,30s,30s,30s,30s".into()),
        ("DELIVERY_TIMEOUT".into(), "5s".into()),
        ("SWEEP_INTERVAL".into(), "15s".into()),
        ("RUST_LOG".into(), "info,lapin=warn,sqlx=warn".into()),
    ];
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build()?;
    let mut system =
        System { hosts, work: options.work.clone(), quota: options.quota.clone(), services: Vec::new(), client };
    for (name, kind) in [("api1", "api"), ("api2", "api"), ("disp1", "d"), ("disp2", "d"), ("disp3", "d")] {
        let ip = system.hosts.addr(name).await?;
        let mut env = common.clone();
        let (program, args, probe) = if kind == "api" {
            env.push(("API_LISTEN_ADDR".into(), format!("{ip}:8080")));
            env.push(("INTERNAL_LISTEN_ADDR".into(), format!("{ip}:8081")));
            (options.bin.join("webhooks-api"), vec!["serve".to_owned()], format!("http://{ip}:8081"))
        } else {
            env.push(("DISPATCHER_LISTEN_ADDR".into(), format!("{ip}:8082")));
            (options.bin.join("webhooks-dispatcher"), Vec::new(), format!("http://{ip}:8082"))
        };
        system.services.push(Service {
            name: name.into(),
            host: name.into(),
            program,
            args,
            env,
            probe,
            child: None,
            starts: 0,
        });
    }
    // The first API migrates the database before anything else starts.
    system.spawn("api1")?;
    system.ready("api1", Duration::from_secs(120)).await?;
    for name in ["api2", "disp1", "disp2", "disp3"] {
        system.spawn(name)?;
    }
    for name in ["api2", "disp1", "disp2", "disp3"] {
        system.ready(name, Duration::from_secs(120)).await?;
    }
    say(started, "2 APIs and 3 dispatchers ready on their hosts");

    let api1 = format!("http://{}:8080/v0", system.hosts.addr("api1").await?);
    let mut developers = Vec::new();
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (key, developer) = create_key(&mut system, &common).await?;
        developers.push(developer);
        keys.push(key);
    }
    let mut endpoints = Vec::new();
    for (name, developer, categories) in ENDPOINTS {
        let tally = Tally::start_at(&ca, 50, my_ip).await?;
        let webhook =
            tests::procs::active_endpoint(&system.client, &api1, &keys[developer], &tally.url(), categories).await?;
        tally.serve_endpoint(&webhook, developers[developer], categories)?;
        endpoints.push(Endpoint { name: name.into(), developer, categories: categories.to_vec(), tally });
    }
    let mut ingest_urls = Vec::new();
    for host in ["api1", "api2"] {
        ingest_urls.push(format!("http://{}:8081/internal/events", system.hosts.addr(host).await?));
    }
    let producer = Producer {
        ingest_urls,
        token: Some(token),
        developers,
        categories: CATEGORIES.to_vec(),
        run_id: format!("hosts-{}", random_suffix()),
        give_up_after: Duration::from_secs(90),
        request_timeout: Duration::from_secs(15),
    };
    let progress = Arc::new(Progress::default());
    let stop = CancellationToken::new();
    let ingest_started = Instant::now();
    say(
        started,
        &format!("{} events at {}/s through both APIs to {} endpoints", options.events, options.rate, endpoints.len()),
    );
    let mut producing = tokio::spawn({
        let (producer, progress, stop) = (producer.clone(), progress.clone(), stop.clone());
        let (events, rate) = (options.events, options.rate);
        async move { producer.run(events, rate, progress, stop).await }
    });

    let mut samples = Vec::new();
    let mut incidents = Vec::new();
    let mut done_faults = Vec::new();
    let mut restarts: Vec<(Instant, Fault)> = Vec::new();
    let mut running: Vec<(Fault, tokio::task::JoinHandle<anyhow::Result<()>>)> = Vec::new();
    let mut schedule = SCHEDULE.iter().peekable();
    let mut produced = None;
    let mut next_progress = Instant::now() + Duration::from_secs(10);
    let delivered = |endpoints: &[Endpoint]| endpoints.iter().map(|e| e.tally.distinct()).sum::<usize>();
    let settle_deadline = |produced_at: Instant| produced_at + options.settle;
    let mut produced_at = None;
    loop {
        tokio::select! {
            done = &mut producing, if produced.is_none() => {
                produced = Some(done.context("the producer panicked")?);
                produced_at = Some(Instant::now());
                say(started, "every event offered has settled at the APIs");
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        samples.push(Sample { at: ingest_started.elapsed(), delivered: delivered(&endpoints) });
        if let Some(&&(at, fault)) = schedule.peek()
            && ingest_started.elapsed() >= Duration::from_secs(at)
        {
            schedule.next();
            say(started, &fault.describe());
            match inflict(&mut system, fault).await {
                Ok(Some(task)) => running.push((fault, task)),
                Ok(None) => restarts.push((Instant::now() + RESTART_AFTER, fault)),
                Err(error) => incidents.push(format!("{}: {error:#}", fault.describe())),
            }
            done_faults.push((at, fault));
        }
        // Killed processes come back after a while, as under a supervisor.
        while let Some(&(due, fault)) = restarts.first()
            && Instant::now() >= due
        {
            restarts.remove(0);
            let name = if matches!(fault, Fault::KillDispatcher) { "disp1" } else { "api1" };
            system.spawn(name)?;
        }
        for (fault, task) in std::mem::take(&mut running) {
            if !task.is_finished() {
                running.push((fault, task));
                continue;
            }
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => incidents.push(format!("{}: {error:#}", fault.describe())),
                Err(error) => incidents.push(format!("{}: {error}", fault.describe())),
            }
        }
        incidents.extend(system.supervise()?);
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(10);
            say(
                started,
                &format!(
                    "offered {}, accepted {}, retried {}; delivered {}",
                    progress.offered.load(std::sync::atomic::Ordering::Relaxed),
                    progress.accepted.load(std::sync::atomic::Ordering::Relaxed),
                    progress.retried.load(std::sync::atomic::Ordering::Relaxed),
                    delivered(&endpoints),
                ),
            );
        }
        if let (Some(produced), Some(at)) = (&produced, produced_at)
            && schedule.peek().is_none()
            && restarts.is_empty()
            && running.is_empty()
        {
            let missing = producer::missing(&produced.accepted, &endpoints);
            if missing == 0 {
                say(started, "every accepted event has arrived where it is due");
                break;
            }
            if Instant::now() > settle_deadline(at) {
                say(started, &format!("deadline: {missing} deliveries still missing"));
                break;
            }
        }
    }
    let all_arrived = ingest_started.elapsed();
    // Late duplicates (a message redelivered after a cut heals) have a moment to come.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let produced = produced.unwrap_or_default();
    let (per_endpoint, total) = producer::account(&produced.accepted, &endpoints);
    let (gap, gap_from) = longest_gap(&samples, Duration::ZERO);

    let pool = sqlx::PgPool::connect(&database_url).await?;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY 1").fetch_all(&pool).await?;
    let swept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE generation > 0").fetch_one(&pool).await?;
    pool.close().await;
    let starts: BTreeMap<String, u32> = system.services.iter().map(|s| (s.name.clone(), s.starts)).collect();
    system.stop_all().await;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "== webhooks-hosts: {} events offered at {}/s, CPU quota {}",
        options.events,
        options.rate,
        options.quota.as_deref().unwrap_or("none")
    );
    for (at, fault) in &done_faults {
        let _ = writeln!(s, "fault at {at:>4} s: {}", fault.describe());
    }
    let _ = writeln!(
        s,
        "events:     accepted {}, abandoned {} (requests retried {}, replayed {})",
        produced.accepted.len(),
        produced.abandoned.len(),
        progress.retried.load(std::sync::atomic::Ordering::Relaxed),
        progress.replayed.load(std::sync::atomic::Ordering::Relaxed),
    );
    for abandoned in produced.abandoned.iter().take(5) {
        let _ = writeln!(s, "  abandoned: event {} after {} tries: {}", abandoned.n, abandoned.tries, abandoned.last);
    }
    let _ = writeln!(
        s,
        "pairs:      expected {}, delivered {}, lost {}, duplicates {} ({:.2}%)",
        total.expected,
        total.arrived,
        total.lost,
        total.duplicates,
        100.0 * total.duplicates as f64 / total.arrived.max(1) as f64
    );
    let _ = writeln!(
        s,
        "receivers:  refused on purpose {}, bad signatures {}, misrouted {}, unaccepted events delivered {}",
        total.refused, total.bad_signature, total.misrouted, total.unaccepted
    );
    for (endpoint, account) in endpoints.iter().zip(&per_endpoint) {
        let _ = writeln!(
            s,
            "  {:<24} expected {:>6}, delivered {:>6}, lost {:>4}, duplicates {:>4}",
            endpoint.name, account.expected, account.arrived, account.lost, account.duplicates
        );
    }
    let _ = writeln!(
        s,
        "gap:        longest without a delivery {:.1} s (from {:.1} s); all arrived {:.1} s after the first event",
        gap.as_secs_f64(),
        gap_from.as_secs_f64(),
        all_arrived.as_secs_f64()
    );
    let states: Vec<String> = states.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(s, "store:      deliveries {}; swept again {swept}", states.join(", "));
    let starts: Vec<String> = starts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(s, "starts:     {}", starts.join(", "));
    for incident in &incidents {
        let _ = writeln!(s, "incident:   {incident}");
    }
    let _ = writeln!(s, "logs:       {}/logs", options.work.display());
    let passed = total.lost == 0 && total.violations() == 0 && produced.abandoned.is_empty();
    let _ = write!(s, "result:     {}", if passed { "PASS" } else { "FAIL" });
    out(&s);
    Ok(passed)
}

fn options() -> anyhow::Result<Option<Options>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        out(USAGE);
        return Ok(None);
    }
    let flags = Flags::parse(args, &["hosts", "bin", "work", "events", "rate", "quota", "settle"], &[])?;
    let path = |name: &str| -> anyhow::Result<PathBuf> {
        let value: String = flags.get(name, String::new())?;
        anyhow::ensure!(!value.is_empty(), "--{name} is required\n\n{USAGE}");
        Ok(Path::new(&value).to_path_buf())
    };
    let quota: String = flags.get("quota", "none".to_owned())?;
    Ok(Some(Options {
        hosts: path("hosts")?,
        bin: path("bin")?,
        work: path("work")?,
        events: flags.get("events", 12_000)?,
        rate: flags.get("rate", 100.0)?,
        quota: (quota != "none").then_some(quota),
        settle: Duration::from_secs(flags.get("settle", 180)?),
    }))
}

#[tokio::main]
async fn main() -> ExitCode {
    tests::init();
    let outcome = match options() {
        Ok(None) => return ExitCode::SUCCESS,
        Ok(Some(options)) => tokio::select! {
            outcome = run(options) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        },
        Err(error) => Err(error),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("webhooks-hosts: {error:#}");
            ExitCode::from(2)
        }
    }
}
