//! Whether a retry (or a first attempt that waited long in its queue) should
//! still be made, asked in batches ([`webhooks_store::batch`]): a backlog of such
//! messages costs one statement per batch, not one per message.

use webhooks_store::{
    RetryStanding, StandingQuestion, Store, StoreError, StoreResult, batch::Batcher, batch::Batching,
};

/// Largest batch per statement.
const MAX_BATCH: usize = 256;

/// Asks the store in batches. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Standings {
    batcher: Batcher<StandingQuestion, StoreResult<RetryStanding>>,
}

impl Standings {
    /// Starts the asking task; it stops once every handle is dropped.
    pub fn spawn(store: Store, tasks: &tokio_util::task::TaskTracker) -> Standings {
        let batcher = Batcher::spawn(Batching { max: MAX_BATCH, linger: None }, tasks, move |questions| {
            let store = store.clone();
            async move {
                match store.retry_standings(&questions).await {
                    Ok(standings) => standings.into_iter().map(Ok).collect(),
                    Err(error) => error.for_batch(questions.len()),
                }
            }
        });
        Standings { batcher }
    }

    /// See [`Store::retry_standing`].
    pub async fn ask(&self, question: StandingQuestion) -> StoreResult<RetryStanding> {
        self.batcher
            .submit(question)
            .await
            .unwrap_or_else(|| Err(StoreError::Corrupt("the standing checks have stopped".into())))
    }
}
