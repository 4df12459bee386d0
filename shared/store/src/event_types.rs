//! The event catalog (API.md §8.9): the kinds of events, kept in the database
//! so every process reads the same catalog and a change needs no restart.

use chrono::{DateTime, Utc};

use webhooks_model::{Category, EventType};

/// An event type as the operator gives it; the store keeps the times.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEventType {
    pub name: String,
    pub category: Category,
    pub description: String,
    pub schema: serde_json::Value,
    pub example: serde_json::Value,
    pub deprecated: bool,
}

impl NewEventType {
    /// Whether `stored` already says what this says (times aside).
    pub fn same_as(&self, stored: &EventType) -> bool {
        self.name == stored.name
            && self.category == stored.category
            && self.description == stored.description
            && self.schema == stored.schema
            && self.example == stored.example
            && self.deprecated == stored.deprecated
    }
}

/// How much of the catalog there is and when it last changed: a process
/// reloads its copy when this moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogVersion {
    pub count: i64,
    pub last_change: Option<DateTime<Utc>>,
}

/// A stored row as the domain type.
pub(crate) fn event_type_of(
    name: String,
    category: &str,
    description: String,
    schema: &str,
    example: &str,
    deprecated: bool,
    (created_at, updated_at): (DateTime<Utc>, DateTime<Utc>),
) -> crate::StoreResult<EventType> {
    let corrupt = |what: &str| crate::StoreError::Corrupt(format!("event type {name}: bad {what}"));
    Ok(EventType {
        category: Category::intern(category).ok_or_else(|| corrupt("category"))?,
        schema: serde_json::from_str(schema).map_err(|_| corrupt("schema"))?,
        example: serde_json::from_str(example).map_err(|_| corrupt("example"))?,
        name,
        description,
        deprecated,
        created_at,
        updated_at,
    })
}
