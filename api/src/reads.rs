//! Expensive reads (log searches, event lists and lookups, upcoming events)
//! kept from crowding out everything else (API.md §8.12): all developers
//! together hold at most half of the process's database connections with
//! them (a read that cannot get one within [`WAIT_AT_MOST`] answers 503
//! with `Retry-After`), and a developer at most [`PER_DEVELOPER`] of those,
//! and never all of them (the next answers 429 with `Retry-After`). So
//! however many searches one developer starts, another's find a share
//! free, and every other call a connection; and each statement is bounded
//! in time by `DATABASE_STATEMENT_TIMEOUT`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::error::{ApiError, ApiResult};

/// Expensive reads one developer may have in flight at once, per process.
pub const PER_DEVELOPER: usize = 3;

/// How long an expensive read waits for one of the process's share of
/// connections before it answers 503.
const WAIT_AT_MOST: Duration = Duration::from_secs(1);

/// What a refused read is told to wait.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The expensive reads in flight. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reads {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    per_developer: Mutex<HashMap<Uuid, usize>>,
    /// How many one developer may have in flight.
    each: usize,
    process: Arc<Semaphore>,
}

impl Reads {
    /// At most `process` expensive reads at once in this process; a
    /// developer at most [`PER_DEVELOPER`], and one fewer than `process`.
    pub fn new(process: usize) -> Reads {
        let process = process.max(1);
        Reads {
            inner: Arc::new(Inner {
                per_developer: Mutex::default(),
                each: PER_DEVELOPER.min(process - 1).max(1),
                process: Arc::new(Semaphore::new(process)),
            }),
        }
    }

    /// Begins an expensive read of `developer`'s: 429 when they have as
    /// many in flight as one developer may, 503 when the process's share is
    /// taken for longer than [`WAIT_AT_MOST`]. The read ends when the
    /// returned permit is dropped.
    pub async fn begin(&self, developer: Uuid) -> ApiResult<ReadPermit> {
        let mine = {
            let mut in_flight = self.inner.per_developer.lock().unwrap_or_else(PoisonError::into_inner);
            let count = in_flight.entry(developer).or_default();
            if *count >= self.inner.each {
                return Err(ApiError::RateLimited(RETRY_AFTER));
            }
            *count += 1;
            Mine { reads: self.inner.clone(), developer }
        };
        let process = tokio::time::timeout(WAIT_AT_MOST, self.inner.process.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(ApiError::Unavailable(RETRY_AFTER, "The service is busy with searches"))?;
        Ok(ReadPermit { _mine: mine, _process: process })
    }
}

/// An expensive read in flight.
#[derive(Debug)]
pub struct ReadPermit {
    _mine: Mine,
    _process: OwnedSemaphorePermit,
}

/// One of a developer's reads in flight; counted off when dropped.
#[derive(Debug)]
struct Mine {
    reads: Arc<Inner>,
    developer: Uuid,
}

impl Drop for Mine {
    fn drop(&mut self) {
        let mut in_flight = self.reads.per_developer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = in_flight.get_mut(&self.developer) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.developer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_developer_has_a_few_reads_at_once_and_all_share_the_process() {
        let reads = Reads::new(4);
        assert_eq!(Reads::new(1).inner.each, 1, "a share of one is one developer's");
        assert_eq!(Reads::new(3).inner.each, 2, "never all of the share");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut held = Vec::new();
        for _ in 0..PER_DEVELOPER {
            held.push(reads.begin(a).await.unwrap());
        }
        assert!(matches!(reads.begin(a).await, Err(ApiError::RateLimited(_))), "a's fourth");
        let b_read = reads.begin(b).await.unwrap();
        // The process's four are taken: another's read waits, then 503.
        assert!(matches!(reads.begin(Uuid::new_v4()).await, Err(ApiError::Unavailable(..))));
        drop(held.pop());
        drop(b_read);
        reads.begin(a).await.unwrap();
        assert!(reads.inner.per_developer.lock().unwrap().get(&b).is_none(), "nothing left of b");
    }
}
