//! Writes attempt outcomes in batches: whatever has queued up while the
//! previous batch committed goes in the next transaction. Each caller waits for
//! the commit of its own record before it acks its message.

use shared::store::{AttemptRecord, Store};
use tokio::sync::{mpsc, oneshot};

/// Largest batch per transaction.
const MAX_BATCH: usize = 512;

type Job = (AttemptRecord, oneshot::Sender<Result<(), ()>>);

/// Hands records to the writer task.
#[derive(Debug, Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
}

impl Recorder {
    /// Starts the writer; it stops once every `Recorder` handle is dropped and
    /// the queue is drained.
    pub fn spawn(store: Store, tasks: &tokio_util::task::TaskTracker) -> Recorder {
        let (jobs, queue) = mpsc::channel(4 * MAX_BATCH);
        tasks.spawn(write_batches(store, queue));
        Recorder { jobs }
    }

    /// Records one outcome; `Err` when it could not be committed, in which
    /// case the caller hands its message back.
    pub async fn record(&self, record: AttemptRecord) -> Result<(), ()> {
        let (done, committed) = oneshot::channel();
        self.jobs.send((record, done)).await.map_err(drop)?;
        committed.await.map_err(drop)?
    }
}

async fn write_batches(store: Store, mut queue: mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (records, dones): (Vec<AttemptRecord>, Vec<_>) = batch.drain(..).unzip();
        let Err(error) = store.record_attempts(&records).await else {
            for done in dones {
                let _ = done.send(Ok(()));
            }
            continue;
        };
        // One bad record must not fail the others: try each on its own.
        tracing::warn!(%error, records = records.len(), "batch failed; recording one by one");
        for (record, done) in records.iter().zip(dones) {
            let result = match records.len() {
                1 => Err(()),
                _ => store.record_attempts(std::slice::from_ref(record)).await.map_err(|error| {
                    tracing::error!(%error, delivery_id = record.delivery_id, "could not record a delivery attempt");
                }),
            };
            let _ = done.send(result);
        }
    }
}
