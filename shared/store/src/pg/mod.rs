//! The PostgreSQL backend of the distributed deployment. Any number of API and
//! dispatcher processes share it; delivery and lifecycle messages are written
//! to the transactional [`outbox`] with the change they announce, and the
//! API's relay publishes them to RabbitMQ.

mod api_keys;
mod deliveries;
mod endpoints;
mod event_types;
mod events;
mod held;
mod history;
mod idempotency;
mod outbox;
mod pace;
mod portal_sessions;
mod processes;
mod recoveries;
mod retention;
mod sealed_keys;
mod statistics;
mod sweep;
mod turns;

pub use history::Maintained;
pub use outbox::{OutboxItem, OutboxRow};
pub use processes::{LostProcess, Presence, QueueMark, QueueProgress};
pub use sweep::Swept;

use sqlx::{PgPool, postgres::PgListener};
use tokio_util::sync::CancellationToken;

use super::StoreResult;

/// The channel a dispatcher notifies when it writes outbox rows (a turn it
/// released), so the relay in the API process publishes them at once.
pub(crate) const OUTBOX_CHANNEL: &str = "webhooks_outbox";

/// A fresh UUIDv7 on the database's clock, as SQL: the id of a log entry
/// a statement writes itself (the delivery log's partitions are ranges of
/// ids, by time).
pub(crate) const NEW_V7: &str = "(lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
     || '7' || substr(md5(random()::text), 1, 3) || substr('89ab', floor(random() * 4)::int + 1, 1)
     || substr(md5(random()::text), 1, 15))::uuid";

/// PostgreSQL's code for a transaction aborted to break a deadlock.
const DEADLOCK: &str = "40P01";

/// How often a transaction that lost a deadlock is tried again: one that
/// locks many rows (an endpoint's deliveries, many endpoints) can meet a
/// recovery's batch or a dispatcher's writes locking them in another order.
const DEADLOCK_RETRIES: usize = 3;

/// Whether `error` is a transaction PostgreSQL aborted to break a deadlock,
/// which can simply be tried again.
fn is_deadlock(error: &crate::StoreError) -> bool {
    let crate::StoreError::Database(source) = error else { return false };
    source
        .downcast_ref::<sqlx::Error>()
        .and_then(sqlx::Error::as_database_error)
        .is_some_and(|error| error.code().as_deref() == Some(DEADLOCK))
}

/// Runs `transaction`, and again (at most [`DEADLOCK_RETRIES`] times) while
/// PostgreSQL aborts it to break a deadlock.
async fn retrying_deadlocks<T, F, Fut>(mut transaction: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let mut attempt = 0;
    loop {
        match transaction().await {
            Err(error) if is_deadlock(&error) && attempt < DEADLOCK_RETRIES => attempt += 1,
            outcome => return outcome,
        }
    }
}

/// Items grouped by the table that holds their deliveries, each with its
/// index among them all.
type ByTable<'a, T> = Vec<(std::borrow::Cow<'static, str>, Vec<(usize, &'a T)>)>;

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The endpoint successes this process wrote last (health).
    written_successes: std::sync::Arc<crate::health::WrittenSuccesses>,
    /// The connections of the delivery path's batching tasks.
    held: std::sync::Arc<HeldConnections>,
    /// How the history tables are laid out, as last read.
    layout: std::sync::Arc<std::sync::RwLock<std::sync::Arc<history::Layout>>>,
}

/// A connection kept for each batching task on the path from an ingest to
/// its POST ([`held`]).
#[derive(Debug, Default)]
struct HeldConnections {
    /// The ingest writer's.
    ingest: held::Held,
    /// The dispatcher's admission checks'.
    admissions: held::Held,
}

impl PgStore {
    /// A store over `pool`.
    pub fn new(pool: PgPool) -> PgStore {
        PgStore {
            pool,
            written_successes: std::sync::Arc::default(),
            held: std::sync::Arc::default(),
            layout: std::sync::Arc::default(),
        }
    }

    /// Partitions the history of a new installation, makes the partitions
    /// of the days around today, and reads the layout (at a process's start).
    pub(crate) async fn prepare_history(&self) -> StoreResult<()> {
        let layout = history::prepare(&self.pool).await?;
        self.set_layout(layout);
        Ok(())
    }

    /// Reads the history's layout again: a day's partitions made or
    /// dropped by another process, a conversion.
    pub(crate) async fn refresh_layout(&self) -> StoreResult<()> {
        let layout = history::Layout::read(&self.pool).await?;
        self.set_layout(layout);
        Ok(())
    }

    /// Keeps the partitions: makes the coming days', drops those wholly
    /// before `cutoff` (see `history::maintain`).
    pub(crate) async fn maintain_history(
        &self,
        cutoff: Option<chrono::DateTime<chrono::Utc>>,
    ) -> StoreResult<history::Maintained> {
        let (layout, maintained) = history::maintain(&self.pool, cutoff).await?;
        self.set_layout(layout);
        Ok(maintained)
    }

    /// Makes the partitions of the days from `first` to `last`.
    pub(crate) async fn partition_days(&self, first: chrono::NaiveDate, last: chrono::NaiveDate) -> StoreResult<()> {
        let layout = history::make_days(&self.pool, first, last).await?;
        self.set_layout(layout);
        Ok(())
    }

    /// Converts an installation's history to partitions, online.
    pub(crate) async fn partition_history(&self, say: &(dyn Fn(&str) + Sync)) -> StoreResult<()> {
        history::convert(&self.pool, say).await?;
        self.refresh_layout().await
    }

    fn set_layout(&self, layout: history::Layout) {
        *self.layout.write().unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(layout);
    }

    /// The history's layout, as last read.
    fn layout(&self) -> std::sync::Arc<history::Layout> {
        self.layout.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// `items` grouped by the table that holds their deliveries (see
    /// `history::Layout::deliveries_of`), each group in the order given,
    /// with each item's index.
    fn by_deliveries_table<'a, T>(&self, items: &'a [T], event_id: impl Fn(&T) -> &str) -> ByTable<'a, T> {
        let layout = self.layout();
        let mut groups: ByTable<'a, T> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let table = layout.deliveries_of(event_id(item));
            match groups.iter_mut().find(|(t, _)| *t == table) {
                Some((_, group)) => group.push((index, item)),
                None => groups.push((table, vec![(index, item)])),
            }
        }
        groups
    }

    /// Wakes `wake` at each notification on [`OUTBOX_CHANNEL`], until
    /// `shutdown`; listens again after a lost connection.
    pub(crate) async fn listen_outbox(&self, wake: std::sync::Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            match PgListener::connect_with(&self.pool).await {
                Ok(mut listener) => match listener.listen(OUTBOX_CHANNEL).await {
                    Ok(()) => loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            notified = listener.recv() => match notified {
                                Ok(_) => wake.notify_one(),
                                Err(error) => {
                                    tracing::warn!(%error, "outbox notifications ended; listening again");
                                    break;
                                }
                            },
                        }
                    },
                    Err(error) => tracing::warn!(%error, "cannot listen for outbox notifications"),
                },
                Err(error) => tracing::debug!(%error, "cannot connect to listen for outbox notifications"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }

    pub(crate) async fn close(&self) {
        // The pool closes once every connection is back.
        self.held.ingest.release().await;
        self.held.admissions.release().await;
        self.pool.close().await;
    }

    pub(super) async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
