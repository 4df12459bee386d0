//! Public identifiers: a fixed prefix and 32 lowercase hex digits.

use rand::RngCore;

/// Prefix of webhook endpoint ids.
pub const ENDPOINT_PREFIX: &str = "wep_";
/// Prefix of event ids.
pub const EVENT_PREFIX: &str = "wh_";

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// A fresh endpoint id, `wep_` + 32 hex.
pub fn new_endpoint_id() -> String {
    format!("{ENDPOINT_PREFIX}{}", random_hex())
}

/// A fresh event id, `wh_` + 32 hex: the hex of a UUIDv7, so ids made later
/// sort later (its first 48 bits are the time in milliseconds, the rest
/// random and a counter within the millisecond). Indexes on event ids then
/// grow at one end instead of touching a random page per insert, which
/// matters once they outgrow memory.
pub fn new_event_id() -> String {
    new_event_id_at(crate::time::now())
}

/// The id of an event made at `at`.
pub fn new_event_id_at(at: chrono::DateTime<chrono::Utc>) -> String {
    format!("{EVENT_PREFIX}{}", new_v7_at(at).simple())
}

/// A fresh UUIDv7 whose time is now on the service's one clock
/// ([`crate::time::now`]), not the host's: ids made later on any process
/// sort later, and an id says when it was made (the history's partitions
/// are ranges of ids).
pub fn new_v7() -> uuid::Uuid {
    new_v7_at(crate::time::now())
}

/// A UUIDv7 whose time is `at`. Ids made by one process for the same or
/// later times sort in the order they were made; an id of a time before one
/// made already (a test's, a benchmark's history) is of that time still,
/// in no order among its millisecond's.
pub fn new_v7_at(at: chrono::DateTime<chrono::Utc>) -> uuid::Uuid {
    // The context orders ids within a millisecond, and never goes back in
    // time: given an earlier time, it would give the latest it saw.
    static LATEST: std::sync::Mutex<(uuid::ContextV7, i64)> = std::sync::Mutex::new((uuid::ContextV7::new(), i64::MIN));
    let seconds = u64::try_from(at.timestamp()).unwrap_or(0);
    let nanos = at.timestamp_subsec_nanos();
    let mut latest = LATEST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if at.timestamp_millis() < latest.1 {
        drop(latest);
        return uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, seconds, nanos));
    }
    latest.1 = at.timestamp_millis();
    uuid::Uuid::new_v7(uuid::Timestamp::from_unix(&latest.0, seconds, nanos))
}

/// The time a UUIDv7 was made at, to the millisecond; `None` for other
/// versions.
pub fn v7_time(id: &uuid::Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    let (seconds, nanos) = id.get_timestamp()?.to_unix();
    chrono::DateTime::from_timestamp(i64::try_from(seconds).ok()?, nanos)
}

/// Whether `id` has the shape `<prefix><32 lowercase hex>`; anything else cannot
/// name a stored object, so callers answer 404 without a query.
pub fn is_well_formed(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() == 32 && rest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ids_are_well_formed_and_distinct() {
        let a = new_endpoint_id();
        let b = new_endpoint_id();
        assert!(is_well_formed(&a, ENDPOINT_PREFIX), "{a}");
        assert_ne!(a, b);
        assert!(is_well_formed(&new_event_id(), EVENT_PREFIX));
    }

    #[test]
    fn event_ids_made_later_sort_later() {
        let ids: Vec<String> = (0..1000).map(|_| new_event_id()).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        assert!(ids.iter().all(|id| is_well_formed(id, EVENT_PREFIX)));
    }

    #[test]
    fn a_v7_id_says_when_it_was_made() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:04:05.123456Z").unwrap().to_utc();
        let id = new_v7_at(at);
        assert_eq!(id.get_version_num(), 7);
        assert_eq!(v7_time(&id).unwrap().timestamp_millis(), at.timestamp_millis());
        // Also after an id of a later time.
        let _ = new_v7();
        assert_eq!(v7_time(&new_v7_at(at)).unwrap().timestamp_millis(), at.timestamp_millis());
        let now = new_v7();
        assert!(new_v7() > now, "ids made later sort later");
        assert_eq!(v7_time(&uuid::Uuid::new_v4()), None);
    }

    #[test]
    fn odd_ids_are_refused() {
        for id in [
            "",
            "wep_",
            "wep_123",
            "WEP_00000000000000000000000000000000",
            "wep_0000000000000000000000000000000G",
            "wep_00000000000000000000000000000000a",
            "wh_00000000000000000000000000000000",
        ] {
            assert!(!is_well_formed(id, ENDPOINT_PREFIX), "{id}");
        }
    }
}
