//! The event catalog on SQLite.

use super::{SqliteStore, micros, time};
use crate::{CatalogVersion, NewEventType, StoreResult, event_types::event_type_of};
use webhooks_model::EventType;

type Row = (String, String, String, String, String, bool, i64, i64);

const COLUMNS: &str = "name, category, description, schema, example, deprecated, created_at, updated_at";

fn from_row(
    (name, category, description, schema, example, deprecated, created, updated): Row,
) -> StoreResult<EventType> {
    event_type_of(name, &category, description, &schema, &example, deprecated, (time(created)?, time(updated)?))
}

impl SqliteStore {
    pub(crate) async fn list_event_types(&self) -> StoreResult<Vec<EventType>> {
        let rows: Vec<Row> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM event_types ORDER BY name")).fetch_all(&self.reader).await?;
        rows.into_iter().map(from_row).collect()
    }

    pub(crate) async fn catalog_version(&self) -> StoreResult<CatalogVersion> {
        let (count, last_change): (i64, Option<i64>) =
            sqlx::query_as("SELECT count(*), max(updated_at) FROM event_types").fetch_one(&self.reader).await?;
        Ok(CatalogVersion { count, last_change: last_change.map(time).transpose()? })
    }

    /// Inserts or replaces; `true` when the type is new. One writer, so the
    /// look and the write cannot be split by another.
    pub(crate) async fn put_event_type(&self, new: &NewEventType) -> StoreResult<(EventType, bool)> {
        let now = micros(webhooks_model::time::now());
        let mut tx = self.begin().await?;
        let previous: Option<i64> = sqlx::query_scalar("SELECT updated_at FROM event_types WHERE name = $1")
            .bind(&new.name)
            .fetch_optional(&mut *tx)
            .await?;
        // Every change moves `updated_at`, so a reader's version moves too.
        let updated = previous.map_or(now, |previous| now.max(previous + 1000));
        let row: Row = sqlx::query_as(&format!(
            "INSERT INTO event_types ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (name) DO UPDATE
                SET category = excluded.category, description = excluded.description, schema = excluded.schema,
                    example = excluded.example, deprecated = excluded.deprecated, updated_at = excluded.updated_at
             RETURNING {COLUMNS}"
        ))
        .bind(&new.name)
        .bind(new.category.as_str())
        .bind(&new.description)
        .bind(new.schema.to_string())
        .bind(new.example.to_string())
        .bind(new.deprecated)
        .bind(now)
        .bind(updated)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((from_row(row)?, previous.is_none()))
    }
}
