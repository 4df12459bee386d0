//! The SQLite backend of standalone mode: one process holds `DATA_DIR` and the
//! database in it. There is no broker: the deliveries table is also the
//! delivery queue ([`SqliteStore::claim_due`] and its neighbours), and
//! endpoint changes are announced in-process ([`SqliteStore::changes`]) once
//! committed.
//!
//! Every write goes through one connection, in `BEGIN IMMEDIATE`
//! transactions: writes are serialised, so what PostgreSQL gets from row locks
//! and advisory locks (the event sequence, the endpoint limit, one event per
//! producer `Idempotency-Key`) holds here by construction, and no write meets
//! `SQLITE_BUSY` from another. Reads go through a small pool of read-only
//! connections, which WAL runs beside the writer.
//!
//! Stored types: uuids as hyphenated TEXT, times as INTEGER microseconds since
//! the Unix epoch (they order numerically, and PostgreSQL keeps microseconds
//! too), lists as JSON text, booleans as 0/1.

mod api_keys;
mod deliveries;
mod endpoints;
mod event_types;
mod events;
mod idempotency;
mod portal_sessions;
mod queue;
mod recoveries;
mod retention;
mod sealed_keys;
#[cfg(test)]
mod tests;

use std::{path::Path, sync::Arc, time::Duration};

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::{
    Sqlite, SqlitePool, Transaction,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use tokio::sync::{Notify, broadcast};
use uuid::Uuid;

use super::{StoreError, StoreResult};
use webhooks_model::EndpointChanged;

/// The migrations in `shared/migrations-sqlite`, embedded in every binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations-sqlite");

/// The database file inside `DATA_DIR`.
pub const DATABASE_FILE: &str = "webhooks.db";

/// Read-only connections beside the writer.
const READERS: u32 = 4;

/// How long a statement waits on a lock it cannot take at once: another
/// process's write (an operator's command on the same directory), or a
/// checkpoint.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Endpoint changes kept for a listener that falls behind; one that falls
/// further behind is told it lagged and drops its whole cache.
const CHANGES_CAPACITY: usize = 1024;

/// How every write transaction begins: it holds the database's write lock
/// from its first statement, so what it reads stays true until it commits.
const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// Cheap to clone: a handle on the database of one data directory.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The one connection every write goes through.
    writer: SqlitePool,
    reader: SqlitePool,
    work: Arc<Notify>,
    changes: broadcast::Sender<EndpointChanged>,
    /// The pace of endpoints with a rate limit: one process holds the data
    /// directory, so it lives in memory.
    pacer: Arc<super::pace::Pacer>,
}

/// Creates `dir` (and its parents) readable by this user only (0700), if
/// missing. The store holds endpoints' private keys and hashes of API keys;
/// an existing directory open to others is kept as it is, with a warning.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("create data directory {}", dir.display()))?;
    let mode = std::fs::metadata(dir).with_context(|| format!("read {}", dir.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            data_dir = %dir.display(),
            mode = format!("{:o}", mode & 0o777),
            "the data directory is open to other users; it holds private keys: chmod 700 it"
        );
    }
    Ok(())
}

/// Creates `file` for this user only (0600) if missing, and takes away
/// what others may do with it if it exists. SQLite gives the journal files
/// it makes beside a database the database file's mode.
pub fn create_private_file(file: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let opened = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("open {}", file.display()))?;
    let mode = opened.metadata().with_context(|| format!("read {}", file.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        opened
            .set_permissions(std::fs::Permissions::from_mode(mode & 0o700))
            .with_context(|| format!("chmod {}", file.display()))?;
    }
    Ok(opened)
}

impl SqliteStore {
    /// Opens (creating both if missing) `data_dir` and the database in it, and
    /// applies the migrations. Commits are durable before they return (WAL,
    /// `synchronous = FULL`): an answered request survives a crash or a power
    /// loss.
    pub async fn open(data_dir: &Path) -> anyhow::Result<SqliteStore> {
        create_private_dir(data_dir)?;
        let file = data_dir.join(DATABASE_FILE);
        create_private_file(&file)?;
        let options = SqliteConnectOptions::new().filename(&file).foreign_keys(true).busy_timeout(BUSY_TIMEOUT);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(
                options
                    .clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full),
            )
            .await
            .with_context(|| format!("open {}", file.display()))?;
        MIGRATOR.run(&writer).await.with_context(|| format!("apply migrations to {}", file.display()))?;
        // Opened after the writer: WAL mode is then set in the file, which a
        // read-only connection cannot do itself.
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .min_connections(0)
            .connect_with(options.read_only(true))
            .await
            .with_context(|| format!("open {} for reading", file.display()))?;
        let (changes, _) = broadcast::channel(CHANGES_CAPACITY);
        Ok(SqliteStore { writer, reader, work: Arc::new(Notify::new()), changes, pacer: Arc::default() })
    }

    /// Closes every connection, waiting for those in use; the writer last, so
    /// its close checkpoints the WAL into the database file.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    /// Notified after every commit that made a delivery due now (an ingest
    /// that queued one, a `send`), so the queue need not poll.
    pub fn work(&self) -> Arc<Notify> {
        self.work.clone()
    }

    /// Every endpoint change, once committed: what the distributed mode
    /// publishes on the lifecycle exchange, for the dispatcher to drop its
    /// cache entry.
    pub fn changes(&self) -> broadcast::Receiver<EndpointChanged> {
        self.changes.subscribe()
    }

    pub(super) async fn take_pace(&self, endpoint_id: &str, limit: u32) -> StoreResult<super::pace::Ticket> {
        Ok(self.pacer.take(endpoint_id, limit, webhooks_model::time::now()))
    }

    pub(super) async fn pace_start(&self, endpoint_id: &str, ticket: i64) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(self.pacer.start_of(endpoint_id, ticket))
    }

    pub(super) async fn slow_pace(&self, endpoint_id: &str, paused_until: Option<DateTime<Utc>>) -> StoreResult<()> {
        self.pacer.slow(endpoint_id, paused_until, webhooks_model::time::now());
        Ok(())
    }

    /// Always [`Turn::Go`](super::Turn::Go): the queue hands out only the
    /// lowest unsettled delivery of an ordered endpoint
    /// ([`SqliteStore::claim_due`]).
    pub(super) async fn take_turn(
        &self,
        _delivery_id: i64,
        _generation: Option<i32>,
        _endpoint_id: &str,
    ) -> StoreResult<super::Turn> {
        Ok(super::Turn::Go)
    }

    pub(super) async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    /// A write transaction ([`BEGIN_WRITE`]).
    async fn begin(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with(BEGIN_WRITE).await?)
    }

    /// Sends committed changes to whoever listens.
    fn announce(&self, changes: Vec<EndpointChanged>) {
        for change in changes {
            // Nobody listening (an operator's command, the API alone) is fine.
            let _ = self.changes.send(change);
        }
    }
}

/// Adds the developer's row if it is new.
async fn ensure_developer(
    tx: &mut Transaction<'_, Sqlite>,
    developer_id: Uuid,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO developers (id, created_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(developer_id.hyphenated())
        .bind(micros(now))
        .execute(&mut **tx)
        .await
        .map(drop)
}

/// How a time is stored.
fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// A stored time.
fn time(micros: i64) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros).ok_or_else(|| StoreError::Corrupt(format!("time {micros} out of range")))
}

/// How a list of names is stored (read back as [`crate::columns::Names`]).
fn json_list(names: Vec<&str>) -> String {
    serde_json::Value::from(names).to_string()
}
