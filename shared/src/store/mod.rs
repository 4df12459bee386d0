//! The PostgreSQL store: every query the two programs run, grouped by resource.
//!
//! Handlers and workers talk to [`Store`] only, never to SQL, so the storage
//! seam stays narrow. Each method is one statement or one transaction.

mod api_keys;
mod deliveries;
mod endpoints;
mod events;
mod idempotency;
mod outbox;

pub use api_keys::{NewApiKey, hash_key};
pub use deliveries::{AttemptRecord, DeliveryState, RetryStanding};
pub use endpoints::{EndpointChange, EndpointRecord, EndpointUpdate, NewEndpoint, UpdateOutcome};
pub use events::{
    EVENT_IDEMPOTENCY_INDEX, EventPage, IdempotentEvent, IngestOutcome, NewEvent, SendOutcome, StoredEvent,
};
pub use idempotency::{Claim, StoredResponse};
pub use outbox::OutboxRow;

use sqlx::PgPool;

use crate::broker::Topology;

/// Cheap to clone: a handle on the pool.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    lifecycle_exchange: String,
}

impl Store {
    /// A store over `pool` that announces endpoint changes on the lifecycle
    /// exchange of `topology`.
    pub fn new(pool: PgPool, topology: &Topology) -> Store {
        Store { pool, lifecycle_exchange: topology.lifecycle() }
    }

    /// The pool, for health checks and migrations.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map(drop)
    }
}
