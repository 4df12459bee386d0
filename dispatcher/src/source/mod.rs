//! Where delivery messages come from, and how each is settled.
//!
//! - [`amqp`]: the distributed mode: RabbitMQ's work queue with manual acks,
//!   retries through the per-delay retry queues, cache invalidation from the
//!   lifecycle exchange;
//! - [`embedded`]: standalone mode: the deliveries table of the SQLite store
//!   is the queue (due deliveries are claimed, a retry is the recorded next
//!   attempt time), and endpoint changes arrive in-process.
//!
//! Each message is handed to [`crate::worker::handle`] with a [`Ticket`]; the
//! handler never knows which queue runs.

pub mod amqp;
pub mod embedded;

use std::{sync::Arc, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};
use webhooks_queue::DeliveryMessage;

use crate::worker::{self, Context};

/// The message handlers in flight of one consuming loop. At shutdown they get
/// `SHUTDOWN_TIMEOUT` to finish; the rest are dropped then, unsettled, so
/// their messages go back to the queue and the process stops in time however
/// long an endpoint takes to answer.
#[derive(Debug, Default)]
pub(crate) struct Handlers {
    tasks: TaskTracker,
    abandon: CancellationToken,
}

impl Handlers {
    /// Handles `message` on a task of its own; `held` (its slots) is
    /// released when the handler ends.
    pub(crate) fn spawn(
        &self,
        context: Arc<Context>,
        message: DeliveryMessage,
        ticket: Ticket,
        held: impl Send + 'static,
    ) {
        let abandon = self.abandon.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                biased;
                () = abandon.cancelled() => {}
                () = worker::handle(&context, message, ticket) => {}
            }
            drop(held);
        });
    }

    /// Waits up to `timeout` for the handlers in flight, then drops the rest;
    /// `unfinished` says where their messages go.
    pub(crate) async fn finish(self, timeout: Duration, unfinished: &str) {
        self.tasks.close();
        if !self.tasks.is_empty() {
            tracing::info!(in_flight = self.tasks.len(), "finishing deliveries in flight");
        }
        if tokio::time::timeout(timeout, self.tasks.wait()).await.is_err() {
            tracing::warn!(unfinished = self.tasks.len(), "shutdown deadline passed; {unfinished}");
            self.abandon.cancel();
            self.tasks.wait().await;
        }
    }
}

/// A message taken from a queue: how to settle it.
#[derive(Debug)]
pub enum Ticket {
    Amqp(amqp::AmqpTicket),
    Embedded(embedded::EmbeddedTicket),
}

impl Ticket {
    /// Whether the queue handed this message out before without an ack (its
    /// consumer stopped, lost its connection or requeued it): its attempt
    /// may have been made and recorded.
    pub fn redelivered(&self) -> bool {
        match self {
            Ticket::Amqp(ticket) => ticket.redelivered,
            Ticket::Embedded(_) => false,
        }
    }

    /// Arranges the attempt `next` after `delay`, before the outcome is
    /// recorded: RabbitMQ needs the retry message published (confirmed) first;
    /// the embedded queue takes it from the recorded next attempt time.
    pub async fn schedule_retry(&self, next: &DeliveryMessage, delay: Duration) -> anyhow::Result<()> {
        match self {
            Ticket::Amqp(ticket) => ticket.publish_retry(next, delay).await,
            Ticket::Embedded(_) => Ok(()),
        }
    }

    /// The message is handled and its outcome recorded: take it off the queue.
    pub fn done(self) {
        match self {
            Ticket::Amqp(ticket) => ticket.ack(),
            Ticket::Embedded(ticket) => ticket.done(),
        }
    }

    /// Puts the message back for `delay` without counting an attempt;
    /// `message` is the one to put back, counting this park.
    pub async fn defer(self, context: &Context, message: &DeliveryMessage, delay: Duration, outcome: &'static str) {
        match self {
            Ticket::Amqp(ticket) => ticket.defer(context, message, delay, outcome).await,
            Ticket::Embedded(ticket) => ticket.defer(context, message, delay, outcome).await,
        }
    }

    /// Puts the message back for `delay` behind an endpoint that hangs: on
    /// RabbitMQ its delivery waits in the store, with no message, until the
    /// endpoint answers again or the delay is over (see
    /// [`webhooks_store::Store::release_set_aside`]); the embedded queue is
    /// the store, so there it is a [`Ticket::defer`].
    pub async fn set_aside(self, context: &Context, message: &DeliveryMessage, delay: Duration) {
        match self {
            Ticket::Amqp(ticket) => ticket.set_aside(context, message, delay).await,
            Ticket::Embedded(ticket) => ticket.defer(context, message, delay, "set_aside").await,
        }
    }

    /// Gives up on a message that could not be processed `PARK_LIMIT` times:
    /// RabbitMQ dead-letters it to `{p}.dead` (the delivery stays owed, and
    /// the sweeper queues it again later); the embedded queue records the
    /// delivery `failed`, with `reason` in its log.
    pub async fn dead_letter(self, context: &Context, message: &DeliveryMessage, reason: &str) {
        context.metrics.outcome("dead_lettered");
        match self {
            Ticket::Amqp(ticket) => ticket.dead_letter(),
            Ticket::Embedded(ticket) => ticket.give_up(context, message, reason).await,
        }
    }

    /// Hands the message back after a pause, so a failing dependency is not
    /// hammered: used when even deferring it failed.
    pub async fn requeue(self, context: &Context) {
        context.metrics.outcome("requeued");
        tokio::time::sleep(Duration::from_millis(500)).await;
        match self {
            Ticket::Amqp(ticket) => ticket.requeue(),
            Ticket::Embedded(ticket) => ticket.requeue().await,
        }
    }
}
