//! Portal sessions: bearer tokens that open the dashboard for one developer,
//! stored by SHA-256 hash only (as API keys are, by [`crate::hash_key`]).

use chrono::{DateTime, Utc};
use uuid::Uuid;

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
