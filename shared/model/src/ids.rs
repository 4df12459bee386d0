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
    format!("{EVENT_PREFIX}{}", uuid::Uuid::now_v7().simple())
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
