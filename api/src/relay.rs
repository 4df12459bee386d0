//! The outbox relay: publishes committed outbox rows to RabbitMQ with
//! publisher confirms and deletes each row only once the broker confirmed it.
//!
//! A commit wakes the relay at once (so latency is one round trip, not a
//! polling tick); a slow scan every second is the safety net. While the broker
//! is down the rows wait and the API keeps accepting work; the relay
//! reconnects with capped exponential backoff and drains them.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use lapin::{
    Confirmation, Connection,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use shared::{
    broker::{self, Topology},
    store::pg::{OUTBOX_CHANNEL, PgStore},
};
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Wakes the relay when another process wrote outbox rows (a dispatcher
/// that released an ordered endpoint's next delivery) and said so on
/// [`OUTBOX_CHANNEL`]; the slow scan stays the safety net while it cannot
/// listen.
async fn listen(store: PgStore, wake: Arc<Notify>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        match PgListener::connect_with(store.pool()).await {
            Ok(mut listener) => match listener.listen(OUTBOX_CHANNEL).await {
                Ok(()) => loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        notified = listener.recv() => match notified {
                            Ok(_) => wake.notify_one(),
                            Err(error) => {
                                tracing::warn!(%error, "outbox notifications ended; listening again");
                                break;
                            }
                        },
                    }
                },
                Err(error) => tracing::warn!(%error, "cannot listen for outbox notifications"),
            },
            Err(error) => tracing::debug!(%error, "cannot connect to listen for outbox notifications"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(SCAN_EVERY) => {}
        }
    }
}

/// Rows published per round.
const BATCH: i64 = 500;
/// How long one round may wait for the broker's confirms.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// The safety-net scan interval.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// What the relay needs.
pub struct Relay {
    pub store: PgStore,
    pub amqp_url: String,
    pub topology: Topology,
    pub wake: Arc<Notify>,
    pub broker_up: watch::Sender<bool>,
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The AMQP URL carries the broker password: shown redacted.
        f.debug_struct("Relay")
            .field("store", &self.store)
            .field("amqp_url", &shared::config::redacted_url(&self.amqp_url))
            .field("topology", &self.topology)
            .field("broker_up", &self.broker_up)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Runs until `shutdown`; then publishes what is already committed, within
    /// a short deadline, so a clean stop leaves nothing behind needlessly.
    pub async fn run(self, shutdown: CancellationToken) {
        let listening = tokio::spawn(listen(self.store.clone(), self.wake.clone(), shutdown.clone()));
        shared::broker::reconnecting("outbox relay", &shutdown, || async {
            let result = self.session(&shutdown).await;
            self.broker_up.send_replace(false);
            result
        })
        .await;
        let _ = listening.await;
    }

    async fn session(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let connection = broker::connect(&self.amqp_url, "webhooks-api outbox relay").await.context("connect")?;
        let channel = connection.create_channel().await.context("open channel")?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.context("enable confirms")?;
        self.topology.declare(&channel).await.context("declare topology")?;
        self.broker_up.send_replace(true);
        tracing::info!("outbox relay connected to the broker");

        let result = self.publish_loop(&connection, &channel, shutdown).await;
        if result.is_ok() {
            let _ = tokio::time::timeout(CONFIRM_TIMEOUT, connection.close(200, "shutdown".into())).await;
        }
        result
    }

    async fn publish_loop(
        &self,
        connection: &Connection,
        channel: &lapin::Channel,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        loop {
            // A stalled broker (memory or disk alarm) must not hold the outbox
            // rows locked for ever: give up the round and reconnect.
            let published = tokio::time::timeout(CONFIRM_TIMEOUT, self.publish_batch(channel))
                .await
                .map_err(|_| anyhow::anyhow!("no confirms within {CONFIRM_TIMEOUT:?}"))??;
            if published == BATCH as usize {
                continue;
            }
            if shutdown.is_cancelled() {
                return Ok(());
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(SCAN_EVERY) => {
                    anyhow::ensure!(connection.status().connected(), "connection closed");
                }
                () = shutdown.cancelled() => {}
            }
        }
    }

    /// Publishes one batch; returns how many rows it published (rows the
    /// broker refused stay, and are tried again at the next wake or scan).
    async fn publish_batch(&self, channel: &lapin::Channel) -> anyhow::Result<usize> {
        let (mut tx, rows, orphans) = self.store.lock_outbox(BATCH).await.context("read outbox")?;
        self.metrics.outbox_backlog.set(i64::try_from(rows.len()).unwrap_or(i64::MAX));
        if !orphans.is_empty() {
            tracing::warn!(count = orphans.len(), "outbox rows name deliveries that are gone; dropping them");
        }
        if rows.is_empty() && orphans.is_empty() {
            return Ok(0);
        }
        let mut confirms = Vec::with_capacity(rows.len());
        for row in &rows {
            let options = BasicPublishOptions {
                // A delivery must reach its queue; a lifecycle message with no
                // dispatcher listening has nobody to tell, which is fine.
                mandatory: row.exchange.is_empty(),
                ..BasicPublishOptions::default()
            };
            let confirm = channel
                .basic_publish(
                    row.exchange.as_str().into(),
                    row.routing_key.as_str().into(),
                    options,
                    &row.payload,
                    broker::persistent_json(),
                )
                .await
                .context("publish")?;
            confirms.push(confirm);
        }
        let dropped = orphans.len();
        let mut done = orphans;
        for (row, confirm) in rows.iter().zip(confirms) {
            match confirm.await.context("await confirm")? {
                Confirmation::Ack(None) | Confirmation::NotRequested => done.push(row.id),
                Confirmation::Ack(Some(_)) if !row.exchange.is_empty() => done.push(row.id),
                Confirmation::Ack(Some(_)) => {
                    tracing::warn!(outbox_id = row.id, queue = %row.routing_key, "message unroutable; will retry")
                }
                Confirmation::Nack(_) => tracing::warn!(outbox_id = row.id, "broker refused a message; will retry"),
            }
        }
        PgStore::delete_outbox(&mut tx, &done).await.context("delete outbox rows")?;
        tx.commit().await.context("commit outbox")?;
        let published = done.len() - dropped;
        self.metrics.outbox_published.inc_by(u64::try_from(published).unwrap_or(0));
        Ok(done.len())
    }
}
