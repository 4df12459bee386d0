//! The kinds of change an endpoint goes through, as recorded and published.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The kinds of endpoint change recorded and published.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Activated,
    Disabled,
    UrlChanged,
    CategoriesChanged,
    Deleted,
    /// A fresh key pair of the same scheme; the old key overlaps.
    KeyRotated,
    /// A fresh key pair of another scheme; the old key overlaps.
    SchemeChanged,
    /// The service disabled the endpoint: its deliveries kept failing.
    AutoDisabled,
    /// `rate_limit_per_second` changed.
    RateLimitChanged,
    /// `ordering` changed.
    OrderingChanged,
}

/// A recorded change of an endpoint, as dispatchers hear of it (the lifecycle
/// message on `{p}.lifecycle`, or in-process in standalone mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointChanged {
    /// The id of the recorded change; grows with every change.
    pub change_id: i64,
    pub endpoint_id: String,
    pub developer_id: Uuid,
    pub change: ChangeKind,
    /// The key that made the change.
    pub api_key_id: Option<Uuid>,
    pub occurred_at: DateTime<Utc>,
}

impl ChangeKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_are_the_wire_names() {
        for kind in [ChangeKind::Created, ChangeKind::UrlChanged, ChangeKind::AutoDisabled, ChangeKind::OrderingChanged]
        {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
            assert_eq!(kind.as_str().parse::<ChangeKind>().unwrap(), kind);
        }
        assert_eq!(ChangeKind::UrlChanged.as_str(), "url_changed");
    }
}
