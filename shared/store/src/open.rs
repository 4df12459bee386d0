//! Opening the store: the PostgreSQL pool and its schema migrations, or the
//! SQLite store of standalone mode. Each gives the [`Store`] and the store's
//! side of the deployment's queue ([`QueueStore`]); this is the one place
//! that picks a backend.

use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};

use crate::{Store, pg::PgStore, queue::QueueStore, sqlite::SqliteStore};
use sqlx::{
    PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

/// Opens a pool of at most `max_connections`, each statement of which the
/// database cancels after `statement_timeout` (zero: never). Connections
/// are made lazily, so a database that is down at start only fails the
/// requests that need it.
pub fn pool(database_url: &str, max_connections: u32, statement_timeout: Duration) -> Result<PgPool, sqlx::Error> {
    let options: PgConnectOptions = database_url.parse()?;
    let timeout = match statement_timeout.as_millis() {
        0 => "0".to_owned(),
        millis => format!("{millis}ms"),
    };
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .idle_timeout(Duration::from_secs(300))
        .connect_lazy_with(options.application_name("webhooks").options([("statement_timeout", timeout)])))
}

/// Applies every pending migration; safe to run from several processes at once
/// (sqlx takes an advisory lock). Migrations this binary does not know (a
/// newer version applied them) are no error: during a rolling upgrade a
/// process of the previous version must still (re)start, and migrations only
/// add what older readers ignore. A migration may take long on a large
/// installation: it runs without the pool's statement timeout.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    // The migrations in `shared/store/migrations`, embedded in every binary.
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    let mut connection = pool.acquire().await?;
    sqlx::Executor::execute(&mut *connection, "SET statement_timeout = 0").await?;
    let migrated = migrator.run_direct(&mut *connection).await;
    // Back to the pool's own, or the connection goes.
    if sqlx::Executor::execute(&mut *connection, "RESET statement_timeout").await.is_err() {
        connection.detach();
    }
    migrated
}

/// Opens the pool of `common`, applies migrations (retrying while PostgreSQL
/// starts) and returns the store both programs work through, with the outbox
/// of the broker's queue.
pub async fn distributed(common: &webhooks_config::CommonConfig) -> anyhow::Result<(Store, QueueStore)> {
    let url = common.database_url();
    let pool = pool(url, common.database_max_connections, common.database_statement_timeout).context("DATABASE_URL")?;
    // A few seconds of retries cover a database that is starting; beyond
    // that the operator learns at once what is wrong and what to do (an
    // orchestrator restarts the process anyway).
    (|| migrate(&pool))
        .retry(ExponentialBuilder::default().with_max_delay(Duration::from_secs(2)).with_max_times(4))
        .notify(|error, delay| tracing::warn!(%error, ?delay, "database not ready; retrying"))
        .await
        .map_err(|error| unreachable(url, error))?;
    warn_without_autovacuum(&pool).await;
    take_the_database_clock(&pool).await;
    let store = PgStore::new(pool);
    store.prepare_history().await.context("prepare the history's partitions")?;
    Ok(Store::postgres(store))
}

/// Takes the database's clock as this process's (DESIGN.md, "One clock")
/// before anything is stamped; the process's heartbeat keeps it so.
async fn take_the_database_clock(pool: &PgPool) {
    let sent = std::time::Instant::now();
    match sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("SELECT clock_timestamp()").fetch_one(pool).await {
        Ok(database_now) => {
            let ahead = webhooks_model::time::set_reference(database_now, sent + sent.elapsed() / 2);
            if ahead.num_seconds().abs() >= 1 {
                tracing::warn!(
                    ahead_ms = ahead.num_milliseconds(),
                    "this host's clock is off the database's; the process keeps the database's time"
                );
            }
        }
        Err(error) => tracing::warn!(%error, "cannot read the database's clock; using this host's until it answers"),
    }
}

/// Warns when the server runs without autovacuum: the outbox and the
/// deliveries table churn constantly, and without vacuuming their scans slow
/// down as dead rows pile up (throughput falls over hours).
async fn warn_without_autovacuum(pool: &PgPool) {
    if let Ok(setting) = sqlx::query_scalar::<_, String>("SHOW autovacuum").fetch_one(pool).await
        && setting == "off"
    {
        tracing::warn!(
            "PostgreSQL runs with autovacuum off: the outbox and deliveries tables will slow down as dead rows \
             pile up (the API analyzes the tables that change, but nothing vacuums them); turn it on \
             (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();)"
        );
    }
}

/// The error of a database that cannot be used: where it was looked for and
/// what to do, besides the cause. A database that answered with an error of
/// its own (say, a failed migration) is reported as such.
fn unreachable(url: &str, error: sqlx::migrate::MigrateError) -> anyhow::Error {
    let where_ = webhooks_config::redacted_url(url);
    let unreachable = matches!(
        &error,
        sqlx::migrate::MigrateError::Execute(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_))
    );
    if unreachable {
        anyhow::Error::new(error).context(format!(
            "cannot reach PostgreSQL at {where_}: start it (or install it), point DATABASE_URL at a running \
             server, or run `webhooks-api standalone`, which needs neither PostgreSQL nor RabbitMQ"
        ))
    } else {
        anyhow::Error::new(error).context(format!("apply database migrations on {where_}"))
    }
}

/// Which store an operator's command works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandStore {
    /// Standalone mode's folder.
    Standalone(std::path::PathBuf),
    /// PostgreSQL at `DATABASE_URL`.
    Distributed,
}

impl CommandStore {
    /// Standalone mode's store when `DATA_DIR` is set and `DATABASE_URL` is
    /// not, or when neither is set and standalone mode's default folder
    /// (`./webhooks-data`) is here; PostgreSQL when `DATABASE_URL` is set.
    /// With neither set and no such folder, the error says what to set
    /// rather than guessing a database that may not be there.
    pub fn of(common: &webhooks_config::CommonConfig) -> anyhow::Result<CommandStore> {
        let default_dir = std::path::Path::new(webhooks_config::DEFAULT_DATA_DIR);
        match (&common.database_url, &common.data_dir) {
            (None, Some(data_dir)) => Ok(CommandStore::Standalone(data_dir.clone())),
            (None, None) if default_dir.is_dir() => Ok(CommandStore::Standalone(default_dir.to_path_buf())),
            (None, None) => {
                let here = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
                anyhow::bail!(
                    "no store to work on: {here} has no {} folder, and neither DATA_DIR nor DATABASE_URL is set. \
                     For standalone mode, run this in the folder `webhooks-api standalone` runs in, or set DATA_DIR \
                     to its data folder; for the distributed system, set DATABASE_URL",
                    webhooks_config::DEFAULT_DATA_DIR
                )
            }
            (Some(_), _) => Ok(CommandStore::Distributed),
        }
    }
}

/// The store an operator's command works on ([`CommandStore::of`]).
pub async fn for_command(common: &webhooks_config::CommonConfig) -> anyhow::Result<(Store, QueueStore)> {
    match CommandStore::of(common)? {
        CommandStore::Standalone(data_dir) => {
            tracing::info!(data_dir = %data_dir.display(), "working on standalone mode's store");
            standalone(&data_dir).await
        }
        CommandStore::Distributed => distributed(common).await,
    }
}

/// The SQLite database file inside `DATA_DIR`.
pub use crate::sqlite::{DATABASE_FILE, create_private_dir, create_private_file};

/// Opens (creating it if missing) the SQLite store of standalone mode in
/// `data_dir`, whose deliveries table is the queue.
pub async fn standalone(data_dir: &std::path::Path) -> anyhow::Result<(Store, QueueStore)> {
    Ok(Store::sqlite(SqliteStore::open(data_dir).await?))
}
