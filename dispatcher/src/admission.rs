//! Whether a message may be sent now, asked of the store in batches
//! ([`webhooks_store::batch`]): whether it still stands (no newer
//! generation, attempt or settling overtook it) and whether its endpoint is
//! ordered as the store has it now. A batch of messages costs one
//! statement, not one each.

use webhooks_store::{Admission, StandingQuestion, Store, StoreError, StoreResult, batch::Batcher, batch::Batching};

/// Largest batch per statement.
const MAX_BATCH: usize = 256;

/// Asks the store in batches. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admissions {
    batcher: Batcher<StandingQuestion, StoreResult<Admission>>,
}

impl Admissions {
    /// Starts the asking task; it stops once every handle is dropped.
    pub fn spawn(store: Store, tasks: &tokio_util::task::TaskTracker) -> Admissions {
        let batcher = Batcher::spawn(Batching { max: MAX_BATCH, linger: None }, tasks, move |questions| {
            let store = store.clone();
            async move {
                match store.admissions(&questions).await {
                    Ok(admissions) => admissions.into_iter().map(Ok).collect(),
                    Err(error) => error.for_batch(questions.len()),
                }
            }
        });
        Admissions { batcher }
    }

    /// See [`Store::retry_standing`].
    pub async fn ask(&self, question: StandingQuestion) -> StoreResult<Admission> {
        self.batcher
            .submit(question)
            .await
            .unwrap_or_else(|| Err(StoreError::Corrupt("the admission checks have stopped".into())))
    }
}
