//! Portal sessions on PostgreSQL.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::portal_sessions::{COLUMNS, PortalSessionRow};
use crate::{NewPortalSession, PortalSession, StoreResult};

impl PgStore {
    pub(crate) async fn create_portal_session(&self, session: NewPortalSession<'_>) -> StoreResult<PortalSession> {
        let scopes: Vec<&str> = session.scopes.iter().map(|s| s.as_str()).collect();
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO developers (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(session.developer_id)
            .execute(&mut *tx)
            .await?;
        // Sessions are few and short: the expired ones go as new ones come.
        sqlx::query("DELETE FROM portal_sessions WHERE expires_at <= $1")
            .bind(session.created_at)
            .execute(&mut *tx)
            .await?;
        let row: PortalSessionRow = sqlx::query_as(&format!(
            "INSERT INTO portal_sessions (id, developer_id, token_hash, scopes, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING {COLUMNS}"
        ))
        .bind(webhooks_model::ids::new_v7())
        .bind(session.developer_id)
        .bind(&session.token_hash)
        .bind(&scopes)
        .bind(session.created_at)
        .bind(session.expires_at)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.into())
    }

    pub(crate) async fn find_portal_session(&self, token_hash: &[u8]) -> StoreResult<Option<PortalSession>> {
        let row: Option<PortalSessionRow> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM portal_sessions WHERE token_hash = $1"))
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(Into::into))
    }

    pub(crate) async fn revoke_portal_session(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM portal_sessions WHERE id = $1 AND expires_at > $2")
            .bind(id)
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
