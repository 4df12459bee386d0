//! Group commit for any store call: callers hand in one item each and wait
//! for its answer; one task takes whatever has queued up while its previous
//! batch ran and hands it all to one call (one transaction, one round trip).
//! A caller alone waits for nobody: at a low rate a batch is one item.
//!
//! Used for the ingest of events (one transaction per batch), the record of
//! attempts and the standing checks of retries (one statement per batch).

use std::{future::Future, time::Duration};

use tokio::sync::{mpsc, oneshot};

type Job<I, O> = (I, oneshot::Sender<O>);

/// How a [`Batcher`] forms its batches.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// The largest batch.
    pub max: usize,
    /// How long a batch smaller than `full` waits for more items (once, not
    /// per item), when answers may come a little later at no cost: the
    /// record of an attempt already made, say.
    pub linger: Option<(Duration, usize)>,
}

/// The handle callers submit items with. Cheap to clone; the task stops once
/// every handle is dropped and what was submitted is answered.
#[derive(Debug)]
pub struct Batcher<I, O> {
    jobs: mpsc::Sender<Job<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Batcher { jobs: self.jobs.clone() }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the task on `tasks`. `run` gets each batch and answers it: one
    /// answer per item, in the batch's order.
    pub fn spawn<F, Fut>(batching: Batching, tasks: &tokio_util::task::TaskTracker, mut run: F) -> Batcher<I, O>
    where
        F: FnMut(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<O>> + Send,
    {
        let (jobs, mut queue) = mpsc::channel::<Job<I, O>>(4 * batching.max);
        tasks.spawn(async move {
            let mut batch: Vec<Job<I, O>> = Vec::with_capacity(batching.max);
            while queue.recv_many(&mut batch, batching.max).await > 0 {
                if let Some((linger, full)) = batching.linger
                    && batch.len() < full
                {
                    tokio::time::sleep(linger).await;
                    while batch.len() < batching.max {
                        let Ok(job) = queue.try_recv() else { break };
                        batch.push(job);
                    }
                }
                let (items, answers): (Vec<I>, Vec<oneshot::Sender<O>>) = batch.drain(..).unzip();
                for (answer, out) in answers.into_iter().zip(run(items).await) {
                    // A caller that went away does not need its answer.
                    let _ = answer.send(out);
                }
            }
        });
        Batcher { jobs }
    }

    /// Submits one item and waits for its answer; `None` when the task has
    /// stopped (the process is stopping) or gave no answer for it.
    pub async fn submit(&self, item: I) -> Option<O> {
        let (answer, answered) = oneshot::channel();
        self.jobs.send((item, answer)).await.ok()?;
        answered.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test]
    async fn items_queued_while_a_batch_runs_go_in_the_next_one_each_answered() {
        let tasks = tokio_util::task::TaskTracker::new();
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate) = tokio::sync::watch::channel(false);
        let seen = sizes.clone();
        let batcher = Batcher::spawn(Batching { max: 100, linger: None }, &tasks, move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            let mut gate = gate.clone();
            async move {
                // The first batch waits until the others have queued.
                let _ = gate.wait_for(|open| *open).await;
                items.into_iter().map(|n| n * 10).collect()
            }
        });
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(1).await }
        });
        while sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (2..=5)
            .map(|n| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(n).await })
            })
            .collect();
        while batcher.jobs.capacity() > 400 - 4 {
            tokio::task::yield_now().await;
        }
        gate_tx.send_replace(true);
        assert_eq!(first.await.unwrap(), Some(10));
        for (n, answer) in (2..=5).zip(later) {
            assert_eq!(answer.await.unwrap(), Some(n * 10));
        }
        assert_eq!(*sizes.lock().unwrap(), [1, 4]);
        drop(batcher);
        tasks.close();
        tasks.wait().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_batch_lingers_once_for_more() {
        let tasks = tokio_util::task::TaskTracker::new();
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let batching = Batching { max: 100, linger: Some((Duration::from_millis(2), 10)) };
        let batcher = Batcher::spawn(batching, &tasks, move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            async move { items }
        });
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.submit(1).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = batcher.submit(2).await;
        assert_eq!((first.await.unwrap(), second), (Some(1), Some(2)));
        assert_eq!(*sizes.lock().unwrap(), [2]);
    }
}
