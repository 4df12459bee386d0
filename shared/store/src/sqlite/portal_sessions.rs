//! Portal sessions on SQLite.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{SqliteStore, ensure_developer, json_list, micros};
use crate::portal_sessions::{COLUMNS, PortalSessionRow};
use crate::{NewPortalSession, PortalSession, StoreResult};

impl SqliteStore {
    pub(crate) async fn create_portal_session(&self, session: NewPortalSession<'_>) -> StoreResult<PortalSession> {
        let scopes = json_list(session.scopes.iter().map(|s| s.as_str()).collect());
        let mut tx = self.begin().await?;
        ensure_developer(&mut tx, session.developer_id, session.created_at).await?;
        // Sessions are few and short: the expired ones go as new ones come.
        sqlx::query("DELETE FROM portal_sessions WHERE expires_at <= $1")
            .bind(micros(session.created_at))
            .execute(&mut *tx)
            .await?;
        let row: PortalSessionRow = sqlx::query_as(&format!(
            "INSERT INTO portal_sessions (id, developer_id, token_hash, scopes, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING {COLUMNS}"
        ))
        .bind(webhooks_model::ids::new_v7().hyphenated())
        .bind(session.developer_id.hyphenated())
        .bind(&session.token_hash)
        .bind(scopes)
        .bind(micros(session.created_at))
        .bind(micros(session.expires_at))
        .fetch_one(&mut *tx)
        .await?;
        let stored = PortalSession::from(row);
        tx.commit().await?;
        Ok(stored)
    }

    pub(crate) async fn find_portal_session(&self, token_hash: &[u8]) -> StoreResult<Option<PortalSession>> {
        let row: Option<PortalSessionRow> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM portal_sessions WHERE token_hash = $1"))
                .bind(token_hash)
                .fetch_optional(&self.reader)
                .await?;
        Ok(row.map(Into::into))
    }

    pub(crate) async fn revoke_portal_session(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM portal_sessions WHERE id = $1 AND expires_at > $2")
            .bind(id.hyphenated())
            .bind(micros(now))
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
