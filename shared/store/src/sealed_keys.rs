//! Endpoints' sealed private keys apart from the endpoints: read in pages
//! and sealed again by the operator's `keys reseal`, and grouped by how they
//! are sealed for the check delivery makes at start.
//!
//! The store does not open blobs. It knows only where a blob says how it is
//! sealed (its head: `webhooks_keys::SealedBy`), to group by it in SQL.

use std::collections::HashMap;

/// Which of an endpoint's stored private keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySlot {
    /// The key that signs.
    Current,
    /// The key a rotation replaced, while it overlaps.
    Previous,
}

/// The sealed private keys of one endpoint that is not deleted.
#[derive(Clone)]
pub struct SealedKeys {
    pub endpoint_id: String,
    pub current: Vec<u8>,
    pub previous: Option<Vec<u8>>,
}

impl std::fmt::Debug for SealedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedKeys").field("endpoint_id", &self.endpoint_id).finish_non_exhaustive()
    }
}

/// A stored private key sealed again. It is written only while the endpoint
/// is not deleted and still holds `sealed` in `slot` (compare and swap), so
/// a rotation, the end of an overlap or a delete that came in between is
/// neither lost nor undone.
#[derive(Clone)]
pub struct KeyReseal {
    pub endpoint_id: String,
    pub slot: KeySlot,
    /// The blob as read.
    pub sealed: Vec<u8>,
    /// The blob to write in its place.
    pub resealed: Vec<u8>,
}

impl std::fmt::Debug for KeyReseal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyReseal")
            .field("endpoint_id", &self.endpoint_id)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// The stored private keys (current and previous, of endpoints not deleted)
/// that share a head: a format byte and, for blobs that name their key, the
/// key id.
#[derive(Clone)]
pub struct SealedKeyGroup {
    /// What the blobs of the group start with.
    pub head: Vec<u8>,
    /// How many endpoints hold a key of the group.
    pub endpoints: u64,
    /// Blobs of the group to try to open, with their endpoint's id: those of
    /// the oldest and the newest endpoint (a blob of an endpoint changed
    /// since it was counted may be missing).
    pub samples: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for SealedKeyGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedKeyGroup")
            .field("head", &self.head)
            .field("endpoints", &self.endpoints)
            .field("samples", &self.samples.iter().map(|(id, _)| id).collect::<Vec<_>>())
            .finish()
    }
}

/// A group as counted by the grouping statement: head, endpoints, and the
/// ids of its oldest and newest endpoint.
pub(crate) type CountedGroup = (Vec<u8>, i64, String, String);

/// An endpoint's id and its current and previous sealed key.
pub(crate) type KeyRow = (String, Vec<u8>, Option<Vec<u8>>);

/// The ids whose keys the groups want as samples.
pub(crate) fn sample_ids(groups: &[CountedGroup]) -> Vec<String> {
    let mut ids: Vec<String> =
        groups.iter().flat_map(|(_, _, oldest, newest)| [oldest.clone(), newest.clone()]).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The groups with their samples: of each sample endpoint, the blob (current
/// or previous) that starts with the group's head.
pub(crate) fn with_samples(groups: Vec<CountedGroup>, rows: Vec<KeyRow>) -> Vec<SealedKeyGroup> {
    let rows: HashMap<String, (Vec<u8>, Option<Vec<u8>>)> =
        rows.into_iter().map(|(id, current, previous)| (id, (current, previous))).collect();
    groups
        .into_iter()
        .map(|(head, endpoints, oldest, newest)| {
            let mut samples = Vec::with_capacity(2);
            for id in [oldest, newest] {
                if samples.iter().any(|(seen, _)| *seen == id) {
                    continue;
                }
                let Some((current, previous)) = rows.get(&id) else { continue };
                let blob = std::iter::once(current).chain(previous).find(|blob| blob.starts_with(&head));
                if let Some(blob) = blob {
                    samples.push((id, blob.clone()));
                }
            }
            SealedKeyGroup { head, endpoints: u64::try_from(endpoints).unwrap_or(0), samples }
        })
        .collect()
}

/// The SQL expression of the head of blob column `blob` in the grouping
/// statements, with the named format byte bound as `$1` and its head's
/// length as `$2` ([`head_parameters`]). `substr` counts bytes of a blob,
/// from 1, on both backends.
pub(crate) fn sql_head(blob: &str) -> String {
    format!("CASE WHEN substr({blob}, 1, 1) = $1 THEN substr({blob}, 1, $2) ELSE substr({blob}, 1, 1) END")
}

/// The values of `$1` and `$2` in [`sql_head`].
pub(crate) fn head_parameters() -> (Vec<u8>, i32) {
    (vec![webhooks_keys::FORMAT_NAMED], i32::try_from(webhooks_keys::NAMED_HEAD_LEN).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_the_blobs_that_start_with_the_head() {
        let groups = vec![
            (vec![1], 2, "wep_a".to_owned(), "wep_b".to_owned()),
            (vec![2, 9], 1, "wep_b".to_owned(), "wep_b".to_owned()),
            (vec![0], 1, "wep_gone".to_owned(), "wep_gone".to_owned()),
        ];
        assert_eq!(sample_ids(&groups), ["wep_a", "wep_b", "wep_gone"]);
        let rows =
            vec![("wep_a".to_owned(), vec![1, 1, 1], None), ("wep_b".to_owned(), vec![2, 9, 9], Some(vec![1, 2, 2]))];
        let grouped = with_samples(groups, rows);
        let samples: Vec<Vec<(&str, &[u8])>> = grouped
            .iter()
            .map(|g| g.samples.iter().map(|(id, blob)| (id.as_str(), blob.as_slice())).collect())
            .collect();
        assert_eq!(samples[0], [("wep_a", &[1u8, 1, 1][..]), ("wep_b", &[1, 2, 2][..])]);
        assert_eq!(samples[1], [("wep_b", &[2u8, 9, 9][..])], "one sample when oldest and newest are one endpoint");
        assert!(samples[2].is_empty(), "an endpoint deleted since it was counted");
        assert_eq!(grouped[0].endpoints, 2);
    }
}
