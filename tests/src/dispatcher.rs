//! A dispatcher (`dispatcher::run`) next to a [`crate::TestApi`]: same
//! database, queue prefix, trusted roots and delivery settings.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use webhooks_store::{Store, queue::QueueStore};

use crate::WAIT;

/// One running dispatcher. Stop it (or drop it) before its [`crate::TestApi`],
/// whose clean-up removes the database and queues it works on.
#[derive(Debug)]
pub struct TestDispatcher {
    /// Its `/healthz`, `/readyz` and `/metrics` listener.
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    running: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestDispatcher {
    /// The in-process delivery of a standalone instance over `store`, with
    /// the settings of `webhooks-api standalone` in `args`, and a listener of
    /// its own for `/readyz` and `/metrics`; ready when this returns.
    pub(crate) async fn start_embedded(
        args: Vec<String>,
        opened: (Store, QueueStore),
        clock: webhooks_model::time::Clock,
        client: &reqwest::Client,
    ) -> anyhow::Result<TestDispatcher> {
        let mut config = api::config::StandaloneConfig::from_args(&args).context("standalone flags")?;
        config.api.common.clock = clock;
        let metrics = Arc::new(dispatcher::metrics::Metrics::new());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let served = metrics.clone();
        let router = axum::Router::new()
            .route("/readyz", axum::routing::get(|| async { "ok\n" }))
            .route("/metrics", axum::routing::get(move || async move { served.render() }));
        let listening = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(listening.cancelled_owned()).await;
        });
        let (common, delivery) = (config.api.common, config.delivery);
        let delivering = dispatcher::start_embedded(&common, &delivery, opened, metrics, shutdown.clone()).await?;
        let running = tokio::spawn(delivering);
        TestDispatcher::ready(TestDispatcher { addr, shutdown, running: Some(running) }, client).await
    }

    /// Starts a dispatcher with `args` (the shared flags, then its own) and
    /// waits until its `/readyz` answers 200.
    pub(crate) async fn start(
        args: Vec<String>,
        clock: webhooks_model::time::Clock,
        client: &reqwest::Client,
    ) -> anyhow::Result<TestDispatcher> {
        let mut config = dispatcher::config::Config::from_args(&args).context("dispatcher flags")?;
        config.common.clock = clock;
        // On the address `--dispatcher-listen-addr` names (loopback unless
        // told), on a free port; reached over loopback.
        let listener = TcpListener::bind(SocketAddr::new(config.dispatcher_listen_addr.ip(), 0)).await?;
        let addr = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listener.local_addr()?.port());
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(dispatcher::run(config, listener, shutdown.clone()));
        TestDispatcher::ready(TestDispatcher { addr, shutdown, running: Some(running) }, client).await
    }

    /// Waits until `started` answers `/readyz` with 200.
    async fn ready(mut started: TestDispatcher, client: &reqwest::Client) -> anyhow::Result<TestDispatcher> {
        let addr = started.addr;
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut pause = Duration::from_millis(20);
        loop {
            if let Some(running) = started.running.as_mut().filter(|r| r.is_finished()) {
                let outcome = running.await;
                started.running = None;
                anyhow::bail!("the dispatcher stopped before it was ready: {outcome:?}");
            }
            if let Ok(response) = client.get(format!("http://{addr}/readyz")).send().await
                && response.status() == 200
            {
                return Ok(started);
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the dispatcher was not ready within {WAIT:?}");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Cancels its shutdown token and waits for `dispatcher::run` to return;
    /// a dispatcher that does not stop within two [`WAIT`]s fails the test.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.running.take() {
            Some(running) => tokio::time::timeout(2 * WAIT, running)
                .await
                .map_err(|_| anyhow::anyhow!("the dispatcher did not stop within {:?}", 2 * WAIT))?
                .context("the dispatcher task panicked")?,
            None => Ok(()),
        }
    }
}

impl Drop for TestDispatcher {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            crate::block_on_aside(async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
            });
        }
    }
}
