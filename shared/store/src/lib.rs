//! The store: every read and write the two programs make, behind one handle,
//! over either backend.
//!
//! - PostgreSQL ([`pg`]) for the distributed deployment: several processes,
//!   with a transactional outbox that the API's relay publishes to RabbitMQ;
//! - SQLite ([`sqlite`]) for standalone mode: one process, one directory,
//!   where the deliveries table is also the delivery queue.
//!
//! Handlers and workers talk to [`Store`] only, never to SQL or to a backend:
//! each method is one statement or one transaction on whichever backend runs,
//! with the same guarantees (event sequence, endpoint limit, idempotency under
//! concurrent twins, generations). Logic that is not SQL (what an update
//! changes, which events an endpoint wants) lives in the backend-neutral
//! modules here and is called by both.

mod api_keys;
pub mod batch;
mod columns;
mod deliveries;
mod endpoints;
mod event_types;
mod events;
pub mod health;
mod idempotency;
pub mod open;
pub mod pace;
mod pg;
mod portal_sessions;
pub mod queue;
mod recoveries;
mod retention;
mod sealed_keys;
mod sqlite;

pub use api_keys::{NewApiKey, hash_key};
pub use deliveries::{
    Admission, AttemptRecord, Backlog, DeliveryState, DueDelivery, LogFilter, Parked, StandingQuestion, Turn,
};
pub use endpoints::{
    EndpointChange, EndpointRecord, EndpointUpdate, NewEndpoint, ReplacementKey, StoredKey, UpdateOutcome,
};
pub use event_types::{CatalogVersion, NewEventType};
pub use events::{
    DeliveredEvent, EventDelivery, EventPage, IdempotentEvent, IngestOutcome, NewEvent, QueuedDelivery, RecoveryWindow,
    SendOutcome, StoredEvent, UpcomingDelivery,
};
pub use idempotency::{Claim, IDEMPOTENCY_CLAIM_TIMEOUT, IDEMPOTENCY_KEY_LIFETIME, StoredResponse};
pub use pg::Maintained;
pub use portal_sessions::{NewPortalSession, PortalSession};
pub use recoveries::{NewRecovery, Recoverable, Recovery, RecoveryStart, RecoveryStep};
pub use retention::{Purged, RETENTION_BATCH, retention_cutoff};
pub use sealed_keys::{KeyReseal, KeySlot, SealedKeyGroup, SealedKeys};

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use webhooks_model::{ApiKey, DeliveryLog};

/// Why a store call failed, whatever the backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another request with the same producer `Idempotency-Key` stored its
    /// event first (concurrent twins): answer that event.
    #[error("an event with this Idempotency-Key was stored concurrently")]
    IdempotencyKeyTaken,
    /// A stored row cannot be read back as the domain type.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The statement ran past its time (`DATABASE_STATEMENT_TIMEOUT`) and the
    /// database cancelled it, or no connection came free in time: the
    /// database is busy, and a request may be tried again shortly.
    #[error("the database took too long: {0}")]
    TimedOut(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The batch this call was stored in failed as a whole (group commit):
    /// every call of the batch gets the one cause.
    #[error("the batch failed: {0}")]
    Batch(#[source] std::sync::Arc<StoreError>),
}

impl StoreError {
    /// The answers of a batch of `n` calls that failed as a whole (group
    /// commit): each gets this one cause.
    pub fn for_batch<T>(self, n: usize) -> Vec<StoreResult<T>> {
        let error = std::sync::Arc::new(self);
        (0..n).map(|_| Err(StoreError::Batch(error.clone()))).collect()
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::ColumnDecode { index, source } => StoreError::Corrupt(format!("column {index}: {source}")),
            sqlx::Error::PoolTimedOut => StoreError::TimedOut(Box::new(error)),
            // query_canceled: the statement timeout.
            sqlx::Error::Database(ref database) if database.code().as_deref() == Some("57014") => {
                StoreError::TimedOut(Box::new(error))
            }
            error => StoreError::Database(Box::new(error)),
        }
    }
}

/// The result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// Cheap to clone: a handle on one backend. Which one is decided when the
/// store is opened ([`open`]); nothing above this seam names it.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Debug, Clone)]
enum Backend {
    Postgres(pg::PgStore),
    Sqlite(sqlite::SqliteStore),
}

/// Calls the same method on whichever backend runs.
macro_rules! each_backend {
    ($self:ident, $store:ident => $call:expr) => {
        match &$self.backend {
            Backend::Postgres($store) => $call,
            Backend::Sqlite($store) => $call,
        }
    };
}

impl Store {
    /// Closes the database: every connection, waiting for those in use (on
    /// SQLite the writer last, so its close checkpoints the write-ahead log).
    pub async fn close(&self) {
        each_backend!(self, s => s.close().await)
    }

    /// What waits now (see [`Backlog`]).
    pub async fn backlog(&self) -> StoreResult<Backlog> {
        each_backend!(self, s => s.backlog().await)
    }

    /// Analyzes the tables whose planner statistics are stale by
    /// autovacuum's rule, when the server runs without it (see
    /// `pg/statistics.rs`); returns their names. SQLite plans each statement
    /// as it is prepared and, without statistics, favours the indexes: it
    /// has nothing to refresh.
    pub async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Postgres(store) => store.refresh_statistics().await,
            Backend::Sqlite(_) => Ok(Vec::new()),
        }
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> StoreResult<()> {
        each_backend!(self, s => s.ping().await)
    }

    // The event catalog.

    /// Every event type, by name.
    pub async fn list_event_types(&self) -> StoreResult<Vec<webhooks_model::EventType>> {
        each_backend!(self, s => s.list_event_types().await)
    }

    /// How many types there are and when the catalog last changed.
    pub async fn catalog_version(&self) -> StoreResult<CatalogVersion> {
        each_backend!(self, s => s.catalog_version().await)
    }

    /// Stores a type, new or replacing one; `true` when it is new.
    pub async fn put_event_type(&self, new: &NewEventType) -> StoreResult<(webhooks_model::EventType, bool)> {
        each_backend!(self, s => s.put_event_type(new).await)
    }

    // API keys.

    /// Stores a new key (and its developer, if new).
    pub async fn create_api_key(&self, key: NewApiKey<'_>) -> StoreResult<ApiKey> {
        each_backend!(self, s => s.create_api_key(key).await)
    }

    /// Whether any API key was ever stored: a standalone process that finds
    /// none is on its first start (or was locked out) and issues one.
    pub async fn has_api_keys(&self) -> StoreResult<bool> {
        each_backend!(self, s => s.has_api_keys().await)
    }

    /// The active key with this hash, if any.
    pub async fn find_active_api_key(&self, key_hash: &[u8]) -> StoreResult<Option<ApiKey>> {
        each_backend!(self, s => s.find_active_api_key(key_hash).await)
    }

    /// The developer's active keys, newest first.
    pub async fn list_api_keys(&self, developer_id: Uuid) -> StoreResult<Vec<ApiKey>> {
        each_backend!(self, s => s.list_api_keys(developer_id).await)
    }

    /// Marks the developer's active key deleted; `None` when there is no such key.
    /// Every developer's active keys, newest first, at most `limit`: what
    /// an operator lists to find a developer's id.
    pub async fn all_api_keys(&self, limit: i64) -> StoreResult<Vec<ApiKey>> {
        each_backend!(self, s => s.all_api_keys(limit).await)
    }

    pub async fn delete_api_key(&self, developer_id: Uuid, id: Uuid) -> StoreResult<Option<ApiKey>> {
        each_backend!(self, s => s.delete_api_key(developer_id, id).await)
    }

    // Portal sessions.

    /// Stores a new portal session (and its developer, if new), and drops
    /// the sessions that expired by its `created_at`.
    pub async fn create_portal_session(&self, session: NewPortalSession<'_>) -> StoreResult<PortalSession> {
        each_backend!(self, s => s.create_portal_session(session).await)
    }

    /// The session with this token hash, expired or not: the caller checks
    /// the expiry against its clock.
    pub async fn find_portal_session(&self, token_hash: &[u8]) -> StoreResult<Option<PortalSession>> {
        each_backend!(self, s => s.find_portal_session(token_hash).await)
    }

    /// Revokes (deletes) a session; `false` when there is no such session.
    pub async fn revoke_portal_session(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<bool> {
        each_backend!(self, s => s.revoke_portal_session(id, now).await)
    }

    // Idempotency keys.

    /// Claims `key` for a request with `fingerprint`, or reports what an earlier
    /// request with the same key left. A claim left unanswered for
    /// [`IDEMPOTENCY_CLAIM_TIMEOUT`] (its process died) is taken over; an answer
    /// older than [`IDEMPOTENCY_KEY_LIFETIME`] is forgotten.
    pub async fn claim_idempotency_key(&self, developer_id: Uuid, key: &str, fingerprint: &[u8]) -> StoreResult<Claim> {
        each_backend!(self, s => s.claim_idempotency_key(developer_id, key, fingerprint).await)
    }

    /// Records the answer of a claimed key.
    pub async fn complete_idempotency_key(
        &self,
        developer_id: Uuid,
        key: &str,
        response: &StoredResponse,
    ) -> StoreResult<()> {
        each_backend!(self, s => s.complete_idempotency_key(developer_id, key, response).await)
    }

    /// Forgets a claimed key whose request failed on our side, so the client
    /// can retry with the same key.
    pub async fn release_idempotency_key(&self, developer_id: Uuid, key: &str) -> StoreResult<()> {
        each_backend!(self, s => s.release_idempotency_key(developer_id, key).await)
    }

    /// Deletes stored responses older than [`IDEMPOTENCY_KEY_LIFETIME`]; returns how many.
    pub async fn purge_idempotency_keys(&self) -> StoreResult<u64> {
        each_backend!(self, s => s.purge_idempotency_keys().await)
    }

    // Retention.

    /// Deletes one batch of what is older than `cutoff` (see `retention.rs`):
    /// at most `limit` delivery log entries by their own age, and at most
    /// `limit` events by theirs, each with its deliveries and their log
    /// entries, except events with a delivery still `pending` or `retrying`.
    /// [`Purged::full`] says whether another batch may find more.
    pub async fn purge_expired(&self, cutoff: DateTime<Utc>, limit: u32) -> StoreResult<Purged> {
        each_backend!(self, s => s.purge_expired(cutoff, limit).await)
    }

    /// Keeps the history's partitions (PostgreSQL: `pg/history.rs`): makes
    /// those of the coming days, and drops the days wholly before `cutoff`
    /// (`None`: keep everything), none of whose deliveries is owed. SQLite
    /// keeps its history in one table each: nothing to do there.
    pub async fn maintain_history(&self, cutoff: Option<DateTime<Utc>>) -> StoreResult<Maintained> {
        match &self.backend {
            Backend::Postgres(store) => store.maintain_history(cutoff).await,
            Backend::Sqlite(_) => Ok(Maintained::default()),
        }
    }

    /// Makes the history's partitions of the days from `first` to `last`
    /// (PostgreSQL): for history the service does not make itself, such as
    /// a benchmark's thirty days. SQLite has no partitions.
    pub async fn partition_days(&self, first: chrono::NaiveDate, last: chrono::NaiveDate) -> StoreResult<()> {
        match &self.backend {
            Backend::Postgres(store) => store.partition_days(first, last).await,
            Backend::Sqlite(_) => Ok(()),
        }
    }

    /// Converts the history tables of an installation that has history to
    /// day partitions, online (PostgreSQL; `webhooks-api migrate
    /// --partition-history`), saying each step through `say`. SQLite keeps
    /// its history in one table each.
    pub async fn partition_history(&self, say: &(dyn Fn(&str) + Sync)) -> StoreResult<()> {
        match &self.backend {
            Backend::Postgres(store) => store.partition_history(say).await,
            Backend::Sqlite(_) => {
                say("standalone mode keeps its history in one table each: nothing to convert");
                Ok(())
            }
        }
    }

    // Endpoints.

    /// How many non-deleted endpoints the developer has.
    pub async fn count_endpoints(&self, developer_id: Uuid) -> StoreResult<i64> {
        each_backend!(self, s => s.count_endpoints(developer_id).await)
    }

    /// Stores a new endpoint (`disabled`) and records its creation, unless the
    /// developer already has `limit`: then `None`. The limit holds under
    /// concurrent creates.
    pub async fn create_endpoint(
        &self,
        new: NewEndpoint,
        limit: i64,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        each_backend!(self, s => s.create_endpoint(new, limit, by).await)
    }

    /// The developer's non-deleted endpoints, newest first.
    pub async fn list_endpoints(&self, developer_id: Uuid) -> StoreResult<Vec<EndpointRecord>> {
        each_backend!(self, s => s.list_endpoints(developer_id).await)
    }

    /// The developer's endpoint `id`, unless it is deleted or someone else's.
    pub async fn get_endpoint(&self, developer_id: Uuid, id: &str) -> StoreResult<Option<EndpointRecord>> {
        each_backend!(self, s => s.get_endpoint(developer_id, id).await)
    }

    /// Endpoint `id` whatever its owner or status: what a dispatcher needs.
    pub async fn load_endpoint(&self, id: &str) -> StoreResult<Option<EndpointRecord>> {
        each_backend!(self, s => s.load_endpoint(id).await)
    }

    /// Applies `update` and records one lifecycle change per field that changed.
    pub async fn update_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        update: EndpointUpdate,
        by: EndpointChange,
    ) -> StoreResult<UpdateOutcome> {
        each_backend!(self, s => s.update_endpoint(developer_id, id, update, by).await)
    }

    /// Deletes the endpoint: it leaves every list, answers 404 from now on,
    /// its upcoming deliveries are cancelled, and its private key is
    /// overwritten (the record returned, and every later load, has none).
    pub async fn delete_endpoint(
        &self,
        developer_id: Uuid,
        id: &str,
        by: EndpointChange,
    ) -> StoreResult<Option<EndpointRecord>> {
        each_backend!(self, s => s.delete_endpoint(developer_id, id, by).await)
    }

    /// Disables, with the change `auto_disabled` and `disabled_reason:
    /// failing`, every active endpoint whose attempts have all failed since
    /// before `now - after` and on at least [`health::FAILING_DAYS`] days;
    /// returns the endpoints disabled.
    pub async fn auto_disable_failing(
        &self,
        now: DateTime<Utc>,
        after: std::time::Duration,
    ) -> StoreResult<Vec<EndpointRecord>> {
        each_backend!(self, s => s.auto_disable_failing(now, after).await)
    }

    /// Deletes the replaced keys whose overlap ended by `now` (API.md §8.2);
    /// returns how many.
    pub async fn purge_expired_keys(&self, now: DateTime<Utc>) -> StoreResult<u64> {
        each_backend!(self, s => s.purge_expired_keys(now).await)
    }

    // Sealed private keys.

    /// Up to `limit` endpoints that are not deleted, with their sealed
    /// private keys, in id order after `after` (`""` for the first page):
    /// the pages `keys reseal` walks.
    pub async fn sealed_keys(&self, after: &str, limit: i64) -> StoreResult<Vec<SealedKeys>> {
        each_backend!(self, s => s.sealed_keys(after, limit).await)
    }

    /// Writes, in one transaction, each reseal whose endpoint still holds
    /// the blob it was made from (see [`KeyReseal`]); answers, for each in
    /// order, whether it was written.
    pub async fn reseal_keys(&self, reseals: &[KeyReseal]) -> StoreResult<Vec<bool>> {
        each_backend!(self, s => s.reseal_keys(reseals).await)
    }

    /// The stored private keys of endpoints that are not deleted, grouped by
    /// how they are sealed, in one pass over the table, with a sample or two
    /// of each group: what delivery checks at start.
    pub async fn sealed_key_groups(&self) -> StoreResult<Vec<SealedKeyGroup>> {
        each_backend!(self, s => s.sealed_key_groups().await)
    }

    // Events and deliveries.

    /// Stores an event and one delivery per endpoint it is meant for
    /// (`pending` for active endpoints, due now and queued; `held` for
    /// disabled ones), atomically. [`StoreError::IdempotencyKeyTaken`] when a
    /// concurrent twin with the same producer `Idempotency-Key` won.
    pub async fn ingest_event(&self, event: &NewEvent) -> StoreResult<IngestOutcome> {
        let mut outcomes = self.ingest_events(std::slice::from_ref(event)).await?;
        outcomes.pop().unwrap_or_else(|| Err(StoreError::Corrupt("an ingest returned no outcome".into())))
    }

    /// Stores a batch of events as [`Store::ingest_event`] stores one, in one
    /// transaction (one commit, one flush): each gets its outcome, in the
    /// batch's order, and the event sequences follow that order. An event
    /// whose `Idempotency-Key` an earlier event of the batch, or a concurrent
    /// twin, already used gets [`StoreError::IdempotencyKeyTaken`] and is not
    /// stored; the others are. `Err` when the batch failed as a whole. The
    /// queue of the deployment then carries the deliveries it made due
    /// (`IngestOutcome::queued`).
    pub async fn ingest_events(&self, events: &[NewEvent]) -> StoreResult<Vec<StoreResult<IngestOutcome>>> {
        let twins = events::later_twins(events);
        let stored: Vec<&NewEvent> = events.iter().zip(&twins).filter(|(_, twin)| !**twin).map(|(e, _)| e).collect();
        let mut outcomes = each_backend!(self, s => s.ingest_events(&stored).await)?.into_iter();
        Ok(twins
            .iter()
            .map(|twin| match twin {
                true => Err(StoreError::IdempotencyKeyTaken),
                false => {
                    outcomes.next().unwrap_or_else(|| Err(StoreError::Corrupt("an ingest lost an outcome".into())))
                }
            })
            .collect())
    }

    /// The event `developer_id` made earlier with this `Idempotency-Key`.
    pub async fn find_idempotent_event(
        &self,
        developer_id: Uuid,
        idempotency_key: &str,
    ) -> StoreResult<Option<IdempotentEvent>> {
        each_backend!(self, s => s.find_idempotent_event(developer_id, idempotency_key).await)
    }

    /// The endpoint's upcoming events, oldest first: deliveries not yet
    /// settled, and for `beginning_of_time` endpoints the developer's earlier
    /// events of its categories that it never had.
    pub async fn upcoming_events(&self, endpoint: &EndpointRecord, limit: i64) -> StoreResult<Vec<StoredEvent>> {
        each_backend!(self, s => s.upcoming_events(endpoint, limit).await)
    }

    /// The deliveries to `endpoint_id` of those of `event_ids` that have one
    /// (an upcoming event of a `beginning_of_time` endpoint may have none).
    pub async fn upcoming_deliveries(
        &self,
        endpoint_id: &str,
        event_ids: &[String],
    ) -> StoreResult<Vec<UpcomingDelivery>> {
        each_backend!(self, s => s.upcoming_deliveries(endpoint_id, event_ids).await)
    }

    /// The developer's events, newest first, paged by event-id cursors.
    /// `None` when a cursor names no event of the developer.
    pub async fn list_events(&self, developer_id: Uuid, page: &EventPage<'_>) -> StoreResult<Option<Vec<StoredEvent>>> {
        each_backend!(self, s => s.list_events(developer_id, page).await)
    }

    /// Queues `event_id` for the endpoint now, whatever its status: writes the
    /// delivery (or re-arms the existing one with the next generation) and
    /// queues its first attempt.
    pub async fn send_event(&self, endpoint: &EndpointRecord, event_id: &str) -> StoreResult<SendOutcome> {
        each_backend!(self, s => s.send_event(endpoint, event_id).await)
    }

    /// How many deliveries a recovery of `window` would queue: the events of
    /// the window meant for the endpoint whose delivery is `failed` or
    /// upcoming (held, or never made for a `beginning_of_time` endpoint),
    /// and the range of event sequences they lie in.
    pub async fn recoverable(&self, endpoint: &EndpointRecord, window: RecoveryWindow) -> StoreResult<Recoverable> {
        each_backend!(self, s => s.recoverable(endpoint, window).await)
    }

    /// Starts a recovery, unless another of the endpoint is running: then
    /// that one.
    pub async fn start_recovery(&self, new: &NewRecovery) -> StoreResult<RecoveryStart> {
        each_backend!(self, s => s.start_recovery(new).await)
    }

    /// The endpoint's latest recovery, running or not.
    pub async fn latest_recovery(&self, endpoint_id: &str) -> StoreResult<Option<Recovery>> {
        each_backend!(self, s => s.latest_recovery(endpoint_id).await)
    }

    /// Stores the count of recovery `id`, started before it was counted:
    /// its total and range (unless its first batch fixed one), and, when it
    /// queues nothing, why; it is then done.
    pub async fn count_recovery(&self, id: Uuid, counted: &Recoverable) -> StoreResult<()> {
        each_backend!(self, s => s.count_recovery(id, counted).await)
    }

    /// Takes up to `limit` running recoveries for `owner` (an API process)
    /// for `lease`: those it holds already, and those nobody holds or whose
    /// holder's lease lapsed (it stopped).
    pub async fn claim_recoveries(&self, owner: Uuid, lease: Duration, limit: i64) -> StoreResult<Vec<Recovery>> {
        each_backend!(self, s => s.claim_recoveries(owner, lease, limit).await)
    }

    /// Queues the next `batch` deliveries of `recovery`'s window at most,
    /// reading at most ten events for each (as `send` does, skipping
    /// deliveries already pending or retrying) and moves its progress on,
    /// in one transaction, renewing `owner`'s lease; finishes
    /// it once the window is done or its endpoint is gone. Nothing, and
    /// `done`, when `owner` no longer holds it.
    pub async fn recovery_step(
        &self,
        recovery: &Recovery,
        owner: Uuid,
        batch: i64,
        lease: Duration,
    ) -> StoreResult<RecoveryStep> {
        each_backend!(self, s => s.recovery_step(recovery, owner, batch, lease).await)
    }

    /// Notes why a batch of the recovery failed; it is tried again.
    pub async fn recovery_failed(&self, id: Uuid, error: &str) -> StoreResult<()> {
        each_backend!(self, s => s.recovery_failed(id, error).await)
    }

    /// Lets go of what `owner` holds, for another process (or its next
    /// start) to take at once.
    pub async fn release_recoveries(&self, owner: Uuid) -> StoreResult<()> {
        each_backend!(self, s => s.release_recoveries(owner).await)
    }

    /// Writes a batch of outcomes in one transaction: the log rows, then the
    /// delivery states. Every attempt is logged; the state is written only
    /// while the delivery is at the record's generation (an outcome of a
    /// generation `send` has replaced changes nothing), only while it is not
    /// settled (`succeeded` and `cancelled` stay; only `send` re-arms), and,
    /// for an attempt, only when it is newer than the last one recorded in the
    /// generation (a duplicate message or a forked retry changes nothing).
    pub async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        each_backend!(self, s => s.record_attempts(records).await)
    }

    /// Whether the attempt `question` asks of should still be made: the
    /// delivery is at its generation, not settled, and no attempt as new
    /// has been recorded.
    pub async fn admission(&self, question: StandingQuestion) -> StoreResult<Admission> {
        let mut admissions = self.admissions(std::slice::from_ref(&question)).await?;
        Ok(admissions.pop().unwrap_or(Admission::Superseded))
    }

    /// [`Store::admission`] for several messages at once (one statement):
    /// one answer per question, in their order.
    pub async fn admissions(&self, questions: &[StandingQuestion]) -> StoreResult<Vec<Admission>> {
        each_backend!(self, s => s.admissions(questions).await)
    }

    /// Whether delivery `delivery_id` (at `generation`) of the ordered
    /// endpoint `endpoint_id` may be attempted now; when an earlier delivery
    /// of the endpoint is unsettled, it is marked `waiting` and the settling
    /// of that one queues it again.
    pub async fn take_turn(&self, delivery_id: i64, generation: Option<i32>, endpoint_id: &str) -> StoreResult<Turn> {
        each_backend!(self, s => s.take_turn(delivery_id, generation, endpoint_id).await)
    }

    /// Takes the next ticket in the pace of `endpoint_id`, at most `limit`
    /// attempts per second across every dispatcher (see [`pace`]); it starts
    /// now or later.
    pub async fn take_pace(&self, endpoint_id: &str, limit: u32) -> StoreResult<pace::Ticket> {
        each_backend!(self, s => s.take_pace(endpoint_id, limit).await)
    }

    /// When ticket `ticket` of `endpoint_id` starts by its schedule as it is
    /// now (a throttle since it was taken moves it later); `None` when the
    /// schedule is gone (then it may start now).
    pub async fn pace_start(&self, endpoint_id: &str, ticket: i64) -> StoreResult<Option<DateTime<Utc>>> {
        each_backend!(self, s => s.pace_start(endpoint_id, ticket).await)
    }

    /// The receiver answered 429 or 503: slows the endpoint's pace, paused
    /// until `paused_until` when it sent a `Retry-After`.
    pub async fn slow_pace(&self, endpoint_id: &str, paused_until: Option<DateTime<Utc>>) -> StoreResult<()> {
        each_backend!(self, s => s.slow_pace(endpoint_id, paused_until).await)
    }

    /// The endpoint's delivery log entries that `filter` lets through, newest
    /// first, each with its event's type; `None` when the cursor names no log
    /// entry of this endpoint.
    pub async fn list_logs(
        &self,
        endpoint_id: &str,
        limit: i64,
        starting_after: Option<Uuid>,
        filter: &LogFilter,
    ) -> StoreResult<Option<Vec<DeliveryLog>>> {
        each_backend!(self, s => s.list_logs(endpoint_id, limit, starting_after, filter).await)
    }

    /// The developer's event as delivered, with where each of its deliveries
    /// stands; `None` when the developer has no event with this id.
    pub async fn find_delivered_event(
        &self,
        developer_id: Uuid,
        event_id: &str,
    ) -> StoreResult<Option<DeliveredEvent>> {
        each_backend!(self, s => s.find_delivered_event(developer_id, event_id).await)
    }
}
