//! Webhook endpoints and their lifecycle record. Every change is written with
//! its `endpoint_changes` row and its lifecycle message in one transaction.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::{Store, outbox};
use crate::{
    broker::{ChangeKind, EndpointChanged, Envelope, Message},
    model::{Category, EndpointStatus, EventEpoch, Webhook},
};

/// An endpoint as stored, private key included (still sealed).
#[derive(Clone)]
pub struct EndpointRecord {
    pub id: String,
    pub developer_id: Uuid,
    pub url: String,
    pub status: EndpointStatus,
    pub event_epoch: EventEpoch,
    pub event_categories: Vec<Category>,
    pub public_key_pem: String,
    /// Sealed by [`crate::keys::KeyCipher`]; opened only to sign.
    pub private_key: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl std::fmt::Debug for EndpointRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointRecord")
            .field("id", &self.id)
            .field("developer_id", &self.developer_id)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl EndpointRecord {
    /// The public view of the endpoint.
    pub fn to_webhook(&self) -> Webhook {
        Webhook {
            id: self.id.clone(),
            url: self.url.clone(),
            status: self.status,
            public_key: self.public_key_pem.clone(),
            event_epoch: self.event_epoch,
            event_categories: self.event_categories.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    developer_id: Uuid,
    url: String,
    status: String,
    event_epoch: String,
    event_categories: Vec<String>,
    public_key_pem: String,
    private_key: Vec<u8>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<Row> for EndpointRecord {
    type Error = sqlx::Error;
    fn try_from(row: Row) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("endpoint {}: bad {what}", row.id).into());
        Ok(EndpointRecord {
            status: row.status.parse().map_err(|()| corrupt("status"))?,
            event_epoch: row.event_epoch.parse().map_err(|()| corrupt("event_epoch"))?,
            event_categories: row
                .event_categories
                .iter()
                .map(|c| c.parse().map_err(|()| corrupt("category")))
                .collect::<Result<_, _>>()?,
            id: row.id,
            developer_id: row.developer_id,
            url: row.url,
            public_key_pem: row.public_key_pem,
            private_key: row.private_key,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

const COLUMNS: &str =
    "id, developer_id, url, status, event_epoch, event_categories, public_key_pem, private_key, created_at, updated_at";

/// An endpoint about to be stored.
#[derive(Debug)]
pub struct NewEndpoint {
    pub id: String,
    pub developer_id: Uuid,
    pub url: String,
    pub event_epoch: EventEpoch,
    pub event_categories: Vec<Category>,
    pub public_key_pem: String,
    pub private_key: Vec<u8>,
}

/// What a PUT asks to change; `None` leaves a field alone.
#[derive(Debug, Default)]
pub struct EndpointUpdate {
    pub url: Option<String>,
    pub status: Option<EndpointStatus>,
    pub event_categories: Option<Vec<Category>>,
}

/// How an update ended.
#[derive(Debug)]
pub enum UpdateOutcome {
    Updated(EndpointRecord),
    NotFound,
    /// The url may change only while the endpoint is disabled.
    UrlChangeWhileActive,
}

/// Who made a change, for the lifecycle record.
#[derive(Debug, Clone, Copy)]
pub struct EndpointChange {
    pub api_key_id: Uuid,
}

fn category_names(categories: &[Category]) -> Vec<&'static str> {
    categories.iter().map(|c| c.as_str()).collect()
}

/// Sorted and without repeats, so equal sets compare equal.
fn normalised(mut categories: Vec<Category>) -> Vec<Category> {
    categories.sort();
    categories.dedup();
    categories
}

impl Store {
    async fn record_change(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        endpoint: &EndpointRecord,
        change: ChangeKind,
        by: EndpointChange,
        details: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        let at = crate::time::now();
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
        let message = Envelope::new(Message::EndpointChanged(EndpointChanged {
            change_id,
            endpoint_id: endpoint.id.clone(),
            developer_id: endpoint.developer_id,
            change,
            api_key_id: Some(by.api_key_id),
            occurred_at: at,
        }));
        outbox::enqueue(tx, &self.lifecycle_exchange, "", &message.to_bytes()).await
    }

    /// How many non-deleted endpoints the developer has.
    pub async fn count_endpoints(&self, developer_id: Uuid) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT count(*) FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'")
            .bind(developer_id)
            .fetch_one(&self.pool)
            .await
    }

    /// Stores a new endpoint unless the developer already has `limit`; `None`
    /// when the limit is reached. Concurrent creates of one developer are
    /// serialised by an advisory lock, so the limit holds under races.
    pub async fn create_endpoint(
        &self,
        new: NewEndpoint,
        limit: i64,
        by: EndpointChange,
    ) -> Result<Option<EndpointRecord>, sqlx::Error> {
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
        let now = crate::time::now();
        let row: Row = sqlx::query_as(&format!(
            "INSERT INTO endpoints (id, developer_id, url, status, event_epoch, event_categories, public_key_pem, private_key, created_at, updated_at)
             VALUES ($1, $2, $3, 'disabled', $4, $5, $6, $7, $8, $8)
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
        .fetch_one(&mut *tx)
        .await?;
        let record = EndpointRecord::try_from(row)?;
        let details = serde_json::json!({ "url": record.url, "status": record.status });
        self.record_change(&mut tx, &record, ChangeKind::Created, by, details).await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    /// The developer's non-deleted endpoints, newest first.
    pub async fn list_endpoints(&self, developer_id: Uuid) -> Result<Vec<EndpointRecord>, sqlx::Error> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE developer_id = $1 AND status <> 'deleted'
             ORDER BY created_at DESC, id DESC"
        ))
        .bind(developer_id)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(TryInto::try_into).collect()
    }

    /// The developer's endpoint `id`, unless it is deleted or someone else's.
    pub async fn get_endpoint(&self, developer_id: Uuid, id: &str) -> Result<Option<EndpointRecord>, sqlx::Error> {
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted'"
        ))
        .bind(id)
        .bind(developer_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(TryInto::try_into).transpose()
    }

    /// Endpoint `id` whatever its owner or status: what a dispatcher needs.
    pub async fn load_endpoint(&self, id: &str) -> Result<Option<EndpointRecord>, sqlx::Error> {
        let row: Option<Row> = sqlx::query_as(&format!("SELECT {COLUMNS} FROM endpoints WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(TryInto::try_into).transpose()
    }

    /// Applies `update` and records one lifecycle change per field that changed.
    pub async fn update_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        update: EndpointUpdate,
        by: EndpointChange,
    ) -> Result<UpdateOutcome, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM endpoints WHERE id = $1 AND developer_id = $2 AND status <> 'deleted' FOR UPDATE"
        ))
        .bind(id)
        .bind(developer_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(UpdateOutcome::NotFound) };
        let mut record = EndpointRecord::try_from(row)?;

        let mut changes = Vec::new();
        if let Some(url) = update.url.filter(|url| *url != record.url) {
            if record.status == EndpointStatus::Active {
                return Ok(UpdateOutcome::UrlChangeWhileActive);
            }
            changes.push((ChangeKind::UrlChanged, serde_json::json!({ "from": record.url, "to": url })));
            record.url = url;
        }
        if let Some(categories) = update.event_categories.map(normalised)
            && categories != normalised(record.event_categories.clone())
        {
            changes.push((
                ChangeKind::CategoriesChanged,
                serde_json::json!({ "from": record.event_categories, "to": categories }),
            ));
            record.event_categories = categories;
        }
        if let Some(status) = update.status.filter(|status| *status != record.status) {
            let kind = match status {
                EndpointStatus::Active => ChangeKind::Activated,
                EndpointStatus::Disabled => ChangeKind::Disabled,
                EndpointStatus::Deleted => ChangeKind::Deleted,
            };
            changes.push((kind, serde_json::json!({ "from": record.status, "to": status })));
            record.status = status;
        }
        if changes.is_empty() {
            return Ok(UpdateOutcome::Updated(record));
        }

        record.updated_at = crate::time::now();
        sqlx::query("UPDATE endpoints SET url = $2, status = $3, event_categories = $4, updated_at = $5 WHERE id = $1")
            .bind(&record.id)
            .bind(&record.url)
            .bind(record.status.as_str())
            .bind(category_names(&record.event_categories))
            .bind(record.updated_at)
            .execute(&mut *tx)
            .await?;
        for (kind, details) in changes {
            self.record_change(&mut tx, &record, kind, by, details).await?;
        }
        tx.commit().await?;
        Ok(UpdateOutcome::Updated(record))
    }

    /// Deletes the endpoint: it leaves every list, answers 404 from now on, and
    /// its upcoming deliveries are cancelled.
    pub async fn delete_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        by: EndpointChange,
    ) -> Result<Option<EndpointRecord>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let now = crate::time::now();
        let row: Option<Row> = sqlx::query_as(&format!(
            "UPDATE endpoints SET status = 'deleted', deleted_at = $3, updated_at = $3
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
             WHERE endpoint_id = $1 AND state IN ('held', 'pending', 'retrying')",
        )
        .bind(&record.id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        self.record_change(&mut tx, &record, ChangeKind::Deleted, by, serde_json::json!({})).await?;
        tx.commit().await?;
        Ok(Some(record))
    }
}
