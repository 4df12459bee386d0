//! The `webhooks-api` program: parses its command line, sets up tracing and
//! runs the command. Serving is the control plane's ([`api::run`],
//! [`api::run_standalone`]); the operator's commands live here:
//!
//! - [`operator`]: `events send`, `endpoints list|logs`;
//! - [`reseal`]: `keys reseal`, a step of rotating `KEY_ENCRYPTION_KEY`;
//! - [`receiver`]: `receiver`, an HTTPS receiver for development;
//! - `verify`: a delivery checked as a receiver does, with the verifier of
//!   `webhooks-signature`.

pub mod operator;
pub mod receiver;
pub mod reseal;

use std::{io::Write, path::Path};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::net::TcpListener;
use uuid::Uuid;
use webhooks_config::CommonConfig;
use webhooks_model::{ApiKeyType, Topology};
use webhooks_queue::amqp::dead_letters;

use api::config::StandaloneConfig;

#[derive(Debug, Parser)]
#[command(name = "webhooks-api", version, about = "The control plane of the webhook delivery service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the public API and the internal listener (applies migrations first).
    Serve(Box<api::Config>),
    /// Run the whole system in one process, with everything kept under
    /// DATA_DIR: no PostgreSQL, no RabbitMQ. Prints a key on the first start.
    Standalone(Box<StandaloneConfig>),
    /// Apply the database schema and exit.
    Migrate(MigrateArgs),
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Print the OpenAPI document on stdout.
    Openapi,
    /// The dead-letter queue `{QUEUE_PREFIX}.dead` of the distributed mode.
    DeadLetters {
        #[command(subcommand)]
        command: DeadLettersCommand,
    },
    /// Hand an event to a running service, for testing.
    Events {
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// A developer's endpoints and their delivery logs, from the store.
    Endpoints {
        #[command(subcommand)]
        command: EndpointsCommand,
    },
    /// An HTTPS receiver for development: a throwaway CA, one line per
    /// delivery, the last one kept for `verify`.
    Receiver(ReceiverArgs),
    /// Check a delivery as a receiver does (the kits' CLI, kits/README.md):
    /// prints `genuine: <scheme> signature` (exit 0) or `refused: <reason>`
    /// (exit 1); exit 2 on a usage error or an unusable key.
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// A JSON object: header name -> string value.
    #[arg(long, value_name = "FILE")]
    headers: std::path::PathBuf,
    /// The raw body bytes.
    #[arg(long, value_name = "FILE")]
    body: std::path::PathBuf,
    /// The PEM public key or the whpk_... text.
    #[arg(long, value_name = "FILE")]
    key: std::path::PathBuf,
    /// The receiver's clock, unix milliseconds (default: now).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    now_ms: Option<i64>,
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// POST an event (the body of `POST /internal/events`, from a file or
    /// `-` for stdin) to the internal listener of a running service.
    Send(SendArgs),
}

#[derive(Debug, Args)]
struct SendArgs {
    /// A JSON file with the event, or `-` for stdin.
    #[arg(default_value = "-")]
    file: std::path::PathBuf,
    /// The internal listener of the running service.
    #[arg(long, env = "INTERNAL_URL", default_value = "http://127.0.0.1:8081")]
    internal_url: String,
    /// The service's `INTERNAL_TOKEN`, when it runs with one.
    #[arg(long, env = "INTERNAL_TOKEN", hide_env_values = true)]
    internal_token: Option<webhooks_config::Secret>,
    /// Sent as `Idempotency-Key`: a repeat answers the event it made.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Print the accepted event as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum EndpointsCommand {
    /// A developer's endpoints: status, scheme, url and health.
    List(EndpointsListArgs),
    /// An endpoint's delivery log, newest first.
    Logs(EndpointsLogsArgs),
}

#[derive(Debug, Args)]
#[command(mut_args(store_settings))]
struct EndpointsListArgs {
    #[command(flatten)]
    common: CommonConfig,
    /// The developer whose endpoints to list.
    #[arg(long)]
    developer_id: Uuid,
    /// Print the `Webhook` objects as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(mut_args(store_settings))]
struct EndpointsLogsArgs {
    #[command(flatten)]
    common: CommonConfig,
    /// The endpoint (`wep_…`).
    endpoint_id: String,
    /// How many entries, newest first.
    #[arg(long, default_value_t = 20)]
    limit: i64,
    /// Print the `DeliveryLog` objects as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ReceiverArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:9443")]
    listen: std::net::SocketAddr,
    /// Where to write `ca.pem` and keep the last delivery.
    #[arg(long, default_value = "./webhooks-receiver")]
    dir: std::path::PathBuf,
}

#[derive(Debug, Subcommand)]
enum DeadLettersCommand {
    /// List what the dead-letter queue holds, oldest first (it keeps them).
    List(DeadLettersArgs),
    /// Put the delivery messages of the dead-letter queue back on the work
    /// queue, oldest first.
    Replay(DeadLettersArgs),
}

#[derive(Debug, Args)]
#[command(mut_args(broker_settings))]
struct DeadLettersArgs {
    #[command(flatten)]
    common: CommonConfig,
    /// At most this many messages.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Print JSON instead of lines for people.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(mut_args(store_settings))]
struct Common {
    #[command(flatten)]
    common: CommonConfig,
}

#[derive(Debug, Args)]
struct MigrateArgs {
    #[command(flatten)]
    common: CommonConfig,
    /// Also convert the history tables (events, deliveries, delivery logs)
    /// of an installation that has history to day partitions, online,
    /// while the system runs (docs/operations.md, "Partitioned history").
    /// A new installation gets them at its first start.
    #[arg(long)]
    partition_history: bool,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Create a key and print `{"key": …, "api_key": {…}}` on stdout.
    Create(CreateKey),
    /// List the active keys (never the keys themselves) with their
    /// developers' ids, newest first.
    List(ListKeys),
    /// Seal every stored endpoint private key with the first key of
    /// KEY_ENCRYPTION_KEY (after a new key was listed first everywhere);
    /// progress on stderr, a JSON summary on stdout. Safe while the
    /// service runs, and to run again.
    Reseal(ResealKeys),
}

#[derive(Debug, Args)]
#[command(mut_args(reseal_settings))]
struct ResealKeys {
    #[command(flatten)]
    common: CommonConfig,
    /// Endpoints read and written per transaction.
    #[arg(long, default_value_t = 500)]
    batch: i64,
}

#[derive(Debug, Args)]
#[command(mut_args(store_settings))]
struct ListKeys {
    #[command(flatten)]
    common: CommonConfig,
    /// Only this developer's keys.
    #[arg(long)]
    developer_id: Option<Uuid>,
    /// At most this many keys.
    #[arg(long, default_value_t = 100)]
    limit: i64,
    /// Print the `ApiKey` objects as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(mut_args(key_settings))]
struct CreateKey {
    #[command(flatten)]
    common: CommonConfig,
    /// The developer who owns the key (`keys list` shows them); a new
    /// developer, who sees none of the others' endpoints, when absent.
    #[arg(long)]
    developer_id: Option<Uuid>,
    /// A name for the key, at most 100 characters.
    #[arg(long)]
    name: Option<String>,
    /// Comma-separated scopes; unrestricted when absent.
    #[arg(long, value_delimiter = ',')]
    scopes: Option<Vec<String>>,
}

/// The service settings (`CommonConfig`) an operator's command takes: all
/// of them, so a command reads the same environment as the service, but
/// its `--help` shows only the ones it uses.
fn showing(arg: clap::Arg, used: &[&str]) -> clap::Arg {
    static SERVICE: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        CommonConfig::augment_args(clap::Command::new("settings"))
            .get_arguments()
            .map(|arg| arg.get_id().to_string())
            .collect()
    });
    let id = arg.get_id().as_str();
    if SERVICE.iter().any(|name| name == id) && !used.contains(&id) { arg.hide(true) } else { arg }
}

fn store_settings(arg: clap::Arg) -> clap::Arg {
    showing(arg, &["database_url", "data_dir", "log_format"])
}

fn key_settings(arg: clap::Arg) -> clap::Arg {
    showing(arg, &["database_url", "data_dir", "platform_environment", "log_format"])
}

fn reseal_settings(arg: clap::Arg) -> clap::Arg {
    showing(arg, &["database_url", "data_dir", "key_encryption_key", "log_format"])
}

fn broker_settings(arg: clap::Arg) -> clap::Arg {
    showing(arg, &["amqp_url", "queue_prefix", "log_format"])
}

/// The broker addresses of `AMQP_URL`, checked (a bad entry is named,
/// redacted).
fn brokers(common: &CommonConfig) -> anyhow::Result<webhooks_queue::amqp::Brokers> {
    Ok(webhooks_queue::amqp::Brokers::new(common.broker_addresses().map_err(anyhow::Error::msg)?))
}

fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The `webhooks-api` program: its arguments and environment, parsed.
pub async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Verify(args) => verify(&args),
        Command::Serve(config) => {
            webhooks_config::telemetry::init(config.common.log_format);
            let shutdown = webhooks_config::shutdown::on_signal();
            let listeners = bind(&config).await?;
            api::run(*config, listeners, shutdown).await
        }
        Command::Standalone(config) => {
            webhooks_config::telemetry::init(config.api.common.log_format);
            standalone(*config).await
        }
        Command::Migrate(MigrateArgs { common, partition_history }) => {
            webhooks_config::telemetry::init(common.log_format);
            let (store, _) = webhooks_store::open::for_command(&common).await?;
            tracing::info!("migrations applied");
            if partition_history {
                store.partition_history(&|step| tracing::info!("{step}")).await?;
            }
            Ok(())
        }
        Command::Keys { command: KeysCommand::Create(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            let name = args.name.as_deref().map(str::trim).filter(|n| !n.is_empty());
            anyhow::ensure!(name.is_none_or(|n| n.chars().count() <= 100), "--name must be at most 100 characters");
            let scopes = api::keys::parse_scopes(args.scopes.as_deref()).map_err(anyhow::Error::msg)?;
            let (store, _) = webhooks_store::open::for_command(&args.common).await?;
            let developer_id = args.developer_id.unwrap_or_else(|| {
                let new = Uuid::new_v4();
                eprintln!(
                    "keys create: no --developer-id, so this key is for a new developer, {new}, who sees no other \
                     developer's endpoints; `webhooks-api keys list` shows the developers there are"
                );
                new
            });
            let issued = api::keys::issue(
                &store,
                args.common.platform_environment,
                developer_id,
                ApiKeyType::Public,
                &scopes,
                name,
            )
            .await?;
            let out = serde_json::json!({ "key": issued.key, "api_key": issued.api_key });
            print(&format!("{out}\n"))
        }
        Command::Keys { command: KeysCommand::List(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            anyhow::ensure!((1..=10_000).contains(&args.limit), "--limit must be between 1 and 10000");
            let (store, _) = webhooks_store::open::for_command(&args.common).await?;
            let keys = match args.developer_id {
                Some(developer_id) => store.list_api_keys(developer_id).await?,
                None => store.all_api_keys(args.limit).await?,
            };
            print(&operator::render_keys(&keys, args.json)?)
        }
        Command::Keys { command: KeysCommand::Reseal(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            anyhow::ensure!((1..=10_000).contains(&args.batch), "--batch must be between 1 and 10000");
            let summary = reseal::reseal(&args.common, args.batch, |so_far| {
                eprintln!(
                    "keys reseal: {} endpoints read, {} keys resealed, {} already sealed with key id {}, {} do not open",
                    so_far.endpoints, so_far.resealed, so_far.skipped, so_far.key_id, so_far.failed
                );
            })
            .await?;
            print(&format!("{}\n", serde_json::to_string(&summary)?))?;
            anyhow::ensure!(
                summary.complete(),
                "{} stored keys do not open with KEY_ENCRYPTION_KEY (listed in the summary) and {} kept changing \
                 while being resealed; they were left as they were: list every key that sealed them, then run \
                 `keys reseal` again",
                summary.failed,
                summary.changed
            );
            Ok(())
        }
        Command::Openapi => print(&api::openapi::document()),
        Command::Events { command: EventsCommand::Send(args) } => {
            let body = operator::read_body(&args.file)?;
            let target = operator::SendTarget {
                internal_url: &args.internal_url,
                token: args.internal_token.as_ref().map(webhooks_config::Secret::expose),
                idempotency_key: args.idempotency_key.as_deref(),
            };
            let event = operator::send_event(&target, body).await?;
            if args.json { print(&format!("{event}\n")) } else { print(&operator::render_sent(&event)) }
        }
        Command::Endpoints { command: EndpointsCommand::List(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            let endpoints = operator::list_endpoints(&args.common, args.developer_id).await?;
            print(&operator::render_endpoints(&endpoints, args.json)?)
        }
        Command::Endpoints { command: EndpointsCommand::Logs(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            anyhow::ensure!((1..=1000).contains(&args.limit), "--limit must be between 1 and 1000");
            let logs = operator::endpoint_logs(&args.common, &args.endpoint_id, args.limit).await?;
            print(&operator::render_logs(&logs, args.json)?)
        }
        Command::Receiver(args) => {
            let shutdown = webhooks_config::shutdown::on_signal();
            receiver::run(args.listen, &args.dir, shutdown).await
        }
        Command::DeadLetters { command: DeadLettersCommand::List(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            no_dead_letters_in_standalone(&args.common)?;
            let topology = Topology::new(&args.common.queue_prefix, &args.common.retry_schedule);
            let listed = dead_letters::list(&brokers(&args.common)?, &topology, args.limit).await?;
            print(&render_list(&listed, args.json))
        }
        Command::DeadLetters { command: DeadLettersCommand::Replay(args) } => {
            webhooks_config::telemetry::init(args.common.log_format);
            no_dead_letters_in_standalone(&args.common)?;
            let topology = Topology::new(&args.common.queue_prefix, &args.common.retry_schedule);
            let done = dead_letters::replay(&brokers(&args.common)?, &topology, args.limit, |done| {
                if !args.json && done.replayed > 0 && done.replayed % 100 == 0 {
                    eprintln!("replayed {}…", done.replayed);
                }
            })
            .await?;
            if args.json {
                print(&format!("{}\n", serde_json::to_string(&done)?))
            } else {
                print(&format!(
                    "replayed {} message(s) to the work queue; {} kept (not delivery messages)\n",
                    done.replayed, done.kept
                ))
            }
        }
    }
}

/// Refuses the dead-letter commands where the store at hand is standalone
/// mode's, which has no broker: asking the default RabbitMQ would answer
/// about some other installation, or hang.
fn no_dead_letters_in_standalone(common: &CommonConfig) -> anyhow::Result<()> {
    if let Ok(webhooks_store::open::CommandStore::Standalone(dir)) = webhooks_store::open::CommandStore::of(common) {
        anyhow::bail!(
            "standalone mode ({}) has no dead-letter queue: a delivery it cannot make stays in its store, with \
             its log (`webhooks-api endpoints logs <endpoint>`). Set DATABASE_URL and AMQP_URL for the \
             distributed system's",
            dir.display()
        );
    }
    Ok(())
}

/// `webhooks-api verify`: no tracing, no database; exits 0, 1 or 2.
fn verify(args: &VerifyArgs) -> ! {
    let code = match verify_files(args).and_then(|(line, code)| print(&format!("{line}\n")).map(|()| code)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            2
        }
    };
    std::process::exit(code)
}

/// The line to print and the exit code, or a usage error.
fn verify_files(args: &VerifyArgs) -> anyhow::Result<(String, i32)> {
    let read = |path: &Path| std::fs::read(path).with_context(|| format!("read {}", path.display()));
    let headers: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&read(&args.headers)?)
        .context("the headers file must be a JSON object of header name -> string value")?;
    let headers = headers
        .iter()
        .map(|(name, value)| value.as_str().map(|value| (name.as_str(), value)))
        .collect::<Option<Vec<_>>>()
        .context("the headers file must be a JSON object of header name -> string value")?;
    let body = read(&args.body)?;
    let key = String::from_utf8(read(&args.key)?).context("the key file is not text")?;
    let key = webhooks_signature::verify::ReceiverKey::parse(&key)?;
    let now_ms = args.now_ms.unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
    Ok(match key.verify(&headers, &body, now_ms) {
        Ok(verified) => (format!("genuine: {} signature", verified.scheme.as_str()), 0),
        Err(refusal) => (format!("refused: {refusal}"), 1),
    })
}

async fn bind(config: &api::Config) -> anyhow::Result<api::Listeners> {
    Ok(api::Listeners {
        public: listen("API_LISTEN_ADDR", config.api_listen_addr).await?,
        internal: listen("INTERNAL_LISTEN_ADDR", config.internal_listen_addr).await?,
    })
}

/// Binds the listener `setting` names; a port in use says what to do.
async fn listen(setting: &str, addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => Err(error).with_context(|| {
            format!(
                "cannot listen on {addr} ({setting}): another process has it, often a webhooks-api started \
                 earlier (the README's `cargo run ... standalone`, or one in the background: `pkill -f \
                 webhooks-api`). Stop that one, or set {setting} to a free address"
            )
        }),
        Err(error) => Err(error).with_context(|| format!("bind {setting} {addr}")),
    }
}

/// `webhooks-api standalone`: takes the data directory for this process
/// alone, opens its store, prints a first key when the store holds none (a
/// first start), and runs until SIGTERM or SIGINT.
async fn standalone(config: StandaloneConfig) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    let data_dir = config.api.common.data_dir();
    webhooks_store::open::create_private_dir(&data_dir)?;
    let _lock = lock_data_dir(&data_dir)?;
    let listeners = bind(&config.api).await?;
    let (store, queue_store) = webhooks_store::open::standalone(&data_dir).await?;
    tracing::info!(data_dir = %data_dir.display(), "standalone mode");
    if !store.has_api_keys().await? {
        let issued = api::keys::issue(
            &store,
            config.api.common.platform_environment,
            Uuid::new_v4(),
            ApiKeyType::Public,
            &[webhooks_model::Scope::Unrestricted],
            Some("first key"),
        )
        .await?;
        let out = serde_json::json!({ "key": issued.key, "api_key": issued.api_key });
        print(&format!("{out}\n"))?;
        next_steps(&config, &listeners, issued.api_key.owner_id)?;
    }
    let shutdown = webhooks_config::shutdown::on_signal();
    let result = api::run_standalone(config, (store.clone(), queue_store), listeners, shutdown).await;
    store.close().await;
    result
}

/// Holds `DATA_DIR` for this process alone while it lives: two processes on
/// one directory would hand out the same deliveries.
fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = data_dir.join("lock");
    let file = webhooks_store::open::create_private_file(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!("another webhooks-api standalone is running on DATA_DIR {}", data_dir.display())
        }
        Err(std::fs::TryLockError::Error(error)) => Err(error).with_context(|| format!("lock {}", path.display())),
    }
}

/// What to do next, on stderr (stdout carries only the key): the curl lines
/// that register an endpoint, switch it on, send it an event and read the log.
fn next_steps(config: &StandaloneConfig, listeners: &api::Listeners, developer_id: Uuid) -> anyhow::Result<()> {
    let api = format!("http://{}/v0", listeners.public.local_addr()?);
    let internal = format!("http://{}", listeners.internal.local_addr()?);
    let token = match &config.api.internal_token {
        Some(_) => " -H \"Authorization: Bearer $INTERNAL_TOKEN\"",
        None => "",
    };
    let common = &config.api.common;
    // Endpoints must be HTTPS with a certificate the service trusts, on a
    // public address unless allowed: the development receiver needs both.
    let receiver = if common.tls_extra_roots.is_some() && common.target_allow_private {
        "  # 0. The development receiver, in another terminal, if it is not running yet\n  \
         #    (this service must trust its CA: TLS_EXTRA_ROOTS=webhooks-receiver/ca.pem):\n  \
         webhooks-api receiver\n"
            .to_owned()
    } else {
        "  # 0. A receiver for development, in another terminal (a throwaway CA in\n  \
         #    ./webhooks-receiver, HTTPS on localhost:9443):\n  \
         webhooks-api receiver\n  \
         #    This service must trust it and may deliver to localhost: stop it (Ctrl-C)\n  \
         #    and start it again, in this folder, as\n  \
         TLS_EXTRA_ROOTS=webhooks-receiver/ca.pem TARGET_ALLOW_PRIVATE=true webhooks-api standalone\n"
            .to_owned()
    };
    let steps = format!(
        r#"
webhooks-api standalone is running: API {api}, internal listener {internal}.
The JSON line on stdout is your API key, shown once and kept nowhere else
(only its hash is stored): save it. Next steps:

  export KEY=sk-...   # the "key" of that line

{receiver}
  # 1. Register the receiver as an endpoint, and keep its id:
  ENDPOINT=$(curl -s {api}/webhooks -H "Api-Key: $KEY" -H "Idempotency-Key: first-endpoint" \
       -H "Content-Type: application/json" -d '{{"url": "https://localhost:9443/hooks"}}' \
       | sed -n 's/.*"id":"\(wep_[0-9a-f]*\)".*/\1/p'); echo "$ENDPOINT"

  # 2. Switch it on (endpoints start disabled):
  curl -s -X PUT {api}/webhooks/$ENDPOINT -H "Api-Key: $KEY" \
       -H "Content-Type: application/json" -d '{{"status": "active"}}'

  # 3. Publish an event, as the platform's services do:
  curl -s {internal}/internal/events{token} -H "Content-Type: application/json" \
       -d '{{"developer_id": "{developer_id}", "event_category": "transfer", "event_type": "transfer.updated.status_transitioned", "event_object_id": "tr_1", "event_object": {{"id": "tr_1", "amount": "100.00", "state": "payment_processed"}}}}'

  # 4. Read the delivery log:
  curl -s {api}/webhooks/$ENDPOINT/logs -H "Api-Key: $KEY"

docs/quickstart.md walks through the same, with the signature checked.
"#
    );
    let mut err = std::io::stderr().lock();
    err.write_all(steps.as_bytes())?;
    Ok(())
}

/// Prints `listed` for people, or as a JSON array.
fn render_list(listed: &[dead_letters::DeadLetter], json: bool) -> String {
    if json {
        return format!("{}\n", serde_json::to_string(listed).unwrap_or_default());
    }
    if listed.is_empty() {
        return "no dead letters\n".into();
    }
    let mut out: String = listed.iter().map(|d| format!("{}\n", d.line())).collect();
    out.push_str(&format!("{} dead letter(s)\n", listed.len()));
    out
}
