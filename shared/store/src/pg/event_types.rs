//! The event catalog on PostgreSQL.

use chrono::{DateTime, Utc};

use super::PgStore;
use crate::{CatalogVersion, NewEventType, StoreResult, event_types::event_type_of};
use webhooks_model::EventType;

type Row = (String, String, String, String, String, bool, DateTime<Utc>, DateTime<Utc>);

/// A row as an upsert returns it: the columns, and whether it was inserted.
type Inserted = (String, String, String, String, String, bool, DateTime<Utc>, DateTime<Utc>, bool);

const COLUMNS: &str = "name, category, description, schema, example, deprecated, created_at, updated_at";

fn from_row(
    (name, category, description, schema, example, deprecated, created, updated): Row,
) -> StoreResult<EventType> {
    event_type_of(name, &category, description, &schema, &example, deprecated, (created, updated))
}

impl PgStore {
    pub(crate) async fn list_event_types(&self) -> StoreResult<Vec<EventType>> {
        let rows: Vec<Row> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM event_types ORDER BY name")).fetch_all(&self.pool).await?;
        rows.into_iter().map(from_row).collect()
    }

    pub(crate) async fn catalog_version(&self) -> StoreResult<CatalogVersion> {
        let (count, last_change): (i64, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT count(*), max(updated_at) FROM event_types").fetch_one(&self.pool).await?;
        Ok(CatalogVersion { count, last_change })
    }

    /// Inserts or replaces; `true` when the type is new (`xmax = 0`: the row
    /// was inserted, not updated).
    ///
    /// Writers take turns (the table lock conflicts with itself, not with
    /// readers), and each change is stamped later than every stamp already
    /// there: so the catalog's version, `max(updated_at)` with the count,
    /// moves with every commit, in commit order, whatever the writers'
    /// clocks say, and no reader can have seen a later version without it.
    pub(crate) async fn put_event_type(&self, new: &NewEventType) -> StoreResult<(EventType, bool)> {
        let now = webhooks_model::time::now();
        let mut tx = self.pool.begin().await?;
        sqlx::query("LOCK TABLE event_types IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        let row: Inserted = sqlx::query_as(&format!(
            "INSERT INTO event_types ({COLUMNS})
             VALUES ($1, $2, $3, $4, $5, $6, $7,
                     greatest($7, (SELECT max(updated_at) + interval '1 millisecond' FROM event_types)))
             ON CONFLICT (name) DO UPDATE
                SET category = excluded.category, description = excluded.description, schema = excluded.schema,
                    example = excluded.example, deprecated = excluded.deprecated, updated_at = excluded.updated_at
             RETURNING {COLUMNS}, (xmax = 0)"
        ))
        .bind(&new.name)
        .bind(new.category.as_str())
        .bind(&new.description)
        .bind(new.schema.to_string())
        .bind(new.example.to_string())
        .bind(new.deprecated)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let (name, category, description, schema, example, deprecated, created, updated, inserted) = row;
        let stored = from_row((name, category, description, schema, example, deprecated, created, updated))?;
        Ok((stored, inserted))
    }
}
