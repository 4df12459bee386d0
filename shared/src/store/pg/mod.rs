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
mod retention;
mod sweep;

pub use outbox::OutboxRow;
pub use sweep::Swept;

use sqlx::PgPool;

use super::StoreResult;
use crate::broker::Topology;

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    lifecycle_exchange: String,
    deliveries_queue: String,
}

impl PgStore {
    /// A store over `pool` that queues deliveries on the work queue of
    /// `topology` and announces endpoint changes on its lifecycle exchange.
    pub fn new(pool: PgPool, topology: &Topology) -> PgStore {
        PgStore { pool, lifecycle_exchange: topology.lifecycle(), deliveries_queue: topology.deliveries() }
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
