//! The names of every exchange and queue of one deployment, and the lanes a
//! delivery waits in. Every name starts with `QUEUE_PREFIX`:
//!
//! ```text
//! {p}.deliveries, {p}.deliveries.bulk    the work queues of the two lanes
//! {p}.deliveries.swept                    what the sweeper queued again, taken first
//! {p}.retry.<ms>ms, {p}.retry.bulk.<ms>ms  one retry queue per delay and lane
//! {p}.dead                                messages that could not be processed
//! {p}.lifecycle                           the fanout exchange of endpoint changes
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::RetrySchedule;

/// Which of the two work queues a delivery waits in (docs/architecture.md, "Scheduling"):
/// a developer's events within their fair share go to `default`, the rest,
/// and backlogs by nature (recovery, sweeps, dead-letter replays), to `bulk`,
/// which may hold at most three quarters of a dispatcher's slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Lane {
    #[default]
    Default,
    Bulk,
}

impl Lane {
    pub fn is_default(&self) -> bool {
        *self == Lane::Default
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Where a message waits before it goes back to its work queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRoute {
    /// The retry queue.
    pub queue: String,
    /// The message's own expiration there.
    pub wait: Duration,
    /// The queue's TTL: a queue expires messages only at its head, so one
    /// published now is back in its work queue by `now + ttl` at the latest,
    /// whatever its own expiration.
    pub ttl: Duration,
}

/// Names of every exchange and queue of one deployment.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    retry_delays: Vec<Duration>,
}

impl Topology {
    /// The topology of `prefix`, with one retry queue per distinct delay.
    pub fn new(prefix: &str, schedule: &RetrySchedule) -> Topology {
        let mut retry_delays = schedule.delays().to_vec();
        retry_delays.sort();
        retry_delays.dedup();
        Topology { prefix: prefix.to_owned(), retry_delays }
    }

    /// The work queue dispatchers consume first.
    pub fn deliveries(&self) -> String {
        format!("{}.deliveries", self.prefix)
    }

    /// The work queue of `lane`: [`Topology::deliveries`], or
    /// `{p}.deliveries.bulk`.
    pub fn work_queue(&self, lane: Lane) -> String {
        match lane {
            Lane::Default => self.deliveries(),
            Lane::Bulk => format!("{}.deliveries.bulk", self.prefix),
        }
    }

    /// The work queue of deliveries the sweeper queued again
    /// (DESIGN.md, "Knowing what is stranded"): dispatchers take it before
    /// the lanes, so a delivery found stranded does not wait behind the
    /// backlog it was lost from. It has no retry queues: a message from it
    /// retries in its lane.
    pub fn swept(&self) -> String {
        format!("{}.deliveries.swept", self.prefix)
    }

    /// Every queue of the topology (not the lifecycle listeners' own).
    pub fn queues(&self) -> Vec<String> {
        let mut queues = vec![self.work_queue(Lane::Default), self.work_queue(Lane::Bulk), self.swept(), self.dead()];
        for delay in &self.retry_delays {
            queues.push(self.retry_in(Lane::Default, *delay));
            queues.push(self.retry_in(Lane::Bulk, *delay));
        }
        queues
    }

    /// Where messages go that cannot be processed.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// The fanout exchange of endpoint changes.
    pub fn lifecycle(&self) -> String {
        format!("{}.lifecycle", self.prefix)
    }

    /// The retry queue that holds a message of the default lane for `delay`.
    pub fn retry(&self, delay: Duration) -> String {
        self.retry_in(Lane::Default, delay)
    }

    /// The retry queue that holds a message of `lane` for `delay`; it
    /// dead-letters back into the lane's work queue.
    pub fn retry_in(&self, lane: Lane, delay: Duration) -> String {
        match lane {
            Lane::Default => format!("{}.retry.{}ms", self.prefix, delay.as_millis()),
            Lane::Bulk => format!("{}.retry.bulk.{}ms", self.prefix, delay.as_millis()),
        }
    }

    /// The retry queue that can hold a message for `delay`: the smallest
    /// tier at least as long as `delay` (the message then carries `delay` as
    /// its own expiration), or the longest tier when none is.
    pub fn retry_route(&self, lane: Lane, delay: Duration) -> Option<RetryRoute> {
        let tier = self.retry_delays.iter().find(|tier| **tier >= delay).or_else(|| self.retry_delays.last())?;
        Some(RetryRoute { queue: self.retry_in(lane, *tier), wait: delay.min(*tier), ttl: *tier })
    }

    /// The distinct retry delays, one retry queue each per lane, shortest first.
    pub fn retry_delays(&self) -> &[Duration] {
        &self.retry_delays
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_retry_queue_per_distinct_delay() {
        let topology = Topology::new("p", &"5s,5s,1m".parse().unwrap());
        assert_eq!(topology.retry_delays().len(), 2);
        assert_eq!(topology.retry(Duration::from_secs(5)), "p.retry.5000ms");
        assert_eq!(topology.deliveries(), "p.deliveries");
        let route = topology.retry_route(Lane::Default, Duration::from_secs(3)).unwrap();
        assert_eq!(
            (route.queue.as_str(), route.wait, route.ttl),
            ("p.retry.5000ms", Duration::from_secs(3), Duration::from_secs(5))
        );
        let route = topology.retry_route(Lane::Bulk, Duration::from_secs(600)).unwrap();
        assert_eq!((route.queue.as_str(), route.wait), ("p.retry.bulk.60000ms", Duration::from_secs(60)));
        assert_eq!(topology.work_queue(Lane::Bulk), "p.deliveries.bulk");
        assert_eq!(topology.queues().len(), 8);
        assert_eq!(topology.swept(), "p.deliveries.swept");
    }
}
