//! Timestamps as the contract writes them: RFC 3339, UTC, milliseconds, `Z`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// Formats a timestamp the way every API response and event body does.
pub fn format(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The current time on the service's one clock (DESIGN.md, "One clock"),
/// truncated to the microseconds PostgreSQL keeps, so a value written and
/// read back compares equal.
///
/// Until [`set_reference`] is called it is the host's clock; from then on it
/// is the reference (the database's clock) carried forward by the
/// monotonic clock, so a host clock that drifts or steps changes nothing
/// that is stamped with it.
pub fn now() -> DateTime<Utc> {
    let micros = ONE_CLOCK.now_micros();
    DateTime::from_timestamp_micros(micros).unwrap_or_else(Utc::now)
}

/// The host's own clock (its wall clock, moved by [`skew_host_clock`] in
/// tests): what [`now`] reads before a reference is set, and what the
/// offset gauge compares with the reference.
pub fn host_now() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::microseconds(ONE_CLOCK.skew_micros.load(Ordering::Relaxed))
}

/// Takes `reference` as the time it was at the monotonic instant `at`: from
/// then on [`now`] is `reference` plus the monotonic time since `at`.
/// Returns how far the host's clock is ahead of the reference (negative:
/// behind).
pub fn set_reference(reference: DateTime<Utc>, at: std::time::Instant) -> chrono::Duration {
    let host = host_now() - chrono::Duration::from_std(at.elapsed()).unwrap_or_default();
    let since_origin = i64::try_from(at.saturating_duration_since(ONE_CLOCK.origin()).as_micros()).unwrap_or(0);
    let before = ONE_CLOCK.now_micros();
    let offset = reference.timestamp_micros() - since_origin;
    ONE_CLOCK.offset_micros.store(offset, Ordering::Relaxed);
    ONE_CLOCK.referenced.store(true, Ordering::Relaxed);
    // A reference a little behind the time read so far (half a round trip)
    // waits for it; one far behind (the host clock was wrong until now) is
    // taken at once.
    let after = offset + i64::try_from(ONE_CLOCK.origin().elapsed().as_micros()).unwrap_or(0);
    if before - after > MAX_WAIT_MICROS {
        ONE_CLOCK.last_micros.store(i64::MIN, Ordering::Relaxed);
    }
    host - reference
}

/// How far behind the time read so far a new reference may be and still
/// make the clock wait for it rather than go back.
const MAX_WAIT_MICROS: i64 = 1_000_000;

/// Moves this process's host clock by `by` (negative: back), as a host whose
/// clock is wrong: for the tests of the one clock. Call it before anything
/// reads the time.
pub fn skew_host_clock(by: chrono::Duration) {
    ONE_CLOCK.skew_micros.store(by.num_microseconds().unwrap_or(0), Ordering::Relaxed);
    if !ONE_CLOCK.referenced.load(Ordering::Relaxed) {
        ONE_CLOCK.offset_micros.store(ONE_CLOCK.host_offset(), Ordering::Relaxed);
    }
}

/// The process's clock: an origin on the monotonic clock and the time it
/// stands for. A process-wide value, as the host's clock is.
struct OneClock {
    origin: std::sync::OnceLock<std::time::Instant>,
    /// Microseconds since the epoch at `origin`, on the reference once set.
    offset_micros: AtomicI64,
    /// Whether a reference was set.
    referenced: AtomicBool,
    /// The test skew of the host clock, in microseconds.
    skew_micros: AtomicI64,
    /// The latest time read.
    last_micros: AtomicI64,
}

/// Not set yet: the first read takes the host's clock.
const UNSET: i64 = i64::MIN;

static ONE_CLOCK: OneClock = OneClock {
    origin: std::sync::OnceLock::new(),
    offset_micros: AtomicI64::new(UNSET),
    referenced: AtomicBool::new(false),
    skew_micros: AtomicI64::new(0),
    last_micros: AtomicI64::new(i64::MIN),
};

impl OneClock {
    fn origin(&self) -> std::time::Instant {
        *self.origin.get_or_init(std::time::Instant::now)
    }

    /// The host's time at `origin`, in microseconds since the epoch.
    fn host_offset(&self) -> i64 {
        let elapsed = i64::try_from(self.origin().elapsed().as_micros()).unwrap_or(0);
        host_now().timestamp_micros() - elapsed
    }

    fn now_micros(&self) -> i64 {
        let mut offset = self.offset_micros.load(Ordering::Relaxed);
        if offset == UNSET {
            offset = self.host_offset();
            // Whoever comes first sets it; a reference set meanwhile wins.
            let _ = self.offset_micros.compare_exchange(UNSET, offset, Ordering::Relaxed, Ordering::Relaxed);
            offset = self.offset_micros.load(Ordering::Relaxed);
        }
        let micros = offset + i64::try_from(self.origin().elapsed().as_micros()).unwrap_or(0);
        // A new reference may be a little behind the one before (half a
        // round trip): time does not go back, it waits until it catches up.
        let last = self.last_micros.fetch_max(micros, Ordering::Relaxed);
        if last.saturating_sub(micros) > MAX_WAIT_MICROS {
            // Far ahead: read with the offset a reference just replaced
            // (the host clock was wrong until then), by a reader beside
            // `set_reference`. Taken back, as `set_reference` would.
            let _ = self.last_micros.compare_exchange(last, micros, Ordering::Relaxed, Ordering::Relaxed);
            return micros;
        }
        micros.max(last)
    }
}

/// The time as the service reads it for decisions that span days (endpoint
/// health): the system clock plus an offset that is zero in production and
/// that tests move forward, so days pass without waiting for them. Cheap to
/// clone; clones share the offset.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Clock {
    /// The current time by this clock, as [`now`] truncates it.
    pub fn now(&self) -> DateTime<Utc> {
        now() + chrono::Duration::milliseconds(self.offset_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Moves this clock (and its clones) `by` into the future.
    pub fn advance(&self, by: std::time::Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `serialize_with` adapter for `DateTime<Utc>` fields.
pub fn serialize<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(at))
}

/// `serialize_with` adapter for `Option<DateTime<Utc>>` fields (null when absent).
pub fn serialize_option<S: Serializer>(at: &Option<DateTime<Utc>>, serializer: S) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => serializer.serialize_str(&format(at)),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_moves_with_its_clones() {
        let clock = Clock::default();
        let twin = clock.clone();
        twin.advance(std::time::Duration::from_secs(86_400));
        assert!(clock.now() - now() > chrono::Duration::hours(23));
    }

    #[test]
    fn the_clock_follows_its_reference_not_the_host() {
        // One test only moves the process-wide clock, so tests running
        // beside it see a reference that is right to within a millisecond.
        let before = now();
        let reference = Utc::now();
        skew_host_clock(chrono::Duration::hours(1));
        let host_ahead = set_reference(reference, std::time::Instant::now());
        assert!((host_ahead - chrono::Duration::hours(1)).num_milliseconds().abs() < 100, "{host_ahead}");
        let after = now();
        assert!(after >= before, "the clock went back: {before} then {after}");
        assert!((after - Utc::now()).num_milliseconds().abs() < 100, "{after} is not the reference's time");
        assert!(host_now() - after > chrono::Duration::minutes(59));
        skew_host_clock(chrono::Duration::zero());
    }

    #[test]
    fn formats_with_milliseconds_and_z() {
        let at = DateTime::parse_from_rfc3339("2026-11-21T10:04:05.123456+00:00").unwrap().with_timezone(&Utc);
        assert_eq!(format(&at), "2026-11-21T10:04:05.123Z");
    }
}
