//! The control plane of `webhooks-api`: API keys, webhook endpoints and their
//! lifecycle, event ingest; in the distributed mode over PostgreSQL with an
//! outbox relayed to RabbitMQ, in standalone mode over SQLite with delivery in
//! the same process.
//!
//! - [`routes`]: the public `/v0` API, one module per resource;
//! - [`auth`] and [`idempotency`]: the middleware every public route runs;
//! - [`internal`]: health, readiness and metrics on the internal listener;
//! - [`server`]: how both listeners bound slow and numerous clients;
//! - [`run`]: starts all of it on given listeners until a shutdown token fires.

pub mod auth;
pub mod catalog;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod ingest;
pub mod internal;
pub mod keys;
pub mod metrics;
pub mod openapi;
pub mod portal;
pub mod rate_limit;
pub mod reads;
pub mod recoveries;
pub mod routes;
pub mod state;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use axum::{Router, middleware};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower_http::catch_panic::CatchPanicLayer;
use webhooks_model::Topology;
use webhooks_net::tls;
use webhooks_queue::Producer;
use webhooks_store::{Purged, RETENTION_BATCH, Store, queue::QueueStore, retention_cutoff};

pub use config::Config;
use state::AppState;

/// The two sockets `serve` listens on; tests bind them to port 0.
#[derive(Debug)]
pub struct Listeners {
    pub public: TcpListener,
    pub internal: TcpListener,
}

/// The public router over `state`, with the request timeout, metrics and
/// panic containment.
pub fn app(state: AppState) -> Router {
    routes::router(state.clone())
        .layer(middleware::from_fn_with_state(state.config.limits.request_timeout, webhooks_listener::request_timeout))
        .layer(middleware::from_fn_with_state(state, metrics::track))
        .layer(CatchPanicLayer::custom(|_| {
            axum::response::IntoResponse::into_response(error::ApiError::Unexpected(anyhow::anyhow!(
                "handler panicked"
            )))
        }))
}

/// What runs beside the listeners: the outbox relay (distributed), or in
/// standalone mode in-process delivery with these settings (`None`: the
/// caller runs delivery itself).
enum Mode {
    Distributed,
    Standalone(Option<Box<dispatcher::DeliveryConfig>>),
}

/// The distributed control plane: serves until `shutdown` fires, then drains
/// requests in flight, lets the relay publish what is committed, and returns.
pub async fn run(config: Config, listeners: Listeners, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    config.common.apply_faults();
    if config.fault_lose_first_attempts {
        config.faults.lose_first_attempts(true);
    }
    let opened = webhooks_store::open::distributed(&config.common).await?;
    serve(config, Mode::Distributed, opened, listeners, shutdown).await
}

/// Standalone mode: the API, the internal listener and delivery in one
/// process over `opened` (the SQLite store of `DATA_DIR`, whose deliveries
/// table is the queue), no broker. On `shutdown` the listeners drain and
/// delivery finishes or keeps what it holds.
pub async fn run_standalone(
    config: config::StandaloneConfig,
    opened: (Store, QueueStore),
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    serve(config.api, Mode::Standalone(Some(Box::new(config.delivery))), opened, listeners, shutdown).await
}

/// The listeners of standalone mode over `opened`, without delivery: the
/// caller runs `dispatcher::start_embedded` on the same store beside it (as
/// the black-box tests do, to stop and start delivery on their own).
pub async fn run_standalone_without_delivery(
    config: Config,
    opened: (Store, QueueStore),
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    serve(config, Mode::Standalone(None), opened, listeners, shutdown).await
}

async fn serve(
    config: Config,
    mode: Mode,
    (store, queue_store): (Store, QueueStore),
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // The socket actually given, which may differ from INTERNAL_LISTEN_ADDR.
    config.check_internal_exposure(listeners.internal.local_addr()?).map_err(anyhow::Error::msg)?;
    if config.internal_token.is_some() && config.internal_token().is_none() {
        tracing::warn!("INTERNAL_TOKEN is blank and counts as unset");
    }
    let common = &config.common;
    let topology = Topology::new(&common.queue_prefix, &common.retry_schedule);
    let cipher = common.key_cipher().context("KEY_ENCRYPTION_KEY")?;
    if let Some(sealing) = cipher.sealing_key() {
        let key_ids: Vec<String> = cipher.key_ids().map(|id| id.to_string()).collect();
        tracing::info!(%sealing, key_ids = %key_ids.join(","), "new endpoint keys are sealed with the first key");
    }
    let roots = tls::root_store(common.tls_extra_roots.as_deref()).context("TLS_EXTRA_ROOTS")?;
    let tls = Arc::new(tls::client_config(roots.clone())?);
    // Test events (`POST /webhooks/{id}/test`) go out as deliveries do:
    // the same guarded client and timeouts as a dispatcher's.
    let delivery_client = tls::delivery_client(
        tls::client_config(roots)?,
        common.target_allow_private,
        common.delivery_timeout,
        common.delivery_timeout.min(Duration::from_secs(5)),
    )?;
    let metrics = Arc::new(metrics::Metrics::new());
    let background = CancellationToken::new();
    let tasks = TaskTracker::new();
    // Delivery that stops with an error stops the process: accepting events
    // that nothing delivers would only look healthy.
    let fatal: Arc<std::sync::Mutex<Option<anyhow::Error>>> = Arc::default();
    let broker = webhooks_queue::amqp::BrokerSettings {
        topology: topology.clone(),
        brokers: webhooks_queue::amqp::Brokers::new(common.broker_addresses().map_err(anyhow::Error::msg)?),
        faults: config.faults.clone(),
    };
    let sweep = webhooks_queue::amqp::sweeper::SweepSettings {
        interval: config.sweep_interval,
        batch: i64::from(config.sweep_batch),
        // A dispatcher holds a message for its slot and pace waits (about
        // 2.5 s at most), the attempt and the record.
        in_flight: common.delivery_timeout + Duration::from_secs(3),
    };
    let producer =
        Producer::start(queue_store.clone(), broker, &metrics.queue, sweep, &tasks, background.clone()).await;
    let delivery_metrics = match &mode {
        Mode::Distributed | Mode::Standalone(None) => None,
        Mode::Standalone(Some(delivery)) => {
            let delivery_metrics = Arc::new(dispatcher::metrics::Metrics::new());
            let opened = (store.clone(), queue_store);
            let delivering =
                dispatcher::start_embedded(common, delivery, opened, delivery_metrics.clone(), background.clone())
                    .await
                    .context("delivery")?;
            let (fatal, stop_listeners) = (fatal.clone(), shutdown.clone());
            tasks.spawn(async move {
                if let Err(error) = delivering.await {
                    tracing::error!(error = format!("{error:#}"), "delivery failed; stopping");
                    *fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                    stop_listeners.cancel();
                }
            });
            Some(delivery_metrics)
        }
    };
    let ingester = ingest::Ingester::spawn(store.clone(), producer.clone(), metrics.clone(), &tasks);
    let recoveries = recoveries::Recoveries::start(
        store.clone(),
        producer.clone(),
        (config.recovery_batch, config.recovery_rate),
        &tasks,
        background.clone(),
    );
    let catalog = Arc::new(
        catalog::Catalog::open(store.clone(), config.event_catalog_strict, config.event_catalog.as_deref())
            .await
            .context("event catalog")?,
    );
    tasks.spawn(catalog.clone().keep_fresh(background.clone()));
    let state = AppState {
        // Half the connections the pool has for requests: the ingest writer
        // and the outbox listener keep one each.
        reads: reads::Reads::new(usize::try_from(common.database_max_connections.saturating_sub(2) / 2).unwrap_or(1)),
        catalog,
        delivery_client,
        config: Arc::new(config.clone()),
        store: store.clone(),
        topology,
        cipher: Arc::new(cipher),
        tls,
        metrics,
        producer,
        ingester,
        recoveries,
        delivery_metrics,
        rate_limit: rate_limit::RateLimit::new(config.rate_limit_per_second, config.rate_limit_burst).map(Arc::new),
        fair_share: rate_limit::RateLimit::new(config.fair_share_per_second, config.fair_share_burst).map(Arc::new),
    };
    tasks.spawn(housekeeping(store.clone(), config.clone(), state.producer.clone(), background.clone()));
    tasks.spawn(purge_idempotency_keys(store.clone(), background.clone()));
    tasks.spawn(watch_backlog(store.clone(), state.metrics.clone(), background.clone()));
    if config.retention().is_none() {
        tracing::info!("RETENTION=0: events, deliveries and logs are kept for ever");
    }
    tasks.spawn(keep_history(store, config.retention(), config.retention_interval, background.clone()));

    tracing::info!(public = %listeners.public.local_addr()?, internal = %listeners.internal.local_addr()?, "webhooks-api listening");
    let limits = config.limits;
    let public = webhooks_listener::serve(listeners.public, app(state.clone()), limits, shutdown.clone());
    let internal = webhooks_listener::serve(listeners.internal, internal::router(state), limits, shutdown.clone());
    let served = tokio::try_join!(public, internal);

    background.cancel();
    tasks.close();
    let deadline = match &mode {
        Mode::Standalone(Some(delivery)) => delivery.shutdown_timeout + Duration::from_secs(10),
        Mode::Distributed | Mode::Standalone(None) => Duration::from_secs(10),
    };
    if tokio::time::timeout(deadline, tasks.wait()).await.is_err() {
        tracing::warn!(?deadline, "background tasks did not stop in time");
    }
    served.context("serve")?;
    if let Some(error) = fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
        return Err(error.context("delivery"));
    }
    tracing::info!("webhooks-api stopped");
    Ok(())
}

/// How often housekeeping looks for failing endpoints, expired keys and
/// stale planner statistics.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(2);

/// Endpoint housekeeping, every [`HOUSEKEEPING_INTERVAL`]: disables the
/// endpoints that have failed for `AUTO_DISABLE_AFTER` (API.md §8.3), and
/// deletes the replaced keys whose overlap has ended (§8.2). Both are single
/// statements, safe with several API processes.
async fn housekeeping(store: Store, config: Config, producer: Producer, shutdown: CancellationToken) {
    let clock = config.common.clock.clone();
    let mut tick = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        if !config.auto_disable_after.is_zero() {
            match store.auto_disable_failing(clock.now(), config.auto_disable_after).await {
                Ok(disabled) => {
                    for endpoint in &disabled {
                        tracing::warn!(
                            endpoint_id = %endpoint.id,
                            failing_since = ?endpoint.health.failing_since,
                            "endpoint disabled: its deliveries kept failing"
                        );
                    }
                    if !disabled.is_empty() {
                        producer.wake();
                    }
                }
                Err(error) => tracing::warn!(%error, "could not check endpoint health"),
            }
        }
        match store.purge_expired_keys(webhooks_model::time::now()).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "replaced endpoint keys deleted at the end of their overlap"),
            Err(error) => tracing::warn!(%error, "could not delete expired endpoint keys"),
        }
        match store.refresh_statistics().await {
            Ok(tables) if tables.is_empty() => {}
            Ok(tables) => tracing::debug!(?tables, "analyzed for the planner, as autovacuum would"),
            Err(error) => tracing::warn!(%error, "could not analyze the tables that changed"),
        }
    }
}

/// How often the backlog gauges are refreshed.
const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Refreshes the backlog gauges (`Store::backlog`) every [`BACKLOG_EVERY`].
async fn watch_backlog(store: Store, metrics: Arc<metrics::Metrics>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(BACKLOG_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match store.backlog().await {
            Ok(backlog) => metrics.backlog.show(&backlog, webhooks_model::time::now()),
            Err(error) => tracing::debug!(%error, "cannot read the backlog"),
        }
    }
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

/// Pause between two batches of a sweep, so that the writes a batch made
/// wait (in standalone mode, every write: one writer) go first.
const RETENTION_PAUSE: Duration = Duration::from_millis(20);

/// Keeps the history: at start and then every `interval`, the coming days'
/// partitions are made and the days wholly older than `retention` dropped
/// (`Store::maintain_history`), then what else is older is deleted
/// (`Store::purge_expired`), batch after batch, with a pause between them,
/// until a batch comes back short. Several instances may do it at once;
/// each skips what another holds.
async fn keep_history(store: Store, retention: Option<Duration>, interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let cutoff = retention.and_then(retention_cutoff);
        match store.maintain_history(cutoff).await {
            Ok(maintained) if maintained != webhooks_store::Maintained::default() => {
                tracing::info!(made = maintained.made, dropped = maintained.dropped, "history partitions kept");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "could not keep the history's partitions; next round tries again"),
        }
        let Some(cutoff) = cutoff else { continue };
        let mut deleted = Purged::default();
        loop {
            match store.purge_expired(cutoff, RETENTION_BATCH).await {
                Ok(batch) => {
                    deleted.add(batch);
                    if !batch.full(RETENTION_BATCH) {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "could not delete expired events and logs; next sweep tries again");
                    break;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RETENTION_PAUSE) => {}
                () = shutdown.cancelled() => return,
            }
        }
        if !deleted.is_empty() {
            tracing::debug!(
                events = deleted.events,
                deliveries = deleted.deliveries,
                logs = deleted.logs + deleted.delivery_logs,
                %cutoff,
                "expired events, deliveries and logs deleted"
            );
        }
    }
}
