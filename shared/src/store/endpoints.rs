//! Webhook endpoints and their lifecycle record. Every change is written with
//! its `endpoint_changes` row (and, in the distributed mode, its lifecycle
//! message) in one transaction.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    broker::ChangeKind,
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
    /// Sealed by [`crate::keys::KeyCipher`]; opened only to sign. Empty once
    /// the endpoint is deleted: nothing may sign for it again.
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

    /// Whether an event of `category` created at `created_at` is meant for
    /// this endpoint by its categories and its epoch (API.md §5 rules 1, 4).
    pub fn wants(&self, category: Option<Category>, created_at: DateTime<Utc>) -> bool {
        let in_categories = category.is_some_and(|c| crate::model::categories_include(&self.event_categories, c));
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

/// One recorded change: its kind and what it changed.
pub type ChangeDetail = (ChangeKind, serde_json::Value);

/// The named parts of a stored endpoint row (status, epoch, categories) as
/// domain values; a name neither backend writes means the row is corrupt.
pub(crate) fn parse_names<S: AsRef<str>>(
    id: &str,
    status: &str,
    event_epoch: &str,
    categories: &[S],
) -> Result<(EndpointStatus, EventEpoch, Vec<Category>), crate::store::StoreError> {
    let corrupt = |what: &str| crate::store::StoreError::Corrupt(format!("endpoint {id}: bad {what}"));
    Ok((
        status.parse().map_err(|()| corrupt("status"))?,
        event_epoch.parse().map_err(|()| corrupt("event_epoch"))?,
        categories.iter().map(|c| c.as_ref().parse().map_err(|()| corrupt("category"))).collect::<Result<_, _>>()?,
    ))
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
    if let Some(url) = update.url.filter(|url| !crate::net::same_url(url, &record.url)) {
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
    if let Some(status) = update.status.filter(|status| *status != record.status) {
        let kind = match status {
            EndpointStatus::Active => ChangeKind::Activated,
            EndpointStatus::Disabled => ChangeKind::Disabled,
            EndpointStatus::Deleted => ChangeKind::Deleted,
        };
        changes.push((kind, serde_json::json!({ "from": record.status, "to": status })));
        record.status = status;
    }
    if !changes.is_empty() {
        record.updated_at = crate::time::now();
    }
    Ok(changes)
}

/// The details recorded with a `created` change.
pub(crate) fn created_details(record: &EndpointRecord) -> serde_json::Value {
    serde_json::json!({ "url": record.url, "status": record.status })
}
