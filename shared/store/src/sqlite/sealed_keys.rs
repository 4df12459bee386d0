//! Endpoints' sealed private keys on SQLite (see `crate::sealed_keys`).

use super::SqliteStore;
use crate::sealed_keys::{CountedGroup, KeyRow, head_parameters, sample_ids, sql_head, with_samples};
use crate::{KeyReseal, KeySlot, SealedKeyGroup, SealedKeys, StoreResult};

impl SqliteStore {
    pub(crate) async fn sealed_keys(&self, after: &str, limit: i64) -> StoreResult<Vec<SealedKeys>> {
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT id, private_key, previous_private_key FROM endpoints
              WHERE status <> 'deleted' AND id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(endpoint_id, current, previous)| SealedKeys { endpoint_id, current, previous })
            .collect())
    }

    /// One write transaction: writes are serialised, so each comparison and
    /// its write see the row as no other writer can change it in between.
    pub(crate) async fn reseal_keys(&self, reseals: &[KeyReseal]) -> StoreResult<Vec<bool>> {
        let mut tx = self.begin().await?;
        let mut written = Vec::with_capacity(reseals.len());
        for reseal in reseals {
            let column = match reseal.slot {
                KeySlot::Current => "private_key",
                KeySlot::Previous => "previous_private_key",
            };
            let rows = sqlx::query(&format!(
                "UPDATE endpoints SET {column} = $3 WHERE id = $1 AND status <> 'deleted' AND {column} = $2"
            ))
            .bind(&reseal.endpoint_id)
            .bind(&reseal.sealed)
            .bind(&reseal.resealed)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            written.push(rows == 1);
        }
        tx.commit().await?;
        Ok(written)
    }

    pub(crate) async fn sealed_key_groups(&self) -> StoreResult<Vec<SealedKeyGroup>> {
        let (named, head_len) = head_parameters();
        // One pass over the table. `age` sorts as the creation time, then
        // the id (20 digits, then the id), so its minimum and maximum name
        // the oldest and newest endpoint of each group.
        let groups: Vec<CountedGroup> = sqlx::query_as(&format!(
            "WITH held AS (
                 SELECT id, created_at, private_key AS sealed FROM endpoints WHERE status <> 'deleted'
                 UNION ALL
                 SELECT id, created_at, previous_private_key FROM endpoints
                  WHERE status <> 'deleted' AND previous_private_key IS NOT NULL
             ), headed AS (
                 SELECT DISTINCT {head} AS head, printf('%020d', created_at) || id AS age FROM held
             )
             SELECT head, count(*), substr(min(age), 21), substr(max(age), 21) FROM headed GROUP BY head",
            head = sql_head("sealed"),
        ))
        .bind(named)
        .bind(head_len)
        .fetch_all(&self.reader)
        .await?;
        let ids = sample_ids(&groups);
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT id, private_key, previous_private_key FROM endpoints
              WHERE id IN (SELECT value FROM json_each($1)) AND status <> 'deleted'",
        )
        .bind(super::json_list(ids.iter().map(String::as_str).collect()))
        .fetch_all(&self.reader)
        .await?;
        Ok(with_samples(groups, rows))
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;
    use webhooks_model::{DeliveryOrder, EventEpoch, SignatureScheme};

    use super::*;
    use crate::{EndpointChange, EndpointUpdate, NewEndpoint, ReplacementKey, UpdateOutcome};

    const BY: EndpointChange = EndpointChange { api_key_id: None };

    /// A store on a directory of its own, removed when dropped.
    struct Scratch {
        dir: std::path::PathBuf,
        store: SqliteStore,
    }

    impl Scratch {
        async fn new() -> Scratch {
            let dir = std::env::temp_dir().join(format!("webhooks-sealed-keys-test-{}", Uuid::new_v4().simple()));
            let store = SqliteStore::open(&dir).await.expect("open store");
            Scratch { dir, store }
        }

        async fn endpoint(&self, developer_id: Uuid, private_key: Vec<u8>) -> String {
            let new = NewEndpoint {
                id: format!("wep_{}", Uuid::new_v4().simple()),
                developer_id,
                url: "https://receiver.example/hook".into(),
                event_epoch: EventEpoch::WebhookCreation,
                event_categories: Vec::new(),
                event_types: Vec::new(),
                public_key_pem: "public".into(),
                private_key,
                signature_scheme: SignatureScheme::Platform,
                rate_limit_per_second: None,
                ordering: DeliveryOrder::None,
            };
            self.store.create_endpoint(new, 100, BY).await.unwrap().expect("under the limit").id
        }

        async fn rotate(&self, developer_id: Uuid, id: &str, private_key: Vec<u8>) {
            let new_key = ReplacementKey {
                scheme: SignatureScheme::Platform,
                public_key: "rotated".into(),
                private_key,
                previous_expires_at: webhooks_model::time::now() + chrono::Duration::hours(1),
            };
            let update = EndpointUpdate { new_key: Some(new_key), ..EndpointUpdate::default() };
            let outcome = self.store.update_endpoint(developer_id, id, update, BY).await.unwrap();
            assert!(matches!(outcome, UpdateOutcome::Updated(_)), "{outcome:?}");
        }

        async fn keys(&self, id: &str) -> (Vec<u8>, Option<Vec<u8>>) {
            let record = self.store.load_endpoint(id).await.unwrap().expect("stored");
            (record.private_key, record.previous_key.map(|k| k.private_key))
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn named(id: u8, rest: u8) -> Vec<u8> {
        let mut blob = vec![webhooks_keys::FORMAT_NAMED];
        blob.extend([id; 8]);
        blob.extend([rest; 20]);
        blob
    }

    #[tokio::test]
    async fn keys_are_grouped_by_head_with_the_oldest_and_newest_as_samples() {
        let scratch = Scratch::new().await;
        let developer = Uuid::new_v4();
        let oldest = scratch.endpoint(developer, named(0xaa, 1)).await;
        let unnamed = scratch.endpoint(developer, vec![1, 9, 9, 9]).await;
        let middle = scratch.endpoint(developer, named(0xaa, 2)).await;
        let clear = scratch.endpoint(developer, vec![0, 5, 5]).await;
        let newest = scratch.endpoint(developer, named(0xaa, 3)).await;
        // The unnamed key becomes a previous one; its endpoint holds two heads.
        scratch.rotate(developer, &unnamed, named(0xbb, 4)).await;
        let gone = scratch.endpoint(developer, named(0xcc, 5)).await;
        scratch.store.delete_endpoint(developer, &gone, BY).await.unwrap().expect("deleted");

        let mut groups = scratch.store.sealed_key_groups().await.unwrap();
        groups.sort_by(|a, b| a.head.cmp(&b.head));
        let heads: Vec<(&[u8], u64)> = groups.iter().map(|g| (g.head.as_slice(), g.endpoints)).collect();
        assert_eq!(heads, [(&[0u8][..], 1), (&[1][..], 1), (&named(0xaa, 0)[..9], 3), (&named(0xbb, 0)[..9], 1)]);
        let samples =
            |i: usize| groups[i].samples.iter().map(|(id, blob)| (id.clone(), blob.clone())).collect::<Vec<_>>();
        assert_eq!(samples(0), [(clear, vec![0, 5, 5])]);
        assert_eq!(samples(1), [(unnamed.clone(), vec![1, 9, 9, 9])], "a previous key is sampled too");
        assert_eq!(samples(2), [(oldest, named(0xaa, 1)), (newest, named(0xaa, 3))]);
        assert_eq!(samples(3), [(unnamed, named(0xbb, 4))]);
        assert!(!format!("{groups:?}").contains(&middle));
    }

    #[tokio::test]
    async fn a_reseal_is_written_only_over_the_blob_it_was_made_from() {
        let scratch = Scratch::new().await;
        let developer = Uuid::new_v4();
        // Endpoint ids[n] holds key [1, n].
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(scratch.endpoint(developer, Vec::new()).await);
        }
        ids.sort();
        for (n, id) in (0u8..).zip(&ids) {
            sqlx::query("UPDATE endpoints SET private_key = $2 WHERE id = $1")
                .bind(id)
                .bind(vec![1, n])
                .execute(&scratch.store.writer)
                .await
                .unwrap();
        }
        scratch.rotate(developer, &ids[0], vec![1, 10]).await;

        let mut pages = Vec::new();
        let mut after = String::new();
        loop {
            let page = scratch.store.sealed_keys(&after, 2).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.endpoint_id.clone();
            pages.push(page);
        }
        assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        let read: Vec<SealedKeys> = pages.into_iter().flatten().collect();
        assert_eq!(read.iter().map(|k| k.endpoint_id.clone()).collect::<Vec<_>>(), ids);
        assert_eq!((read[0].current.clone(), read[0].previous.clone()), (vec![1, 10], Some(vec![1, 0])));

        // Between the read and the write: ids[1] rotates, ids[2] is deleted.
        scratch.rotate(developer, &ids[1], vec![1, 11]).await;
        scratch.store.delete_endpoint(developer, &ids[2], BY).await.unwrap().expect("deleted");
        let mut reseals = Vec::new();
        for keys in &read {
            let slots = [(KeySlot::Current, Some(&keys.current)), (KeySlot::Previous, keys.previous.as_ref())];
            for (slot, sealed) in slots {
                let Some(sealed) = sealed else { continue };
                let mut resealed = sealed.clone();
                resealed[0] = 2;
                let reseal =
                    KeyReseal { endpoint_id: keys.endpoint_id.clone(), slot, sealed: sealed.clone(), resealed };
                reseals.push(reseal);
            }
        }
        let written = scratch.store.reseal_keys(&reseals).await.unwrap();
        let written: Vec<(&str, KeySlot)> =
            reseals.iter().zip(written).filter(|(_, w)| *w).map(|(r, _)| (r.endpoint_id.as_str(), r.slot)).collect();
        let expected = [
            (ids[0].as_str(), KeySlot::Current),
            (ids[0].as_str(), KeySlot::Previous),
            (ids[3].as_str(), KeySlot::Current),
            (ids[4].as_str(), KeySlot::Current),
        ];
        assert_eq!(written, expected, "not the rotated ids[1] nor the deleted ids[2]");
        assert_eq!(scratch.keys(&ids[0]).await, (vec![2, 10], Some(vec![2, 0])));
        assert_eq!(scratch.keys(&ids[1]).await, (vec![1, 11], Some(vec![1, 1])), "the rotation stands");
        assert_eq!(scratch.keys(&ids[2]).await, (Vec::new(), None), "the deleted key stays gone");
        assert_eq!(scratch.keys(&ids[3]).await, (vec![2, 3], None));
        let again = scratch.store.reseal_keys(&reseals).await.unwrap();
        assert!(again.iter().all(|w| !w), "a second run writes nothing");
    }
}
