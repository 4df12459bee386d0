//! The check delivery makes before it starts: the stored endpoint private
//! keys open with the configured `KEY_ENCRYPTION_KEY`, or nothing is
//! delivered. Without it, a dispatcher given the wrong keys would look
//! healthy while every attempt to an endpoint it cannot sign for failed.
//!
//! It stays cheap on a big table: one statement groups the stored keys
//! (current and previous, of endpoints not deleted) by how they are sealed,
//! read from each blob's head (its format and the key id it names), and one
//! or two blobs of each group are opened, those of its oldest and newest
//! endpoint. A group that names its key needs that key in the list. A group
//! sealed without a key id (by a release before key ids) is tried with every
//! key; since more than one key may have sealed it, both its oldest and its
//! newest blob must open. It checks samples, not every blob:
//! `webhooks-api keys reseal` opens every one.

use std::fmt::Write as _;

use anyhow::Context as _;
use webhooks_keys::{KeyCipher, KeyError, SealedBy};
use webhooks_store::{SealedKeyGroup, Store};

/// Refuses to deliver when a group of stored keys does not open with
/// `cipher`, naming how many endpoints hold such keys and the key ids they
/// need.
pub async fn check(store: &Store, cipher: &KeyCipher) -> anyhow::Result<()> {
    let groups = store.sealed_key_groups().await.context("read how the stored endpoint keys are sealed")?;
    if let Some(refusal) = refusal(cipher, &groups) {
        anyhow::bail!(refusal);
    }
    if !groups.is_empty() {
        tracing::info!(stored = %summary(&groups), "every kind of stored endpoint key opens with KEY_ENCRYPTION_KEY");
    }
    Ok(())
}

/// What was found, for the log: how many endpoints hold keys of each kind.
fn summary(groups: &[SealedKeyGroup]) -> String {
    let parts: Vec<String> =
        groups.iter().map(|group| format!("{} {}", endpoints(group.endpoints), SealedBy::of(&group.head))).collect();
    parts.join("; ")
}

/// `1 endpoint`, `2 endpoints`.
fn endpoints(n: u64) -> String {
    if n == 1 { "1 endpoint".to_owned() } else { format!("{n} endpoints") }
}

/// The message that stops delivery, when a sample of some group does not
/// open with `cipher`.
fn refusal(cipher: &KeyCipher, groups: &[SealedKeyGroup]) -> Option<String> {
    let mut failures = Vec::new();
    for group in groups {
        let sealed_by = SealedBy::of(&group.head);
        let failed =
            group.samples.iter().find_map(|(id, blob)| cipher.open(blob, id.as_bytes()).err().map(|e| (id, e)));
        let Some((endpoint_id, error)) = failed else { continue };
        let why = match (&error, sealed_by) {
            (KeyError::KeyRequired, _) => "and KEY_ENCRYPTION_KEY is not set".to_owned(),
            (KeyError::KeyNotConfigured(_), _) => "a key that KEY_ENCRYPTION_KEY does not hold".to_owned(),
            (KeyError::Decrypt, SealedBy::UnnamedKey) => "and no key of KEY_ENCRYPTION_KEY opens them".to_owned(),
            (KeyError::Decrypt, SealedBy::Key(_)) => {
                "but that key does not open them (the stored value was altered?)".to_owned()
            }
            (error, _) => format!("({error})"),
        };
        let held = if group.endpoints == 1 { "holds" } else { "hold" };
        failures.push(format!(
            "{} {held} keys {sealed_by}, {why} (one is endpoint {endpoint_id})",
            endpoints(group.endpoints)
        ));
    }
    if failures.is_empty() {
        return None;
    }
    let mut message = format!("KEY_ENCRYPTION_KEY cannot open stored endpoint private keys: {}. ", failures.join("; "));
    let ids: Vec<String> = cipher.key_ids().map(|id| id.to_string()).collect();
    if ids.is_empty() {
        message.push_str("No key is configured. ");
    } else {
        let _ = write!(message, "Configured key ids: {}. ", ids.join(", "));
    }
    message.push_str(
        "List every key that sealed stored keys in KEY_ENCRYPTION_KEY (the sealing key first), and remove an old \
         key only once `webhooks-api keys reseal` has sealed every stored key with the first",
    );
    Some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OLD_ID: &str = "630dcd2966c43366";
    const NEW: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const NEW_ID: &str = "297e3971a2ca15c1";
    const SECRET: &[u8] = b"a private key";

    fn cipher(setting: Option<&str>) -> KeyCipher {
        KeyCipher::new(setting).unwrap()
    }

    /// A group of `endpoints` whose samples are `blobs`, sealed for endpoints `wep_0`, `wep_1`, ….
    fn group(endpoints: u64, blobs: Vec<Vec<u8>>) -> SealedKeyGroup {
        let head = blobs[0][..match SealedBy::of(&blobs[0]) {
            SealedBy::Key(_) => webhooks_keys::NAMED_HEAD_LEN,
            _ => 1,
        }]
            .to_vec();
        let samples = blobs.into_iter().enumerate().map(|(n, blob)| (format!("wep_{n}"), blob)).collect();
        SealedKeyGroup { head, endpoints, samples }
    }

    fn sealed(setting: Option<&str>, endpoint: &str) -> Vec<u8> {
        cipher(setting).seal(SECRET, endpoint.as_bytes()).unwrap()
    }

    /// A blob of format 0x01 as releases before key ids wrote it: the same
    /// ciphertext as 0x02, without the key id.
    fn unnamed(setting: &str, endpoint: &str) -> Vec<u8> {
        let named = sealed(Some(setting), endpoint);
        [&[1u8][..], &named[webhooks_keys::NAMED_HEAD_LEN..]].concat()
    }

    #[test]
    fn keys_that_open_pass() {
        let groups = [
            group(3, vec![sealed(Some(OLD), "wep_0"), sealed(Some(OLD), "wep_1")]),
            group(1, vec![sealed(Some(NEW), "wep_0")]),
            group(2, vec![unnamed(OLD, "wep_0")]),
            group(1, vec![sealed(None, "wep_0")]),
        ];
        assert_eq!(refusal(&cipher(Some(&format!("{NEW},{OLD}"))), &groups), None);
        assert_eq!(
            summary(&groups),
            format!(
                "3 endpoints sealed with key id {OLD_ID}; 1 endpoint sealed with key id {NEW_ID}; 2 endpoints sealed \
                 without a key id; 1 endpoint stored in the clear"
            )
        );
        assert_eq!(refusal(&cipher(None), &groups[3..]), None, "clear keys need no key");
    }

    #[test]
    fn a_missing_key_is_named_by_its_id_with_how_many_endpoints_need_it() {
        let groups = [
            group(3, vec![sealed(Some(OLD), "wep_0"), sealed(Some(OLD), "wep_1")]),
            group(1, vec![sealed(Some(NEW), "wep_0")]),
            group(2, vec![unnamed(OLD, "wep_0")]),
        ];
        let message = refusal(&cipher(Some(NEW)), &groups).expect("refused");
        assert!(message.starts_with("KEY_ENCRYPTION_KEY cannot open stored endpoint private keys: "), "{message}");
        assert!(
            message.contains(&format!("3 endpoints hold keys sealed with key id {OLD_ID}, a key that")),
            "{message}"
        );
        assert!(message.contains("2 endpoints hold keys sealed without a key id, and no key"), "{message}");
        assert!(!message.contains(&format!("sealed with key id {NEW_ID}")), "{message}");
        assert!(message.contains(&format!("Configured key ids: {NEW_ID}.")), "{message}");
        assert!(message.contains("(one is endpoint wep_0)"), "{message}");
        assert!(!message.contains(OLD) && !message.contains(NEW), "no key in {message}");

        let message = refusal(&cipher(None), &groups[..1]).expect("refused");
        assert!(message.contains("and KEY_ENCRYPTION_KEY is not set") && message.contains("No key is configured"));
    }

    #[test]
    fn a_group_without_key_ids_must_open_at_both_ends() {
        // Sealed by two keys before key ids existed: the oldest by one, the newest by another.
        let mixed = group(2, vec![unnamed(OLD, "wep_0"), unnamed(NEW, "wep_1")]);
        let message = refusal(&cipher(Some(NEW)), std::slice::from_ref(&mixed)).expect("refused");
        assert!(message.contains("2 endpoints hold keys sealed without a key id"), "{message}");
        assert!(message.contains("(one is endpoint wep_0)"), "{message}");
        assert_eq!(refusal(&cipher(Some(&format!("{NEW},{OLD}"))), &[mixed]), None);
    }

    #[test]
    fn an_altered_key_of_a_configured_id_is_told_apart() {
        let mut blob = sealed(Some(OLD), "wep_0");
        *blob.last_mut().unwrap() ^= 1;
        let message = refusal(&cipher(Some(OLD)), &[group(1, vec![blob])]).expect("refused");
        assert!(message.contains(&format!("1 endpoint holds keys sealed with key id {OLD_ID}, but")), "{message}");
    }
}
