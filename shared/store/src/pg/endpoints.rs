//! Webhook endpoints and their lifecycle record on PostgreSQL. Every change is
//! written with its `endpoint_changes` row and its lifecycle message (outbox)
//! in one transaction.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::PgStore;
use crate::health::FAILING_DAYS;
use crate::{
    EndpointChange, EndpointRecord, EndpointUpdate, NewEndpoint, StoreResult, UpdateOutcome,
    endpoints::{
        COLUMNS, EndpointRow, apply_update, category_names, created_details, narrows, normalised, normalised_types,
        reason_name, unorders,
    },
};
use webhooks_model::ChangeKind;

impl PgStore {
    async fn record_change(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        endpoint: &EndpointRecord,
        change: ChangeKind,
        by: EndpointChange,
        details: serde_json::Value,
    ) -> StoreResult<()> {
        let at = webhooks_model::time::now();
        let (change_id,): (i64,) = sqlx::query_as(
            "INSERT INTO endpoint_changes (endpoint_id, developer_id, change, api_key_id, details, created_at)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(&endpoint.id)
        .bind(endpoint.developer_id)
        .bind(change.as_str())
        .bind(by.api_key_id)
        .bind(details)
        .bind(at)
        .fetch_one(&mut **tx)
        .await?;
        sqlx::query("INSERT INTO outbox (exchange, routing_key, change_id) VALUES ('', '', $1)")
            .bind(change_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    pub(crate) async fn count_endpoints(&self, developer_id: Uuid) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'")
            .bind(developer_id)
            .fetch_one(&self.pool)
            .await?)
    }

    pub(crate) async fn create_endpoint(
        &self,
        new: NewEndpoint,
        limit: i64,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))")
            .bind(new.developer_id)
            .execute(&mut *tx)
            .await?;
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'")
                .bind(new.developer_id)
                .fetch_one(&mut *tx)
                .await?;
        if count >= limit {
            return Ok(None);
        }
        sqlx::query("INSERT INTO developers (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(new.developer_id)
            .execute(&mut *tx)
            .await?;
        let now = webhooks_model::time::now();
        let row: EndpointRow = sqlx::query_as(&format!(
            "INSERT INTO endpoints (id, developer_id, url, status, event_epoch, event_categories, public_key_pem, private_key,
                                    signature_scheme, rate_limit_per_second, ordering, created_at, updated_at,
                                    event_types)
             VALUES ($1, $2, $3, 'disabled', $4, $5, $6, $7, $9, $10, $11, $8, $8, $12)
             RETURNING {COLUMNS}"
        ))
        .bind(&new.id)
        .bind(new.developer_id)
        .bind(&new.url)
        .bind(new.event_epoch.as_str())
        .bind(category_names(&normalised(new.event_categories)))
        .bind(&new.public_key_pem)
        .bind(&new.private_key)
        .bind(now)
        .bind(new.signature_scheme.as_str())
        .bind(new.rate_limit_per_second.and_then(|limit| i32::try_from(limit).ok()))
        .bind(new.ordering.as_str())
        .bind(normalised_types(new.event_types))
        .fetch_one(&mut *tx)
        .await?;
        let record = EndpointRecord::try_from(row)?;
        let details = created_details(&record);
        self.record_change(&mut tx, &record, ChangeKind::Created, by, details).await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    pub(crate) async fn list_endpoints(&self, developer_id: Uuid) -> StoreResult<Vec<EndpointRecord>> {
        let rows: Vec<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'
             ORDER BY created_at DESC, id DESC"
        ))
        .bind(developer_id)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    pub(crate) async fn get_endpoint(&self, developer_id: Uuid, id: &str) -> StoreResult<Option<EndpointRecord>> {
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'"
        ))
        .bind(id)
        .bind(developer_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(TryInto::try_into).transpose()
    }

    pub(crate) async fn load_endpoint(&self, id: &str) -> StoreResult<Option<EndpointRecord>> {
        let row: Option<EndpointRow> = sqlx::query_as(&format!("SELECT {COLUMNS} FROM endpoints WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(TryInto::try_into).transpose()
    }

    /// Updates an endpoint; a transaction PostgreSQL aborted to break a
    /// deadlock (with a recovery's batch or a dispatcher's writes to the same
    /// deliveries) is tried again.
    pub(crate) async fn update_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        update: EndpointUpdate,
        by: EndpointChange,
    ) -> StoreResult<UpdateOutcome> {
        super::retrying_deadlocks(|| self.update_endpoint_once(developer_id, id, update.clone(), by)).await
    }

    async fn update_endpoint_once(
        &self,
        developer_id: Uuid,
        id: &str,
        update: EndpointUpdate,
        by: EndpointChange,
    ) -> StoreResult<UpdateOutcome> {
        let mut tx = self.pool.begin().await?;
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted' FOR UPDATE"
        ))
        .bind(id)
        .bind(developer_id)
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
        .bind(category_names(&record.event_categories))
        .bind(record.updated_at)
        .bind(reason_name(record.disabled_reason))
        .bind(&record.public_key_pem)
        .bind(&record.private_key)
        .bind(record.signature_scheme.as_str())
        .bind(previous.map(|k| k.scheme.as_str()))
        .bind(previous.map(|k| &k.public_key))
        .bind(previous.map(|k| &k.private_key))
        .bind(previous.map(|k| k.expires_at))
        .bind(record.rate_limit_per_second.and_then(|limit| i32::try_from(limit).ok()))
        .bind(record.ordering.as_str())
        .bind(&record.event_types)
        .execute(&mut *tx)
        .await?;
        let releases = unorders(&changes) || narrows(&changes);
        if releases {
            super::turns::lock_turns(&mut tx, &[record.id.as_str()]).await?;
        }
        if narrows(&changes) {
            sqlx::query(
                "UPDATE deliveries d SET state = 'cancelled', updated_at = now()
                   FROM events e
                  WHERE d.endpoint_id = $1 AND e.id = d.event_id
                    AND d.state IN ('held', 'pending', 'retrying', 'waiting')
                    AND ((cardinality($2::text[]) > 0 AND NOT (e.category = ANY ($2)))
                      OR (cardinality($3::text[]) > 0 AND e.event_type IS NOT NULL
                          AND NOT (e.event_type = ANY ($3))))",
            )
            .bind(&record.id)
            .bind(category_names(&record.event_categories))
            .bind(&record.event_types)
            .execute(&mut *tx)
            .await?;
        }
        if releases {
            self.release_turns(&mut tx, std::slice::from_ref(&record.id), unorders(&changes)).await?;
        }
        // Any change the developer makes restarts the failing streak.
        sqlx::query("UPDATE endpoint_health SET failing_since = NULL, failing_days = 0 WHERE endpoint_id = $1")
            .bind(&record.id)
            .execute(&mut *tx)
            .await?;
        record.health.failing_since = None;
        for (kind, details) in changes {
            self.record_change(&mut tx, &record, kind, by, details).await?;
        }
        tx.commit().await?;
        Ok(UpdateOutcome::Updated(Box::new(record)))
    }

    /// Deletes an endpoint, tried again after a deadlock as an update is.
    pub(crate) async fn delete_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        super::retrying_deadlocks(|| self.delete_endpoint_once(developer_id, id, by)).await
    }

    async fn delete_endpoint_once(
        &self,
        developer_id: Uuid,
        id: &str,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        let mut tx = self.pool.begin().await?;
        let now = webhooks_model::time::now();
        // The private key goes at once: nothing signs for a deleted
        // endpoint again, and a key kept is a key that can leak.
        let row: Option<EndpointRow> = sqlx::query_as(&format!(
            "UPDATE endpoints SET status = 'deleted', deleted_at = $3, updated_at = $3, private_key = ''::bytea,
                    previous_scheme = NULL, previous_public_key = NULL, previous_private_key = NULL,
                    previous_key_expires_at = NULL
             WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'
             RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(developer_id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let record = EndpointRecord::try_from(row)?;
        sqlx::query(
            "UPDATE deliveries SET state = 'cancelled', updated_at = $2
             WHERE endpoint_id = $1 AND state IN ('held', 'pending', 'retrying', 'waiting')",
        )
        .bind(&record.id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        self.record_change(&mut tx, &record, ChangeKind::Deleted, by, serde_json::json!({})).await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    /// Disables every active endpoint whose deliveries have all failed since
    /// before `now - after`, on at least three days; returns them.
    pub(crate) async fn auto_disable_failing(
        &self,
        now: DateTime<Utc>,
        after: std::time::Duration,
    ) -> StoreResult<Vec<EndpointRecord>> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<EndpointRow> = sqlx::query_as(&format!(
            "UPDATE endpoints SET status = 'disabled', disabled_reason = 'failing', updated_at = $1
               FROM endpoint_health h
              WHERE h.endpoint_id = endpoints.id AND endpoints.status = 'active'
                AND h.failing_since <= $1 - make_interval(secs => $2) AND h.failing_days >= {FAILING_DAYS}
                -- Not changed since the streak began: an activation racing
                -- this statement (which resets the streak) wins.
                AND endpoints.updated_at < h.failing_since
              RETURNING {COLUMNS}"
        ))
        .bind(now)
        .bind(after.as_secs_f64())
        .fetch_all(&mut *tx)
        .await?;
        let mut disabled = Vec::with_capacity(rows.len());
        for row in rows {
            let record = EndpointRecord::try_from(row)?;
            let details = serde_json::json!({ "from": "active", "to": "disabled", "reason": "failing" });
            let by = EndpointChange { api_key_id: None };
            self.record_change(&mut tx, &record, ChangeKind::AutoDisabled, by, details).await?;
            disabled.push(record);
        }
        tx.commit().await?;
        Ok(disabled)
    }

    /// Deletes the replaced keys whose overlap ended by `now`; returns how many.
    pub(crate) async fn purge_expired_keys(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        Ok(sqlx::query(
            "UPDATE endpoints SET previous_scheme = NULL, previous_public_key = NULL, previous_private_key = NULL,
                    previous_key_expires_at = NULL
              WHERE previous_key_expires_at <= $1 OR (status = 'deleted' AND previous_key_expires_at IS NOT NULL)",
        )
        .bind(now)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }
}
