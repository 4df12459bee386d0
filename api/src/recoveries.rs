//! The recovery worker of every API process: it takes the running
//! recoveries nobody holds (its own, those of a process that stopped) and
//! queues their windows batch after batch, each batch one transaction that
//! also stores the progress, so a stop or an error loses nothing and queues
//! nothing twice.
//!
//! Recovery work has a budget of its own: one statement at a time per
//! process (the count of each recovery included, made in the background
//! after the call started it; one in flight per developer), and after
//! each batch a pause at least as long as the batch took and long enough to
//! keep to `RECOVERY_RATE` deliveries per second. However many recoveries
//! run, they hold one of the process's database connections at most half of
//! the time, and what they queue reaches the dispatchers at a pace that
//! leaves live traffic its share.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::{Notify, Semaphore, oneshot};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use uuid::Uuid;
use webhooks_queue::Producer;
use webhooks_store::{EndpointRecord, Recoverable, Recovery, RecoveryWindow, Store, StoreResult};

/// How long a process holds a recovery it works on without renewing it; a
/// process that stopped leaves its recoveries to another after this.
const LEASE: Duration = Duration::from_secs(30);
/// The longest pause after a batch that `RECOVERY_BATCH` and `RECOVERY_RATE`
/// may ask for: well within the lease, which the next batch renews.
pub const MAX_PAUSE: Duration = Duration::from_secs(10);
/// How often the worker looks for recoveries when nothing woke it.
const LOOK_EVERY: Duration = Duration::from_secs(2);
/// Recoveries taken at once; they go a batch each in turn.
const AT_ONCE: i64 = 32;
/// The least pause between two batches.
const PAUSE: Duration = Duration::from_millis(20);

/// The recovery worker's handle: cheap to clone.
#[derive(Debug, Clone)]
pub struct Recoveries {
    store: Store,
    budget: Arc<Semaphore>,
    wake: Arc<Notify>,
    /// The developers with a count in flight in this process.
    counting: Arc<Mutex<HashSet<Uuid>>>,
}

/// A developer's one count in flight; given back when dropped.
#[derive(Debug)]
pub struct Counting {
    counting: Arc<Mutex<HashSet<Uuid>>>,
    developer: Uuid,
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.counting.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.developer);
    }
}

impl Recoveries {
    /// Starts the worker on `tasks` until `shutdown`, queueing at most
    /// `batch` deliveries per transaction and at most `rate` per second (0:
    /// no limit); `producer` is told when something was queued.
    pub fn start(
        store: Store,
        producer: Producer,
        (batch, rate): (u32, u32),
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Recoveries {
        let recoveries =
            Recoveries { store, budget: Arc::new(Semaphore::new(1)), wake: Arc::default(), counting: Arc::default() };
        let worker = Worker {
            recoveries: recoveries.clone(),
            producer,
            owner: Uuid::new_v4(),
            batch: i64::from(batch),
            rate: f64::from(rate),
        };
        tasks.spawn(worker.run(shutdown));
        recoveries
    }

    /// Takes the developer's one count in flight, or `None` when they have
    /// one already.
    pub fn begin_count(&self, developer: Uuid) -> Option<Counting> {
        let mut counting = self.counting.lock().unwrap_or_else(PoisonError::into_inner);
        counting.insert(developer).then(|| Counting { counting: self.counting.clone(), developer })
    }

    /// Counts what recovery `id` of `window` (started uncounted) queues,
    /// under the recovery budget, in the background, and stores the count
    /// (`Store::count_recovery`). The receiver gets the count once stored;
    /// `counting` is given back then.
    pub fn count(
        &self,
        counting: Counting,
        endpoint: EndpointRecord,
        id: Uuid,
        window: RecoveryWindow,
    ) -> oneshot::Receiver<Recoverable> {
        let (counted, answer) = oneshot::channel();
        let recoveries = self.clone();
        tokio::spawn(async move {
            let _counting = counting;
            let result: StoreResult<Recoverable> = async {
                let _turn = recoveries.budget.acquire().await;
                let recoverable = recoveries.store.recoverable(&endpoint, window).await?;
                recoveries.store.count_recovery(id, &recoverable).await?;
                Ok(recoverable)
            }
            .await;
            match result {
                Ok(recoverable) => {
                    let _ = counted.send(recoverable);
                }
                Err(error) => {
                    tracing::warn!(%error, recovery_id = %id, "cannot count a recovery; it goes on uncounted")
                }
            }
        });
        answer
    }

    /// A recovery was started: take it now rather than at the next look.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

struct Worker {
    recoveries: Recoveries,
    producer: Producer,
    /// This process, as the holder of the recoveries it works on.
    owner: Uuid,
    batch: i64,
    /// Deliveries per second; 0: no limit.
    rate: f64,
}

impl Worker {
    async fn run(self, shutdown: CancellationToken) {
        let store = &self.recoveries.store;
        'work: loop {
            let held = match store.claim_recoveries(self.owner, LEASE, AT_ONCE).await {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(%error, "cannot take recoveries; looking again");
                    Vec::new()
                }
            };
            if held.is_empty() {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = self.recoveries.wake.notified() => {}
                    () = tokio::time::sleep(LOOK_EVERY) => {}
                }
                continue;
            }
            // A batch of each in turn, until each is done or the next take
            // renews the leases.
            let mut running = held;
            let renew_at = tokio::time::Instant::now() + LEASE / 3;
            while !running.is_empty() && tokio::time::Instant::now() < renew_at {
                let mut still = Vec::with_capacity(running.len());
                for recovery in running {
                    if shutdown.is_cancelled() {
                        break 'work;
                    }
                    // A slow pass (a low RECOVERY_RATE) stops for the
                    // renewal before the leases lapse.
                    if tokio::time::Instant::now() >= renew_at || !self.step(&recovery, &shutdown).await {
                        still.push(recovery);
                    }
                }
                running = still;
            }
        }
        if let Err(error) = store.release_recoveries(self.owner).await {
            tracing::warn!(%error, "cannot let go of the recoveries under way; another process takes them later");
        }
    }

    /// One batch of `recovery`, under the budget, then the pause; whether
    /// it is done.
    async fn step(&self, recovery: &Recovery, shutdown: &CancellationToken) -> bool {
        let started = tokio::time::Instant::now();
        let stepped = {
            let _turn = self.recoveries.budget.acquire().await;
            self.recoveries.store.recovery_step(recovery, self.owner, self.batch, LEASE).await
        };
        let (done, queued) = match stepped {
            Ok(step) => {
                if step.queued > 0 {
                    self.producer.wake();
                }
                if step.done {
                    tracing::info!(recovery_id = %recovery.id, endpoint_id = %recovery.endpoint_id, "recovery done");
                }
                (step.done, step.queued)
            }
            Err(error) => {
                tracing::warn!(%error, recovery_id = %recovery.id, "a recovery batch failed; trying again");
                let _ = self.recoveries.store.recovery_failed(recovery.id, &error.to_string()).await;
                (false, 0)
            }
        };
        let paced = if self.rate > 0.0 { Duration::from_secs_f64(queued as f64 / self.rate) } else { Duration::ZERO };
        tokio::select! {
            () = tokio::time::sleep(started.elapsed().max(PAUSE).max(paced)) => {}
            () = shutdown.cancelled() => {}
        }
        done
    }
}
