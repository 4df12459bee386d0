//! `POST /internal/events`: producers hand events over here. The event and
//! its deliveries are committed together before the 201, so an accepted event
//! survives any later crash. A producer that retries sends an
//! `Idempotency-Key`: the same request again answers the event it made, with
//! `Idempotent-Replayed: true`, instead of making a second one.
//!
//! Handlers do not write themselves: they hand their event to the
//! [`Ingester`], one writer per process, which stores whatever has queued up
//! while its previous batch committed in one transaction (group commit), then
//! hands the first attempts to the queue (`webhooks_queue::Producer`).

use std::sync::Arc;

use axum::{
    Router,
    body::{Body, to_bytes},
    extract::State,
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use serde::Deserialize;
use utoipa::ToSchema;
use uuid::Uuid;
use webhooks_model::{Category, Event, Lane, ids};
use webhooks_queue::{DeliveryMessage, Pending, Producer};
use webhooks_store::{
    IngestOutcome, NewEvent, Store, StoreError, StoreResult, StoredResponse, batch::Batcher, batch::Batching,
};

use crate::{
    error::{ApiError, ApiResult, Location},
    extract::parse_json,
    idempotency::{self, fingerprint},
    metrics::Metrics,
    state::AppState,
};

/// Events per ingest transaction at most.
const MAX_BATCH: usize = 256;

/// The one writer of ingested events ([`webhooks_store::batch`]): each call waits
/// for the commit of the batch its event went in. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ingester {
    batcher: Batcher<(NewEvent, Arc<Pending>), StoreResult<IngestOutcome>>,
    producer: Producer,
}

impl Ingester {
    /// Starts the writer; it stops once every handle is dropped and what was
    /// handed to it is stored. The first attempts of each committed batch go
    /// to `producer`.
    pub fn spawn(
        store: Store,
        producer: Producer,
        metrics: Arc<Metrics>,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Ingester {
        let writer = Arc::new(Writer { store, producer: producer.clone(), metrics });
        let batcher = Batcher::spawn(Batching { max: MAX_BATCH, linger: None }, tasks, move |events| {
            let writer = writer.clone();
            async move { writer.write(events).await }
        });
        Ingester { batcher, producer }
    }

    /// Stores `event` with the batch it joins. From now until its first
    /// attempts are handed over, they are on their way (see
    /// `webhooks_queue::Producer::pending`).
    pub async fn ingest(&self, event: NewEvent) -> StoreResult<IngestOutcome> {
        let pending = self.producer.pending(event.created_at);
        self.batcher
            .submit((event, pending))
            .await
            .unwrap_or_else(|| Err(StoreError::Corrupt("the ingest writer has stopped".into())))
    }
}

struct Writer {
    store: Store,
    producer: Producer,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Stores one batch and enqueues its first attempts.
    async fn write(&self, batch: Vec<(NewEvent, Arc<Pending>)>) -> Vec<StoreResult<IngestOutcome>> {
        self.metrics.ingest_batch_size.observe(batch.len() as f64);
        let (events, pending): (Vec<NewEvent>, Vec<Arc<Pending>>) = batch.into_iter().unzip();
        let outcomes = match self.store.ingest_events(&events).await {
            Ok(outcomes) => outcomes,
            Err(error) => return error.for_batch(events.len()),
        };
        let mut first_attempts = Vec::new();
        for ((event, outcome), pending) in events.iter().zip(&outcomes).zip(&pending) {
            let Ok(outcome) = outcome else { continue };
            for queued in &outcome.queued {
                let message = DeliveryMessage::first_attempt(queued, event, outcome.body.clone());
                first_attempts.push((message, pending.clone()));
            }
        }
        self.producer.enqueue(first_attempts).await;
        outcomes
    }
}

/// The routes of the ingest endpoint.
pub fn router() -> Router<AppState> {
    Router::new().route("/internal/events", post(ingest))
}

/// Body of `POST /internal/events`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "developer_id": "0b7e2a54-8a0f-4f63-9d61-4f3c2f1e9a10",
    "event_category": "transfer",
    "event_type": "transfer.updated.status_transitioned",
    "event_object_id": "tr_123",
    "event_object": {"id": "tr_123", "amount": "100.00", "currency": "usdc", "state": "payment_processed"},
    "event_object_status": "payment_processed",
    "event_object_changes": {"state": ["pending", "payment_processed"]}
}))]
pub struct IngestEvent {
    /// The developer whose endpoints get the event.
    pub developer_id: Uuid,
    /// A category of the event catalog: the one of `event_type`.
    #[schema(value_type = Category)]
    pub event_category: String,
    /// A type of the event catalog (`GET /v0/event_types`); an unknown one
    /// is refused unless `EVENT_CATALOG_STRICT=false`.
    #[schema(min_length = 1, max_length = 255)]
    pub event_type: String,
    /// 1 to 255 characters, no control characters.
    #[schema(min_length = 1, max_length = 255)]
    pub event_object_id: String,
    /// The object as it is now: a JSON object that satisfies the schema of
    /// its type.
    #[schema(value_type = Object)]
    pub event_object: serde_json::Value,
    /// 1 to 255 characters, no control characters.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 255)]
    pub event_object_status: Option<String>,
    /// What changed: a JSON object (or null).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub event_object_changes: Option<serde_json::Value>,
}

fn check_text(key: &str, value: &str, max: usize) -> ApiResult<()> {
    if value.trim().is_empty() || value.len() > max || value.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            Location::Body,
            key,
            format!("{key} must be 1 to {max} characters without control characters"),
        ));
    }
    Ok(())
}

fn validate(body: &IngestEvent) -> ApiResult<()> {
    check_text("event_category", &body.event_category, 64)?;
    check_text("event_type", &body.event_type, 255)?;
    check_text("event_object_id", &body.event_object_id, 255)?;
    if let Some(status) = &body.event_object_status {
        check_text("event_object_status", status, 255)?;
    }
    if !body.event_object.is_object() {
        return Err(ApiError::invalid(Location::Body, "event_object", "event_object must be a JSON object"));
    }
    if body.event_object_changes.as_ref().is_some_and(|c| !c.is_object() && !c.is_null()) {
        return Err(ApiError::invalid(
            Location::Body,
            "event_object_changes",
            "event_object_changes must be a JSON object",
        ));
    }
    Ok(())
}

/// Checks the event against the catalog (API.md §8.9): a known type, of the
/// category given, whose object satisfies the type's schema; or, with
/// `EVENT_CATALOG_STRICT=false`, an unknown type of a known category.
/// Answers the event's category.
async fn check_catalog(state: &AppState, body: &IngestEvent) -> ApiResult<Category> {
    let catalog = &state.catalog;
    let Some(entry) = catalog.get(&body.event_type).await else {
        if catalog.strict {
            return Err(ApiError::invalid(
                Location::Body,
                "event_type",
                format!("unknown event_type {:?}: GET /v0/event_types lists the catalog", body.event_type),
            ));
        }
        let category = catalog.category(&body.event_category).await.ok_or_else(|| unknown_category(body))?;
        tracing::info!(event_type = %body.event_type, %category, "event of a type the catalog does not know accepted");
        state.metrics.unknown_event_types.inc();
        return Ok(category);
    };
    let category = entry.event_type.category;
    if category.as_str() != body.event_category {
        return Err(ApiError::invalid(
            Location::Body,
            "event_category",
            format!("event_category must be {category:?}, the category of {}", entry.event_type.name),
        ));
    }
    entry.check(&body.event_object).map_err(|message| ApiError::invalid(Location::Body, "event_object", message))?;
    Ok(category)
}

fn unknown_category(body: &IngestEvent) -> ApiError {
    ApiError::invalid(
        Location::Body,
        "event_category",
        format!("unknown event_category {:?}: GET /v0/event_types lists the catalog", body.event_category),
    )
}

/// The event's JSON in two parts, before and after the value of
/// `event_sequence`, so the store can put in the sequence it hands out. The
/// key is found as `"event_sequence":0` in the JSON of the event with sequence
/// 0: inside JSON strings every quote is escaped, so only the real key can
/// match, and it precedes `event_object`, the only field with free structure.
fn split_at_sequence(event: &Event) -> Result<(String, String), serde_json::Error> {
    const KEY: &str = "\"event_sequence\":";
    let json = serde_json::to_string(&Event { event_sequence: 0, ..event.clone() })?;
    let at = json
        .find(&format!("{KEY}0"))
        .ok_or_else(|| <serde_json::Error as serde::ser::Error>::custom("event_sequence not found"))?;
    let split = at + KEY.len();
    Ok((json[..split].to_owned(), json[split + 1..].to_owned()))
}

/// The answer for a key `developer_id` already used: the same 201 and event
/// for the same request, 422 for another one; `None` for a fresh key.
async fn replay(state: &AppState, developer_id: Uuid, key: &str, hash: &[u8]) -> ApiResult<Option<Response>> {
    let Some(earlier) = state.store.find_idempotent_event(developer_id, key).await? else { return Ok(None) };
    if earlier.request_hash != hash {
        return Err(ApiError::IdempotencyKeyReused);
    }
    Ok(Some(idempotency::replay(StoredResponse {
        status: StatusCode::CREATED.as_u16(),
        body: earlier.body.into_bytes(),
    })))
}

/// Hands an event over for delivery (internal listener, port 8081 by default).
///
/// Producers (the platform's other services) call it; developers never do.
/// The event, one delivery per endpoint it is meant for and their queue
/// messages are committed together before the 201: an accepted event
/// survives any later crash. `Authorization: Bearer <INTERNAL_TOKEN>` when
/// the service runs with a token. An optional `Idempotency-Key` makes a
/// retry answer the event it made (`Idempotent-Replayed: true`) instead of
/// making another.
#[utoipa::path(post, path = "/internal/events", tag = "internal", operation_id = "ingestEvent",
    request_body = IngestEvent,
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible characters, per developer; kept as long as the event")),
    security(("internal_token" = [])),
    responses(
        (status = 201, description = "The event as receivers will get it", body = Event,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer"))),
        (status = 400, description = "`invalid`/`required` body field (`source.key` names it): an `event_type` the catalog does not know, an `event_category` that is not the type's, an `event_object` that breaks the type's schema (the message names the JSON pointer at fault); or a malformed `Idempotency-Key`", body = crate::error::ErrorBody),
        (status = 401, description = "`invalid`: the bearer token is missing or wrong (only when `INTERNAL_TOKEN` is set)", body = crate::error::ErrorBody),
        (status = 413, description = "`too_large`: the body is over `MAX_EVENT_BYTES` (256 KiB by default)", body = crate::error::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = crate::error::ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: this developer used the key for another event", body = crate::error::ErrorBody),
    ))]
pub async fn ingest(State(state): State<AppState>, headers: HeaderMap, body: Body) -> ApiResult<Response> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")));
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let limit = state.config.max_event_bytes;
    let bytes = to_bytes(body, limit).await.map_err(|_| ApiError::TooLarge { limit, setting: "MAX_EVENT_BYTES" })?;
    let idempotency_key = idempotency::key_from_headers(&headers)?;
    let body: IngestEvent = parse_json(&bytes)?;
    validate(&body)?;
    let request_hash = idempotency_key.as_ref().map(|_| fingerprint(&Method::POST, "/internal/events", &bytes));
    // A repeat answers what the first request got, before the catalog is
    // asked: a type changed since must not refuse an accepted event.
    if let (Some(key), Some(hash)) = (&idempotency_key, &request_hash)
        && let Some(answer) = replay(&state, body.developer_id, key, hash).await?
    {
        return Ok(answer);
    }
    let category = check_catalog(&state, &body).await?;

    let created_at = webhooks_model::time::now();
    let id = ids::new_event_id_at(created_at);
    let event = Event {
        api_version: "v0".into(),
        event_id: id.clone(),
        event_developer_id: body.developer_id,
        event_category: category,
        event_type: body.event_type,
        event_sequence: 0,
        event_object_id: body.event_object_id,
        event_object_status: body.event_object_status,
        event_object: body.event_object,
        event_object_changes: body.event_object_changes.filter(|c| !c.is_null()),
        event_created_at: created_at,
        test: false,
    };
    let (body_head, body_tail) = split_at_sequence(&event).map_err(|e| ApiError::Unexpected(e.into()))?;
    let developer_id = event.event_developer_id;
    let twin = idempotency_key.clone().zip(request_hash.clone());
    let new = NewEvent {
        id,
        developer_id,
        category: event.event_category,
        event_type: event.event_type.clone(),
        created_at,
        idempotency_key,
        request_hash,
        body_head,
        body_tail,
        lane: state.fair_share.as_ref().map_or(Lane::Default, |share| share.lane(developer_id)),
    };
    let outcome = match state.ingester.ingest(new).await {
        Ok(outcome) => outcome,
        // A twin with the same key committed first (a concurrent request, or
        // an earlier one of the same batch): answer its event.
        Err(StoreError::IdempotencyKeyTaken) => {
            let Some((key, hash)) = &twin else {
                return Err(ApiError::Unexpected(anyhow::anyhow!("idempotency conflict without a key")));
            };
            return replay(&state, developer_id, key, hash)
                .await?
                .ok_or_else(|| ApiError::Unexpected(anyhow::anyhow!("the event of a concurrent twin is gone")));
        }
        Err(error) => return Err(error.into()),
    };
    state.metrics.events_accepted.inc();
    tracing::debug!(event_id = %event.event_id, %developer_id, queued = outcome.queued.len(), held = outcome.held, "event accepted");
    Ok((StatusCode::CREATED, [(header::CONTENT_TYPE, "application/json")], outcome.body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_sequence_tail_is_the_event_json() {
        let mut event = Event {
            api_version: "v0".into(),
            event_id: ids::new_event_id(),
            event_developer_id: Uuid::new_v4(),
            event_category: Category::Transfer,
            event_type: "odd \"event_sequence\":0 type".into(),
            event_sequence: 0,
            event_object_id: "tr_1".into(),
            event_object_status: Some("payment_processed".into()),
            event_object: serde_json::json!({"event_sequence": 0, "nested": {"a": [1, 2]}}),
            event_object_changes: Some(serde_json::json!({"state": ["pending", "payment_processed"]})),
            event_created_at: webhooks_model::time::now(),
            test: false,
        };
        let (head, tail) = split_at_sequence(&event).unwrap();
        event.event_sequence = 42;
        assert_eq!(format!("{head}42{tail}"), serde_json::to_string(&event).unwrap());
        event.event_object_status = None;
        event.event_object_changes = None;
        let (head, tail) = split_at_sequence(&event).unwrap();
        assert_eq!(format!("{head}42{tail}"), serde_json::to_string(&event).unwrap());
    }
}
