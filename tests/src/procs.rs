//! The system under test as operating-system processes, run the way an
//! operator runs it (settings in the environment): `webhooks-api serve` and
//! `webhooks-dispatcher` processes over a fresh database and queue prefix, or
//! one `webhooks-api standalone` on a fresh `DATA_DIR`. The fault run and the
//! soak start it; processes can be SIGKILLed and started again.
//!
//! Which programs run: [`Programs`]. A tool binary of this package runs
//! itself as each program (see [`exec_as`]), so `cargo run -p tests --bin
//! webhooks-faults` needs nothing else built; `WEBHOOKS_API_BIN` and
//! `WEBHOOKS_DISPATCHER_BIN` name other binaries (a shipped build).

use std::{
    collections::BTreeMap,
    fs::File,
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use uuid::Uuid;
use webhooks_model::{Category, RetrySchedule, Topology};

use crate::{
    Backend, TestCa,
    broker::{self, QueueCleanup},
    db::TestDatabase,
    random_suffix,
};

/// The environment variable that makes a tool binary of this package run as
/// one of the service's programs: `webhooks-api` or `webhooks-dispatcher`.
pub const EXEC_AS: &str = "WEBHOOKS_EXEC_AS";

/// Runs the program [`EXEC_AS`] names, with this process's arguments, when
/// it is set, and returns its exit code; `None` otherwise. A tool's `main`
/// calls it first, so that the tool can start the service's programs by
/// starting itself: the same code as `webhooks-api` and `webhooks-dispatcher`
/// (their `main` is one call). Otherwise it prepares the tool's own TLS.
pub async fn exec_as() -> Option<std::process::ExitCode> {
    let Ok(program) = std::env::var(EXEC_AS) else {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        return None;
    };
    let result = match program.as_str() {
        "webhooks-api" => webhooks_api::main().await,
        "webhooks-dispatcher" => dispatcher::main().await,
        other => Err(anyhow::anyhow!("{EXEC_AS}={other}: not a program of the service")),
    };
    Some(match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error:?}");
            std::process::ExitCode::FAILURE
        }
    })
}

/// One program to start: a binary, run as itself or, for the binary of a
/// tool, as the program [`EXEC_AS`] names.
#[derive(Debug, Clone)]
pub struct Program {
    pub path: PathBuf,
    pub exec_as: Option<&'static str>,
}

impl Program {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.path);
        command.env_clear();
        // Passed through: what the runtime or a developer may want.
        for name in ["PATH", "HOME", "TOKIO_WORKER_THREADS", "RUST_BACKTRACE", "RUST_LIB_BACKTRACE"] {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        if let Some(name) = self.exec_as {
            command.env(EXEC_AS, name);
        }
        command
    }
}

/// The `webhooks-api` and `webhooks-dispatcher` programs.
#[derive(Debug, Clone)]
pub struct Programs {
    pub api: Program,
    pub dispatcher: Program,
}

impl Programs {
    /// The binaries `WEBHOOKS_API_BIN` and `WEBHOOKS_DISPATCHER_BIN` name,
    /// else this executable running as each (its `main` must call
    /// [`exec_as`] first).
    pub fn this_executable() -> anyhow::Result<Programs> {
        let this = std::env::current_exe().context("the path of this executable")?;
        Ok(Programs::from_env_or(
            Program { path: this.clone(), exec_as: Some("webhooks-api") },
            Program { path: this, exec_as: Some("webhooks-dispatcher") },
        ))
    }

    /// The binaries `WEBHOOKS_API_BIN` and `WEBHOOKS_DISPATCHER_BIN` name,
    /// else `api` and `dispatcher` (in tests: `CARGO_BIN_EXE_api-process`
    /// and `CARGO_BIN_EXE_dispatcher-process`).
    pub fn at(api: impl Into<PathBuf>, dispatcher: impl Into<PathBuf>) -> Programs {
        Programs::from_env_or(
            Program { path: api.into(), exec_as: None },
            Program { path: dispatcher.into(), exec_as: None },
        )
    }

    fn from_env_or(api: Program, dispatcher: Program) -> Programs {
        let named = |name: &str| std::env::var_os(name).map(|path| Program { path: path.into(), exec_as: None });
        Programs {
            api: named("WEBHOOKS_API_BIN").unwrap_or(api),
            dispatcher: named("WEBHOOKS_DISPATCHER_BIN").unwrap_or(dispatcher),
        }
    }
}

/// How the system is run.
#[derive(Debug, Clone)]
pub struct StackOptions {
    pub backend: Backend,
    /// `RETRY_SCHEDULE`.
    pub retry_schedule: String,
    /// `DELIVERY_TIMEOUT`.
    pub delivery_timeout: String,
    /// `RUST_LOG` of the processes.
    pub rust_log: String,
    /// `DATABASE_MAX_CONNECTIONS` of each process.
    pub database_max_connections: u32,
    /// Where each process's standard error goes (`<name>.log`, appended).
    pub log_dir: PathBuf,
    /// Further settings of every process (`KEY_ENCRYPTION_KEY`, …), set
    /// after the stack's own.
    pub env: Vec<(String, String)>,
    /// `AMQP_URL` of the distributed system (one address or a cluster's
    /// list); `None`: the tests' broker ([`broker::amqp_url`]).
    pub amqp_url: Option<String>,
    /// Distributed: SQL run on the fresh database once its migrations are
    /// applied, before the API first starts (an installation as an earlier
    /// release left it).
    pub seed: Option<String>,
}

impl StackOptions {
    /// Short retries, so that a run settles in minutes; logs in a fresh
    /// directory under the temporary directory, named after `tool`.
    pub fn new(backend: Backend, tool: &str) -> StackOptions {
        StackOptions {
            backend,
            retry_schedule: "1s,2s,5s,10s,10s,20s,30s,30s,30s,30s".into(),
            delivery_timeout: "5s".into(),
            rust_log: std::env::var("RUST_LOG").unwrap_or_else(|_| "info,lapin=warn,sqlx=warn".into()),
            database_max_connections: 4,
            log_dir: std::env::temp_dir().join(format!("{tool}-{}", random_suffix())),
            env: Vec::new(),
            amqp_url: None,
            seed: None,
        }
    }
}

/// One running process of the system.
#[derive(Debug)]
pub struct Proc {
    /// `api`, `standalone` or `dispatcher-<n>`.
    pub name: String,
    pub pid: u32,
    /// Its internal listener (API, standalone) or `DISPATCHER_LISTEN_ADDR`.
    pub addr: SocketAddr,
    pub started: Instant,
    child: Child,
}

impl Proc {
    /// SIGKILL, and its exit status.
    pub async fn kill(mut self) -> anyhow::Result<ExitStatus> {
        self.child.start_kill().with_context(|| format!("SIGKILL {}", self.name))?;
        self.child.wait().await.with_context(|| format!("the status of {}", self.name))
    }

    /// SIGTERM, then SIGKILL if it is not gone within `grace`.
    pub async fn terminate(mut self, grace: Duration) -> Option<ExitStatus> {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.pid.to_string()).status();
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.start_kill();
                self.child.wait().await.ok()
            }
        }
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its resident memory.
    pub fn memory(&self) -> Option<Memory> {
        Memory::of(self.pid)
    }
}

/// A process's memory, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now, KiB.
    pub rss_kib: u64,
    /// `VmHWM`: the most it was ever resident, KiB.
    pub peak_kib: u64,
}

impl Memory {
    /// The memory of `pid`, if it runs and this is Linux.
    pub fn of(pid: u32) -> Option<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status.lines().find_map(|line| line.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok())
        };
        Some(Memory { rss_kib: field("VmRSS:")?, peak_kib: field("VmHWM:").unwrap_or(0) })
    }

    /// `VmRSS` in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
}

/// A port nobody listens on right now.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The running system: its processes, and what it runs on (a database and a
/// queue prefix, or a `DATA_DIR`), removed by [`Stack::shutdown`].
#[derive(Debug)]
pub struct Stack {
    pub backend: Backend,
    /// The CA its `TLS_EXTRA_ROOTS` trusts: receivers take certificates from it.
    pub ca: TestCa,
    /// A client for its listeners.
    pub client: reqwest::Client,
    /// Its public listener.
    pub public: SocketAddr,
    /// Its internal listener.
    pub internal: SocketAddr,
    /// The API process (`webhooks-api serve` or `standalone`), while it runs.
    pub api: Option<Proc>,
    /// The dispatcher processes running (distributed only).
    pub dispatchers: Vec<Proc>,
    /// Where the processes' logs are.
    pub log_dir: PathBuf,
    programs: Programs,
    options: StackOptions,
    env: Vec<(String, String)>,
    prefix: String,
    amqp_url: String,
    database: Option<TestDatabase>,
    queues: Option<QueueCleanup>,
    data_dir: Option<PathBuf>,
    dispatchers_started: usize,
    api_starts: usize,
}

impl Stack {
    /// Makes a fresh database and queue prefix (distributed) or `DATA_DIR`
    /// (standalone), and starts the API on them; ready when this returns.
    pub async fn start(programs: Programs, options: StackOptions) -> anyhow::Result<Stack> {
        crate::init();
        std::fs::create_dir_all(&options.log_dir)
            .with_context(|| format!("create the log directory {}", options.log_dir.display()))?;
        let ca = TestCa::new()?;
        let (public, internal) = (free_addr()?, free_addr()?);
        let prefix = broker::random_prefix();
        let mut env: Vec<(String, String)> = vec![
            ("API_LISTEN_ADDR".into(), public.to_string()),
            ("INTERNAL_LISTEN_ADDR".into(), internal.to_string()),
            ("TLS_EXTRA_ROOTS".into(), ca.pem_path().to_str().context("temporary path is not UTF-8")?.into()),
            ("TARGET_ALLOW_PRIVATE".into(), "true".into()),
            ("DELIVERY_TIMEOUT".into(), options.delivery_timeout.clone()),
            ("RETRY_SCHEDULE".into(), options.retry_schedule.clone()),
            ("RUST_LOG".into(), options.rust_log.clone()),
        ];
        let (mut database, mut queues, mut data_dir) = (None, None, None);
        let amqp_url = options.amqp_url.clone().unwrap_or_else(broker::amqp_url);
        match options.backend {
            Backend::Distributed => {
                let created = TestDatabase::create().await?;
                if let Some(seed) = &options.seed {
                    let pool = sqlx::PgPool::connect(created.url()).await?;
                    webhooks_store::open::migrate(&pool).await.context("migrate the database to seed")?;
                    sqlx::raw_sql(seed).execute(&pool).await.context("seed the database")?;
                    pool.close().await;
                }
                let schedule: RetrySchedule = options.retry_schedule.parse().map_err(anyhow::Error::msg)?;
                queues = Some(QueueCleanup::new(&amqp_url, &prefix, &schedule));
                env.extend([
                    ("DATABASE_URL".into(), created.url().to_owned()),
                    ("DATABASE_MAX_CONNECTIONS".into(), options.database_max_connections.to_string()),
                    ("AMQP_URL".into(), amqp_url.clone()),
                    ("QUEUE_PREFIX".into(), prefix.clone()),
                    // The sweeper is the net for a message the broker lost
                    // (docs/architecture.md, "Nothing stranded"): at its shortest, so that
                    // what it catches arrives within a run's settle time.
                    ("SWEEP_INTERVAL".into(), "15s".into()),
                ]);
                database = Some(created);
            }
            Backend::Standalone => {
                let dir = std::env::temp_dir().join(format!("webhooks-data-{}", random_suffix()));
                env.push(("DATA_DIR".into(), dir.to_str().context("temporary path is not UTF-8")?.into()));
                data_dir = Some(dir);
            }
        }
        env.extend(options.env.iter().cloned());
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()?;
        let mut stack = Stack {
            backend: options.backend,
            ca,
            client,
            public,
            internal,
            api: None,
            dispatchers: Vec::new(),
            log_dir: options.log_dir.clone(),
            programs,
            options,
            env,
            prefix,
            amqp_url,
            database,
            queues,
            data_dir,
            dispatchers_started: 0,
            api_starts: 0,
        };
        stack.start_api().await?;
        Ok(stack)
    }

    /// `http://<public>/v0`.
    pub fn api_url(&self) -> String {
        format!("http://{}/v0", self.public)
    }

    /// `http://<internal>/internal/events`.
    pub fn ingest_url(&self) -> String {
        format!("http://{}/internal/events", self.internal)
    }

    /// The database the distributed system runs on.
    pub fn database_url(&self) -> Option<&str> {
        self.database.as_ref().map(TestDatabase::url)
    }

    /// The standalone `DATA_DIR`.
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// The `QUEUE_PREFIX` of the distributed system.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Sets `name` to `value` for the processes and commands started from
    /// now on, as an operator changes a setting before a restart.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.env.retain(|(set, _)| set != name);
        self.env.push((name.to_owned(), value.to_owned()));
    }

    /// The log of process `name` (`api`, `standalone`, `dispatcher-<n>`):
    /// what it wrote to standard error, every start of it.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// An operator's command of the API program (`keys reseal`, …) with the
    /// system's settings.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = self.programs.api.command();
        command.args(args).envs(self.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
        command
    }

    fn log_file(&self, name: &str) -> anyhow::Result<File> {
        let path = self.log_dir.join(format!("{name}.log"));
        let mut file = File::options().create(true).append(true).open(&path)?;
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        writeln!(file, "=== {now} started by the test tool")?;
        Ok(file)
    }

    /// Starts the API process (`serve`, or `standalone` on the same
    /// `DATA_DIR` as before) and waits until `/readyz` answers 200.
    pub async fn start_api(&mut self) -> anyhow::Result<()> {
        let proc = self.spawn_api()?;
        let proc = self.ready(proc, "/readyz", Duration::from_secs(60)).await?;
        self.api = Some(proc);
        Ok(())
    }

    /// Starts the API process again without waiting for it (it may start
    /// while the broker or the database is down).
    pub fn respawn_api(&mut self) -> anyhow::Result<()> {
        let proc = self.spawn_api()?;
        self.api = Some(proc);
        Ok(())
    }

    /// Starts the API process without waiting for it.
    fn spawn_api(&mut self) -> anyhow::Result<Proc> {
        let (name, command) = match self.backend {
            Backend::Distributed => ("api", "serve"),
            Backend::Standalone => ("standalone", "standalone"),
        };
        self.api_starts += 1;
        let log = self.log_file(name)?;
        let mut command_line = self.programs.api.command();
        command_line
            .arg(command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            // The first standalone start prints a key there: not for a log.
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = command_line.spawn().with_context(|| format!("start {}", self.programs.api.path.display()))?;
        let pid = child.id().context("the API's pid")?;
        Ok(Proc { name: name.into(), pid, addr: self.internal, started: Instant::now(), child })
    }

    /// Starts another API process (`serve`) beside the first, on listeners
    /// of its own, with `env` over the stack's settings, and waits until its
    /// `/readyz` answers 200. Returns it; its `addr` is its internal
    /// listener.
    pub async fn start_another_api(&mut self, name: &str, env: &[(&str, &str)]) -> anyhow::Result<Proc> {
        anyhow::ensure!(self.backend == Backend::Distributed, "standalone mode runs one process");
        let (public, internal) = (free_addr()?, free_addr()?);
        let log = self.log_file(name)?;
        let mut command = self.programs.api.command();
        command
            .arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("API_LISTEN_ADDR", public.to_string())
            .env("INTERNAL_LISTEN_ADDR", internal.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("start {}", self.programs.api.path.display()))?;
        let pid = child.id().context("the API's pid")?;
        let proc = Proc { name: name.into(), pid, addr: internal, started: Instant::now(), child };
        self.ready(proc, "/readyz", Duration::from_secs(60)).await
    }

    /// How often the API process was started.
    pub fn api_starts(&self) -> usize {
        self.api_starts
    }

    /// Starts a dispatcher process without waiting for it to be ready (it
    /// may start while the broker or the database is down); see
    /// [`Stack::start_dispatcher`].
    pub fn spawn_dispatcher(&mut self) -> anyhow::Result<Proc> {
        anyhow::ensure!(self.backend == Backend::Distributed, "standalone mode has no dispatcher process");
        self.dispatchers_started += 1;
        let name = format!("dispatcher-{}", self.dispatchers_started);
        let addr = free_addr()?;
        let log = self.log_file(&name)?;
        let mut command = self.programs.dispatcher.command();
        command
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("DISPATCHER_LISTEN_ADDR", addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("start {}", self.programs.dispatcher.path.display()))?;
        let pid = child.id().context("the dispatcher's pid")?;
        Ok(Proc { name, pid, addr, started: Instant::now(), child })
    }

    /// Starts a dispatcher process, waits until its `/readyz` answers 200
    /// and adds it to [`Stack::dispatchers`].
    pub async fn start_dispatcher(&mut self) -> anyhow::Result<()> {
        let proc = self.spawn_dispatcher()?;
        let proc = self.ready(proc, "/readyz", Duration::from_secs(60)).await?;
        self.dispatchers.push(proc);
        Ok(())
    }

    /// How many dispatcher processes were started so far.
    pub fn dispatchers_started(&self) -> usize {
        self.dispatchers_started
    }

    /// Waits until `proc` answers `path` with 200; fails if it exits first.
    async fn ready(&self, mut proc: Proc, path: &str, within: Duration) -> anyhow::Result<Proc> {
        let url = format!("http://{}{path}", proc.addr);
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = proc.exited() {
                bail!("{} exited before it answered {path}: {status} (log: {})", proc.name, self.log_dir.display());
            }
            if self.client.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
                return Ok(proc);
            }
            if Instant::now() > deadline {
                bail!("{} did not answer {path} with 200 within {within:?}", proc.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether `proc` answers `/healthz` (it runs and listens).
    pub async fn alive(&self, proc: &Proc) -> bool {
        self.client.get(format!("http://{}/healthz", proc.addr)).send().await.is_ok()
    }

    /// `webhooks-api keys create`, as the operator makes keys: an
    /// unrestricted key of `developer` (of a new developer when `None`).
    /// Returns the plaintext key and its developer.
    pub async fn create_key(&self, developer: Option<Uuid>) -> anyhow::Result<(String, Uuid)> {
        let mut command = self.programs.api.command();
        command.args(["keys", "create", "--name", "test tool"]).envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(developer) = developer {
            command.args(["--developer-id", &developer.to_string()]);
        }
        let output = command.stdin(Stdio::null()).output().await.context("run webhooks-api keys create")?;
        created_key(&output)
    }

    /// Registers an endpoint for `url` with `categories` (empty: all) under
    /// `key`, switches it on and returns the `Webhook`.
    pub async fn active_endpoint(&self, key: &str, url: &str, categories: &[Category]) -> anyhow::Result<Value> {
        active_endpoint(&self.client, &self.api_url(), key, url, categories).await
    }

    /// How many deliveries are in each state, read from the store (the
    /// standalone one only while no process holds it is the safe time, but
    /// SQLite readers do not block its writer).
    pub async fn delivery_states(&self) -> anyhow::Result<BTreeMap<String, i64>> {
        let query = "SELECT state, count(*) FROM deliveries GROUP BY state";
        let rows: Vec<(String, i64)> = match (&self.database, &self.data_dir) {
            (Some(database), _) => {
                let pool = sqlx::PgPool::connect(database.url()).await?;
                let rows = sqlx::query_as(query).fetch_all(&pool).await?;
                pool.close().await;
                rows
            }
            (None, Some(dir)) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.join("webhooks.db"))
                    .read_only(true)
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::SqlitePool::connect_with(options).await?;
                let rows = sqlx::query_as(query).fetch_all(&pool).await?;
                pool.close().await;
                rows
            }
            (None, None) => Vec::new(),
        };
        Ok(rows.into_iter().collect())
    }

    /// Rows left in the outbox (distributed only).
    pub async fn outbox_rows(&self) -> anyhow::Result<Option<i64>> {
        let Some(database) = &self.database else { return Ok(None) };
        let pool = sqlx::PgPool::connect(database.url()).await?;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox").fetch_one(&pool).await?;
        pool.close().await;
        Ok(Some(rows))
    }

    /// Deliveries the sweeper queued again at least once: a new generation,
    /// which only a sweep (or `send`, which a run does not use) makes
    /// (distributed only).
    pub async fn swept_deliveries(&self) -> anyhow::Result<Option<i64>> {
        let Some(database) = &self.database else { return Ok(None) };
        let pool = sqlx::PgPool::connect(database.url()).await?;
        let rows: i64 =
            sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE generation > 0").fetch_one(&pool).await?;
        pool.close().await;
        Ok(Some(rows))
    }

    /// Messages in the dead-letter queue `{p}.dead` (distributed only).
    pub async fn dead_letters(&self) -> anyhow::Result<Option<u32>> {
        if self.backend != Backend::Distributed {
            return Ok(None);
        }
        let schedule: RetrySchedule = self.options.retry_schedule.parse().map_err(anyhow::Error::msg)?;
        let dead = Topology::new(&self.prefix, &schedule).dead();
        let connection = webhooks_queue::amqp::connect(&self.amqp_url, "webhooks test tool").await?;
        let channel = connection.create_channel().await?;
        let declared = channel
            .queue_declare(
                dead.as_str().into(),
                lapin::options::QueueDeclareOptions { passive: true, ..Default::default() },
                lapin::types::FieldTable::default(),
            )
            .await;
        let _ = connection.close(200, "done".into()).await;
        Ok(declared.ok().map(|queue| queue.message_count()))
    }

    /// Stops every process (SIGTERM, then SIGKILL after `grace`) and removes
    /// the database, the queues and the `DATA_DIR`. The log directory stays.
    pub async fn shutdown(mut self, grace: Duration) {
        let mut stopping: Vec<Proc> = self.dispatchers.drain(..).collect();
        stopping.extend(self.api.take());
        futures::future::join_all(stopping.into_iter().map(|p| p.terminate(grace))).await;
        if let Some(database) = self.database.take() {
            database.remove().await;
        }
        if let Some(queues) = self.queues.take() {
            queues.remove().await;
        }
        if let Some(dir) = self.data_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Children are killed on drop; the database and queues clean up in
        // their own `Drop`.
        if let Some(dir) = self.data_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The key and its developer from what `webhooks-api keys create` printed.
pub fn created_key(output: &std::process::Output) -> anyhow::Result<(String, Uuid)> {
    anyhow::ensure!(
        output.status.success(),
        "keys create: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let created: Value = serde_json::from_slice(&output.stdout).context("keys create prints JSON")?;
    let key = created["key"].as_str().context("no key")?.to_owned();
    let developer = created["api_key"]["owner_id"].as_str().context("no owner_id")?.parse()?;
    Ok((key, developer))
}

/// Registers an endpoint for `url` with `categories` (empty: all) under
/// `key` at `api_url` (`http://<public>/v0`), switches it on and returns
/// the `Webhook`.
pub async fn active_endpoint(
    client: &reqwest::Client,
    api_url: &str,
    key: &str,
    url: &str,
    categories: &[Category],
) -> anyhow::Result<Value> {
    let names: Vec<&str> = categories.iter().map(|c| c.as_str()).collect();
    active_endpoint_of(client, api_url, key, json!({ "url": url, "event_categories": names })).await
}

/// Registers the endpoint `body` describes (the body of `POST /webhooks`) and
/// switches it on; returns it as the `PUT` answered.
pub async fn active_endpoint_of(
    client: &reqwest::Client,
    api_url: &str,
    key: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let response = client
        .post(format!("{api_url}/webhooks"))
        .header("Api-Key", key)
        .header("Idempotency-Key", Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    let created: Value = response.json().await?;
    anyhow::ensure!(status == 201, "POST /webhooks answered {status}: {created}");
    let id = created["id"].as_str().context("no endpoint id")?;
    let response = client
        .put(format!("{api_url}/webhooks/{id}"))
        .header("Api-Key", key)
        .json(&json!({ "status": "active" }))
        .send()
        .await?;
    let status = response.status();
    let updated: Value = response.json().await?;
    anyhow::ensure!(status == 200 && updated["status"] == "active", "PUT /webhooks/{id} answered {status}: {updated}");
    Ok(updated)
}
