//! Webhook endpoints and their lifecycle record. Every change is written with
//! its `endpoint_changes` row (and, in the distributed mode, its lifecycle
//! message) in one transaction.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    StoreError,
    columns::{At, Id, Int, Names, optional},
};
use webhooks_model::{
    Category, ChangeKind, DeliveryOrder, DisabledReason, EndpointStatus, EventEpoch, Health, SignatureScheme, Webhook,
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
    /// The event types it is narrowed to; empty means every type.
    pub event_types: Vec<String>,
    /// The public key as the API shows it (PEM, or `whpk_…` for `standard`).
    pub public_key_pem: String,
    /// Sealed by `webhooks_keys::KeyCipher`; opened only to sign. Empty once
    /// the endpoint is deleted: nothing may sign for it again.
    pub private_key: Vec<u8>,
    pub signature_scheme: SignatureScheme,
    /// The key a rotation or scheme change replaced, while it overlaps.
    pub previous_key: Option<StoredKey>,
    pub disabled_reason: Option<DisabledReason>,
    pub health: Health,
    /// The most attempts per second, across every dispatcher.
    pub rate_limit_per_second: Option<u32>,
    pub ordering: DeliveryOrder,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A signing key as stored: its scheme, public half and sealed private half,
/// and for a replaced key, when it stops signing.
#[derive(Clone)]
pub struct StoredKey {
    pub scheme: SignatureScheme,
    pub public_key: String,
    pub private_key: Vec<u8>,
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredKey")
            .field("scheme", &self.scheme)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// A fresh key pair for an endpoint (rotation, scheme change): the current
/// key becomes the previous one until `previous_expires_at`.
#[derive(Clone)]
pub struct ReplacementKey {
    pub scheme: SignatureScheme,
    pub public_key: String,
    /// Sealed.
    pub private_key: Vec<u8>,
    pub previous_expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for ReplacementKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplacementKey").field("scheme", &self.scheme).finish_non_exhaustive()
    }
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
            signature_scheme: self.signature_scheme,
            previous_public_key: self.previous_key.as_ref().map(|k| k.public_key.clone()),
            previous_key_expires_at: self.previous_key.as_ref().map(|k| k.expires_at),
            disabled_reason: self.disabled_reason,
            health: self.health.clone(),
            rate_limit_per_second: self.rate_limit_per_second,
            ordering: self.ordering,
            event_epoch: self.event_epoch,
            event_categories: self.event_categories.clone(),
            event_types: self.event_types.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }

    /// Whether an event of `category` and `event_type` (`None`: stored
    /// before types were kept) created at `created_at` is meant for this
    /// endpoint by its categories, its types and its epoch (API.md §5 rules
    /// 1, 4, §8.9).
    pub fn wants(&self, category: Option<Category>, event_type: Option<&str>, created_at: DateTime<Utc>) -> bool {
        let in_categories = category.is_some_and(|c| webhooks_model::categories_include(&self.event_categories, c))
            && event_type.is_none_or(|t| webhooks_model::event_types_include(&self.event_types, t));
        let in_epoch = self.event_epoch == EventEpoch::BeginningOfTime || created_at >= self.created_at;
        in_categories && in_epoch
    }
}

/// An endpoint about to be stored.
#[derive(Debug)]
pub struct NewEndpoint {
    pub id: String,
    pub developer_id: Uuid,
    pub url: String,
    pub event_epoch: EventEpoch,
    pub event_categories: Vec<Category>,
    pub event_types: Vec<String>,
    pub public_key_pem: String,
    pub private_key: Vec<u8>,
    pub signature_scheme: SignatureScheme,
    pub rate_limit_per_second: Option<u32>,
    pub ordering: DeliveryOrder,
}

/// What a PUT (or a rotation) asks to change; `None` leaves a field alone.
#[derive(Debug, Default, Clone)]
pub struct EndpointUpdate {
    pub url: Option<String>,
    pub status: Option<EndpointStatus>,
    pub event_categories: Option<Vec<Category>>,
    pub event_types: Option<Vec<String>>,
    /// A new key pair: a rotation (same scheme) or a scheme change.
    pub new_key: Option<ReplacementKey>,
    /// `Some(None)` removes the limit.
    pub rate_limit_per_second: Option<Option<u32>>,
    pub ordering: Option<DeliveryOrder>,
}

/// How an update ended.
#[derive(Debug)]
pub enum UpdateOutcome {
    Updated(Box<EndpointRecord>),
    NotFound,
    /// The url may change only while the endpoint is disabled.
    UrlChangeWhileActive,
}

/// Who made a change, for the lifecycle record: a key, or the service itself
/// (`None`: an automatic disable).
#[derive(Debug, Clone, Copy)]
pub struct EndpointChange {
    pub api_key_id: Option<Uuid>,
}

impl EndpointChange {
    /// A change made with the API key `id`.
    pub fn by_key(id: Uuid) -> EndpointChange {
        EndpointChange { api_key_id: Some(id) }
    }
}

/// One recorded change: its kind and what it changed.
pub type ChangeDetail = (ChangeKind, serde_json::Value);

/// The columns of an endpoint row that both backends select.
pub(crate) const COLUMNS: &str =
    "id, developer_id, url, status, event_epoch, event_categories, event_types, public_key_pem, private_key,
     signature_scheme, previous_scheme, previous_public_key, previous_private_key, previous_key_expires_at,
     disabled_reason, rate_limit_per_second, ordering,
     (SELECT h.last_success_at FROM endpoint_health h WHERE h.endpoint_id = endpoints.id) AS last_success_at,
     (SELECT h.last_failure_at FROM endpoint_health h WHERE h.endpoint_id = endpoints.id) AS last_failure_at,
     (SELECT h.failing_since FROM endpoint_health h WHERE h.endpoint_id = endpoints.id) AS failing_since,
     created_at, updated_at";

/// An endpoint row as [`COLUMNS`] selects it, in either dialect.
#[derive(sqlx::FromRow)]
pub(crate) struct EndpointRow {
    id: String,
    developer_id: Id,
    url: String,
    status: String,
    event_epoch: String,
    event_categories: Names,
    event_types: Names,
    public_key_pem: String,
    private_key: Vec<u8>,
    signature_scheme: String,
    previous_scheme: Option<String>,
    previous_public_key: Option<String>,
    previous_private_key: Option<Vec<u8>>,
    previous_key_expires_at: Option<At>,
    disabled_reason: Option<String>,
    rate_limit_per_second: Option<Int>,
    ordering: String,
    last_success_at: Option<At>,
    last_failure_at: Option<At>,
    failing_since: Option<At>,
    created_at: At,
    updated_at: At,
}

impl TryFrom<EndpointRow> for EndpointRecord {
    type Error = StoreError;

    /// The row as the model has it; a name neither backend writes means the
    /// row is corrupt.
    fn try_from(row: EndpointRow) -> Result<EndpointRecord, StoreError> {
        let id = row.id;
        let corrupt = |what: &str| StoreError::Corrupt(format!("endpoint {id}: bad {what}"));
        let event_categories = (row.event_categories.0.iter())
            .map(|c| Category::intern(c).ok_or_else(|| corrupt("category")))
            .collect::<Result<_, _>>()?;
        let disabled_reason = match row.disabled_reason.as_deref() {
            None => None,
            Some("failing") => Some(DisabledReason::Failing),
            Some(_) => return Err(corrupt("disabled_reason")),
        };
        let rate_limit_per_second = (row.rate_limit_per_second)
            .map(|Int(limit)| u32::try_from(limit).map_err(|_| corrupt("rate_limit_per_second")))
            .transpose()?;
        let previous_key = match (
            row.previous_scheme,
            row.previous_public_key,
            row.previous_private_key,
            optional(row.previous_key_expires_at),
        ) {
            (Some(scheme), Some(public_key), Some(private_key), Some(expires_at)) => Some(StoredKey {
                scheme: scheme.parse().map_err(|_| corrupt("previous_scheme"))?,
                public_key,
                private_key,
                expires_at,
            }),
            _ => None,
        };
        Ok(EndpointRecord {
            status: row.status.parse().map_err(|_| corrupt("status"))?,
            event_epoch: row.event_epoch.parse().map_err(|_| corrupt("event_epoch"))?,
            event_categories,
            event_types: row.event_types.0,
            signature_scheme: row.signature_scheme.parse().map_err(|_| corrupt("signature_scheme"))?,
            previous_key,
            disabled_reason,
            rate_limit_per_second,
            ordering: row.ordering.parse().map_err(|_| corrupt("ordering"))?,
            health: Health {
                last_success_at: optional(row.last_success_at),
                last_failure_at: optional(row.last_failure_at),
                failing_since: optional(row.failing_since),
            },
            developer_id: row.developer_id.0,
            url: row.url,
            public_key_pem: row.public_key_pem,
            private_key: row.private_key,
            created_at: row.created_at.0,
            updated_at: row.updated_at.0,
            id,
        })
    }
}

/// The stored names of `categories`.
pub(crate) fn category_names(categories: &[Category]) -> Vec<&'static str> {
    categories.iter().map(|c| c.as_str()).collect()
}

/// Sorted and without repeats, so equal sets compare equal.
pub(crate) fn normalised(mut categories: Vec<Category>) -> Vec<Category> {
    categories.sort();
    categories.dedup();
    categories
}

/// Event type names sorted and without repeats, so equal sets compare equal.
pub(crate) fn normalised_types(mut event_types: Vec<String>) -> Vec<String> {
    event_types.sort();
    event_types.dedup();
    event_types
}

/// Why an update is refused: the url may change only while the endpoint is
/// disabled.
#[derive(Debug)]
pub(crate) struct UrlChangeWhileActive;

impl From<UrlChangeWhileActive> for UpdateOutcome {
    fn from(_: UrlChangeWhileActive) -> UpdateOutcome {
        UpdateOutcome::UrlChangeWhileActive
    }
}

/// Applies `update` to `record` and lists the changes to record, one per field
/// that changed; `Err` when the update is refused. Both backends run it inside
/// the transaction that holds the endpoint's row.
pub(crate) fn apply_update(
    record: &mut EndpointRecord,
    update: EndpointUpdate,
) -> Result<Vec<ChangeDetail>, UrlChangeWhileActive> {
    let mut changes = Vec::new();
    // Another spelling of the current url (host case, default port) is not
    // a change: it would refuse an active endpoint and record nothing real.
    if let Some(url) = update.url.filter(|url| !webhooks_model::same_url(url, &record.url)) {
        if record.status == EndpointStatus::Active {
            return Err(UrlChangeWhileActive);
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
    // Narrowing by type is a change of what the endpoint subscribes to, like
    // its categories; the details say which list changed.
    if let Some(event_types) = update.event_types.map(normalised_types)
        && event_types != record.event_types
    {
        changes.push((
            ChangeKind::CategoriesChanged,
            serde_json::json!({ "event_types": { "from": record.event_types, "to": event_types } }),
        ));
        record.event_types = event_types;
    }
    if let Some(status) = update.status.filter(|status| *status != record.status) {
        let kind = match status {
            EndpointStatus::Active => ChangeKind::Activated,
            EndpointStatus::Disabled => ChangeKind::Disabled,
            EndpointStatus::Deleted => ChangeKind::Deleted,
        };
        changes.push((kind, serde_json::json!({ "from": record.status, "to": status })));
        record.status = status;
        // The reason belongs to the service's disable; any change of status
        // by a developer clears it.
        record.disabled_reason = None;
    }
    if let Some(limit) = update.rate_limit_per_second.filter(|limit| *limit != record.rate_limit_per_second) {
        changes.push((
            ChangeKind::RateLimitChanged,
            serde_json::json!({ "from": record.rate_limit_per_second, "to": limit }),
        ));
        record.rate_limit_per_second = limit;
    }
    if let Some(ordering) = update.ordering.filter(|ordering| *ordering != record.ordering) {
        changes.push((ChangeKind::OrderingChanged, serde_json::json!({ "from": record.ordering, "to": ordering })));
        record.ordering = ordering;
    }
    if let Some(key) = update.new_key {
        let kind =
            if key.scheme == record.signature_scheme { ChangeKind::KeyRotated } else { ChangeKind::SchemeChanged };
        changes.push((
            kind,
            serde_json::json!({
                "from": record.signature_scheme,
                "to": key.scheme,
                "previous_key_expires_at": webhooks_model::time::format(&key.previous_expires_at),
            }),
        ));
        record.previous_key = Some(StoredKey {
            scheme: record.signature_scheme,
            public_key: std::mem::take(&mut record.public_key_pem),
            private_key: std::mem::take(&mut record.private_key),
            expires_at: key.previous_expires_at,
        });
        record.signature_scheme = key.scheme;
        record.public_key_pem = key.public_key;
        record.private_key = key.private_key;
    }
    if !changes.is_empty() {
        record.updated_at = webhooks_model::time::now();
    }
    Ok(changes)
}

/// Whether `changes` narrow the endpoint's categories to some (none means
/// every category): then its upcoming deliveries of other categories are
/// cancelled, no longer wanted.
pub(crate) fn narrows(changes: &[ChangeDetail]) -> bool {
    let narrowed = |list: &serde_json::Value| list.as_array().is_some_and(|to| !to.is_empty());
    changes.iter().any(|(kind, details)| {
        *kind == ChangeKind::CategoriesChanged && (narrowed(&details["to"]) || narrowed(&details["event_types"]["to"]))
    })
}

/// Whether `changes` end the endpoint's ordering: then every delivery
/// waiting for its turn goes at once.
pub(crate) fn unorders(changes: &[ChangeDetail]) -> bool {
    changes.iter().any(|(kind, details)| *kind == ChangeKind::OrderingChanged && details["to"] == "none")
}

/// The stored name of a disable reason.
pub(crate) fn reason_name(reason: Option<DisabledReason>) -> Option<&'static str> {
    reason.map(|DisabledReason::Failing| "failing")
}

/// The details recorded with a `created` change.
pub(crate) fn created_details(record: &EndpointRecord) -> serde_json::Value {
    serde_json::json!({ "url": record.url, "status": record.status })
}
