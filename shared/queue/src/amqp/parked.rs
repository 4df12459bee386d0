//! The due times of deliveries parked in the broker's retry queues, written
//! in batches ([`webhooks_store::batch`]): a backlog parked behind a hanging
//! endpoint costs one statement per batch, not a commit per message.

use webhooks_store::{Parked, batch::Batcher, batch::Batching, queue::Outbox};

/// Largest batch per statement.
const MAX_BATCH: usize = 256;

/// Hands parked deliveries to the writer task. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct ParkedWrites {
    batcher: Batcher<Parked, bool>,
}

impl ParkedWrites {
    /// Starts the writer; it stops once every handle is dropped.
    pub(crate) fn spawn(outbox: Outbox, tasks: &tokio_util::task::TaskTracker) -> ParkedWrites {
        let batcher = Batcher::spawn(Batching { max: MAX_BATCH, linger: None }, tasks, move |parked: Vec<Parked>| {
            let outbox = outbox.clone();
            async move {
                let written = match outbox.park(&parked).await {
                    Ok(()) => true,
                    Err(error) => {
                        tracing::debug!(%error, parked = parked.len(), "cannot move the parked deliveries' due times");
                        false
                    }
                };
                vec![written; parked.len()]
            }
        });
        ParkedWrites { batcher }
    }

    /// See [`Outbox::park`]: whether the due time was written. When it
    /// was not (the store may be why the message was parked), the due time
    /// stays, and a sweep may queue the delivery again; the older message is
    /// then dropped unsent when it comes back.
    pub(crate) async fn write(&self, parked: Parked) -> bool {
        self.batcher.submit(parked).await.unwrap_or(false)
    }
}
