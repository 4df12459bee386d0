//! `webhooks-dispatcher`, the delivery worker: takes delivery messages from a
//! queue, signs each attempt with its endpoint's key, POSTs it to `active`
//! HTTPS endpoints only, records every attempt, and schedules retries.
//!
//! - [`decide`]: the delivery decision (send, hold, cancel; retry or fail;
//!   how long a message put back waits), pure;
//! - [`worker`]: the handling of one message, whatever its queue: it decides
//!   an outcome, and the queue (`webhooks-queue`) carries it out;
//! - [`deliver`]: one signed HTTP attempt;
//! - [`key_check`]: at start, the stored endpoint keys open with the
//!   configured ones;
//! - [`cache`]: endpoints, invalidated by lifecycle messages;
//! - [`admission`]: batched checks that a message may be sent now;
//! - [`slots`]: attempts in flight per endpoint, under limits that adapt;
//! - [`run`]: the distributed dispatcher plus `/healthz`, `/readyz`,
//!   `/metrics`, until shutdown; [`start_embedded`]: delivery inside the
//!   standalone process.

pub mod admission;
pub mod cache;
pub mod config;
pub mod decide;
pub mod deliver;
pub mod key_check;
pub mod metrics;
pub mod slots;
pub mod worker;

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::{net::TcpListener, sync::watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use webhooks_config::CommonConfig;
use webhooks_listener::{Limits, Token};
use webhooks_model::Topology;
use webhooks_net::tls;
use webhooks_queue::Queue;
use webhooks_store::{Store, queue::QueueStore};

pub use config::{Config, DeliveryConfig};

use crate::{
    cache::EndpointCache,
    metrics::Metrics,
    worker::{Context, Worker},
};

#[derive(Debug, Clone)]
struct Health {
    store: Store,
    broker_up: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
}

/// The paths served without the token: the liveness and readiness probes.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

fn health_router(health: Health, token: Option<Token>, limits: Limits) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(health)
        .layer(middleware::from_fn_with_state(token, webhooks_listener::require_token))
        .layer(middleware::from_fn_with_state(limits.request_timeout, webhooks_listener::request_timeout))
}

async fn readyz(State(health): State<Health>) -> Response {
    let database = health.store.ping().await.is_ok();
    let broker = *health.broker_up.borrow();
    let body = serde_json::json!({
        "database": if database { "ok" } else { "down" },
        "broker": if broker { "ok" } else { "down" },
    });
    let status = if database && broker { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

async fn render_metrics(State(health): State<Health>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], health.metrics.render())
        .into_response()
}

#[derive(Debug, clap::Parser)]
#[command(name = "webhooks-dispatcher", version, about = "The delivery worker of the webhook service")]
struct Cli {
    #[command(flatten)]
    config: Config,
}

/// The `webhooks-dispatcher` program: reads its settings from the command
/// line and the environment, sets up logging, binds `DISPATCHER_LISTEN_ADDR`
/// and runs until SIGTERM or SIGINT.
pub async fn main() -> anyhow::Result<()> {
    let Cli { config } = clap::Parser::parse();
    webhooks_config::telemetry::init(config.common.log_format);
    let shutdown = webhooks_config::shutdown::on_signal();
    let listener = TcpListener::bind(config.dispatcher_listen_addr).await.context("bind DISPATCHER_LISTEN_ADDR")?;
    run(config, listener, shutdown).await
}

/// The handler context over `store` and its queue, with the delivery client
/// and an empty endpoint cache; `writers` tracks the batched writers, which
/// drain on shutdown. `handlers`: the messages the queue hands out at once.
async fn context(
    common: &CommonConfig,
    delivery: &DeliveryConfig,
    (store, queue_store): (Store, QueueStore),
    metrics: Arc<Metrics>,
    writers: &TaskTracker,
    handlers: usize,
) -> anyhow::Result<Arc<Context>> {
    let cipher = Arc::new(common.key_cipher().context("KEY_ENCRYPTION_KEY")?);
    key_check::check(&store, &cipher).await?;
    let roots = tls::root_store(common.tls_extra_roots.as_deref()).context("TLS_EXTRA_ROOTS")?;
    let connect_timeout = common.delivery_timeout.min(Duration::from_secs(5));
    let client = tls::delivery_client(
        tls::client_config(roots)?,
        common.target_allow_private,
        common.delivery_timeout,
        connect_timeout,
    )?;
    let settings = webhooks_queue::Settings {
        topology: Topology::new(&common.queue_prefix, &common.retry_schedule),
        brokers: webhooks_queue::amqp::Brokers::new(common.broker_addresses().map_err(anyhow::Error::msg)?),
        prefetch: delivery.dispatcher_prefetch,
        concurrency: delivery.dispatcher_concurrency,
        shutdown_timeout: delivery.shutdown_timeout,
        retry_schedule: common.retry_schedule.clone(),
        clock: metrics.clock.clone(),
    };
    Ok(Arc::new(Context {
        common: common.clone(),
        delivery: delivery.clone(),
        client,
        cache: EndpointCache::new(store.clone(), cipher, delivery.endpoint_cache_ttl),
        admissions: admission::Admissions::spawn(store.clone(), writers),
        queue: Queue::new(store.clone(), queue_store, settings, writers),
        store,
        metrics,
        slots: slots::Slots::new(
            delivery.dispatcher_endpoint_concurrency,
            delivery.endpoint_slot_wait,
            common.delivery_timeout,
            handlers,
        ),
    }))
}

/// Runs a dispatcher until `shutdown`: then it stops consuming, finishes or
/// hands back what it holds within `SHUTDOWN_TIMEOUT`, and returns.
pub async fn run(config: Config, listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    config.common.apply_faults();
    webhooks_listener::check_exposure("DISPATCHER_LISTEN_ADDR", listener.local_addr()?, config.internal_token())
        .map_err(anyhow::Error::msg)?;
    let common = &config.common;
    // No statement timeout here: a dispatcher's statements are bounded by
    // their batches, and a record cancelled after its POST was made would
    // make it again.
    let opened = webhooks_store::open::distributed(&webhooks_config::CommonConfig {
        database_statement_timeout: Duration::ZERO,
        ..common.clone()
    })
    .await?;
    let store = opened.0.clone();
    let metrics = Arc::new(Metrics::new());
    let (broker_tx, broker_rx) = watch::channel(false);
    let writers = TaskTracker::new();
    // Two lanes, each with its own prefetch window, share the handlers.
    let handlers = config.delivery.dispatcher_concurrency.min(2 * usize::from(config.delivery.dispatcher_prefetch));
    let context = context(common, &config.delivery, opened, metrics.clone(), &writers, handlers).await?;

    let health_stop = CancellationToken::new();
    tracing::info!(addr = %listener.local_addr()?, "webhooks-dispatcher listening");
    let token = Token::new(config.internal_token(), &PROBES);
    let router = health_router(Health { store, broker_up: broker_rx, metrics }, token, config.limits);
    let health = tokio::spawn(webhooks_listener::serve(listener, router, config.limits, health_stop.clone()));

    // On a worker thread of the runtime, not the thread that called `run`:
    // the tasks the session spawns then start on the same worker, instead of
    // each waking a parked one from outside.
    let consuming = tokio::spawn({
        let (context, shutdown) = (context.clone(), shutdown.clone());
        async move {
            let queue = context.queue.clone();
            queue.consume(Arc::new(Worker(context)), broker_tx, shutdown).await
        }
    });
    match consuming.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(error = format!("{error:#}"), "consuming ended with an error"),
        Err(error) => tracing::error!(%error, "the broker sessions ended abnormally"),
    }

    // Every handler has finished: let the batched writers drain, then stop.
    drop(context);
    writers.close();
    writers.wait().await;
    health_stop.cancel();
    health.await.context("health listener")?.context("health listener")?;
    tracing::info!("webhooks-dispatcher stopped");
    Ok(())
}

/// Delivers from the SQLite store's own queue until `shutdown` (standalone
/// mode: no broker, no listener of its own), then finishes what it holds
/// within `SHUTDOWN_TIMEOUT`. `metrics` are served by the caller.
///
/// What can fail at start (settings, a `KEY_ENCRYPTION_KEY` that cannot open
/// the stored keys) fails here, before anything runs; the future it returns
/// delivers.
pub async fn start_embedded(
    common: &CommonConfig,
    delivery: &DeliveryConfig,
    opened: (Store, QueueStore),
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<impl Future<Output = anyhow::Result<()>> + Send + use<>> {
    delivery.validate().map_err(anyhow::Error::msg)?;
    let writers = TaskTracker::new();
    let handlers = delivery.dispatcher_concurrency;
    let context = context(common, delivery, opened, metrics, &writers, handlers).await?;
    Ok(async move {
        let queue = context.queue.clone();
        let (ready, _) = watch::channel(false);
        let result = queue.consume(Arc::new(Worker(context)), ready, shutdown).await;
        drop(queue);
        writers.close();
        writers.wait().await;
        result
    })
}
