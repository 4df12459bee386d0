//! The event catalog (API.md §8.9): which event types exist, their category,
//! the JSON Schema of their `event_object` and an example.
//!
//! The catalog lives in the database, so every API process reads the same
//! one and `PUT /internal/event_types/{name}` needs no restart. Each process
//! keeps a copy with each type's schema compiled once; it reloads the copy
//! when the catalog's version (count and last change) moves: at once after
//! its own change, on a type or category it does not know, and every
//! [`REFRESH_INTERVAL`] otherwise. A reload compiles only the schemas that
//! changed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use anyhow::Context;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use webhooks_model::{Category, EventType};
use webhooks_store::{CatalogVersion, NewEventType, Store, StoreResult};

/// The catalog shipped with the service, used when `EVENT_CATALOG` is unset.
pub const DEFAULT_CATALOG: &str = include_str!("../catalog/default.json");

/// How often a process checks whether another changed the catalog.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The shortest time between two reloads caused by an unknown name, so a
/// producer that keeps sending an unknown type costs no query per event.
const MISS_RELOAD_INTERVAL: Duration = Duration::from_millis(50);

/// The longest error message ingest quotes from the schema check.
const MAX_DETAIL: usize = 300;

/// One type with its compiled schema.
#[derive(Debug)]
pub struct Entry {
    pub event_type: EventType,
    validator: jsonschema::Validator,
}

impl Entry {
    /// Checks `object` against the type's schema; the error names the JSON
    /// pointer of the first place at fault.
    pub fn check(&self, object: &serde_json::Value) -> Result<(), String> {
        let Err(error) = self.validator.validate(object) else { return Ok(()) };
        let pointer = error.instance_path().to_string();
        let mut detail = error.to_string();
        if detail.len() > MAX_DETAIL {
            let mut cut = MAX_DETAIL;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
            detail.push('…');
        }
        Err(format!("event_object does not match the schema of {} at \"{pointer}\": {detail}", self.event_type.name))
    }
}

#[derive(Debug, Default)]
struct Snapshot {
    version: Option<CatalogVersion>,
    types: BTreeMap<String, Arc<Entry>>,
    categories: BTreeSet<Category>,
}

/// The process's copy of the catalog. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Catalog {
    store: Store,
    /// Whether ingest refuses unknown types.
    pub strict: bool,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held while reloading, so concurrent reloads do the work once.
    reloading: tokio::sync::Mutex<()>,
    /// When a miss last caused a reload.
    last_miss: std::sync::Mutex<Option<Instant>>,
}

/// Why a type given by the operator is refused; the message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{message}")]
    Invalid { key: &'static str, message: String },
}

impl Refusal {
    fn invalid(key: &'static str, message: impl Into<String>) -> Refusal {
        Refusal::Invalid { key, message: message.into() }
    }
}

/// An event type as a catalog file or `PUT /internal/event_types/{name}`
/// gives it.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventTypeInput {
    /// A category name (1 to 64 of `a-z`, `0-9`, `_`, `.`); a new one is
    /// created with the type.
    pub category: String,
    /// 1 to 1000 characters.
    pub description: String,
    /// A JSON Schema (2020-12) of `event_object`; remote `$ref`s are not
    /// fetched.
    #[schema(value_type = Object)]
    pub schema: serde_json::Value,
    /// An `event_object` that satisfies `schema`.
    #[schema(value_type = Object)]
    pub example: serde_json::Value,
    #[serde(default)]
    pub deprecated: bool,
}

/// A catalog file: `{"event_types": [{"name": …, "category": …, …}]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    event_types: Vec<NamedInput>,
}

#[derive(Debug, Deserialize)]
struct NamedInput {
    name: String,
    #[serde(flatten)]
    input: EventTypeInput,
}

/// Checks a type given by the operator: its names, that its schema compiles
/// and that its example satisfies it.
pub fn check_input(name: &str, input: EventTypeInput) -> Result<NewEventType, Refusal> {
    if !webhooks_model::valid_event_type_name(name) {
        return Err(Refusal::invalid(
            "name",
            "the name must be 1 to 128 characters of a-z, 0-9, '_', '-' and '.', starting with a letter",
        ));
    }
    if !Category::valid_name(&input.category) {
        return Err(Refusal::invalid(
            "category",
            "category must be 1 to 64 characters of a-z, 0-9, '_' and '.', starting with a letter",
        ));
    }
    let description = input.description.trim();
    if description.is_empty() || description.chars().count() > 1000 {
        return Err(Refusal::invalid("description", "description must be 1 to 1000 characters"));
    }
    if !input.schema.is_object() {
        return Err(Refusal::invalid("schema", "schema must be a JSON Schema object"));
    }
    let validator = compile(&input.schema).map_err(|error| Refusal::invalid("schema", error))?;
    if !input.example.is_object() {
        return Err(Refusal::invalid("example", "example must be a JSON object (an event_object)"));
    }
    if let Err(error) = validator.validate(&input.example) {
        return Err(Refusal::invalid(
            "example",
            format!("example does not satisfy schema at \"{}\": {error}", error.instance_path()),
        ));
    }
    let category = Category::intern(&input.category).ok_or_else(|| Refusal::invalid("category", "bad category"))?;
    Ok(NewEventType {
        name: name.to_owned(),
        category,
        description: description.to_owned(),
        schema: input.schema,
        example: input.example,
        deprecated: input.deprecated,
    })
}

/// Compiles a schema as JSON Schema 2020-12 (the default when it names no
/// `$schema`), checking it against its meta-schema.
fn compile(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(schema)
        .map_err(|error| format!("schema is not a valid JSON Schema (2020-12): {error}"))
}

/// Reads a catalog file (or the default catalog) and checks every type in it.
pub fn parse_catalog(text: &str) -> anyhow::Result<Vec<NewEventType>> {
    let file: CatalogFile = serde_json::from_str(text).context("not a catalog: {\"event_types\": [...]}")?;
    let mut seen = BTreeSet::new();
    file.event_types
        .into_iter()
        .map(|named| {
            anyhow::ensure!(seen.insert(named.name.clone()), "event type {} is listed twice", named.name);
            check_input(&named.name, named.input)
                .map_err(|refusal| anyhow::anyhow!("event type {}: {refusal}", named.name))
        })
        .collect()
}

impl Catalog {
    /// Stores the types of `file` that the database does not already hold as
    /// given, and loads the catalog. Without a file, the shipped catalog
    /// only adds the types the database lacks: a type changed through
    /// `PUT /internal/event_types/{name}` stays as changed across restarts
    /// and upgrades. A file of the operator's is the catalog's source, and
    /// its types win.
    pub async fn open(store: Store, strict: bool, file: Option<&Path>) -> anyhow::Result<Catalog> {
        let text = match file {
            Some(path) => std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?,
            None => DEFAULT_CATALOG.to_owned(),
        };
        let types = parse_catalog(&text).with_context(|| match file {
            Some(path) => format!("EVENT_CATALOG {}", path.display()),
            None => "the default event catalog".to_owned(),
        })?;
        let stored: BTreeMap<String, EventType> =
            store.list_event_types().await?.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut written = 0;
        for new in &types {
            let keep = match stored.get(&new.name) {
                Some(old) => file.is_none() || new.same_as(old),
                None => false,
            };
            if !keep {
                store.put_event_type(new).await?;
                written += 1;
            }
        }
        tracing::info!(types = types.len(), written, "event catalog loaded");
        let catalog = Catalog {
            store,
            strict,
            snapshot: RwLock::default(),
            reloading: tokio::sync::Mutex::default(),
            last_miss: std::sync::Mutex::default(),
        };
        catalog.reload().await?;
        Ok(catalog)
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Reloads the copy if the stored catalog changed since it was made.
    pub async fn reload(&self) -> StoreResult<()> {
        let _reloading = self.reloading.lock().await;
        let version = self.store.catalog_version().await?;
        let current = self.snapshot();
        if current.version == Some(version) {
            return Ok(());
        }
        let mut types = BTreeMap::new();
        let mut categories = BTreeSet::new();
        for event_type in self.store.list_event_types().await? {
            categories.insert(event_type.category);
            // A schema that did not change keeps its compiled validator.
            if let Some(entry) = current.types.get(&event_type.name)
                && entry.event_type == event_type
            {
                types.insert(event_type.name.clone(), entry.clone());
                continue;
            }
            match compile(&event_type.schema) {
                Ok(validator) => {
                    types.insert(event_type.name.clone(), Arc::new(Entry { event_type, validator }));
                }
                // Stored types were checked when written; one that no longer
                // compiles is left out (and logged) rather than failing all.
                Err(error) => tracing::error!(name = %event_type.name, %error, "stored event type left out"),
            }
        }
        let snapshot = Arc::new(Snapshot { version: Some(version), types, categories });
        *self.snapshot.write().unwrap_or_else(std::sync::PoisonError::into_inner) = snapshot;
        Ok(())
    }

    /// Reloads after a miss, at most every [`MISS_RELOAD_INTERVAL`]; a miss
    /// in between waits for the reload under way, if any, and sees its copy.
    async fn reload_after_miss(&self) {
        let throttled = {
            let mut last = self.last_miss.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let throttled = last.is_some_and(|at| at.elapsed() < MISS_RELOAD_INTERVAL);
            if !throttled {
                *last = Some(Instant::now());
            }
            throttled
        };
        if throttled {
            drop(self.reloading.lock().await);
            return;
        }
        if let Err(error) = self.reload().await {
            tracing::warn!(error = %error, "event catalog reload failed");
        }
    }

    /// The type named `name`, if the catalog has it.
    pub async fn get(&self, name: &str) -> Option<Arc<Entry>> {
        if let Some(entry) = self.snapshot().types.get(name) {
            return Some(entry.clone());
        }
        self.reload_after_miss().await;
        self.snapshot().types.get(name).cloned()
    }

    /// Every type, by name.
    pub fn list(&self) -> Vec<EventType> {
        self.snapshot().types.values().map(|entry| entry.event_type.clone()).collect()
    }

    /// The category named `name`, if a type of the catalog has it.
    pub async fn category(&self, name: &str) -> Option<Category> {
        let known = |snapshot: &Snapshot| Category::known(name).filter(|c| snapshot.categories.contains(c));
        if let Some(category) = known(&self.snapshot()) {
            return Some(category);
        }
        self.reload_after_miss().await;
        known(&self.snapshot())
    }

    /// Stores a type (new or replacing one) and reloads; `true` when new.
    pub async fn put(&self, new: &NewEventType) -> StoreResult<(EventType, bool)> {
        let stored = self.store.put_event_type(new).await?;
        self.reload().await?;
        Ok(stored)
    }

    /// Keeps the copy in step with the database until `stop`.
    pub async fn keep_fresh(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(REFRESH_INTERVAL) => {}
            }
            if let Err(error) = self.reload().await {
                tracing::warn!(error = %error, "event catalog reload failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_catalog_is_valid_and_covers_every_contract_category() {
        let types = parse_catalog(DEFAULT_CATALOG).expect("the default catalog");
        for category in Category::CONTRACT {
            for suffix in ["created", "updated", "updated.status_transitioned"] {
                let name = format!("{category}.{suffix}");
                let found = types.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} is missing"));
                assert_eq!(found.category, category, "{name}");
            }
        }
    }

    #[test]
    fn an_example_that_breaks_its_schema_is_refused_naming_the_pointer() {
        let input = EventTypeInput {
            category: "transfer".into(),
            description: "A transfer".into(),
            schema: serde_json::json!({"type": "object", "properties": {"amount": {"type": "string"}}}),
            example: serde_json::json!({"amount": 5}),
            deprecated: false,
        };
        let Err(Refusal::Invalid { key, message }) = check_input("transfer.created", input) else { panic!("accepted") };
        assert_eq!(key, "example");
        assert!(message.contains("\"/amount\""), "{message}");
    }

    #[test]
    fn a_schema_that_is_not_one_is_refused() {
        let input = EventTypeInput {
            category: "transfer".into(),
            description: "A transfer".into(),
            schema: serde_json::json!({"type": 12}),
            example: serde_json::json!({}),
            deprecated: false,
        };
        assert!(matches!(check_input("transfer.created", input), Err(Refusal::Invalid { key: "schema", .. })));
    }
}
