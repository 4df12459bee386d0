//! The message handlers in flight of one consuming loop.

use std::{sync::Arc, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{Delivery, Handler};

/// The handlers in flight. At shutdown they get `SHUTDOWN_TIMEOUT` to
/// finish; the rest are dropped then, unsettled, so their messages go back
/// to the queue and the process stops in time however long an endpoint
/// takes to answer.
#[derive(Debug, Default)]
pub(crate) struct Handlers {
    tasks: TaskTracker,
    abandon: CancellationToken,
}

impl Handlers {
    /// Handles `delivery` on a task of its own; `held` (its slots) is
    /// released when the handler ends.
    pub(crate) fn spawn<H: Handler>(&self, handler: &Arc<H>, delivery: Delivery, held: impl Send + 'static) {
        let (abandon, handler) = (self.abandon.clone(), handler.clone());
        self.tasks.spawn(async move {
            tokio::select! {
                biased;
                () = abandon.cancelled() => {}
                () = handler.handle(delivery) => {}
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
