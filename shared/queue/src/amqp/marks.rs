//! How far this dispatcher's workers have got in each work queue
//! (DESIGN.md, "Knowing what is stranded"): the latest `enters_at` of a
//! message a worker started, and the `enters_at` of the messages the broker
//! pushed that wait in the dispatcher's buffer for a worker. A work queue
//! hands messages out in the order they entered it, so every message that
//! entered before the latest started one was handed out: to a worker, or
//! to a buffer, which holds the queue's watermark back until its messages
//! start. The process's presence ([`super::presence`]) writes them to the
//! store once a second, where the sweeper reads them.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicI64, Ordering},
    },
};

use chrono::{DateTime, Utc};
use webhooks_store::queue::QueueMark;

use super::WorkQueue;
use crate::metrics::ClockMetrics;

/// Nothing started yet.
const NONE: i64 = i64::MIN;

/// The marks of every work queue, in milliseconds since the epoch.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    queues: [QueueMarks; 3],
}

#[derive(Debug)]
struct QueueMarks {
    started: AtomicI64,
    /// The `enters_at` of the messages waiting in the buffer, and how many
    /// of each.
    holding: Mutex<BTreeMap<i64, u32>>,
}

impl Default for QueueMarks {
    fn default() -> Self {
        QueueMarks { started: AtomicI64::new(NONE), holding: Mutex::default() }
    }
}

impl Marks {
    fn of(&self, queue: WorkQueue) -> &QueueMarks {
        let index = WorkQueue::ALL.iter().position(|q| *q == queue).unwrap_or(0);
        &self.queues[index]
    }

    /// A message that entered `queue` at `enters_at` is in the buffer,
    /// waiting for a worker. Messages from writers that do not say are no
    /// evidence; a stamp far ahead of this clock is counted.
    pub(crate) fn held(&self, queue: WorkQueue, enters_at: Option<DateTime<Utc>>, clock: &ClockMetrics) {
        let Some(at) = enters_at else { return };
        clock.stamp(at, "enters_at");
        let mut holding = self.of(queue).holding.lock().unwrap_or_else(PoisonError::into_inner);
        *holding.entry(at.timestamp_millis()).or_default() += 1;
    }

    /// A worker started the message of `queue` that entered at `enters_at`.
    pub(crate) fn started(&self, queue: WorkQueue, enters_at: Option<DateTime<Utc>>) {
        let Some(at) = enters_at else { return };
        let marks = self.of(queue);
        marks.started.fetch_max(at.timestamp_millis(), Ordering::Relaxed);
        self.release(marks, at);
    }

    /// A message that waited in the buffer went back to the broker unstarted.
    pub(crate) fn returned(&self, queue: WorkQueue, enters_at: Option<DateTime<Utc>>) {
        if let Some(at) = enters_at {
            self.release(self.of(queue), at);
        }
    }

    fn release(&self, marks: &QueueMarks, at: DateTime<Utc>) {
        let mut holding = marks.holding.lock().unwrap_or_else(PoisonError::into_inner);
        if let std::collections::btree_map::Entry::Occupied(mut held) = holding.entry(at.timestamp_millis()) {
            *held.get_mut() -= 1;
            if *held.get() == 0 {
                held.remove();
            }
        }
    }

    /// What the store is told of each queue.
    pub(crate) fn current(&self) -> Vec<QueueMark> {
        let millis = |ms: i64| (ms != NONE).then(|| DateTime::from_timestamp_millis(ms)).flatten();
        WorkQueue::ALL
            .iter()
            .map(|queue| {
                let marks = self.of(*queue);
                let holding = marks.holding.lock().unwrap_or_else(PoisonError::into_inner);
                QueueMark {
                    queue: queue.as_str(),
                    started_through: millis(marks.started.load(Ordering::Relaxed)),
                    holding_since: holding.keys().next().copied().and_then(millis),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use webhooks_model::Lane;

    #[test]
    fn a_queue_is_held_back_by_what_waits_unstarted_and_moves_with_what_starts() {
        let marks = Marks::default();
        let clock = ClockMetrics::default();
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0);
        let default = WorkQueue::Lane(Lane::Default);
        marks.held(default, at(10), &clock);
        marks.held(default, at(12), &clock);
        marks.held(default, None, &clock);
        marks.started(default, at(10));
        let mark = |q: &str| marks.current().into_iter().find(|m| m.queue == q).unwrap();
        assert_eq!(mark("default").started_through, at(10));
        assert_eq!(mark("default").holding_since, at(12));
        marks.started(default, at(5));
        marks.returned(default, at(12));
        assert_eq!(mark("default").started_through, at(10), "a mark only moves forward");
        assert_eq!(mark("default").holding_since, None);
        assert_eq!(mark("swept").started_through, None);
        assert_eq!(marks.current().len(), 3);
    }
}
