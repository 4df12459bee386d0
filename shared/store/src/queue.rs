//! What the store keeps for the queue of its deployment, beside [`Store`]:
//!
//! - [`Outbox`] (PostgreSQL): the transactional outbox the relay publishes
//!   to RabbitMQ, the due times of messages parked in the broker, deliveries
//!   set aside with no message at all, and the sweeps that queue again what
//!   no queue holds;
//! - [`DeliveryTable`] (SQLite): the deliveries table, which is itself the
//!   queue of standalone mode.
//!
//! Only the queue (`webhooks-queue`) works with these; everything else goes
//! through [`Store`].

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;
use webhooks_model::{EndpointChanged, Lane};

use crate::{
    DueDelivery, Parked, Store, StoreResult,
    pg::{self, PgStore},
    sqlite::SqliteStore,
};

pub use pg::{LostProcess, OutboxItem, OutboxRow, Presence, QueueMark, QueueProgress, Swept};

/// The store's side of the queue of this deployment.
#[derive(Debug, Clone)]
pub enum QueueStore {
    /// PostgreSQL: RabbitMQ carries the messages.
    Outbox(Outbox),
    /// SQLite: the deliveries table is the queue.
    Table(DeliveryTable),
}

/// The broker's queue as the PostgreSQL store keeps it.
#[derive(Debug, Clone)]
pub struct Outbox(PgStore);

/// The queue of standalone mode: the SQLite store's deliveries table.
#[derive(Debug, Clone)]
pub struct DeliveryTable(SqliteStore);

impl Store {
    pub(crate) fn postgres(store: PgStore) -> (Store, QueueStore) {
        let queue = QueueStore::Outbox(Outbox(store.clone()));
        (Store { backend: crate::Backend::Postgres(store) }, queue)
    }

    pub(crate) fn sqlite(store: SqliteStore) -> (Store, QueueStore) {
        let queue = QueueStore::Table(DeliveryTable(store.clone()));
        (Store { backend: crate::Backend::Sqlite(store) }, queue)
    }
}

impl Outbox {
    /// Claims up to `limit` of the oldest unclaimed rows for `lease` (rows
    /// another relay claimed are skipped until its claim lapses) and returns
    /// what each announces. Delete them once published, or release them.
    pub async fn claim(&self, limit: i64, lease: Duration) -> StoreResult<Vec<OutboxRow>> {
        self.0.claim_outbox(limit, lease).await
    }

    /// Deletes rows that were published (or announce nothing any more);
    /// their messages entered stamped `entered`. A delivery due more than
    /// `allowance` before that has its due time moved up to it.
    pub async fn delete(&self, ids: &[i64], entered: DateTime<Utc>, allowance: Duration) -> StoreResult<()> {
        self.0.delete_outbox(ids, entered, allowance).await
    }

    /// Gives claimed rows back at once, for the next round to try again.
    pub async fn release(&self, ids: &[i64]) -> StoreResult<()> {
        self.0.release_outbox(ids).await
    }

    /// Writes rows for first attempts that the relay could not publish,
    /// unless their delivery has moved on since or has a row already.
    pub async fn first_attempts(&self, deliveries: &[(i64, Lane)]) -> StoreResult<()> {
        self.0.outbox_first_attempts(deliveries).await
    }

    /// Wakes `wake` whenever another process wrote outbox rows and said so
    /// (a dispatcher that handed an ordered endpoint's turn on), until
    /// `shutdown`; the relay's slow scan stays the safety net while it cannot
    /// listen.
    pub async fn notify_writes(&self, wake: Arc<Notify>, shutdown: CancellationToken) {
        self.0.listen_outbox(wake, shutdown).await;
    }

    /// Moves the due times of deliveries whose messages were parked in the
    /// broker's retry queues, or set aside with no message at all
    /// (`Parked::set_aside`), in one statement.
    pub async fn park(&self, parked: &[Parked]) -> StoreResult<()> {
        self.0.defer_parked(parked).await
    }

    /// Queues again up to `batch` deliveries set aside behind `endpoint_id`,
    /// in event order, each under a new generation: the endpoint answered
    /// again. Returns how many.
    pub async fn release_set_aside(&self, endpoint_id: &str, batch: i64) -> StoreResult<u64> {
        self.0.release_set_aside(endpoint_id, batch).await
    }

    /// Queues again up to `batch` deliveries of `lane` (`swept`: whose
    /// latest message went to the swept queue) that are due before
    /// `watermark` and that no queue holds; fails those queued again `limit`
    /// times already without an attempt (see `pg/sweep.rs`).
    pub async fn sweep_stranded(
        &self,
        lane: Lane,
        swept: bool,
        watermark: DateTime<Utc>,
        batch: i64,
        limit: i32,
    ) -> StoreResult<Swept> {
        self.0.sweep_stranded(lane, swept, watermark, batch, limit).await
    }

    /// Queues again, to the swept queue, up to `batch` first attempts of
    /// `lane` of events made within `window` that are not attempted and
    /// have no outbox row: a process that died may have lost their
    /// messages. Returns how many.
    pub async fn requeue_first_attempts(
        &self,
        lane: Lane,
        window: (DateTime<Utc>, DateTime<Utc>),
        batch: i64,
    ) -> StoreResult<u64> {
        self.0.requeue_first_attempts(lane, window, batch).await
    }

    /// Queues again up to `batch` deliveries set aside behind a hanging
    /// endpoint whose due time has come.
    pub async fn sweep_set_aside(&self, batch: i64) -> StoreResult<Swept> {
        self.0.sweep_set_aside(batch).await
    }

    /// How many deliveries of `lane` are stranded by `watermark`, counted up
    /// to `at_most`.
    pub async fn count_stranded(&self, lane: Lane, watermark: DateTime<Utc>, at_most: i64) -> StoreResult<i64> {
        self.0.count_stranded(lane, watermark, at_most).await
    }

    /// Hands on the turns of ordered endpoints that no settling handed on,
    /// looking at up to `batch` endpoints after `after` (see
    /// `pg/turns.rs`); returns how many were released and where to go on.
    pub async fn release_stalled_turns(&self, after: Option<&str>, batch: i64) -> StoreResult<(u64, Option<String>)> {
        self.0.release_stalled_turns(after, batch).await
    }

    /// Says that this process is alive, and what it knows (see
    /// `pg/processes.rs`); answers with the database's clock.
    pub async fn seen(&self, presence: &Presence) -> StoreResult<DateTime<Utc>> {
        self.0.process_seen(presence).await
    }

    /// The processes not seen for `after`, oldest first.
    pub async fn lost_processes(&self, after: Duration) -> StoreResult<Vec<LostProcess>> {
        self.0.lost_processes(after).await
    }

    /// Forgets a lost process, and what it held.
    pub async fn forget_process(&self, id: uuid::Uuid) -> StoreResult<()> {
        self.0.forget_process(id).await
    }

    /// How far the work queues have got, holds counted for the processes
    /// seen within `live`.
    pub async fn queue_progress(&self, live: Duration) -> StoreResult<QueueProgress> {
        self.0.queue_progress(live).await
    }

    /// Reads the history's layout again (another process made or dropped
    /// a day's partitions, or converted the tables), and makes the coming
    /// days' partitions should they be missing.
    pub async fn keep_partitions(&self) -> StoreResult<()> {
        self.0.maintain_history(None).await.map(|_| ())
    }

    /// Outbox rows waiting to be published.
    pub async fn count_rows(&self) -> StoreResult<i64> {
        self.0.count_outbox().await
    }
}

impl DeliveryTable {
    /// Claims up to `limit` due deliveries, those of the default lane first
    /// and at most `bulk_limit` of the bulk lane.
    pub async fn claim_due(&self, limit: usize, bulk_limit: usize) -> StoreResult<Vec<DueDelivery>> {
        self.0.claim_due(limit, bulk_limit).await
    }

    /// When the next unclaimed delivery falls due; only the default lane's
    /// unless `bulk`.
    pub async fn next_due_at(&self, bulk: bool) -> StoreResult<Option<DateTime<Utc>>> {
        self.0.next_due_at(bulk).await
    }

    /// Puts a claimed delivery back, due at `until`, without counting an
    /// attempt; `parks` and `pace_ticket` are kept for its next claim (`None`
    /// keeps the stored ones).
    pub async fn put_back(
        &self,
        delivery_id: i64,
        generation: Option<i32>,
        until: DateTime<Utc>,
        parks: Option<(u32, u32)>,
        pace_ticket: Option<i64>,
    ) -> StoreResult<()> {
        self.0.defer(delivery_id, generation, until, parks, pace_ticket).await
    }

    /// Makes the deliveries of `endpoint_id` that were put back for a while
    /// due now: the endpoint answered again. Returns how many.
    pub async fn bring_forward(&self, endpoint_id: &str) -> StoreResult<u64> {
        self.0.bring_forward(endpoint_id).await
    }

    /// Releases every claim: the process that held them stopped.
    pub async fn release_claims(&self) -> StoreResult<u64> {
        self.0.release_claims().await
    }

    /// Notified after every commit that made a delivery due now.
    pub fn work(&self) -> Arc<Notify> {
        self.0.work()
    }

    /// Every endpoint change, once committed.
    pub fn changes(&self) -> broadcast::Receiver<EndpointChanged> {
        self.0.changes()
    }
}
