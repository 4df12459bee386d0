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
mod idempotency;
mod outbox;
mod pace;
mod portal_sessions;
mod recoveries;
mod retention;
mod sealed_keys;
mod statistics;
mod sweep;
mod turns;

pub use outbox::{OutboxItem, OutboxRow};
pub use sweep::Swept;

use sqlx::{PgPool, postgres::PgListener};
use tokio_util::sync::CancellationToken;

use super::StoreResult;

/// The channel a dispatcher notifies when it writes outbox rows (a turn it
/// released), so the relay in the API process publishes them at once.
pub(crate) const OUTBOX_CHANNEL: &str = "webhooks_outbox";

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

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The endpoint successes this process wrote last (health).
    written_successes: std::sync::Arc<crate::health::WrittenSuccesses>,
    /// The connections of the delivery path's batching tasks.
    held: std::sync::Arc<HeldConnections>,
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
        PgStore { pool, written_successes: std::sync::Arc::default(), held: std::sync::Arc::default() }
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
