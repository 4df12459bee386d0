//! Retention on SQLite: one batch per call (what goes and what stays:
//! `store/retention.rs`). Each part is one short write transaction on
//! the one writer, so ingest and delivery wait at most for one batch.

use chrono::{DateTime, Utc};

use super::{SqliteStore, json_list, micros};
use crate::{Purged, StoreResult};

impl SqliteStore {
    pub(crate) async fn purge_expired(&self, cutoff: DateTime<Utc>, limit: u32) -> StoreResult<Purged> {
        let (cutoff, limit) = (micros(cutoff), i64::from(limit));
        // Log entries by their own age, in one statement of its own.
        let logs = sqlx::query(
            "DELETE FROM delivery_attempts WHERE id IN (
                 SELECT id FROM delivery_attempts WHERE created_at < $1 ORDER BY created_at LIMIT $2)",
        )
        .bind(cutoff)
        .bind(limit)
        .execute(&self.writer)
        .await?
        .rows_affected();
        let mut purged = Purged { logs, ..Purged::default() };

        // Old events, with all they carry, in one transaction. It holds the
        // write lock from its first read, so no delivery of these events is
        // claimed or re-armed by `send` before they go; one that is pending or
        // retrying (claimed ones included) keeps its event until it settles.
        let mut tx = self.begin().await?;
        let doomed: Vec<String> = sqlx::query_scalar(
            "SELECT e.id FROM events e
              WHERE e.created_at < $1
                AND NOT EXISTS (SELECT 1 FROM deliveries d
                                 WHERE d.event_id = e.id AND d.state IN ('pending', 'retrying'))
              ORDER BY e.created_at LIMIT $2",
        )
        .bind(cutoff)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if doomed.is_empty() {
            return Ok(purged);
        }
        let doomed = json_list(doomed.iter().map(String::as_str).collect());
        purged.delivery_logs = sqlx::query(
            "DELETE FROM delivery_attempts WHERE delivery_id IN (
                 SELECT id FROM deliveries WHERE event_id IN (SELECT value FROM json_each($1)))",
        )
        .bind(&doomed)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        purged.deliveries = sqlx::query("DELETE FROM deliveries WHERE event_id IN (SELECT value FROM json_each($1))")
            .bind(&doomed)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        purged.events = sqlx::query("DELETE FROM events WHERE id IN (SELECT value FROM json_each($1))")
            .bind(&doomed)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use chrono::Duration;
    use uuid::Uuid;

    use super::*;
    use crate::{EndpointChange, EndpointUpdate, NewEndpoint, NewEvent};
    use webhooks_model::{Category, EndpointStatus, EventEpoch};

    /// A store on a directory of its own, removed when dropped.
    struct Scratch {
        dir: PathBuf,
        store: SqliteStore,
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    const BY: EndpointChange = EndpointChange { api_key_id: Some(Uuid::nil()) };

    async fn endpoint(store: &SqliteStore, developer_id: Uuid, status: EndpointStatus) -> String {
        let new = NewEndpoint {
            signature_scheme: webhooks_model::SignatureScheme::Platform,
            rate_limit_per_second: None,
            ordering: webhooks_model::DeliveryOrder::None,
            id: format!("wep_{}", Uuid::new_v4().simple()),
            developer_id,
            url: "https://receiver.example/hook".into(),
            event_epoch: EventEpoch::WebhookCreation,
            event_categories: Vec::new(),
            event_types: Vec::new(),
            public_key_pem: "public".into(),
            private_key: vec![0, 1, 2],
        };
        let id = store.create_endpoint(new, 100, BY).await.unwrap().expect("under the limit").id;
        if status != EndpointStatus::Disabled {
            let update = EndpointUpdate { status: Some(status), ..EndpointUpdate::default() };
            store.update_endpoint(developer_id, &id, update, BY).await.unwrap();
        }
        id
    }

    /// Ingests an event made at `created_at`; returns its id.
    async fn event_at(store: &SqliteStore, developer_id: Uuid, created_at: DateTime<Utc>) -> String {
        let id = format!("wh_{}", Uuid::new_v4().simple());
        let event = NewEvent {
            id: id.clone(),
            developer_id,
            category: Category::Customer,
            event_type: "customer.updated".into(),
            created_at,
            idempotency_key: None,
            request_hash: None,
            body_head: "{\"event_sequence\":".into(),
            body_tail: "}".into(),
            lane: webhooks_model::Lane::Default,
        };
        store.ingest_event(&event).await.unwrap();
        id
    }

    /// Sets the state of the event's delivery to `endpoint_id` and logs an
    /// attempt of it made at `at`, as a dispatcher's record would.
    async fn settle(store: &SqliteStore, event_id: &str, endpoint_id: &str, state: &str, at: DateTime<Utc>) {
        let delivery_id: i64 = sqlx::query_scalar(
            "UPDATE deliveries SET state = $3 WHERE event_id = $1 AND endpoint_id = $2 RETURNING id",
        )
        .bind(event_id)
        .bind(endpoint_id)
        .bind(state)
        .fetch_one(&store.writer)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, duration_ms, created_at)
             VALUES ($1, $2, $3, $4, 1, 200, 5, $5)",
        )
        .bind(Uuid::now_v7().hyphenated())
        .bind(delivery_id)
        .bind(endpoint_id)
        .bind(event_id)
        .bind(micros(at))
        .execute(&store.writer)
        .await
        .unwrap();
    }

    /// The ids of a table's rows, or of the events its rows belong to, sorted.
    async fn column(store: &SqliteStore, sql: &str) -> Vec<String> {
        let mut values: Vec<String> = sqlx::query_scalar(sql).fetch_all(&store.reader).await.unwrap();
        values.sort();
        values
    }

    #[tokio::test]
    async fn batches_delete_old_events_with_all_they_carry_and_keep_the_rest() {
        let dir = std::env::temp_dir().join(format!("webhooks-retention-test-{}", Uuid::new_v4().simple()));
        let scratch = Scratch { store: SqliteStore::open(&dir).await.unwrap(), dir };
        let store = &scratch.store;
        let developer = Uuid::new_v4();
        let active = endpoint(store, developer, EndpointStatus::Active).await;
        let disabled = endpoint(store, developer, EndpointStatus::Disabled).await;
        let now = webhooks_model::time::now();
        let days_ago = |days: i64| now - Duration::hours(24 * days) - Duration::minutes(1);

        // Delivered three days ago, and again (a `send`) just now.
        let delivered = event_at(store, developer, days_ago(3)).await;
        settle(store, &delivered, &active, "succeeded", days_ago(3)).await;
        settle(store, &delivered, &disabled, "succeeded", now).await;
        // Failed for good two days ago.
        let failed = event_at(store, developer, days_ago(2)).await;
        settle(store, &failed, &active, "failed", days_ago(2)).await;
        // Two days old and still being delivered: kept until it settles.
        let in_flight = event_at(store, developer, days_ago(2)).await;
        // New, with an old log entry (by its own age, it goes) and a new one.
        let new = event_at(store, developer, now).await;
        settle(store, &new, &active, "succeeded", days_ago(1) - Duration::hours(12)).await;
        settle(store, &new, &disabled, "succeeded", now).await;

        let cutoff = now - Duration::hours(24);
        let (mut purged, mut batches) = (Purged::default(), 0);
        loop {
            let batch = store.purge_expired(cutoff, 1).await.unwrap();
            purged.add(batch);
            batches += 1;
            if !batch.full(1) {
                break;
            }
        }
        // Full batches while either part finds one (three old logs, two old
        // settled events), then a short one.
        assert_eq!(batches, 4, "{purged:?}");
        assert_eq!((purged.events, purged.deliveries, purged.logs + purged.delivery_logs), (2, 4, 4), "{purged:?}");
        assert_eq!(purged.delivery_logs, 1, "the new log of an old event goes with it: {purged:?}");
        let mut kept = vec![in_flight.clone(), new.clone()];
        kept.sort();
        assert_eq!(column(store, "SELECT id FROM events").await, kept);
        let mut kept_deliveries = [kept.clone(), kept.clone()].concat();
        kept_deliveries.sort();
        assert_eq!(column(store, "SELECT event_id FROM deliveries").await, kept_deliveries);
        assert_eq!(column(store, "SELECT event_id FROM delivery_attempts").await, std::slice::from_ref(&new));
        // What retention never deletes: endpoints and their lifecycle record.
        assert_eq!(column(store, "SELECT count(*) || '' FROM endpoints").await, ["2"]);
        assert_eq!(column(store, "SELECT count(*) || '' FROM endpoint_changes").await, ["3"]);

        // Settled, the old event goes in the next sweep; nothing else does.
        sqlx::query("UPDATE deliveries SET state = 'failed' WHERE event_id = $1 AND state = 'pending'")
            .bind(&in_flight)
            .execute(&store.writer)
            .await
            .unwrap();
        let last = store.purge_expired(cutoff, 500).await.unwrap();
        assert_eq!(last, Purged { logs: 0, events: 1, deliveries: 2, delivery_logs: 0 });
        assert_eq!(column(store, "SELECT id FROM events").await, [new]);
        assert_eq!(store.purge_expired(cutoff, 500).await.unwrap(), Purged::default());
    }

    #[tokio::test]
    async fn sweeps_find_what_is_old_by_index() {
        let dir = std::env::temp_dir().join(format!("webhooks-retention-test-{}", Uuid::new_v4().simple()));
        let scratch = Scratch { store: SqliteStore::open(&dir).await.unwrap(), dir };
        let plan = async |sql: &str| -> String {
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                .bind(0_i64)
                .bind(1_i64)
                .fetch_all(&scratch.store.reader)
                .await
                .unwrap();
            rows.into_iter().map(|row| row.3).collect::<Vec<_>>().join("; ")
        };
        let logs = plan(
            "DELETE FROM delivery_attempts WHERE id IN (
                 SELECT id FROM delivery_attempts WHERE created_at < $1 ORDER BY created_at LIMIT $2)",
        )
        .await;
        assert!(logs.contains("delivery_attempts_by_age") && logs.contains("sqlite_autoindex"), "{logs}");
        let events = plan(
            "SELECT e.id FROM events e WHERE e.created_at < $1
                AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.id AND d.state IN ('pending', 'retrying'))
              ORDER BY e.created_at LIMIT $2",
        )
        .await;
        assert!(events.contains("events_by_age") && events.contains("deliveries_by_event"), "{events}");
        let attempts = plan("SELECT id FROM delivery_attempts WHERE delivery_id = $1 LIMIT $2").await;
        assert!(attempts.contains("delivery_attempts_by_delivery"), "{attempts}");
    }
}
