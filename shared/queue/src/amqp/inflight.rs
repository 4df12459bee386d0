//! The first attempts an API process is committing or has committed that
//! the broker has not confirmed yet, nor the outbox taken (DESIGN.md,
//! "Knowing what is stranded"). Its presence tells the store how far they
//! are confirmed, so that if the process dies between a commit and a
//! confirm, the sweeper knows which events' first attempts may be in no
//! queue, even ahead of a backlog.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use chrono::{DateTime, Utc};

/// How long an event may take from its stamp to [`Inflight::enter`] (the
/// handler's few steps between them): `confirmed_through` stays at least
/// this far behind now.
const STAMP_TO_ENTER: chrono::Duration = chrono::Duration::seconds(1);

/// The events whose first attempts are not confirmed yet, by their time.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    times: Mutex<BTreeMap<i64, u32>>,
}

impl Inflight {
    /// An event stamped `created_at` is on its way: until the returned
    /// token is dropped (its first attempts confirmed, or written to the
    /// outbox), the process's first attempts are confirmed only through
    /// its time.
    pub(crate) fn enter(self: &Arc<Self>, created_at: DateTime<Utc>) -> Pending {
        let micros = created_at.timestamp_micros();
        *self.times.lock().unwrap_or_else(PoisonError::into_inner).entry(micros).or_default() += 1;
        Pending(Some((self.clone(), micros)))
    }

    /// Every first attempt of an event stamped before this was confirmed
    /// or written to the outbox.
    pub(crate) fn confirmed_through(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let floor = now - STAMP_TO_ENTER;
        let times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        let oldest = times.keys().next().and_then(|micros| DateTime::from_timestamp_micros(*micros));
        oldest.map_or(floor, |oldest| oldest.min(floor))
    }
}

/// An event whose first attempts are on their way to the broker; dropped
/// once they are confirmed or in the outbox. The embedded queue's is empty.
#[derive(Debug, Default)]
pub struct Pending(Option<(Arc<Inflight>, i64)>);

impl Drop for Pending {
    fn drop(&mut self) {
        let Some((inflight, micros)) = self.0.take() else { return };
        let mut times = inflight.times.lock().unwrap_or_else(PoisonError::into_inner);
        if let std::collections::btree_map::Entry::Occupied(mut entry) = times.entry(micros) {
            *entry.get_mut() -= 1;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_attempts_are_confirmed_through_the_oldest_on_its_way() {
        let inflight = Arc::new(Inflight::default());
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        assert_eq!(inflight.confirmed_through(now), now - STAMP_TO_ENTER);
        let older = inflight.enter(now - chrono::Duration::seconds(30));
        let newer = inflight.enter(now - chrono::Duration::seconds(10));
        let twin = inflight.enter(now - chrono::Duration::seconds(30));
        assert_eq!(inflight.confirmed_through(now), now - chrono::Duration::seconds(30));
        drop(older);
        assert_eq!(inflight.confirmed_through(now), now - chrono::Duration::seconds(30), "its twin is on its way");
        drop(twin);
        assert_eq!(inflight.confirmed_through(now), now - chrono::Duration::seconds(10));
        drop(newer);
        assert_eq!(inflight.confirmed_through(now), now - STAMP_TO_ENTER);
        drop(Pending::default());
    }
}
