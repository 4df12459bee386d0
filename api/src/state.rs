//! The state every handler shares: cheap handles, cloned per request.

use std::sync::Arc;

use tokio::sync::{Notify, watch};
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
    /// Wakes the outbox relay after a commit, so messages leave at once.
    pub relay_wake: Arc<Notify>,
    /// Stores ingested events in batches.
    pub ingester: crate::ingest::Ingester,
    /// Whether the relay holds a working broker channel; `None` in standalone
    /// mode, which has no broker.
    pub broker_up: Option<watch::Receiver<bool>>,
    /// The metrics of in-process delivery (standalone mode), served with the API's.
    pub delivery_metrics: Option<Arc<dispatcher::metrics::Metrics>>,
    /// The per-developer request limit, unless switched off.
    pub rate_limit: Option<Arc<RateLimit>>,
    /// Each developer's fair share of the default work queue, unless
    /// switched off.
    pub fair_share: Option<Arc<RateLimit>>,
    /// Work a request starts and does not wait for (a recovery's batches):
    /// the process waits for it at shutdown, and `stopping` tells it to end.
    pub tasks: tokio_util::task::TaskTracker,
    pub stopping: tokio_util::sync::CancellationToken,
}
