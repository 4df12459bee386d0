//! Portal sessions: bearer tokens that open the dashboard for one developer,
//! stored by SHA-256 hash only (as API keys are, by [`crate::hash_key`]).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::columns::{At, Id, Names};
use webhooks_model::Scope;

/// A session about to be stored. Times come from the caller's clock, so the
/// expiry a test moves past is the one the API checks.
#[derive(Debug)]
pub struct NewPortalSession<'a> {
    pub developer_id: Uuid,
    pub token_hash: Vec<u8>,
    pub scopes: &'a [Scope],
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// A stored session. It never holds the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalSession {
    pub id: Uuid,
    pub developer_id: Uuid,
    pub scopes: Vec<Scope>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl PortalSession {
    /// Whether the session still opens the API at `now`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }
}

/// The columns of a portal session row that both backends select.
pub(crate) const COLUMNS: &str = "id, developer_id, scopes, created_at, expires_at";

/// A portal session row as [`COLUMNS`] selects it, in either dialect.
#[derive(sqlx::FromRow)]
pub(crate) struct PortalSessionRow {
    id: Id,
    developer_id: Id,
    scopes: Names,
    created_at: At,
    expires_at: At,
}

impl From<PortalSessionRow> for PortalSession {
    fn from(row: PortalSessionRow) -> PortalSession {
        PortalSession {
            id: row.id.0,
            developer_id: row.developer_id.0,
            scopes: row.scopes.0.iter().filter_map(|s| s.parse().ok()).collect(),
            created_at: row.created_at.0,
            expires_at: row.expires_at.0,
        }
    }
}
