//! The pace of endpoints with a `rate_limit_per_second` (docs/architecture.md,
//! "Scheduling"): each attempt takes a ticket, numbered in order, and ticket
//! `k` starts at `anchor_at + (k - anchor_ticket) / rate`. A ticket whose
//! start is far off is waited for in a queue; when it comes back, its start
//! is computed again from the schedule as it is then.
//!
//! So the schedule can change under tickets already handed out: a 429 or 503
//! multiplies the `rate` by [`SLOW_FACTOR`] at once (at most once per
//! [`SLOW_GUARD`]: the answers to attempts already under way arrive
//! together) and pauses until the `Retry-After`, by moving the anchor to the
//! ticket due now, so every later ticket starts later; each ticket taken
//! raises the rate by [`RECOVERY_STEP`] per second, up to the limit, so it
//! grows back by about 5% a second.
//!
//! PostgreSQL keeps the schedule in one row per endpoint, shared by every
//! dispatcher, changed in one statement; standalone mode keeps it here, in
//! memory ([`Pacer`]), with the same rules.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use chrono::{DateTime, Utc};

/// What a 429 or 503 multiplies the pace by.
pub const SLOW_FACTOR: f64 = 0.7;
/// A 429 or 503 within this long of the last slowing does not slow again.
pub const SLOW_GUARD: Duration = Duration::from_secs(1);
/// What each ticket adds to the pace, in attempts per second.
pub const RECOVERY_STEP: f64 = 0.05;
/// The slowest pace, in attempts per second.
pub const SLOWEST: f64 = 1.0;

/// A ticket taken in an endpoint's pace, and when it starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ticket {
    pub number: i64,
    pub start: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// The next ticket to hand out.
    tickets: i64,
    anchor_ticket: f64,
    anchor_at: DateTime<Utc>,
    rate: f64,
    slowed_at: Option<DateTime<Utc>>,
    paused_until: Option<DateTime<Utc>>,
}

impl Schedule {
    fn start(&self, ticket: f64) -> DateTime<Utc> {
        self.anchor_at + seconds((ticket - self.anchor_ticket) / self.rate.max(SLOWEST))
    }
}

fn seconds(seconds: f64) -> chrono::Duration {
    chrono::Duration::microseconds((seconds * 1_000_000.0) as i64)
}

/// The pace of a single process's endpoints.
#[derive(Debug, Default)]
pub struct Pacer {
    schedules: Mutex<HashMap<String, Schedule>>,
}

impl Pacer {
    /// Takes the next ticket of `endpoint_id`, paced at most `limit` per
    /// second; it starts now or later.
    pub fn take(&self, endpoint_id: &str, limit: u32, now: DateTime<Utc>) -> Ticket {
        let limit = f64::from(limit);
        let mut schedules = self.lock();
        if schedules.len() > 10_000 {
            schedules.retain(|_, s| s.start(s.tickets as f64) > now);
        }
        let schedule = schedules.entry(endpoint_id.to_owned()).or_insert(Schedule {
            tickets: 0,
            anchor_ticket: 0.0,
            anchor_at: now,
            rate: limit,
            slowed_at: None,
            paused_until: None,
        });
        schedule.rate = schedule.rate.min(limit);
        let number = schedule.tickets;
        let start = schedule.start(number as f64).max(now);
        // Anchored at the new ticket, so a change of rate moves only later ones.
        schedule.anchor_ticket = number as f64;
        schedule.anchor_at = start;
        schedule.tickets += 1;
        schedule.rate = (schedule.rate + RECOVERY_STEP).min(limit);
        Ticket { number, start }
    }

    /// When ticket `number` of `endpoint_id` starts, by the schedule as it is
    /// now (`None`: the schedule is gone, or is a newer one that never handed
    /// out this ticket; it may start now).
    pub fn start_of(&self, endpoint_id: &str, number: i64) -> Option<DateTime<Utc>> {
        self.lock().get(endpoint_id).filter(|s| number < s.tickets).map(|s| s.start(number as f64))
    }

    /// A 429 or 503: slows the pace and pauses it until `paused_until` when
    /// the receiver asked for that (see the module).
    pub fn slow(&self, endpoint_id: &str, paused_until: Option<DateTime<Utc>>, now: DateTime<Utc>) {
        let mut schedules = self.lock();
        let Some(schedule) = schedules.get_mut(endpoint_id) else { return };
        let guard = chrono::Duration::from_std(SLOW_GUARD).unwrap_or_default();
        let slows = schedule.slowed_at.is_none_or(|at| at <= now - guard);
        if !slows && paused_until.is_none_or(|until| until <= now) {
            return;
        }
        // The ticket due now (or at the end of a pause under way: nothing
        // starts before it, so pauses never add up) becomes the anchor;
        // later tickets follow the new rate, from the end of the pause.
        let from = schedule.paused_until.map_or(now, |until| until.max(now));
        schedule.anchor_ticket +=
            (from - schedule.anchor_at).num_microseconds().unwrap_or(0) as f64 / 1e6 * schedule.rate.max(SLOWEST);
        schedule.anchor_at = from.max(paused_until.unwrap_or(from));
        schedule.paused_until = schedule.paused_until.max(paused_until);
        if slows {
            schedule.rate = (schedule.rate * SLOW_FACTOR).max(SLOWEST);
            schedule.slowed_at = Some(now);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Schedule>> {
        self.schedules.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
        (to - from).num_milliseconds()
    }

    #[test]
    fn tickets_are_spaced_by_the_limit_and_a_throttle_moves_those_handed_out() {
        let pacer = Pacer::default();
        let t0 = webhooks_model::time::now();
        let tickets: Vec<Ticket> = (0..4).map(|_| pacer.take("wep_a", 10, t0)).collect();
        // 10 per second: 100 ms apart; the step grows the pace only up to the limit.
        let starts: Vec<i64> = tickets.iter().map(|t| ms(t0, t.start)).collect();
        assert_eq!(starts, [0, 100, 200, 300]);
        assert_eq!(pacer.start_of("wep_a", 3), Some(tickets[3].start));
        // Another endpoint has its own schedule.
        assert_eq!(pacer.take("wep_b", 10, t0).start, t0);

        // 150 ms in, a 429 asking for a pause until 1 s: ticket 1 was due at
        // 100 ms and goes at once; ticket 2 now starts at 1 s plus half a
        // ticket at 7 per second, ticket 3 a seventh of a second later.
        let t150 = t0 + chrono::Duration::milliseconds(150);
        pacer.slow("wep_a", Some(t0 + chrono::Duration::seconds(1)), t150);
        // A second 429 at once does not slow again, nor does its pause add
        // to the first.
        pacer.slow("wep_a", Some(t0 + chrono::Duration::seconds(1)), t150);
        pacer.slow("wep_a", None, t150);
        let two = pacer.start_of("wep_a", 2).unwrap();
        assert_eq!(ms(t0, two), 1000 + 500 / 7);
        assert_eq!(ms(two, pacer.start_of("wep_a", 3).unwrap()), 1000 / 7);
        // A new ticket follows the last one handed out.
        let three = pacer.start_of("wep_a", 3).unwrap();
        let four = pacer.take("wep_a", 10, t150);
        assert_eq!(ms(three, four.start), 1000 / 7);
        // Each ticket adds RECOVERY_STEP until the pace is back at the limit.
        for _ in 0..200 {
            pacer.take("wep_a", 10, t150);
        }
        let (a, b) = (pacer.take("wep_a", 10, t150), pacer.take("wep_a", 10, t150));
        assert_eq!(ms(a.start, b.start), 100);
    }
}
