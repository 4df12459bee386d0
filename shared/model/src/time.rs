//! Timestamps as the contract writes them: RFC 3339, UTC, milliseconds, `Z`.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// Formats a timestamp the way every API response and event body does.
pub fn format(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The current time, truncated to the microseconds PostgreSQL keeps, so a value
/// written and read back compares equal.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
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
    fn formats_with_milliseconds_and_z() {
        let at = DateTime::parse_from_rfc3339("2026-11-21T10:04:05.123456+00:00").unwrap().with_timezone(&Utc);
        assert_eq!(format(&at), "2026-11-21T10:04:05.123Z");
    }
}
