//! One running API instance per test: its own database, queue prefix and CA,
//! `api::run` on two port-0 listeners, and helpers that speak the contract.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use bytes::Bytes;
use reqwest::{Method, RequestBuilder, header::HeaderMap};
use serde_json::Value;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_config::Environment;
use webhooks_model::{ApiKey, ApiKeyType, Scope, time::Clock};
use webhooks_store::{Store, queue::QueueStore};

use crate::{
    WAIT,
    broker::{self, LifecycleTap, QueueCleanup},
    ca::TestCa,
    db::TestDatabase,
    dispatcher::TestDispatcher,
    expect, init,
    receiver::Receiver,
};

/// How an instance is configured; [`Default`] is what most tests want.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// `--target-allow-private`: true so receivers on 127.0.0.1 can be registered.
    pub allow_private: bool,
    /// `--max-endpoints-per-developer`.
    pub max_endpoints: u32,
    /// `--internal-token`, when set.
    pub internal_token: Option<String>,
    /// `--delivery-timeout` (also bounds the TLS check at registration).
    pub delivery_timeout: String,
    /// `--retry-schedule`, when set.
    pub retry_schedule: Option<String>,
    /// `--platform-environment`.
    pub environment: Environment,
    /// Further flags, appended last.
    pub extra_args: Vec<String>,
    /// Flags of delivery (`--dispatcher-concurrency` and the like): given to
    /// every dispatcher started for the instance, or in standalone mode to
    /// the instance itself.
    pub delivery_args: Vec<String>,
    /// `--database-max-connections` of each process (distributed).
    pub database_max_connections: u32,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            allow_private: true,
            max_endpoints: 5,
            internal_token: None,
            delivery_timeout: "5s".into(),
            retry_schedule: None,
            environment: Environment::Sandbox,
            extra_args: Vec::new(),
            delivery_args: Vec::new(),
            database_max_connections: 4,
        }
    }
}

/// An API key made for a test, with its plaintext.
#[derive(Debug, Clone)]
pub struct DeveloperKey {
    /// The plaintext to send as `Api-Key`.
    pub key: String,
    pub api_key: ApiKey,
}

impl DeveloperKey {
    /// The developer the key belongs to.
    pub fn developer_id(&self) -> Uuid {
        self.api_key.owner_id
    }

    /// The key's id.
    pub fn id(&self) -> Uuid {
        self.api_key.id
    }

    /// The plaintext, for the request helpers.
    pub fn as_str(&self) -> &str {
        &self.key
    }
}

impl AsRef<str> for DeveloperKey {
    fn as_ref(&self) -> &str {
        &self.key
    }
}

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    /// `METHOD path`, for failure messages.
    pub request: String,
    pub status: u16,
    pub headers: HeaderMap,
    /// The raw body.
    pub body: Bytes,
    /// The body as JSON, `Value::Null` when it is not JSON.
    pub json: Value,
}

impl ApiResponse {
    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status and returns the JSON body.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Value {
        assert_eq!(self.status, status, "{} answered {}: {}", self.request, self.status, self.text());
        &self.json
    }

    /// Asserts an error answer: the status, a JSON body in the error shape of
    /// API.md §2, and `code`. Returns the body.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> &Value {
        self.expect(status);
        let content_type = self.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(
            content_type.starts_with("application/json"),
            "{} answered {status} with Content-Type {content_type:?}: {}",
            self.request,
            self.text()
        );
        let problems = expect::error_shape_problems(&self.json);
        assert!(problems.is_empty(), "{} answered {status} {}: {}", self.request, self.text(), problems.join(", "));
        assert_eq!(self.json["code"], code, "{} answered {status}: {}", self.request, self.text());
        &self.json
    }

    /// Asserts an error answer with `source: {location, key}`.
    #[track_caller]
    pub fn expect_error_at(&self, status: u16, code: &str, location: &str, key: &str) -> &Value {
        self.expect_error(status, code);
        assert_eq!(
            self.json["source"],
            serde_json::json!({"location": location, "key": key}),
            "{} answered {status}: {}",
            self.request,
            self.text()
        );
        &self.json
    }

    /// Asserts that the status is not a server error and that an error status
    /// comes with a body in the error shape.
    #[track_caller]
    pub fn expect_handled(&self) {
        assert!(self.status < 500, "{} answered {}: {}", self.request, self.status, self.text());
        if self.status >= 400 {
            let problems = expect::error_shape_problems(&self.json);
            assert!(
                problems.is_empty(),
                "{} answered {} {:?}: {}",
                self.request,
                self.status,
                self.text(),
                problems.join(", ")
            );
        }
    }
}

/// Which deployment a test runs against: `TEST_BACKEND=standalone` runs the
/// black-box suite against standalone mode (one process, SQLite, no broker);
/// anything else (the default) against the distributed system (PostgreSQL,
/// RabbitMQ and dispatchers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Distributed,
    Standalone,
}

impl Backend {
    /// The program whose flags a dispatcher of this backend takes.
    fn program(self) -> &'static str {
        match self {
            Backend::Distributed => "webhooks-dispatcher",
            Backend::Standalone => "webhooks-api",
        }
    }

    /// The backend of the running test: the one `#[tests::test]` runs it
    /// on, else the one `TEST_BACKEND` names (`standalone`; distributed
    /// otherwise).
    pub fn current() -> Backend {
        CURRENT.try_with(|backend| *backend).unwrap_or_else(|_| match std::env::var("TEST_BACKEND").as_deref() {
            Ok("standalone") => Backend::Standalone,
            _ => Backend::Distributed,
        })
    }

    /// Runs `test` with this as [`Backend::current`].
    pub async fn scope<F: std::future::Future>(self, test: F) -> F::Output {
        CURRENT.scope(self, test).await
    }
}

tokio::task_local! {
    static CURRENT: Backend;
}

/// A standalone instance's `DATA_DIR`, removed on drop.
#[derive(Debug)]
struct DataDir(std::path::PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One API instance and everything it owns.
#[derive(Debug)]
pub struct TestApi {
    /// Which deployment this is.
    pub backend: Backend,
    /// The public listener.
    pub public: SocketAddr,
    /// The internal listener.
    pub internal: SocketAddr,
    /// A client for the API (no proxy, generous timeout).
    pub client: reqwest::Client,
    /// The store of the instance, for issuing keys as the operator does.
    pub store: Store,
    /// The store's side of its queue, for in-process delivery in standalone
    /// mode.
    queue_store: QueueStore,
    /// A pool of its own on the PostgreSQL database (distributed mode), for
    /// what a test reads or writes behind the instance's back.
    pool: Option<sqlx::PgPool>,
    /// The CA the instance trusts through `TLS_EXTRA_ROOTS`.
    pub ca: Arc<TestCa>,
    /// This instance's `QUEUE_PREFIX`.
    pub prefix: String,
    /// The configuration it runs with.
    pub config: api::Config,
    /// The AMQP URL it uses.
    pub amqp_url: String,
    /// The clock of endpoint health, shared by the instance and every
    /// dispatcher started for it: tests move it to let days pass.
    pub clock: Clock,
    internal_token: Option<String>,
    shared_args: Vec<String>,
    delivery_args: Vec<String>,
    shutdown: CancellationToken,
    running: Option<JoinHandle<anyhow::Result<()>>>,
    database: Option<TestDatabase>,
    queues: Option<QueueCleanup>,
    data_dir: Option<DataDir>,
    _watchdog: Watchdog,
}

/// How long one test may run with its API before its test binary is aborted
/// (`TEST_DEADLINE_SECS` overrides it): a hang must fail, loudly, not stall
/// the run.
pub const TEST_DEADLINE: Duration = Duration::from_secs(300);

fn test_deadline() -> Duration {
    std::env::var("TEST_DEADLINE_SECS").ok().and_then(|s| s.parse().ok()).map_or(TEST_DEADLINE, Duration::from_secs)
}

/// Aborts the process if it is not dropped within its deadline, after
/// dumping the flight record and the threads' backtraces.
#[derive(Debug)]
struct Watchdog {
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl Watchdog {
    fn start(what: String) -> Watchdog {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = done.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let deadline = test_deadline();
            while started.elapsed() < deadline {
                if seen.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            crate::flight::dump(&format!(
                "a test ({what}) ran for over {deadline:?}: it hangs; aborting its test binary"
            ));
            std::process::abort();
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl TestApi {
    /// An instance with [`ApiOptions::default`].
    pub async fn start() -> anyhow::Result<TestApi> {
        TestApi::start_with(ApiOptions::default()).await
    }

    /// An instance configured by `options`, ready (database and broker) when
    /// this returns, on [`Backend::current`].
    pub async fn start_with(options: ApiOptions) -> anyhow::Result<TestApi> {
        init();
        let backend = Backend::current();
        let prefix = broker::random_prefix();
        let amqp_url = broker::amqp_url();
        let ca = Arc::new(TestCa::new()?);
        let environment = match options.environment {
            Environment::Sandbox => "sandbox",
            Environment::Production => "production",
        };
        let (database, data_dir) = match backend {
            Backend::Distributed => (Some(TestDatabase::create().await?), None),
            Backend::Standalone => {
                let dir = std::env::temp_dir().join(format!("webhooks-test-data-{}", crate::random_suffix()));
                (None, Some(DataDir(dir)))
            }
        };
        // The settings both programs share, so a dispatcher can join later.
        let mut shared_args: Vec<String> = [
            "--queue-prefix",
            &prefix,
            "--platform-environment",
            environment,
            "--tls-extra-roots",
            ca.pem_path().to_str().context("temporary directory path is not UTF-8")?,
            "--target-allow-private",
            if options.allow_private { "true" } else { "false" },
            "--delivery-timeout",
            &options.delivery_timeout,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if let Some(database) = &database {
            let connections = options.database_max_connections.to_string();
            shared_args.extend(
                ["--database-url", database.url(), "--database-max-connections", &connections].map(String::from),
            );
            shared_args.extend(["--amqp-url".to_owned(), amqp_url.clone()]);
        }
        if let Some(DataDir(dir)) = &data_dir {
            let dir = dir.to_str().context("temporary directory path is not UTF-8")?;
            shared_args.extend(["--data-dir".to_owned(), dir.to_owned()]);
        }
        if let Some(schedule) = &options.retry_schedule {
            shared_args.extend(["--retry-schedule".to_owned(), schedule.clone()]);
        }
        let mut args = vec!["webhooks-api".to_owned()];
        args.extend(shared_args.iter().cloned());
        args.extend(["--max-endpoints-per-developer".to_owned(), options.max_endpoints.to_string()]);
        if let Some(token) = &options.internal_token {
            args.extend(["--internal-token".to_owned(), token.clone()]);
        }
        args.extend(options.extra_args.iter().cloned());

        let listeners = api::Listeners {
            public: TcpListener::bind("127.0.0.1:0").await?,
            internal: TcpListener::bind("127.0.0.1:0").await?,
        };
        let (public, internal) = (listeners.public.local_addr()?, listeners.internal.local_addr()?);
        let shutdown = CancellationToken::new();
        let clock = Clock::default();
        let (config, store, queue_store, queues, running) = match &data_dir {
            None => {
                let mut config = api::Config::from_args(&args).context("API flags")?;
                config.common.clock = clock.clone();
                let queues = QueueCleanup::new(&amqp_url, &prefix, &config.common.retry_schedule);
                let (store, queue_store) =
                    webhooks_store::open::distributed(&config.common).await.context("test database")?;
                let running = tokio::spawn(api::run(config.clone(), listeners, shutdown.clone()));
                (config, store, queue_store, Some(queues), running)
            }
            Some(DataDir(dir)) => {
                let mut standalone = api::config::StandaloneConfig::from_args(&args).context("standalone flags")?;
                standalone.api.common.clock = clock.clone();
                let (store, queue_store) = webhooks_store::open::standalone(dir).await.context("standalone store")?;
                let config = standalone.api.clone();
                // Delivery runs beside it when a test starts a dispatcher,
                // as `webhooks-api standalone` runs it beside its listeners.
                let running = tokio::spawn(api::run_standalone_without_delivery(
                    standalone.api,
                    (store.clone(), queue_store.clone()),
                    listeners,
                    shutdown.clone(),
                ));
                (config, store, queue_store, None, running)
            }
        };
        let client =
            // Idle connections are dropped before the API's HEADER_READ_TIMEOUT
            // closes them, so a request never goes out on one being closed.
            reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .context("HTTP client")?;

        let pool = match &database {
            Some(database) => Some(sqlx::PgPool::connect(database.url()).await.context("test database pool")?),
            None => None,
        };
        let mut api = TestApi {
            backend,
            public,
            internal,
            client,
            store,
            queue_store,
            pool,
            ca,
            prefix,
            config,
            amqp_url,
            internal_token: options.internal_token,
            clock,
            shared_args,
            delivery_args: options.delivery_args,
            shutdown,
            running: Some(running),
            database,
            queues,
            data_dir,
            _watchdog: Watchdog::start(std::thread::current().name().unwrap_or("unnamed").to_owned()),
        };
        api.wait_ready().await?;
        Ok(api)
    }

    /// Polls `/readyz` until it answers 200, or fails early if `run` returned.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut pause = Duration::from_millis(20);
        loop {
            if let Some(running) = self.running.as_mut().filter(|r| r.is_finished()) {
                let outcome = running.await;
                self.running = None;
                anyhow::bail!("the API stopped before it was ready: {outcome:?}");
            }
            if let Ok(response) = self.internal_request(Method::GET, "/readyz").send().await
                && response.status() == 200
            {
                return Ok(());
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the API was not ready within {WAIT:?}");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// `http://<public>/v0`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v0", self.public)
    }

    /// `http://<internal>`.
    pub fn internal_url(&self) -> String {
        format!("http://{}", self.internal)
    }

    /// A request to the public listener; `path` is taken as is (`/v0/...`).
    pub fn raw_request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("http://{}{path}", self.public))
    }

    /// A request to the internal listener, with the bearer token when one is configured.
    pub fn internal_request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.internal_url()));
        match &self.internal_token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends `request` and reads the whole answer.
    pub async fn send(&self, request: RequestBuilder) -> ApiResponse {
        let built = request.build().expect("request builds");
        let label = format!("{} {}", built.method(), built.url().path());
        let response = self.client.execute(built).await.unwrap_or_else(|e| panic!("{label}: no answer: {e:?}"));
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_else(|e| panic!("{label}: body unreadable: {e:?}"));
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        ApiResponse { request: label, status, headers, body, json }
    }

    fn v0(&self, method: Method, path: &str, key: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base_url())).header("Api-Key", key)
    }

    /// `GET /v0{path}` with `Api-Key: key`.
    pub async fn get(&self, path: &str, key: impl AsRef<str>) -> ApiResponse {
        self.send(self.v0(Method::GET, path, key.as_ref())).await
    }

    /// `POST /v0{path}` with a JSON body and a fresh `Idempotency-Key`.
    pub async fn post(&self, path: &str, key: impl AsRef<str>, body: &Value) -> ApiResponse {
        self.post_idempotent(path, key, &Uuid::new_v4().to_string(), body).await
    }

    /// `POST /v0{path}` with a JSON body and the given `Idempotency-Key`.
    pub async fn post_idempotent(
        &self,
        path: &str,
        key: impl AsRef<str>,
        idempotency_key: &str,
        body: &Value,
    ) -> ApiResponse {
        self.send(self.v0(Method::POST, path, key.as_ref()).header("Idempotency-Key", idempotency_key).json(body)).await
    }

    /// `PUT /v0{path}` with a JSON body.
    pub async fn put(&self, path: &str, key: impl AsRef<str>, body: &Value) -> ApiResponse {
        self.send(self.v0(Method::PUT, path, key.as_ref()).json(body)).await
    }

    /// `DELETE /v0{path}`.
    pub async fn delete(&self, path: &str, key: impl AsRef<str>) -> ApiResponse {
        self.send(self.v0(Method::DELETE, path, key.as_ref())).await
    }

    /// A request to `/v0{path}` with `Api-Key: key`, to finish by hand (odd
    /// headers and bodies); send it with [`TestApi::send`].
    pub fn request(&self, method: Method, path: &str, key: impl AsRef<str>) -> RequestBuilder {
        self.v0(method, path, key.as_ref())
    }

    /// A key of a new developer with `scopes`, made as `webhooks-api keys create` does.
    pub async fn new_developer_key(&self, scopes: &[Scope]) -> DeveloperKey {
        self.key_for(Uuid::new_v4(), scopes).await
    }

    /// A further key of `developer_id`, made as `webhooks-api keys create` does.
    pub async fn key_for(&self, developer_id: Uuid, scopes: &[Scope]) -> DeveloperKey {
        self.issue_key(self.config.common.platform_environment, developer_id, scopes).await
    }

    /// A key of `environment` (the other one makes a key this instance must refuse).
    pub async fn issue_key(&self, environment: Environment, developer_id: Uuid, scopes: &[Scope]) -> DeveloperKey {
        let issued =
            api::keys::issue(&self.store, environment, developer_id, ApiKeyType::Public, scopes, Some("test key"))
                .await
                .expect("issue a key");
        DeveloperKey { key: issued.key, api_key: issued.api_key }
    }

    /// An unrestricted key of a new developer.
    pub async fn new_developer(&self) -> DeveloperKey {
        self.new_developer_key(&[Scope::Unrestricted]).await
    }

    /// A receiver whose certificate this instance trusts.
    pub async fn receiver(&self) -> Receiver {
        Receiver::start(&self.ca).await.expect("start a receiver")
    }

    /// Registers an endpoint for `url` and returns the `Webhook` (asserts 201).
    pub async fn create_endpoint(&self, key: impl AsRef<str>, url: &str) -> Value {
        self.post("/webhooks", key, &serde_json::json!({ "url": url })).await.expect(201).clone()
    }

    /// `POST /internal/events` with `body` (`developer_id`, `event_category`, …).
    pub async fn ingest(&self, body: &Value) -> ApiResponse {
        self.send(self.internal_request(Method::POST, "/internal/events").json(body)).await
    }

    /// A dispatcher on this instance's database, prefix, roots and delivery
    /// settings, ready when this returns.
    pub async fn start_dispatcher(&self) -> anyhow::Result<TestDispatcher> {
        self.start_dispatcher_with(&[]).await
    }

    /// [`TestApi::start_dispatcher`] with further dispatcher flags. In
    /// standalone mode this starts the instance's in-process delivery
    /// (`dispatcher::start_embedded` over its store, as `webhooks-api
    /// standalone` runs it), which stops with the handle. One at a time there:
    /// a second would release the first one's claims as a restart does.
    pub async fn start_dispatcher_with(&self, extra_args: &[&str]) -> anyhow::Result<TestDispatcher> {
        let mut args = vec![self.backend.program().to_owned()];
        args.extend(self.shared_args.iter().cloned());
        args.extend(self.delivery_args.iter().cloned());
        args.extend(extra_args.iter().map(|s| (*s).to_owned()));
        match &self.queue_store {
            QueueStore::Outbox(_) => TestDispatcher::start(args, self.clock.clone(), &self.client).await,
            table @ QueueStore::Table(_) => {
                let opened = (self.store.clone(), table.clone());
                TestDispatcher::start_embedded(args, opened, self.clock.clone(), &self.client).await
            }
        }
    }

    /// A tap on this instance's lifecycle exchange.
    pub async fn lifecycle_tap(&self) -> LifecycleTap {
        LifecycleTap::start(&self.amqp_url, &self.prefix).await.expect("lifecycle tap")
    }

    /// Everything the instance keeps, as text, each part under a `== <name>`
    /// line: every row of every table of the PostgreSQL database (bytea as
    /// hex), or every file of the standalone `DATA_DIR` (as lossy text, then
    /// as hex), so a test can look for what must never be stored.
    pub async fn stored_dump(&self) -> String {
        let mut dump = String::new();
        if let Some(DataDir(dir)) = &self.data_dir {
            let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read DATA_DIR").flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let bytes = std::fs::read(entry.path()).unwrap_or_default();
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let name = entry.file_name().to_string_lossy().into_owned();
                dump.push_str(&format!("== {name}\n{}\n== {name} (hex)\n{hex}\n", String::from_utf8_lossy(&bytes)));
            }
            return dump;
        }
        let pool = self.pool();
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
        )
        .fetch_all(pool)
        .await
        .expect("list tables");
        for table in tables {
            let rows: Option<String> =
                sqlx::query_scalar(&format!("SELECT string_agg(row_to_json(t)::text, '\n') FROM \"{table}\" t"))
                    .fetch_one(pool)
                    .await
                    .expect("dump a table");
            dump.push_str(&format!("== {table}\n{}\n", rows.unwrap_or_default()));
        }
        dump
    }

    /// Runs one SQL statement on the instance's own database, behind its
    /// back (to damage a row as a failing disk or a bad restore would):
    /// PostgreSQL, or the SQLite file of the standalone `DATA_DIR` through a
    /// connection of its own. `$1` is bound to `param`.
    pub async fn execute_sql(&self, sql: &str, param: &str) {
        match &self.data_dir {
            Some(DataDir(dir)) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.join(webhooks_store::open::DATABASE_FILE))
                    .busy_timeout(std::time::Duration::from_secs(10));
                let pool = sqlx::SqlitePool::connect_with(options).await.expect("open the SQLite file");
                sqlx::query(sql).bind(param).execute(&pool).await.expect("run SQL on SQLite");
                pool.close().await;
            }
            None => {
                let pool = self.pool();
                sqlx::query(sql).bind(param).execute(pool).await.expect("run SQL on PostgreSQL");
            }
        }
    }

    /// A pool on the instance's PostgreSQL database, for what a test reads or
    /// writes behind its back. Panics in standalone mode.
    pub fn pool(&self) -> &sqlx::PgPool {
        self.pool.as_ref().expect("a distributed instance runs on PostgreSQL")
    }

    /// The outbox of the instance's queue (distributed mode), for tests of
    /// the sweeper's statements. Panics in standalone mode.
    pub fn outbox(&self) -> &webhooks_store::queue::Outbox {
        match &self.queue_store {
            QueueStore::Outbox(outbox) => outbox,
            QueueStore::Table(_) => panic!("a standalone instance has no outbox"),
        }
    }

    /// The deliveries table of the instance's queue (standalone mode).
    /// Panics in the distributed mode.
    pub fn delivery_table(&self) -> &webhooks_store::queue::DeliveryTable {
        match &self.queue_store {
            QueueStore::Table(table) => table,
            QueueStore::Outbox(_) => panic!("a distributed instance has no delivery table"),
        }
    }

    /// Whether this instance runs in standalone mode.
    pub fn is_standalone(&self) -> bool {
        self.data_dir.is_some()
    }

    /// Stops the instance as SIGTERM does and starts it again on the same
    /// database (or `DATA_DIR`) and settings, on new ports; ready when this
    /// returns.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        let listeners = api::Listeners {
            public: TcpListener::bind("127.0.0.1:0").await?,
            internal: TcpListener::bind("127.0.0.1:0").await?,
        };
        (self.public, self.internal) = (listeners.public.local_addr()?, listeners.internal.local_addr()?);
        self.shutdown = CancellationToken::new();
        let running = match &self.queue_store {
            QueueStore::Outbox(_) => tokio::spawn(api::run(self.config.clone(), listeners, self.shutdown.clone())),
            QueueStore::Table(_) => tokio::spawn(api::run_standalone_without_delivery(
                self.config.clone(),
                (self.store.clone(), self.queue_store.clone()),
                listeners,
                self.shutdown.clone(),
            )),
        };
        self.running = Some(running);
        self.wait_ready().await
    }

    /// Cancels the shutdown token and waits for `api::run` to return its result.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.running.take() {
            Some(running) => running.await.context("the API task panicked")?,
            None => Ok(()),
        }
    }

    /// Stops the instance (waiting up to [`WAIT`]) and removes its database and queues.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let stopped = tokio::time::timeout(WAIT, self.stop()).await;
        if let Some(database) = self.database.take() {
            database.remove().await;
        }
        if let Some(queues) = self.queues.take() {
            queues.remove().await;
        }
        self.data_dir.take();
        stopped.map_err(|_| anyhow::anyhow!("the API did not stop within {WAIT:?}"))?
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            // Let it stop before its database and queues go, so it does not
            // declare them again; a test runtime with one thread cannot run it
            // meanwhile, hence the bound.
            crate::block_on_aside(async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
            });
        }
        // `database` and `queues` clean up in their own `Drop`.
    }
}
