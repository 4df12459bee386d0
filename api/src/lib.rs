//! `webhooks-api`, the control plane: API keys, webhook endpoints and their
//! lifecycle on PostgreSQL, lifecycle messages to RabbitMQ through an outbox.
//!
//! - [`routes`]: the public `/v0` API, one module per resource;
//! - [`auth`] and [`idempotency`]: the middleware every public route runs;
//! - [`internal`]: health, readiness and metrics on the internal listener;
//! - [`relay`]: the outbox relay that publishes committed messages;
//! - [`run`]: starts all of it on given listeners until a shutdown token fires.

pub mod auth;
pub mod config;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod ingest;
pub mod internal;
pub mod keys;
pub mod metrics;
pub mod openapi;
pub mod rate_limit;
pub mod relay;
pub mod routes;
pub mod state;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use axum::{Router, middleware};
use shared::{broker::Topology, db, store::Store, tls};
use tokio::{net::TcpListener, sync::watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower_http::catch_panic::CatchPanicLayer;

pub use config::Config;
use state::AppState;

/// The two sockets `serve` listens on; tests bind them to port 0.
#[derive(Debug)]
pub struct Listeners {
    pub public: TcpListener,
    pub internal: TcpListener,
}

/// Opens the pool and applies migrations, retrying while PostgreSQL starts.
pub async fn connect_database(common: &shared::config::CommonConfig) -> anyhow::Result<Store> {
    db::connect(common).await
}

/// The public router over `state`, with metrics and panic containment.
pub fn app(state: AppState) -> Router {
    routes::router(state.clone()).layer(middleware::from_fn_with_state(state, metrics::track)).layer(
        CatchPanicLayer::custom(|_| {
            axum::response::IntoResponse::into_response(error::ApiError::Unexpected(anyhow::anyhow!(
                "handler panicked"
            )))
        }),
    )
}

/// Serves until `shutdown` fires, then drains requests in flight, lets the
/// relay publish what is committed, and returns.
pub async fn run(config: Config, listeners: Listeners, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    let common = &config.common;
    let store = connect_database(common).await?;
    let topology = Topology::new(&common.queue_prefix, &common.retry_schedule);
    let cipher = common.key_cipher().context("KEY_ENCRYPTION_KEY")?;
    let roots = tls::root_store(common.tls_extra_roots.as_deref()).context("TLS_EXTRA_ROOTS")?;
    let tls = Arc::new(tls::client_config(roots)?);
    let (broker_tx, broker_rx) = watch::channel(false);
    let metrics = Arc::new(metrics::Metrics::new());
    let state = AppState {
        config: Arc::new(config.clone()),
        store: store.clone(),
        topology: topology.clone(),
        cipher: Arc::new(cipher),
        tls,
        metrics: metrics.clone(),
        relay_wake: Arc::default(),
        broker_up: broker_rx,
        rate_limit: rate_limit::RateLimit::new(config.rate_limit_per_second, config.rate_limit_burst).map(Arc::new),
    };

    let background = CancellationToken::new();
    let tasks = TaskTracker::new();
    let relay = relay::Relay {
        store: store.clone(),
        amqp_url: common.amqp_url.clone(),
        topology,
        wake: state.relay_wake.clone(),
        broker_up: broker_tx,
        metrics,
    };
    tasks.spawn(relay.run(background.clone()));
    tasks.spawn(purge_idempotency_keys(store, background.clone()));

    tracing::info!(public = %listeners.public.local_addr()?, internal = %listeners.internal.local_addr()?, "webhooks-api listening");
    let public =
        axum::serve(listeners.public, app(state.clone())).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let internal = axum::serve(listeners.internal, internal::router(state))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let served = tokio::try_join!(public.into_future(), internal.into_future());

    background.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await.is_err() {
        tracing::warn!("background tasks did not stop within 10s");
    }
    served.context("serve")?;
    tracing::info!("webhooks-api stopped");
    Ok(())
}

/// Forgets stored idempotent answers older than 24 hours, hourly.
async fn purge_idempotency_keys(store: Store, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match store.purge_idempotency_keys().await {
            Ok(purged) => tracing::debug!(purged, "expired idempotency keys purged"),
            Err(error) => tracing::warn!(%error, "could not purge idempotency keys"),
        }
    }
}
