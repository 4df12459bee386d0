//! Writes attempt outcomes in batches ([`webhooks_store::batch`]): whatever has queued
//! up while the previous batch committed goes in the next transaction, and a
//! small batch waits up to [`LINGER`] for more. Each caller waits for the
//! commit of its own record before it acks its message: the attempt has been
//! made by then, so the wait delays the ack, never the delivery.

use std::time::Duration;

use webhooks_store::{AttemptRecord, Store, batch::Batcher, batch::Batching};

/// Largest batch per transaction.
const MAX_BATCH: usize = 512;

/// How long a batch smaller than [`FULL_ENOUGH`] waits for more records
/// before it is written: at a few hundred attempts a second, records would
/// otherwise go one transaction each.
const LINGER: Duration = Duration::from_millis(2);

/// A batch this large is written without lingering.
const FULL_ENOUGH: usize = 64;

/// Hands records to the writer task.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    batcher: Batcher<AttemptRecord, Result<(), ()>>,
}

impl Recorder {
    /// Starts the writer; it stops once every `Recorder` handle is dropped and
    /// the queue is drained.
    pub(crate) fn spawn(store: Store, tasks: &tokio_util::task::TaskTracker) -> Recorder {
        let batching = Batching { max: MAX_BATCH, linger: Some((LINGER, FULL_ENOUGH)) };
        let batcher = Batcher::spawn(batching, tasks, move |records| {
            let store = store.clone();
            async move { write(&store, records).await }
        });
        Recorder { batcher }
    }

    /// Records one outcome; `Err` when it could not be committed, in which
    /// case the caller hands its message back.
    pub(crate) async fn record(&self, record: AttemptRecord) -> Result<(), ()> {
        self.batcher.submit(record).await.unwrap_or(Err(()))
    }
}

async fn write(store: &Store, records: Vec<AttemptRecord>) -> Vec<Result<(), ()>> {
    let Err(error) = store.record_attempts(&records).await else { return vec![Ok(()); records.len()] };
    // One bad record must not fail the others: try each on its own.
    tracing::warn!(%error, records = records.len(), "batch failed; recording one by one");
    if records.len() == 1 {
        return vec![Err(())];
    }
    let mut results = Vec::with_capacity(records.len());
    for record in &records {
        results.push(store.record_attempts(std::slice::from_ref(record)).await.map_err(|error| {
            tracing::error!(%error, delivery_id = record.delivery_id, "could not record a delivery attempt");
        }));
    }
    results
}
