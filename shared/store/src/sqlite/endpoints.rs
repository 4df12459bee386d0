//! Webhook endpoints and their lifecycle record on SQLite. Every change is
//! written with its `endpoint_changes` row in one transaction, and announced
//! on [`SqliteStore::changes`] once committed.

use chrono::{DateTime, Utc};
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::{SqliteStore, ensure_developer, json_list, micros};
use crate::{
    EndpointChange, EndpointRecord, EndpointUpdate, NewEndpoint, StoreResult, UpdateOutcome,
    endpoints::{
        COLUMNS, EndpointRow, apply_update, category_names, created_details, narrows, normalised, normalised_types,
        reason_name,
    },
    health::FAILING_DAYS,
};
use webhooks_model::{ChangeKind, EndpointChanged};

/// Records a change inside the caller's transaction; returns the message to
/// announce once it commits.
async fn record_change(
    tx: &mut Transaction<'_, Sqlite>,
    endpoint: &EndpointRecord,
    change: ChangeKind,
    by: EndpointChange,
    details: serde_json::Value,
) -> StoreResult<EndpointChanged> {
    let at = webhooks_model::time::now();
    let change_id: i64 = sqlx::query_scalar(
        "INSERT INTO endpoint_changes (endpoint_id, developer_id, change, api_key_id, details, created_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(&endpoint.id)
    .bind(endpoint.developer_id.hyphenated())
    .bind(change.as_str())
    .bind(by.api_key_id.map(|id| id.hyphenated()))
    .bind(details.to_string())
    .bind(micros(at))
    .fetch_one(&mut **tx)
    .await?;
    Ok(EndpointChanged {
        change_id,
        endpoint_id: endpoint.id.clone(),
        developer_id: endpoint.developer_id,
        change,
        api_key_id: by.api_key_id,
        occurred_at: at,
    })
}

impl SqliteStore {
    pub(crate) async fn count_endpoints(&self, developer_id: Uuid) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'")
            .bind(developer_id.hyphenated())
            .fetch_one(&self.reader)
            .await?)
    }

    pub(crate) async fn create_endpoint(
        &self,
        new: NewEndpoint,
        limit: i64,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        // The transaction holds the write lock from its start, so the count
        // stays true until the insert commits.
        let mut tx = self.begin().await?;
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'")
                .bind(new.developer_id.hyphenated())
                .fetch_one(&mut *tx)
                .await?;
        if count >= limit {
            return Ok(None);
        }
        let now = webhooks_model::time::now();
        ensure_developer(&mut tx, new.developer_id, now).await?;
        let row: EndpointRow = sqlx::query_as(&format!(
            "INSERT INTO endpoints (id, developer_id, url, status, event_epoch, event_categories, public_key_pem, private_key,
                                    signature_scheme, rate_limit_per_second, ordering, created_at, updated_at,
                                    event_types)
             VALUES ($1, $2, $3, 'disabled', $4, $5, $6, $7, $9, $10, $11, $8, $8, $12)
             RETURNING {COLUMNS}"
        ))
        .bind(&new.id)
        .bind(new.developer_id.hyphenated())
        .bind(&new.url)
        .bind(new.event_epoch.as_str())
        .bind(json_list(category_names(&normalised(new.event_categories))))
        .bind(&new.public_key_pem)
        .bind(&new.private_key)
        .bind(micros(now))
        .bind(new.signature_scheme.as_str())
        .bind(new.rate_limit_per_second.map(i64::from))
        .bind(new.ordering.as_str())
        .bind(json_list(normalised_types(new.event_types).iter().map(String::as_str).collect()))
        .fetch_one(&mut *tx)
        .await?;
        let record = EndpointRecord::try_from(row)?;
        let details = created_details(&record);
        let change = record_change(&mut tx, &record, ChangeKind::Created, by, details).await?;
        tx.commit().await?;
        self.announce(vec![change]);
        Ok(Some(record))
    }

    pub(crate) async fn list_endpoints(&self, developer_id: Uuid) -> StoreResult<Vec<EndpointRecord>> {
        let rows: Vec<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'
             ORDER BY created_at DESC, id DESC"
        ))
        .bind(developer_id.hyphenated())
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    pub(crate) async fn get_endpoint(&self, developer_id: Uuid, id: &str) -> StoreResult<Option<EndpointRecord>> {
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'"
        ))
        .bind(id)
        .bind(developer_id.hyphenated())
        .fetch_optional(&self.reader)
        .await?;
        row.map(TryInto::try_into).transpose()
    }

    pub(crate) async fn load_endpoint(&self, id: &str) -> StoreResult<Option<EndpointRecord>> {
        let row: Option<EndpointRow> = sqlx::query_as(&format!("SELECT {COLUMNS} FROM endpoints WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reader)
            .await?;
        row.map(TryInto::try_into).transpose()
    }

    pub(crate) async fn update_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        update: EndpointUpdate,
        by: EndpointChange,
    ) -> StoreResult<UpdateOutcome> {
        let mut tx = self.begin().await?;
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'"
        ))
        .bind(id)
        .bind(developer_id.hyphenated())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(UpdateOutcome::NotFound) };
        let mut record = EndpointRecord::try_from(row)?;

        let changes = match apply_update(&mut record, update) {
            Ok(changes) => changes,
            Err(refused) => return Ok(refused.into()),
        };
        if changes.is_empty() {
            return Ok(UpdateOutcome::Updated(Box::new(record)));
        }
        let previous = record.previous_key.as_ref();
        sqlx::query(
            "UPDATE endpoints SET url = $2, status = $3, event_categories = $4, updated_at = $5, disabled_reason = $6,
                    public_key_pem = $7, private_key = $8, signature_scheme = $9, previous_scheme = $10,
                    previous_public_key = $11, previous_private_key = $12, previous_key_expires_at = $13,
                    rate_limit_per_second = $14, ordering = $15, event_types = $16
             WHERE id = $1",
        )
        .bind(&record.id)
        .bind(&record.url)
        .bind(record.status.as_str())
        .bind(json_list(category_names(&record.event_categories)))
        .bind(micros(record.updated_at))
        .bind(reason_name(record.disabled_reason))
        .bind(&record.public_key_pem)
        .bind(&record.private_key)
        .bind(record.signature_scheme.as_str())
        .bind(previous.map(|k| k.scheme.as_str()))
        .bind(previous.map(|k| &k.public_key))
        .bind(previous.map(|k| &k.private_key))
        .bind(previous.map(|k| micros(k.expires_at)))
        .bind(record.rate_limit_per_second.map(i64::from))
        .bind(record.ordering.as_str())
        .bind(json_list(record.event_types.iter().map(String::as_str).collect()))
        .execute(&mut *tx)
        .await?;
        if narrows(&changes) {
            sqlx::query(
                "UPDATE deliveries SET state = 'cancelled', updated_at = $3
                  WHERE endpoint_id = $1 AND state IN ('held', 'pending', 'retrying')
                    AND EXISTS (
                        SELECT 1 FROM events e WHERE e.id = deliveries.event_id
                           AND ((json_array_length($2) > 0
                                 AND e.category NOT IN (SELECT value FROM json_each($2)))
                             OR (json_array_length($4) > 0 AND e.event_type IS NOT NULL
                                 AND e.event_type NOT IN (SELECT value FROM json_each($4)))))",
            )
            .bind(&record.id)
            .bind(json_list(category_names(&record.event_categories)))
            .bind(micros(record.updated_at))
            .bind(json_list(record.event_types.iter().map(String::as_str).collect()))
            .execute(&mut *tx)
            .await?;
        }
        // Any change the developer makes restarts the failing streak.
        sqlx::query("UPDATE endpoint_health SET failing_since = NULL, failing_days = 0 WHERE endpoint_id = $1")
            .bind(&record.id)
            .execute(&mut *tx)
            .await?;
        record.health.failing_since = None;
        let mut announced = Vec::with_capacity(changes.len());
        for (kind, details) in changes {
            announced.push(record_change(&mut tx, &record, kind, by, details).await?);
        }
        tx.commit().await?;
        self.announce(announced);
        // A change of order or categories may let waiting deliveries go.
        self.work.notify_one();
        Ok(UpdateOutcome::Updated(Box::new(record)))
    }

    pub(crate) async fn delete_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        let mut tx = self.begin().await?;
        let now = micros(webhooks_model::time::now());
        // The private key goes at once: nothing signs for a deleted
        // endpoint again, and a key kept is a key that can leak.
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "UPDATE endpoints SET status = 'deleted', deleted_at = $3, updated_at = $3, private_key = X'',
                    previous_scheme = NULL, previous_public_key = NULL, previous_private_key = NULL,
                    previous_key_expires_at = NULL
             WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'
             RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(developer_id.hyphenated())
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let record = EndpointRecord::try_from(row)?;
        sqlx::query(
            "UPDATE deliveries SET state = 'cancelled', updated_at = $2
             WHERE endpoint_id = $1 AND state IN ('held', 'pending', 'retrying')",
        )
        .bind(&record.id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let change = record_change(&mut tx, &record, ChangeKind::Deleted, by, serde_json::json!({})).await?;
        tx.commit().await?;
        self.announce(vec![change]);
        Ok(Some(record))
    }

    pub(crate) async fn auto_disable_failing(
        &self,
        now: DateTime<Utc>,
        after: std::time::Duration,
    ) -> StoreResult<Vec<EndpointRecord>> {
        let cutoff = micros(now) - i64::try_from(after.as_micros()).unwrap_or(i64::MAX);
        let mut tx = self.begin().await?;
        let rows: Vec<EndpointRow> = sqlx::query_as(&format!(
            "UPDATE endpoints SET status = 'disabled', disabled_reason = 'failing', updated_at = $1
              WHERE status = 'active' AND id IN (
                    SELECT h.endpoint_id FROM endpoint_health h
                     WHERE h.failing_since <= $2 AND h.failing_days >= {FAILING_DAYS}
                       -- Not changed since the streak began (as on PostgreSQL).
                       AND endpoints.updated_at < h.failing_since)
              RETURNING {COLUMNS}"
        ))
        .bind(micros(now))
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await?;
        let mut announced = Vec::with_capacity(rows.len());
        let mut disabled = Vec::with_capacity(rows.len());
        for row in rows {
            let record = EndpointRecord::try_from(row)?;
            let details = serde_json::json!({ "from": "active", "to": "disabled", "reason": "failing" });
            let by = EndpointChange { api_key_id: None };
            announced.push(record_change(&mut tx, &record, ChangeKind::AutoDisabled, by, details).await?);
            disabled.push(record);
        }
        tx.commit().await?;
        self.announce(announced);
        Ok(disabled)
    }

    pub(crate) async fn purge_expired_keys(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        let purged = sqlx::query(
            "UPDATE endpoints SET previous_scheme = NULL, previous_public_key = NULL, previous_private_key = NULL,
                    previous_key_expires_at = NULL
              WHERE previous_key_expires_at <= $1 OR (status = 'deleted' AND previous_key_expires_at IS NOT NULL)",
        )
        .bind(micros(now))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(purged)
    }
}
