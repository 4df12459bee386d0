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

/// `serialize_with` adapter for `DateTime<Utc>` fields.
pub fn serialize<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_milliseconds_and_z() {
        let at = DateTime::parse_from_rfc3339("2026-11-21T10:04:05.123456+00:00").unwrap().with_timezone(&Utc);
        assert_eq!(format(&at), "2026-11-21T10:04:05.123Z");
    }
}
