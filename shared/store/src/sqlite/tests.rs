//! What the SQLite store must guarantee, each on a fresh data directory.

use std::{path::PathBuf, time::Duration};

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;
use uuid::Uuid;

use super::SqliteStore;
use crate::{
    Admission, AttemptRecord, Claim, DeliveryState, EndpointChange, EndpointRecord, EndpointUpdate, EventPage,
    IngestOutcome, NewApiKey, NewEndpoint, NewEvent, SendOutcome, StoreError, StoreResult, StoredResponse,
    UpdateOutcome,
};
use webhooks_model::{ApiKeyType, Category, ChangeKind, DeliveryLog, EndpointStatus, EventEpoch, Scope};

/// A store on a directory of its own, removed when dropped.
struct Scratch {
    dir: PathBuf,
    store: SqliteStore,
}

impl Scratch {
    async fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("webhooks-sqlite-test-{}", Uuid::new_v4().simple()));
        let store = SqliteStore::open(&dir).await.expect("open store");
        Scratch { dir, store }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const BY: EndpointChange = EndpointChange { api_key_id: Some(Uuid::nil()) };

fn event_at(developer_id: Uuid, category: Category, created_at: DateTime<Utc>) -> NewEvent {
    NewEvent {
        id: format!("wh_{}", Uuid::new_v4().simple()),
        developer_id,
        category,
        event_type: format!("{category}.updated"),
        created_at,
        idempotency_key: None,
        request_hash: None,
        body_head: "{\"event_sequence\":".into(),
        body_tail: "}".into(),
        lane: webhooks_model::Lane::Default,
    }
}

fn event(developer_id: Uuid) -> NewEvent {
    event_at(developer_id, Category::Customer, webhooks_model::time::now())
}

fn new_endpoint(developer_id: Uuid, event_epoch: EventEpoch, event_categories: Vec<Category>) -> NewEndpoint {
    NewEndpoint {
        signature_scheme: webhooks_model::SignatureScheme::Platform,
        rate_limit_per_second: None,
        ordering: webhooks_model::DeliveryOrder::None,
        id: format!("wep_{}", Uuid::new_v4().simple()),
        developer_id,
        url: "https://receiver.example/hook".into(),
        event_epoch,
        event_categories,
        event_types: Vec::new(),
        public_key_pem: "public".into(),
        private_key: vec![0, 1, 2],
    }
}

/// A new endpoint of `developer_id` for `categories`, in `status`.
async fn endpoint(
    store: &SqliteStore,
    developer_id: Uuid,
    categories: Vec<Category>,
    status: EndpointStatus,
) -> EndpointRecord {
    let new = new_endpoint(developer_id, EventEpoch::WebhookCreation, categories);
    let created = store.create_endpoint(new, 100, BY).await.unwrap().expect("under the limit");
    if status == EndpointStatus::Disabled {
        return created;
    }
    let update = EndpointUpdate { status: Some(status), ..EndpointUpdate::default() };
    match store.update_endpoint(developer_id, &created.id, update, BY).await.unwrap() {
        UpdateOutcome::Updated(record) => *record,
        other => panic!("update refused: {other:?}"),
    }
}

/// state, generation, attempts, next_attempt, force, claimed, next_attempt_at
type QueueRow = (String, i32, i64, i64, bool, bool, Option<i64>);

async fn queue_row(store: &SqliteStore, delivery_id: i64) -> QueueRow {
    sqlx::query_as(
        "SELECT state, generation, attempts, next_attempt, force, claimed, next_attempt_at FROM deliveries WHERE id = $1",
    )
    .bind(delivery_id)
    .fetch_one(&store.reader)
    .await
    .unwrap()
}

fn log(event_id: &str, attempt: i32, created_at: DateTime<Utc>) -> DeliveryLog {
    DeliveryLog {
        id: Uuid::now_v7(),
        event_id: event_id.to_owned(),
        event_type: None,
        attempt,
        status: Some(500),
        response_body: Some("nope".into()),
        error: None,
        error_detail: Some("HTTP 500 Internal Server Error".into()),
        duration_ms: 12,
        created_at,
    }
}

/// The question a message asks before its attempt; the SQLite store finds a
/// delivery by its id alone.
fn asked(delivery_id: i64, generation: Option<i32>, attempt: i32) -> crate::StandingQuestion {
    crate::StandingQuestion { delivery_id, event_id: String::new(), generation, attempt }
}

fn outcome(
    delivery_id: i64,
    endpoint_id: &str,
    state: DeliveryState,
    generation: Option<i32>,
    log: Option<DeliveryLog>,
) -> AttemptRecord {
    AttemptRecord {
        delivery_id,
        event_id: String::new(),
        state,
        next_attempt_at: None,
        log,
        endpoint_id: endpoint_id.to_owned(),
        generation,
    }
}

#[tokio::test]
async fn sequence_grows_by_one_under_concurrent_ingests() {
    let scratch = Scratch::new().await;
    let developer = Uuid::new_v4();
    endpoint(&scratch.store, developer, vec![], EndpointStatus::Active).await;
    let mut ingests = JoinSet::new();
    for _ in 0..50 {
        let store = scratch.store.clone();
        ingests.spawn(async move { store.ingest_event(&event(developer)).await });
    }
    let mut sequences = Vec::new();
    while let Some(outcome) = ingests.join_next().await {
        let outcome = outcome.unwrap().unwrap();
        assert_eq!(outcome.body, format!("{{\"event_sequence\":{}}}", outcome.sequence));
        assert_eq!((outcome.queued.len(), outcome.held), (1, 0));
        sequences.push(outcome.sequence);
    }
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=50).collect::<Vec<i64>>());

    let other = scratch.store.ingest_event(&event(Uuid::new_v4())).await.unwrap();
    assert_eq!(other.sequence, 1, "each developer has a sequence of its own");
}

#[tokio::test]
async fn endpoint_limit_holds_under_concurrent_creates() {
    let scratch = Scratch::new().await;
    let developer = Uuid::new_v4();
    let mut changes = scratch.store.changes();
    let mut creates = JoinSet::new();
    for _ in 0..20 {
        let store = scratch.store.clone();
        creates.spawn(async move {
            store.create_endpoint(new_endpoint(developer, EventEpoch::WebhookCreation, vec![]), 5, BY).await
        });
    }
    let mut created = 0;
    while let Some(result) = creates.join_next().await {
        if result.unwrap().unwrap().is_some() {
            created += 1;
        }
    }
    assert_eq!(created, 5);
    assert_eq!(scratch.store.count_endpoints(developer).await.unwrap(), 5);
    assert_eq!(scratch.store.list_endpoints(developer).await.unwrap().len(), 5);

    let mut change_ids = Vec::new();
    while let Ok(change) = changes.try_recv() {
        assert_eq!(
            (change.change, change.developer_id, change.api_key_id),
            (ChangeKind::Created, developer, BY.api_key_id)
        );
        change_ids.push(change.change_id);
    }
    assert_eq!(change_ids.len(), 5, "one announcement per committed create");
    assert!(change_ids.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test]
async fn idempotency_key_twins_store_one_event() {
    let scratch = Scratch::new().await;
    let developer = Uuid::new_v4();
    let mut twins = JoinSet::new();
    for _ in 0..10 {
        let store = scratch.store.clone();
        let twin =
            NewEvent { idempotency_key: Some("order-42".into()), request_hash: Some(vec![7; 32]), ..event(developer) };
        twins.spawn(async move { store.ingest_event(&twin).await });
    }
    let (mut won, mut taken) = (Vec::new(), 0);
    while let Some(result) = twins.join_next().await {
        match result.unwrap() {
            Ok(outcome) => won.push(outcome),
            Err(StoreError::IdempotencyKeyTaken) => taken += 1,
            Err(error) => panic!("unexpected error: {error}"),
        }
    }
    assert_eq!((won.len(), taken), (1, 9));
    let found = scratch.store.find_idempotent_event(developer, "order-42").await.unwrap().unwrap();
    assert_eq!((found.body.as_str(), found.request_hash), (won[0].body.as_str(), vec![7; 32]));
    assert!(scratch.store.find_idempotent_event(developer, "order-43").await.unwrap().is_none());
    let page = EventPage { limit: 100, ..EventPage::default() };
    assert_eq!(scratch.store.list_events(developer, &page).await.unwrap().unwrap().len(), 1);
    // The losers gave their sequence back.
    assert_eq!(scratch.store.ingest_event(&event(developer)).await.unwrap().sequence, 2);
}

#[tokio::test]
async fn ingest_queues_for_active_endpoints_and_holds_for_disabled_ones() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let everything = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    let customers = endpoint(store, developer, vec![Category::Customer], EndpointStatus::Disabled).await;
    endpoint(store, developer, vec![Category::Transfer], EndpointStatus::Active).await;
    let deleted = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    store.delete_endpoint(developer, &deleted.id, BY).await.unwrap().unwrap();
    endpoint(store, Uuid::new_v4(), vec![], EndpointStatus::Active).await;

    let work = store.work();
    let new = event(developer);
    let outcome = store.ingest_event(&new).await.unwrap();
    assert_eq!((outcome.sequence, outcome.queued.len(), outcome.held), (1, 1, 1));
    tokio::time::timeout(Duration::from_secs(1), work.notified()).await.expect("queue woken");

    let messages = store.claim_due(10, 10).await.unwrap();
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(
        (message.event_id.as_str(), message.endpoint_id.as_str(), message.developer_id),
        (new.id.as_str(), everything.id.as_str(), developer)
    );
    assert_eq!((message.attempt, message.force, message.generation), (1, false, Some(0)));
    assert_eq!((message.body.as_str(), message.event_created_at), (outcome.body.as_str(), new.created_at));

    let upcoming = store.upcoming_events(&customers, 10).await.unwrap();
    assert_eq!(upcoming.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [new.id.as_str()]);
}

#[tokio::test]
async fn the_queue_claims_once_retries_on_time_and_ignores_older_generations() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let active = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    let work = store.work();
    let new = event(developer);
    store.ingest_event(&new).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), work.notified()).await.expect("queue woken");

    let first = store.claim_due(10, 10).await.unwrap();
    assert_eq!(first.len(), 1);
    let delivery = first[0].delivery_id;
    assert!(store.claim_due(10, 10).await.unwrap().is_empty(), "a claimed delivery is not handed out twice");
    assert_eq!(store.next_due_at(true).await.unwrap(), None);

    assert_eq!(store.release_claims().await.unwrap(), 1);
    let again = store.claim_due(10, 10).await.unwrap();
    assert_eq!(again, first, "a released claim is due again, unchanged");

    // A failed first attempt: retried an hour from now, not before.
    let retry_at = webhooks_model::time::now() + chrono::Duration::hours(1);
    let failed = AttemptRecord {
        next_attempt_at: Some(retry_at),
        ..outcome(
            delivery,
            &active.id,
            DeliveryState::Retrying,
            Some(0),
            Some(log(&new.id, 1, webhooks_model::time::now())),
        )
    };
    store.record_attempts(&[failed]).await.unwrap();
    assert_eq!(
        queue_row(store, delivery).await,
        ("retrying".into(), 0, 1, 2, false, false, Some(retry_at.timestamp_micros()))
    );
    assert!(store.claim_due(10, 10).await.unwrap().is_empty(), "not due before its time");
    assert_eq!(store.next_due_at(true).await.unwrap(), Some(retry_at));
    assert_eq!(store.admission(delivery, Some(0), 2).await.unwrap(), Admission::Go { ordered: false });

    // A put-back of a delivery no longer claimed (its handler was dropped
    // at shutdown after its outcome was recorded) leaves the retry time.
    let earlier = webhooks_model::time::now() - chrono::Duration::seconds(1);
    store.defer(delivery, Some(0), earlier, Some((1, 0)), None).await.unwrap();
    assert_eq!(store.next_due_at(true).await.unwrap(), Some(retry_at), "the recorded retry time stands");

    // Brought forward, it is due with the next attempt number.
    sqlx::query("UPDATE deliveries SET next_attempt_at = $2, parks = 1 WHERE id = $1")
        .bind(delivery)
        .bind(earlier.timestamp_micros())
        .execute(&store.writer)
        .await
        .unwrap();
    let retry = store.claim_due(10, 10).await.unwrap();
    assert_eq!(retry.len(), 1);
    assert_eq!((retry[0].attempt, retry[0].force, retry[0].generation), (2, false, Some(0)));
    assert_eq!((retry[0].parks, retry[0].failures), (1, 0), "a deferral keeps the message's counts");

    // A deferral of another generation changes nothing: the claim stays.
    store.defer(delivery, Some(5), webhooks_model::time::now(), Some((3, 3)), None).await.unwrap();
    assert!(queue_row(store, delivery).await.5, "still claimed");

    // `send` re-arms it: next generation, first attempt, forced, due now.
    assert_eq!(store.send_event(&active, &new.id).await.unwrap(), SendOutcome::Queued);
    tokio::time::timeout(Duration::from_secs(1), work.notified()).await.expect("queue woken");
    let sent = store.claim_due(10, 10).await.unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].delivery_id, sent[0].attempt, sent[0].force, sent[0].generation), (delivery, 1, true, Some(1)));
    assert_eq!((sent[0].parks, sent[0].failures), (0, 0), "a new generation starts unparked");
    assert_eq!(store.admission(delivery, Some(0), 2).await.unwrap(), Admission::Superseded);

    // The outcome of the replaced generation is logged, and changes nothing.
    let stale = outcome(
        delivery,
        &active.id,
        DeliveryState::Failed,
        Some(0),
        Some(log(&new.id, 2, webhooks_model::time::now())),
    );
    store.record_attempts(&[stale]).await.unwrap();
    let (state, generation, attempts, _, force, claimed, _) = queue_row(store, delivery).await;
    assert_eq!((state.as_str(), generation, attempts, force, claimed), ("pending", 1, 1, true, true));

    let delivered = outcome(
        delivery,
        &active.id,
        DeliveryState::Succeeded,
        Some(1),
        Some(log(&new.id, 1, webhooks_model::time::now())),
    );
    store.record_attempts(&[delivered]).await.unwrap();
    assert_eq!(queue_row(store, delivery).await, ("succeeded".into(), 1, 2, 2, false, false, None));
    assert_eq!(store.admission(delivery, Some(1), 2).await.unwrap(), Admission::Superseded);
    assert_eq!(store.next_due_at(true).await.unwrap(), None);
    assert_eq!(
        store.list_logs(&active.id, 10, None, &Default::default()).await.unwrap().unwrap().len(),
        3,
        "every attempt is logged"
    );
}

#[tokio::test]
async fn the_state_never_goes_backwards() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let active = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    let new = event(developer);
    store.ingest_event(&new).await.unwrap();
    let delivery = store.claim_due(1, 1).await.unwrap()[0].delivery_id;
    let at = |attempt, state| {
        let mut record =
            outcome(delivery, &active.id, state, Some(0), Some(log(&new.id, attempt, webhooks_model::time::now())));
        record.next_attempt_at = (state == DeliveryState::Retrying).then(webhooks_model::time::now);
        record
    };

    // Attempts 1 and 2 failed; then a duplicate of attempt 1 failed again.
    store.record_attempts(&[at(1, DeliveryState::Retrying)]).await.unwrap();
    store.record_attempts(&[at(2, DeliveryState::Retrying)]).await.unwrap();
    store.record_attempts(&[at(1, DeliveryState::Failed)]).await.unwrap();
    let (state, _, attempts, next_attempt, ..) = queue_row(store, delivery).await;
    assert_eq!((state.as_str(), attempts, next_attempt), ("retrying", 2, 3), "an older attempt changed the state");
    // Its retry, attempt 2 again, is a fork of the chain: dropped.
    assert_eq!(store.admission(delivery, Some(0), 2).await.unwrap(), Admission::Superseded);
    assert_eq!(store.admission(delivery, Some(0), 3).await.unwrap(), Admission::Go { ordered: false });

    // Success is final within the generation: a late failure changes nothing.
    store.record_attempts(&[at(3, DeliveryState::Succeeded)]).await.unwrap();
    store.record_attempts(&[at(4, DeliveryState::Retrying)]).await.unwrap();
    assert_eq!(queue_row(store, delivery).await.0, "succeeded");
    assert_eq!(store.admission(delivery, Some(0), 5).await.unwrap(), Admission::Superseded);
    assert_eq!(
        store.list_logs(&active.id, 10, None, &Default::default()).await.unwrap().unwrap().len(),
        5,
        "every attempt is logged"
    );
}

#[tokio::test]
async fn deleting_an_endpoint_cancels_its_deliveries_for_good() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let active = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    let new = event(developer);
    store.ingest_event(&new).await.unwrap();
    let claimed = store.claim_due(1, 1).await.unwrap();

    let mut changes = store.changes();
    store.delete_endpoint(developer, &active.id, BY).await.unwrap().expect("deleted");
    let change = changes.try_recv().expect("deletion announced");
    assert_eq!((change.change, change.endpoint_id.as_str()), (ChangeKind::Deleted, active.id.as_str()));
    assert!(store.get_endpoint(developer, &active.id).await.unwrap().is_none());
    assert_eq!(store.load_endpoint(&active.id).await.unwrap().unwrap().status, EndpointStatus::Deleted);

    let delivery = claimed[0].delivery_id;
    let late = outcome(
        delivery,
        &active.id,
        DeliveryState::Succeeded,
        None,
        Some(log(&new.id, 1, webhooks_model::time::now())),
    );
    store.record_attempts(&[late]).await.unwrap();
    assert_eq!(queue_row(store, delivery).await.0, "cancelled");
    assert_eq!(store.admission(delivery, None, 2).await.unwrap(), Admission::Superseded);
}

#[tokio::test]
async fn updates_record_one_change_per_field() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let disabled = endpoint(store, developer, vec![], EndpointStatus::Disabled).await;
    let mut changes = store.changes();
    let update = EndpointUpdate {
        url: Some("https://elsewhere.example/".into()),
        status: Some(EndpointStatus::Active),
        event_categories: Some(vec![Category::Transfer, Category::Customer, Category::Transfer]),
        ..EndpointUpdate::default()
    };
    let UpdateOutcome::Updated(updated) = store.update_endpoint(developer, &disabled.id, update, BY).await.unwrap()
    else {
        panic!("refused")
    };
    let kinds: Vec<ChangeKind> = std::iter::from_fn(|| changes.try_recv().ok()).map(|c| c.change).collect();
    assert_eq!(kinds, [ChangeKind::UrlChanged, ChangeKind::CategoriesChanged, ChangeKind::Activated]);
    let loaded = store.get_endpoint(developer, &disabled.id).await.unwrap().unwrap();
    assert_eq!(loaded.event_categories, [Category::Customer, Category::Transfer]);
    assert_eq!((loaded.url.as_str(), loaded.status), ("https://elsewhere.example/", EndpointStatus::Active));
    assert_eq!((loaded.updated_at, loaded.private_key.as_slice()), (updated.updated_at, [0, 1, 2].as_slice()));

    let move_url = EndpointUpdate { url: Some("https://third.example/".into()), ..EndpointUpdate::default() };
    let refused = store.update_endpoint(developer, &disabled.id, move_url, BY).await.unwrap();
    assert!(matches!(refused, UpdateOutcome::UrlChangeWhileActive));
    let missing = store.update_endpoint(developer, "wep_missing", EndpointUpdate::default(), BY).await.unwrap();
    assert!(matches!(missing, UpdateOutcome::NotFound));
}

#[tokio::test]
async fn send_checks_the_event_and_the_endpoint() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let transfers = endpoint(store, developer, vec![Category::Transfer], EndpointStatus::Disabled).await;
    let customer = event(developer);
    store.ingest_event(&customer).await.unwrap();
    assert_eq!(store.send_event(&transfers, "wh_missing").await.unwrap(), SendOutcome::NoSuchEvent);
    assert_eq!(store.send_event(&transfers, &customer.id).await.unwrap(), SendOutcome::NotForEndpoint);
    let transfer = event_at(developer, Category::Transfer, webhooks_model::time::now());
    store.ingest_event(&transfer).await.unwrap();
    assert!(store.claim_due(10, 10).await.unwrap().is_empty(), "held for a disabled endpoint");
    assert_eq!(store.send_event(&transfers, &transfer.id).await.unwrap(), SendOutcome::Queued);
    let sent = store.claim_due(10, 10).await.unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].event_id.as_str(), sent[0].force, sent[0].generation), (transfer.id.as_str(), true, Some(1)));
}

#[tokio::test]
async fn upcoming_events_include_earlier_ones_from_the_beginning_of_time() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let earlier = event_at(developer, Category::Customer, webhooks_model::time::now() - chrono::Duration::seconds(10));
    let earlier_transfer =
        event_at(developer, Category::Transfer, webhooks_model::time::now() - chrono::Duration::seconds(9));
    store.ingest_event(&earlier).await.unwrap();
    store.ingest_event(&earlier_transfer).await.unwrap();
    let new = new_endpoint(developer, EventEpoch::BeginningOfTime, vec![Category::Customer]);
    let everything = store.create_endpoint(new, 10, BY).await.unwrap().unwrap();
    let recent = store.create_endpoint(new_endpoint(developer, EventEpoch::WebhookCreation, vec![]), 10, BY).await;
    let recent = recent.unwrap().unwrap();
    let later = event(developer);
    store.ingest_event(&later).await.unwrap();

    let ids = |events: Vec<crate::StoredEvent>| events.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(ids(store.upcoming_events(&everything, 10).await.unwrap()), [earlier.id.as_str(), later.id.as_str()]);
    assert_eq!(ids(store.upcoming_events(&everything, 1).await.unwrap()), [earlier.id.as_str()]);
    assert_eq!(ids(store.upcoming_events(&recent, 10).await.unwrap()), [later.id.as_str()]);
}

#[tokio::test]
async fn events_page_newest_first_by_time_then_id() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let t0 = webhooks_model::time::now() - chrono::Duration::seconds(60);
    let at = |seconds: i64| t0 + chrono::Duration::seconds(seconds);
    // Stored out of order; two share a time and are told apart by id.
    let specs = [("wh_c", 2, Category::Customer), ("wh_a", 0, Category::Customer), ("wh_e", 1, Category::Transfer)];
    let more = [("wh_d", 1, Category::Customer), ("wh_b", 1, Category::Customer)];
    for (id, seconds, category) in specs.into_iter().chain(more) {
        store.ingest_event(&NewEvent { id: id.into(), ..event_at(developer, category, at(seconds)) }).await.unwrap();
    }
    store.ingest_event(&NewEvent { id: "wh_x".into(), ..event(Uuid::new_v4()) }).await.unwrap();

    let list = |page: EventPage<'static>| async move {
        store
            .list_events(developer, &page)
            .await
            .unwrap()
            .map(|events| events.into_iter().map(|e| e.id).collect::<Vec<_>>())
    };
    let page = |limit| EventPage { limit, ..EventPage::default() };
    assert_eq!(list(page(10)).await.unwrap(), ["wh_c", "wh_e", "wh_d", "wh_b", "wh_a"]);
    assert_eq!(list(page(2)).await.unwrap(), ["wh_c", "wh_e"]);
    assert_eq!(list(EventPage { starting_after: Some("wh_e"), ..page(2) }).await.unwrap(), ["wh_d", "wh_b"]);
    assert_eq!(list(EventPage { ending_before: Some("wh_b"), ..page(2) }).await.unwrap(), ["wh_e", "wh_d"]);
    assert_eq!(
        list(EventPage { starting_after: Some("wh_c"), ending_before: Some("wh_a"), ..page(10) }).await.unwrap(),
        ["wh_e", "wh_d", "wh_b"]
    );
    let customers = EventPage { category: Some(Category::Customer), starting_after: Some("wh_e"), ..page(10) };
    assert_eq!(list(customers).await.unwrap(), ["wh_d", "wh_b", "wh_a"]);
    assert_eq!(list(EventPage { starting_after: Some("wh_missing"), ..page(10) }).await, None);
    assert_eq!(list(EventPage { ending_before: Some("wh_x"), ..page(10) }).await, None, "another developer's event");
}

#[tokio::test]
async fn logs_page_newest_first() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    let active = endpoint(store, developer, vec![], EndpointStatus::Active).await;
    let new =
        NewEvent { body_head: "{\"event_type\":\"customer.created\",\"event_sequence\":".into(), ..event(developer) };
    store.ingest_event(&new).await.unwrap();
    let delivery = store.claim_due(1, 1).await.unwrap()[0].delivery_id;
    let t0 = webhooks_model::time::now();
    let logs: Vec<DeliveryLog> =
        (0..5).map(|i| log(&new.id, i + 1, t0 + chrono::Duration::seconds(i64::from(i / 2)))).collect();
    let records: Vec<AttemptRecord> =
        logs.iter().map(|l| outcome(delivery, &active.id, DeliveryState::Retrying, Some(0), Some(l.clone()))).collect();
    store.record_attempts(&records).await.unwrap();
    store.record_attempts(&records[..1]).await.unwrap();

    let mut newest_first = logs.clone();
    newest_first.sort_by_key(|l| std::cmp::Reverse((l.created_at, l.id)));
    let all = store.list_logs(&active.id, 10, None, &Default::default()).await.unwrap().unwrap();
    // Each entry is read with its event's type.
    let stored_type = all.first().and_then(|l| l.event_type.clone());
    assert_eq!(stored_type.as_deref(), Some("customer.created"), "{all:?}");
    for l in &mut newest_first {
        l.event_type = stored_type.clone();
    }
    assert_eq!(all, newest_first, "each log once, newest first");
    let rest = store.list_logs(&active.id, 2, Some(newest_first[1].id), &Default::default()).await.unwrap().unwrap();
    assert_eq!(rest, newest_first[2..4]);
    assert_eq!(store.list_logs(&active.id, 10, Some(Uuid::now_v7()), &Default::default()).await.unwrap(), None);
    assert_eq!(store.list_logs("wep_other", 10, Some(newest_first[0].id), &Default::default()).await.unwrap(), None);
}

#[tokio::test]
async fn idempotency_keys_claim_complete_and_expire() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer = Uuid::new_v4();
    assert_eq!(store.claim_idempotency_key(developer, "k", b"one").await.unwrap(), Claim::Claimed);
    assert_eq!(store.claim_idempotency_key(developer, "k", b"one").await.unwrap(), Claim::InProgress);
    assert_eq!(store.claim_idempotency_key(developer, "k", b"two").await.unwrap(), Claim::Mismatch);
    let response = StoredResponse { status: 201, body: b"{}".to_vec() };
    store.complete_idempotency_key(developer, "k", &response).await.unwrap();
    assert_eq!(store.claim_idempotency_key(developer, "k", b"one").await.unwrap(), Claim::Completed(response));
    store.release_idempotency_key(developer, "k").await.unwrap();
    assert!(matches!(store.claim_idempotency_key(developer, "k", b"one").await.unwrap(), Claim::Completed(_)));

    // A released claim is free again.
    assert_eq!(store.claim_idempotency_key(developer, "r", b"one").await.unwrap(), Claim::Claimed);
    store.release_idempotency_key(developer, "r").await.unwrap();
    assert_eq!(store.claim_idempotency_key(developer, "r", b"two").await.unwrap(), Claim::Claimed);

    // An abandoned claim is taken over; an answer outlives the claim timeout.
    let age = |minutes: i64| (webhooks_model::time::now() - chrono::Duration::minutes(minutes)).timestamp_micros();
    sqlx::query("UPDATE idempotency_keys SET created_at = $1").bind(age(6)).execute(&store.writer).await.unwrap();
    assert_eq!(store.claim_idempotency_key(developer, "r", b"three").await.unwrap(), Claim::Claimed);
    assert!(matches!(store.claim_idempotency_key(developer, "k", b"one").await.unwrap(), Claim::Completed(_)));

    sqlx::query("UPDATE idempotency_keys SET created_at = $1 WHERE key = 'k'")
        .bind(age(24 * 60 + 1))
        .execute(&store.writer)
        .await
        .unwrap();
    assert_eq!(store.purge_idempotency_keys().await.unwrap(), 1);
    assert_eq!(store.claim_idempotency_key(developer, "k", b"two").await.unwrap(), Claim::Claimed);
}

#[tokio::test]
async fn commits_are_durable_and_checked() {
    let scratch = Scratch::new().await;
    // A claim commits without syncing, and sets the writer back.
    let developer = Uuid::new_v4();
    endpoint(&scratch.store, developer, vec![], EndpointStatus::Active).await;
    scratch.store.ingest_event(&event(developer)).await.unwrap();
    assert_eq!(scratch.store.claim_due(10, 10).await.unwrap().len(), 1);
    let mut writer = scratch.store.writer.acquire().await.unwrap();
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&mut *writer).await.unwrap();
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *writer).await.unwrap();
    let foreign_keys: bool = sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(&mut *writer).await.unwrap();
    assert_eq!((journal.as_str(), synchronous, foreign_keys), ("wal", 2, true), "WAL, synchronous = FULL");
}

#[tokio::test]
async fn data_survives_closing_and_reopening() {
    let mut scratch = Scratch::new().await;
    assert!(!scratch.store.has_api_keys().await.unwrap(), "a new store has no key");
    let developer = Uuid::new_v4();
    let scopes = [Scope::WebhooksRead, Scope::WebhooksWrite];
    let key = NewApiKey {
        developer_id: developer,
        kind: ApiKeyType::Private,
        prefix: "sk-test",
        key_hash: crate::hash_key("sk-test-secret"),
        last_4: "cret",
        scopes: &scopes,
        name: Some("ci"),
    };
    let created = scratch.store.create_api_key(key).await.unwrap();
    assert!(scratch.store.has_api_keys().await.unwrap());
    let active = endpoint(&scratch.store, developer, vec![Category::Customer], EndpointStatus::Active).await;
    let first = scratch.store.ingest_event(&event(developer)).await.unwrap();

    scratch.store.close().await;
    scratch.store = SqliteStore::open(&scratch.dir).await.unwrap();
    let store = &scratch.store;

    let found = store.find_active_api_key(&crate::hash_key("sk-test-secret")).await.unwrap().unwrap();
    assert_eq!(found, created);
    assert_eq!(found.scopes, scopes);
    assert_eq!(store.list_api_keys(developer).await.unwrap(), std::slice::from_ref(&created));
    assert_eq!(
        store.get_endpoint(developer, &active.id).await.unwrap().unwrap().event_categories,
        [Category::Customer]
    );
    let events = store.list_events(developer, &EventPage { limit: 10, ..EventPage::default() }).await.unwrap().unwrap();
    assert_eq!(events.iter().map(|e| e.body.as_str()).collect::<Vec<_>>(), [first.body.as_str()]);
    assert_eq!(store.claim_due(10, 10).await.unwrap().len(), 1, "the queued delivery survived");
    assert_eq!(store.ingest_event(&event(developer)).await.unwrap().sequence, 2);

    let deleted = store.delete_api_key(developer, created.id).await.unwrap().unwrap();
    assert_eq!(deleted.state, webhooks_model::ApiKeyState::Deleted);
    assert!(store.find_active_api_key(&crate::hash_key("sk-test-secret")).await.unwrap().is_none());
    assert!(store.delete_api_key(developer, created.id).await.unwrap().is_none());
    store.ping().await.unwrap();
}

/// The single-event forms the tests above read best in.
impl SqliteStore {
    pub(crate) async fn ingest_event(&self, event: &NewEvent) -> StoreResult<IngestOutcome> {
        self.ingest_events(&[event]).await?.pop().expect("one outcome per event")
    }

    async fn admission(&self, delivery_id: i64, generation: Option<i32>, attempt: i32) -> StoreResult<Admission> {
        let question = asked(delivery_id, generation, attempt);
        Ok(self.admissions(&[question]).await?.pop().expect("one answer per question"))
    }
}

#[tokio::test]
async fn a_stored_value_that_does_not_read_is_corrupt_and_named() {
    let scratch = Scratch::new().await;
    let store = &scratch.store;
    let developer_id = Uuid::new_v4();
    let created = endpoint(store, developer_id, vec![Category::Customer], EndpointStatus::Active).await;
    for (column, value) in [("event_types", "not a list"), ("created_at", "9223372036854775807")] {
        sqlx::query(&format!("UPDATE endpoints SET {column} = $1 WHERE id = $2"))
            .bind(value)
            .bind(&created.id)
            .execute(&store.writer)
            .await
            .unwrap();
        match store.get_endpoint(developer_id, &created.id).await {
            Err(StoreError::Corrupt(message)) => assert!(message.contains(column), "{column}: {message}"),
            other => panic!("{column}: {:?}", other.map(|found| found.map(|e| e.id))),
        }
        sqlx::query(&format!("UPDATE endpoints SET {column} = $1 WHERE id = $2"))
            .bind(if column == "event_types" { "[]" } else { "0" })
            .bind(&created.id)
            .execute(&store.writer)
            .await
            .unwrap();
    }
    let restored = store.get_endpoint(developer_id, &created.id).await.unwrap().expect("found");
    assert_eq!(restored.event_types, Vec::<String>::new());
}
