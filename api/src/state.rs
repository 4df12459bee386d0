//! The state every handler shares: cheap handles, cloned per request.

use std::sync::Arc;

use webhooks_keys::KeyCipher;
use webhooks_model::Topology;
use webhooks_store::Store;

use crate::{config::Config, metrics::Metrics, rate_limit::RateLimit};

/// Handles on the store, the broker relay and settings.
#[derive(Debug, Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Store,
    pub topology: Topology,
    pub cipher: Arc<KeyCipher>,
    /// Trusted roots for the TLS check of endpoint URLs.
    pub tls: Arc<rustls::ClientConfig>,
    pub metrics: Arc<Metrics>,
    /// The queue's side of the API: wakes the relay after a commit wrote the
    /// outbox, and says whether a broker serves (`None`: no broker).
    pub producer: webhooks_queue::Producer,
    /// Stores ingested events in batches.
    pub ingester: crate::ingest::Ingester,
    /// Runs the recoveries, under a budget of their own.
    pub recoveries: crate::recoveries::Recoveries,
    /// The event catalog, kept in step with the database.
    pub catalog: Arc<crate::catalog::Catalog>,
    /// The guarded delivery client, for test events.
    pub delivery_client: reqwest::Client,
    /// The metrics of in-process delivery (standalone mode), served with the API's.
    pub delivery_metrics: Option<Arc<dispatcher::metrics::Metrics>>,
    /// The per-developer request limit, unless switched off.
    pub rate_limit: Option<Arc<RateLimit>>,
    /// Each developer's fair share of the default work queue, unless
    /// switched off.
    pub fair_share: Option<Arc<RateLimit>>,
    /// The expensive reads in flight, per developer and in all.
    pub reads: crate::reads::Reads,
}
