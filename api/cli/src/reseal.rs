//! `webhooks-api keys reseal`: seals every stored endpoint private key, the
//! current and the previous one of every endpoint that is not deleted, with
//! the first key of `KEY_ENCRYPTION_KEY`. It is the step of a key rotation
//! between listing the new key first everywhere and removing the old one
//! (docs/operations.md, "Rotating the key-encryption key").
//!
//! It walks the endpoints in pages of `--batch` by id. Each key is opened
//! (a key that no configured key opens is reported and left as it was) and,
//! unless the first key sealed it already, sealed again and written only
//! where the row still holds the blob that was read: a rotation or a delete
//! of the same endpoint in between wins, and the keys it left are read and
//! tried again. So it runs safely beside the service, and again after
//! itself: a second run opens every key and writes none.

use anyhow::Context as _;
use serde::Serialize;
use webhooks_config::CommonConfig;
use webhooks_keys::{KeyCipher, Resealed, SealedBy};
use webhooks_model::EndpointStatus;
use webhooks_store::{KeyReseal, KeySlot, SealedKeys, Store};

/// How often keys that changed under a reseal are read and tried again.
const ROUNDS: usize = 3;

/// Most failures the summary lists; `failed` counts them all.
const LISTED_FAILURES: usize = 100;

/// What a run did, printed as JSON on stdout. Counts are of keys, except
/// `endpoints`.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// The id of the key that seals now: the first of `KEY_ENCRYPTION_KEY`.
    pub key_id: String,
    /// Endpoints (not deleted) walked.
    pub endpoints: u64,
    /// Keys sealed again with the first key.
    pub resealed: u64,
    /// Keys the first key had sealed already: opened, left as they were.
    pub skipped: u64,
    /// Keys that changed under every try (the endpoint kept rotating): what
    /// replaced them is not checked; run again.
    pub changed: u64,
    /// Keys no configured key opens: left as they were.
    pub failed: u64,
    /// The first of those.
    pub failures: Vec<Failure>,
}

impl Summary {
    /// Whether every stored key is now sealed with the first key.
    pub fn complete(&self) -> bool {
        self.failed == 0 && self.changed == 0
    }
}

/// A stored key that did not open.
#[derive(Debug, Serialize)]
pub struct Failure {
    pub endpoint_id: String,
    /// `current` or `previous`.
    pub key: &'static str,
    /// How the blob says it is sealed (`sealed with key id …`, `sealed
    /// without a key id`, …).
    pub sealed: String,
    pub reason: String,
}

/// A stored key as read: its endpoint, which of its keys, the blob.
type Held = (String, KeySlot, Vec<u8>);

/// Reseals every stored key of the store the operator's commands work on,
/// `batch` endpoints at a time; `progress` sees the summary after each batch.
pub async fn reseal(common: &CommonConfig, batch: i64, mut progress: impl FnMut(&Summary)) -> anyhow::Result<Summary> {
    let cipher = common.key_cipher().context("KEY_ENCRYPTION_KEY")?;
    let key_id = cipher
        .sealing_key()
        .context("keys reseal seals with the first key of KEY_ENCRYPTION_KEY, and KEY_ENCRYPTION_KEY is not set")?;
    let (store, _) = webhooks_store::open::for_command(common).await?;
    tracing::info!(%key_id, "sealing every stored endpoint key with the first key of KEY_ENCRYPTION_KEY");
    let mut summary = Summary { key_id: key_id.to_string(), ..Summary::default() };
    let mut after = String::new();
    loop {
        let page = store.sealed_keys(&after, batch).await.context("read stored endpoint keys")?;
        let Some(last) = page.last() else { break };
        after = last.endpoint_id.clone();
        summary.endpoints += page.len() as u64;
        let mut held: Vec<Held> = page.into_iter().flat_map(slots).collect();
        for round in 1..=ROUNDS {
            let reseals = plan(&cipher, held, &mut summary);
            if reseals.is_empty() {
                break;
            }
            let written = store.reseal_keys(&reseals).await.context("write resealed endpoint keys")?;
            summary.resealed += written.iter().filter(|written| **written).count() as u64;
            let lost: Vec<KeyReseal> =
                reseals.into_iter().zip(written).filter(|(_, written)| !written).map(|(reseal, _)| reseal).collect();
            if lost.is_empty() {
                break;
            }
            if round == ROUNDS {
                summary.changed += lost.len() as u64;
                break;
            }
            held = reread(&store, &lost).await?;
        }
        progress(&summary);
    }
    Ok(summary)
}

/// The keys of one endpoint as read.
fn slots(keys: SealedKeys) -> impl Iterator<Item = Held> {
    let SealedKeys { endpoint_id, current, previous } = keys;
    let previous = previous.map(|blob| (endpoint_id.clone(), KeySlot::Previous, blob));
    std::iter::once((endpoint_id, KeySlot::Current, current)).chain(previous)
}

/// What to do with each held key, decided without the store: counts the
/// keys skipped and those that do not open, and returns the reseals to
/// write.
fn plan(cipher: &KeyCipher, held: Vec<Held>, summary: &mut Summary) -> Vec<KeyReseal> {
    let mut reseals = Vec::new();
    for (endpoint_id, slot, sealed) in held {
        match cipher.reseal(&sealed, endpoint_id.as_bytes()) {
            Ok(Resealed::Current) => summary.skipped += 1,
            Ok(Resealed::Sealed(resealed)) => reseals.push(KeyReseal { endpoint_id, slot, sealed, resealed }),
            Err(error) => {
                summary.failed += 1;
                if summary.failures.len() < LISTED_FAILURES {
                    summary.failures.push(Failure {
                        endpoint_id,
                        key: match slot {
                            KeySlot::Current => "current",
                            KeySlot::Previous => "previous",
                        },
                        sealed: SealedBy::of(&sealed).to_string(),
                        reason: error.to_string(),
                    });
                }
            }
        }
    }
    reseals
}

/// The keys that now stand where reseals were not written: the endpoint
/// changed in between (rotated, its overlap ended, deleted).
async fn reread(store: &Store, lost: &[KeyReseal]) -> anyhow::Result<Vec<Held>> {
    let mut held = Vec::new();
    for reseal in lost {
        let record = store.load_endpoint(&reseal.endpoint_id).await.context("read a changed endpoint")?;
        let Some(record) = record.filter(|r| r.status != EndpointStatus::Deleted) else { continue };
        let blob = match reseal.slot {
            KeySlot::Current => Some(record.private_key),
            KeySlot::Previous => record.previous_key.map(|key| key.private_key),
        };
        held.extend(blob.map(|blob| (reseal.endpoint_id.clone(), reseal.slot, blob)));
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const NEW: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn the_plan_reseals_what_the_first_key_did_not_seal_and_lists_what_does_not_open() {
        let old = KeyCipher::new(Some(OLD)).unwrap();
        let rotated = KeyCipher::new(Some(&format!("{NEW},{OLD}"))).unwrap();
        let foreign = KeyCipher::new(Some("q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=")).unwrap();
        let held = vec![
            ("wep_a".to_owned(), KeySlot::Current, old.seal(b"a", b"wep_a").unwrap()),
            ("wep_a".to_owned(), KeySlot::Previous, KeyCipher::new(None).unwrap().seal(b"a0", b"wep_a").unwrap()),
            ("wep_b".to_owned(), KeySlot::Current, rotated.seal(b"b", b"wep_b").unwrap()),
            ("wep_c".to_owned(), KeySlot::Previous, foreign.seal(b"c", b"wep_c").unwrap()),
        ];
        let mut summary = Summary::default();
        let reseals = plan(&rotated, held, &mut summary);
        let planned: Vec<(&str, KeySlot)> = reseals.iter().map(|r| (r.endpoint_id.as_str(), r.slot)).collect();
        assert_eq!(planned, [("wep_a", KeySlot::Current), ("wep_a", KeySlot::Previous)]);
        let new = KeyCipher::new(Some(NEW)).unwrap();
        assert_eq!(new.open(&reseals[0].resealed, b"wep_a").unwrap(), b"a");
        assert_eq!(new.open(&reseals[1].resealed, b"wep_a").unwrap(), b"a0");
        assert_eq!((summary.skipped, summary.failed), (1, 1));
        let failure = &summary.failures[0];
        assert_eq!((failure.endpoint_id.as_str(), failure.key), ("wep_c", "previous"));
        assert!(failure.sealed.starts_with("sealed with key id "), "{failure:?}");
        assert!(!summary.complete());
    }
}
