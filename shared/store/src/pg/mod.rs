//! The PostgreSQL backend of the distributed deployment. Any number of API and
//! dispatcher processes share it; delivery and lifecycle messages are written
//! to the transactional [`outbox`] with the change they announce, and the
//! API's relay publishes them to RabbitMQ.

mod api_keys;
mod deliveries;
mod endpoints;
mod events;
mod idempotency;
mod outbox;
mod pace;
mod retention;
mod sealed_keys;
mod sweep;
mod turns;

pub use outbox::{OutboxItem, OutboxRow};
pub use sweep::Swept;

use sqlx::PgPool;

use super::StoreResult;

/// The channel a dispatcher notifies when it writes outbox rows (a turn it
/// released), so the relay in the API process publishes them at once.
pub const OUTBOX_CHANNEL: &str = "webhooks_outbox";

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The endpoint successes this process wrote last (health).
    written_successes: std::sync::Arc<crate::health::WrittenSuccesses>,
}

impl PgStore {
    /// A store over `pool`.
    pub fn new(pool: PgPool) -> PgStore {
        PgStore { pool, written_successes: std::sync::Arc::default() }
    }

    /// The pool, for health checks, migrations and tests.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(super) async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
