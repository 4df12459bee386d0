//! The per-developer request limit of the public API (API.md §2: 429
//! `rate_limited` with `Retry-After`).
//!
//! A generic cell rate limiter (governor) keyed by developer id: every key of
//! a developer draws on one allowance of `RATE_LIMIT_PER_SECOND` with bursts of
//! `RATE_LIMIT_BURST`. The state lives in this process, so each API instance
//! enforces the limit on what it serves. The same allowance, of
//! `FAIR_SHARE_PER_SECOND` events, picks the work queue of each event's
//! deliveries ([`RateLimit::lane`]).

use std::{
    num::NonZeroU32,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use governor::{DefaultKeyedRateLimiter, Quota, clock::Clock};
use uuid::Uuid;

/// How many checks pass between sweeps of developers idle long enough to be
/// back at a full allowance, which keeps the table as small as the set of
/// recently active developers.
const SWEEP_EVERY: u32 = 4096;

/// The limit, or `None` when `RATE_LIMIT_PER_SECOND` is 0.
#[derive(Debug)]
pub struct RateLimit {
    limiter: DefaultKeyedRateLimiter<Uuid>,
    checks: AtomicU32,
}

impl RateLimit {
    /// A limit of `per_second` sustained with bursts of `burst`; `None` when
    /// `per_second` is 0.
    pub fn new(per_second: u32, burst: u32) -> Option<RateLimit> {
        let quota = Quota::per_second(NonZeroU32::new(per_second)?).allow_burst(NonZeroU32::new(burst.max(1))?);
        Some(RateLimit { limiter: DefaultKeyedRateLimiter::keyed(quota), checks: AtomicU32::new(0) })
    }

    /// Takes one request from `developer`'s allowance, or tells how long to
    /// wait (at least a second, since `Retry-After` counts whole seconds).
    pub fn check(&self, developer: Uuid) -> Result<(), Duration> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        self.limiter.check_key(&developer).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.limiter.clock().now());
            Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(Duration::from_secs(1))
        })
    }
}

impl RateLimit {
    /// The lane of an event of `developer`, as a fair share: `default`
    /// within the allowance, `bulk` beyond it.
    pub fn lane(&self, developer: Uuid) -> webhooks_model::Lane {
        match self.check(developer) {
            Ok(()) => webhooks_model::Lane::Default,
            Err(_) => webhooks_model::Lane::Bulk,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_refused_per_developer() {
        let limit = RateLimit::new(1, 3).unwrap();
        let (one, other) = (Uuid::new_v4(), Uuid::new_v4());
        for _ in 0..3 {
            assert_eq!(limit.check(one), Ok(()));
        }
        let wait = limit.check(one).unwrap_err();
        assert_eq!(wait, Duration::from_secs(1), "one request per second comes back within a second");
        assert_eq!(limit.check(other), Ok(()), "another developer has its own allowance");
    }

    #[test]
    fn zero_switches_the_limit_off() {
        assert!(RateLimit::new(0, 10).is_none());
    }
}
