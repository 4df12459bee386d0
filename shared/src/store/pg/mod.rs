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
mod sweep;
mod turns;

pub use outbox::OutboxRow;
pub use sweep::Swept;

use sqlx::PgPool;

use super::StoreResult;
use crate::broker::Topology;

/// The channel a dispatcher notifies when it writes outbox rows (a turn it
/// released), so the relay in the API process publishes them at once.
pub const OUTBOX_CHANNEL: &str = "webhooks_outbox";

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    lifecycle_exchange: String,
    deliveries_queue: String,
    /// The work queue of the bulk lane: recoveries, sweeps, and events past
    /// their developer's fair share.
    bulk_queue: String,
    /// The endpoint successes this process wrote last (health).
    written_successes: std::sync::Arc<crate::store::health::WrittenSuccesses>,
}

impl PgStore {
    /// A store over `pool` that queues deliveries on the work queues of
    /// `topology` and announces endpoint changes on its lifecycle exchange.
    pub fn new(pool: PgPool, topology: &Topology) -> PgStore {
        PgStore {
            pool,
            lifecycle_exchange: topology.lifecycle(),
            deliveries_queue: topology.deliveries(),
            bulk_queue: topology.work_queue(crate::broker::Lane::Bulk),
            written_successes: std::sync::Arc::default(),
        }
    }

    /// The pool, for health checks, migrations and tests.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The work queue of `lane`.
    fn work_queue(&self, lane: crate::broker::Lane) -> &str {
        match lane {
            crate::broker::Lane::Default => &self.deliveries_queue,
            crate::broker::Lane::Bulk => &self.bulk_queue,
        }
    }

    pub(super) async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
