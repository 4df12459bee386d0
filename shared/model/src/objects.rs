//! The objects of the contract (API.md): what users see in responses and what
//! receivers get in deliveries.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// What an API key may do; `<resource>:<action>`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
    strum::VariantArray,
)]
pub enum Scope {
    /// Everything; only ever alone in a key's scope list.
    #[serde(rename = "platform:api_unrestricted")]
    #[strum(serialize = "platform:api_unrestricted")]
    Unrestricted,
    /// Read endpoints, events and logs.
    #[serde(rename = "webhooks:read")]
    #[strum(serialize = "webhooks:read")]
    WebhooksRead,
    /// Create, change, delete endpoints and send events.
    #[serde(rename = "webhooks:write")]
    #[strum(serialize = "webhooks:write")]
    WebhooksWrite,
    /// List API keys.
    #[serde(rename = "api_keys:read")]
    #[strum(serialize = "api_keys:read")]
    ApiKeysRead,
    /// Create and delete API keys.
    #[serde(rename = "api_keys:write")]
    #[strum(serialize = "api_keys:write")]
    ApiKeysWrite,
}

impl Scope {
    /// Every scope, in a stable order.
    pub const ALL: &'static [Scope] = <Scope as strum::VariantArray>::VARIANTS;

    /// The wire name, as stored and returned.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Whether a set of scopes grants `needed`.
pub fn scopes_grant(scopes: &[Scope], needed: Scope) -> bool {
    scopes.iter().any(|s| *s == Scope::Unrestricted || *s == needed)
}

/// How a key was made: through the API, or by the operator's command line.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::EnumString, strum::IntoStaticStr,
)]
pub enum ApiKeyType {
    /// Made through `POST /v0/api_keys`.
    Private,
    /// Made by `webhooks-api keys create`.
    Public,
}

/// Whether a key still works.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::EnumString, strum::IntoStaticStr,
)]
pub enum ApiKeyState {
    /// Accepted.
    Active,
    /// Refused from the moment it was deleted.
    Deleted,
}

/// Who owns a key. Only developers own keys in this service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum OwnerType {
    /// A developer on the platform.
    Developer,
}

/// An API key as every operation shows it: never the key itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    pub id: Uuid,
    #[serde(rename = "type")]
    pub kind: ApiKeyType,
    pub owner_type: OwnerType,
    pub owner_id: Uuid,
    /// `sk-test` or `sk-live`.
    #[schema(pattern = "^sk-(test|live)$")]
    pub prefix: String,
    /// The last four characters of the key.
    #[schema(min_length = 4, max_length = 4)]
    pub last_4: String,
    pub state: ApiKeyState,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: DateTime<Utc>,
    /// `["platform:api_unrestricted"]`, or one or more of the other scopes.
    #[schema(min_items = 1)]
    pub scopes: Vec<Scope>,
    /// Absent when the key has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 100)]
    pub name: Option<String>,
}

/// Where an endpoint is in its life.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum EndpointStatus {
    /// Receives deliveries.
    Active,
    /// Keeps its events as upcoming and receives nothing automatically.
    Disabled,
    /// Gone: answers 404 everywhere.
    Deleted,
}

impl EndpointStatus {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Which earlier events an endpoint may list and send.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    ToSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum EventEpoch {
    /// Only events created after the endpoint.
    #[default]
    WebhookCreation,
    /// Also the developer's events from before the endpoint existed.
    BeginningOfTime,
}

impl EventEpoch {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An event category: a name the event catalog defines (API.md §4, §8.9).
///
/// Categories are data, not code: a catalog may add one at any time. Each
/// name is interned once per process (the set is the operator's, so it is
/// small and bounded), which keeps `Category` a cheap `Copy` value. Parsing
/// and deserializing accept only names already known to the process (the
/// contract's and those of the catalog it loaded), so a request can never
/// grow the set; [`Category::intern`] is for trusted names (the catalog,
/// stored rows).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Category(&'static str);

// The contract's categories have constants, for code and tests that name one.
#[allow(non_upper_case_globals)]
impl Category {
    pub const Customer: Category = Category("customer");
    pub const KycLink: Category = Category("kyc_link");
    pub const Transfer: Category = Category("transfer");
    pub const ExternalAccount: Category = Category("external_account");
    pub const LiquidationAddress: Category = Category("liquidation_address");
    pub const LiquidationAddressDrain: Category = Category("liquidation_address.drain");
    pub const VirtualAccount: Category = Category("virtual_account");
    pub const VirtualAccountActivity: Category = Category("virtual_account.activity");
    pub const StaticMemoActivity: Category = Category("static_memo.activity");
    pub const PlatformWalletActivity: Category = Category("platform_wallet.activity");
    pub const CardAccount: Category = Category("card_account");
    pub const CardTransaction: Category = Category("card_transaction");
    pub const CardWithdrawal: Category = Category("card_withdrawal");
    pub const PostedCardAccountTransaction: Category = Category("posted_card_account_transaction");
}

impl Category {
    /// The categories of the contract (API.md §4), in its order; known to
    /// every process from the start.
    pub const CONTRACT: [Category; 14] = [
        Category::Customer,
        Category::KycLink,
        Category::Transfer,
        Category::ExternalAccount,
        Category::LiquidationAddress,
        Category::LiquidationAddressDrain,
        Category::VirtualAccount,
        Category::VirtualAccountActivity,
        Category::StaticMemoActivity,
        Category::PlatformWalletActivity,
        Category::CardAccount,
        Category::CardTransaction,
        Category::CardWithdrawal,
        Category::PostedCardAccountTransaction,
    ];

    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Whether `name` may name a category: 1 to 64 characters of lowercase
    /// ASCII letters, digits, `_` and `.`, starting with a letter.
    pub fn valid_name(name: &str) -> bool {
        (1..=64).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
    }

    /// The category named `name`, made known to this process if it was not:
    /// for trusted names only (the catalog, stored rows). `None` when the
    /// name is not of the right form.
    pub fn intern(name: &str) -> Option<Category> {
        if !Category::valid_name(name) {
            return None;
        }
        if let Some(known) = Category::known(name) {
            return Some(known);
        }
        let mut names = interned().write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(&known) = names.get(name) {
            return Some(Category(known));
        }
        // Leaked once per distinct name for the life of the process: the
        // names are the operator's, a bounded set.
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(name);
        Some(Category(name))
    }

    /// The category named `name` if this process knows it.
    pub fn known(name: &str) -> Option<Category> {
        let names = interned().read().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.get(name).copied().map(Category)
    }
}

fn interned() -> &'static std::sync::RwLock<std::collections::HashSet<&'static str>> {
    static NAMES: std::sync::OnceLock<std::sync::RwLock<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    NAMES.get_or_init(|| std::sync::RwLock::new(Category::CONTRACT.iter().map(|c| c.0).collect()))
}

impl fmt::Debug for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl FromStr for Category {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Category::known(s).ok_or(())
    }
}

impl Serialize for Category {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Category {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Category::known(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown category {name:?}")))
    }
}

impl utoipa::PartialSchema for Category {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("A category of the event catalog (`GET /v0/event_types`), such as `transfer`."))
            .examples([serde_json::json!("transfer")])
            .into()
    }
}

impl ToSchema for Category {}

/// How an endpoint's deliveries are signed (API.md §6, §8.4).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum SignatureScheme {
    /// RSA-2048, `X-Webhook-Signature: t=<ms>,v0=<base64>` (the original platform's).
    #[default]
    Platform,
    /// Standard Webhooks, asymmetric: Ed25519, `webhook-id`,
    /// `webhook-timestamp` (seconds) and `webhook-signature: v1a,<base64>`.
    Standard,
}

impl SignatureScheme {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Whether an endpoint's deliveries keep the order of their events (API.md
/// §8.5).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum DeliveryOrder {
    /// Each delivery goes as soon as it can (the default).
    #[default]
    None,
    /// In `event_sequence` order: an event is sent only once every earlier
    /// event meant for the endpoint has succeeded, failed for good, or was
    /// left held (the endpoint was disabled when it came).
    Ordered,
}

impl DeliveryOrder {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The bounds of `rate_limit_per_second`.
pub const RATE_LIMIT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;

/// How an endpoint's deliveries have been going (API.md §8.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// The last 2xx answer, or null.
    #[serde(serialize_with = "crate::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_success_at: Option<DateTime<Utc>>,
    /// The last failed attempt, or null.
    #[serde(serialize_with = "crate::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_failure_at: Option<DateTime<Utc>>,
    /// The first failure since the last success, or null while deliveries
    /// succeed.
    #[serde(serialize_with = "crate::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub failing_since: Option<DateTime<Utc>>,
}

/// A webhook endpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    /// `wep_` + 32 hex.
    #[schema(pattern = "^wep_[0-9a-f]{32}$")]
    pub id: String,
    /// Where deliveries go: an absolute `https` URL.
    #[schema(format = "uri")]
    pub url: String,
    pub status: EndpointStatus,
    /// The key that verifies this endpoint's deliveries: PEM
    /// SubjectPublicKeyInfo (RSA) for the `platform` scheme, `whpk_` and the
    /// base64 of the 32-byte Ed25519 key for `standard`.
    pub public_key: String,
    pub signature_scheme: SignatureScheme,
    /// After a rotation or a scheme change, until `previous_key_expires_at`:
    /// the key replaced, which still signs every delivery beside the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_public_key: Option<String>,
    /// When the previous key stops signing and its private half is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "crate::time::serialize_option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub previous_key_expires_at: Option<DateTime<Utc>>,
    /// `failing` when the service disabled the endpoint because its
    /// deliveries kept failing; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<DisabledReason>,
    pub health: Health,
    /// The most deliveries per second to this endpoint, across every
    /// dispatcher together; null for no limit of its own.
    #[schema(minimum = 1, maximum = 10000)]
    pub rate_limit_per_second: Option<u32>,
    /// `none` or `ordered` (deliveries in `event_sequence` order).
    pub ordering: DeliveryOrder,
    pub event_epoch: EventEpoch,
    /// Empty means every category.
    pub event_categories: Vec<Category>,
    /// Event types of the catalog the endpoint is narrowed to; empty means
    /// every type of its categories.
    #[serde(default)]
    pub event_types: Vec<String>,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: DateTime<Utc>,
}

/// Why the service (not a developer) disabled an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DisabledReason {
    /// Every delivery failed for `AUTO_DISABLE_AFTER`, on three days or more.
    Failing,
}

/// Whether an endpoint with these categories gets events of `category`.
pub fn categories_include(categories: &[Category], category: Category) -> bool {
    categories.is_empty() || categories.contains(&category)
}

/// An event: the exact body POSTed to receivers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "api_version": "v0",
    "event_id": "wh_4f1c2e0d9b8a7c6d5e4f3a2b1c0d9e8f",
    "event_developer_id": "0b7e2a54-8a0f-4f63-9d61-4f3c2f1e9a10",
    "event_category": "transfer",
    "event_type": "transfer.updated.status_transitioned",
    "event_sequence": 42,
    "event_object_id": "tr_123",
    "event_object_status": "payment_processed",
    "event_object": {"id": "tr_123", "amount": "100.00", "currency": "usdc", "state": "payment_processed"},
    "event_object_changes": {"state": ["pending", "payment_processed"]},
    "event_created_at": "2026-11-21T10:04:05.123Z"
}))]
pub struct Event {
    /// Always `v0`.
    pub api_version: String,
    /// `wh_` + 32 hex; receivers use it as their idempotency key.
    #[schema(pattern = "^wh_[0-9a-f]{32}$")]
    pub event_id: String,
    pub event_developer_id: Uuid,
    pub event_category: Category,
    pub event_type: String,
    /// Grows by one for each event of a developer.
    pub event_sequence: i64,
    pub event_object_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_object_status: Option<String>,
    #[schema(value_type = Object)]
    pub event_object: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub event_object_changes: Option<serde_json::Value>,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub event_created_at: DateTime<Utc>,
    /// `true` only on a test event (`POST /webhooks/{id}/test`): the type's
    /// example, sent once, stored nowhere; absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub test: bool,
}

/// A kind of event in the catalog (API.md §8.9): what producers may send
/// and what developers may subscribe to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "name": "transfer.updated.status_transitioned",
    "category": "transfer",
    "description": "A transfer moved to another state.",
    "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["id"]},
    "example": {"id": "tr_123", "state": "payment_processed"},
    "deprecated": false,
    "created_at": "2026-11-21T10:04:05.123Z",
    "updated_at": "2026-11-21T10:04:05.123Z"
}))]
pub struct EventType {
    /// The `event_type` of its events.
    pub name: String,
    pub category: Category,
    pub description: String,
    /// A JSON Schema (2020-12) that every `event_object` of this type satisfies.
    #[schema(value_type = Object)]
    pub schema: serde_json::Value,
    /// An `event_object` of this type; it satisfies `schema`.
    #[schema(value_type = Object)]
    pub example: serde_json::Value,
    /// Still accepted and delivered, but on its way out.
    pub deprecated: bool,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: DateTime<Utc>,
}

/// Whether `name` may name an event type: 1 to 128 characters of lowercase
/// ASCII letters, digits, `_`, `-` and `.`, starting with a letter.
pub fn valid_event_type_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether an endpoint narrowed to `event_types` (empty: every type of its
/// categories) gets events of type `event_type`.
pub fn event_types_include(event_types: &[String], event_type: &str) -> bool {
    event_types.is_empty() || event_types.iter().any(|t| t == event_type)
}

/// One delivery attempt, as `GET /webhooks/{id}/logs` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryLog {
    pub id: Uuid,
    pub event_id: String,
    /// The event's `event_type`, read with the log (null only for a log
    /// entry written before it was kept).
    #[serde(default)]
    pub event_type: Option<String>,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// The receiver's HTTP status, or null when no response came.
    pub status: Option<i32>,
    /// The first 4 KiB of the response body.
    pub response_body: Option<String>,
    /// `timeout`, `connect`, `tls`, `dns`, `blocked_address`, … or null.
    pub error: Option<String>,
    /// What failed, in a short sentence that is safe to show: the TLS or DNS
    /// reason, the timeout, the status line of a non-2xx answer. Never a
    /// secret, never a URL. Null when the attempt succeeded.
    #[serde(default)]
    #[schema(max_length = 300)]
    pub error_detail: Option<String>,
    pub duration_ms: i64,
    #[serde(serialize_with = "crate::time::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
}

impl DeliveryLog {
    /// Whether the attempt succeeded: a 2xx answer and no error.
    pub fn succeeded(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// A list answer: `{count, data, has_more}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct List<T> {
    /// How many items `data` holds.
    pub count: usize,
    pub data: Vec<T>,
    /// Whether the next page (by the list's cursor) has more.
    pub has_more: bool,
}

impl<T> From<Vec<T>> for List<T> {
    /// A whole list: nothing more to page.
    fn from(data: Vec<T>) -> Self {
        List { count: data.len(), data, has_more: false }
    }
}

impl<T> List<T> {
    /// A page of at most `limit` from `rows`, which were fetched with one row
    /// more than `limit` to tell whether there is more; the extra row is cut
    /// from the end, or from the start when `from_start` (a page read
    /// backwards, then flipped).
    pub fn page(mut rows: Vec<T>, limit: i64, from_start: bool) -> List<T> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let has_more = rows.len() > limit;
        if has_more {
            if from_start {
                rows.drain(..rows.len() - limit);
            } else {
                rows.truncate(limit);
            }
        }
        List { count: rows.len(), data: rows, has_more }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in Category::CONTRACT {
            assert_eq!(c.as_str().parse::<Category>(), Ok(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        for &s in Scope::ALL {
            assert_eq!(s.as_str().parse::<Scope>(), Ok(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn unrestricted_grants_everything_and_scopes_only_themselves() {
        assert!(scopes_grant(&[Scope::Unrestricted], Scope::ApiKeysWrite));
        assert!(scopes_grant(&[Scope::WebhooksRead], Scope::WebhooksRead));
        assert!(!scopes_grant(&[Scope::WebhooksRead], Scope::WebhooksWrite));
        assert!(!scopes_grant(&[], Scope::WebhooksRead));
    }

    #[test]
    fn a_page_cuts_the_extra_row_at_the_right_end() {
        let page = List::page(vec![1, 2, 3], 2, false);
        assert_eq!((page.data, page.has_more, page.count), (vec![1, 2], true, 2));
        let page = List::page(vec![1, 2, 3], 2, true);
        assert_eq!((page.data, page.has_more), (vec![2, 3], true));
        let page = List::page(vec![1, 2], 2, false);
        assert_eq!((page.data, page.has_more), (vec![1, 2], false));
    }

    #[test]
    fn empty_categories_mean_all() {
        assert!(categories_include(&[], Category::Transfer));
        assert!(categories_include(&[Category::Transfer], Category::Transfer));
        assert!(!categories_include(&[Category::Customer], Category::Transfer));
    }
}
