//! RabbitMQ for tests: a queue prefix per test, removed afterwards, and a tap
//! on the lifecycle exchange.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use futures::StreamExt;
use lapin::{
    Connection,
    options::{BasicConsumeOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
};
use serde_json::Value;
use tokio::{sync::Notify, task::JoinHandle};
use webhooks_model::{ChangeKind, EndpointChanged, RetrySchedule, Topology};
use webhooks_queue::amqp as broker;
use webhooks_queue::{Message, message::decode};

use crate::{WAIT, block_on_aside, random_suffix};

/// The broker tests use, unless `TEST_AMQP_URL` says otherwise.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The AMQP URL tests connect to.
pub fn amqp_url() -> String {
    std::env::var("TEST_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned())
}

/// A fresh `QUEUE_PREFIX`: `t_<random>`.
pub fn random_prefix() -> String {
    format!("t_{}", random_suffix())
}

/// Every queue and exchange a deployment with `prefix` and `schedule`
/// declares, deleted by [`QueueCleanup::remove`] or else on `Drop`.
#[derive(Debug)]
pub struct QueueCleanup {
    amqp_url: String,
    queues: Vec<String>,
    exchanges: Vec<String>,
    removed: bool,
}

impl QueueCleanup {
    /// The names of `prefix`'s topology under `schedule`.
    pub fn new(amqp_url: &str, prefix: &str, schedule: &RetrySchedule) -> QueueCleanup {
        let topology = Topology::new(prefix, schedule);
        let mut queues = topology.queues();
        queues.sort();
        queues.dedup();
        QueueCleanup { amqp_url: amqp_url.to_owned(), queues, exchanges: vec![topology.lifecycle()], removed: false }
    }

    /// Deletes the queues and exchanges now.
    pub async fn remove(mut self) {
        self.removed = true;
        delete_topology(self.amqp_url.clone(), self.queues.clone(), self.exchanges.clone()).await;
    }
}

impl Drop for QueueCleanup {
    fn drop(&mut self) {
        if !self.removed {
            block_on_aside(delete_topology(self.amqp_url.clone(), self.queues.clone(), self.exchanges.clone()));
        }
    }
}

async fn delete_topology(amqp_url: String, queues: Vec<String>, exchanges: Vec<String>) {
    let result = async {
        let connection = broker::connect(&amqp_url, "webhooks tests clean-up").await?;
        for queue in &queues {
            // A failed delete closes the channel; use one per name.
            let channel = connection.create_channel().await?;
            if let Err(error) = channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await {
                tracing::debug!(%error, %queue, "queue not deleted");
            }
        }
        for exchange in &exchanges {
            let channel = connection.create_channel().await?;
            if let Err(error) =
                channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await
            {
                tracing::debug!(%error, %exchange, "exchange not deleted");
            }
        }
        connection.close(200, "done".into()).await?;
        anyhow::Ok(())
    };
    match tokio::time::timeout(crate::WAIT, result).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "could not clean up test queues"),
        Err(_) => tracing::warn!(?queues, "test queue clean-up timed out"),
    }
}

/// One message seen on the lifecycle exchange: the JSON as published and,
/// when it decodes, the typed message.
#[derive(Debug, Clone)]
pub struct TapMessage {
    pub raw: Value,
    pub message: Option<Message>,
}

impl TapMessage {
    /// The endpoint change this message announces, if it is one.
    pub fn endpoint_changed(&self) -> Option<&EndpointChanged> {
        match &self.message {
            Some(Message::EndpointChanged(changed)) => Some(changed),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Seen {
    messages: Mutex<Vec<TapMessage>>,
    notify: Notify,
}

/// A consumer on an exclusive, auto-delete queue bound to `{prefix}.lifecycle`:
/// sees every lifecycle message published after [`LifecycleTap::start`].
#[derive(Debug)]
pub struct LifecycleTap {
    seen: Arc<Seen>,
    connection: Connection,
    consumer: JoinHandle<()>,
}

impl LifecycleTap {
    /// Binds a fresh queue to the lifecycle exchange of `prefix`, which must
    /// already exist (the API declares it before it reports ready).
    pub async fn start(amqp_url: &str, prefix: &str) -> anyhow::Result<LifecycleTap> {
        let exchange = lifecycle_exchange(prefix)?;
        let connection = broker::connect(amqp_url, "webhooks tests lifecycle tap").await.context("connect")?;
        let channel = connection.create_channel().await.context("channel")?;
        let queue = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions { exclusive: true, auto_delete: true, ..QueueDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .context("declare tap queue")?;
        channel
            .queue_bind(
                queue.name().clone(),
                exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .context("bind tap queue to the lifecycle exchange")?;
        let mut consumer = channel
            .basic_consume(
                queue.name().clone(),
                "".into(),
                BasicConsumeOptions { no_ack: true, exclusive: true, ..BasicConsumeOptions::default() },
                FieldTable::default(),
            )
            .await
            .context("consume tap queue")?;
        let seen = Arc::new(Seen::default());
        let consumer = tokio::spawn({
            let seen = seen.clone();
            async move {
                while let Some(Ok(delivery)) = consumer.next().await {
                    let raw = serde_json::from_slice(&delivery.data)
                        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&delivery.data).into_owned()));
                    let message = decode(&delivery.data).ok();
                    seen.messages.lock().unwrap_or_else(|e| e.into_inner()).push(TapMessage { raw, message });
                    seen.notify.notify_waiters();
                }
            }
        });
        Ok(LifecycleTap { seen, connection, consumer })
    }

    /// Every message seen so far, in arrival order.
    pub fn messages(&self) -> Vec<TapMessage> {
        self.seen.messages.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The messages about `endpoint_id` seen so far, in arrival order.
    pub fn messages_for(&self, endpoint_id: &str) -> Vec<TapMessage> {
        self.messages()
            .into_iter()
            .filter(|m| m.endpoint_changed().is_some_and(|c| c.endpoint_id == endpoint_id))
            .collect()
    }

    /// Waits (up to [`WAIT`]) for a message announcing `change` of `endpoint_id`.
    pub async fn wait_for(&self, change: ChangeKind, endpoint_id: &str) -> anyhow::Result<TapMessage> {
        let found = || {
            self.messages()
                .into_iter()
                .find(|m| m.endpoint_changed().is_some_and(|c| c.change == change && c.endpoint_id == endpoint_id))
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.seen.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(message) = found() {
                return Ok(message);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!(
                    "no {change:?} message for {endpoint_id} within {WAIT:?}; seen: {:?}",
                    self.messages().iter().map(|m| m.raw.to_string()).collect::<Vec<_>>()
                );
            }
        }
    }

    /// Closes the connection; the broker deletes the tap's queue.
    pub async fn close(self) {
        self.consumer.abort();
        let _ = self.connection.close(200, "done".into()).await;
    }
}

impl Drop for LifecycleTap {
    fn drop(&mut self) {
        self.consumer.abort();
    }
}

/// The name of `prefix`'s lifecycle exchange, which no retry delay affects.
fn lifecycle_exchange(prefix: &str) -> anyhow::Result<String> {
    let no_retries: RetrySchedule = "".parse().map_err(anyhow::Error::msg)?;
    Ok(Topology::new(prefix, &no_retries).lifecycle())
}
