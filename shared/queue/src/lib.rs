//! The queue seam: how a delivery's message gets from the commit that made
//! it due to a dispatcher, and how its outcome is carried out.
//!
//! - [`message`]: the delivery message, its codec and its only constructors;
//! - [`amqp`]: RabbitMQ, the distributed mode: the relay that publishes what
//!   the API committed, the lane consumers, the settler, the retry queues,
//!   the sweeper that queues again what no queue holds, dead letters;
//! - `embedded`: standalone mode, where the SQLite store's deliveries table
//!   is the queue.
//!
//! [`Queue`] is an enum over the two, as the store is. The API enqueues
//! through a [`Producer`]; a dispatcher consumes with [`Queue::consume`],
//! whose handler decides an [`Outcome`] for each [`Delivery`] and hands it
//! back to [`Delivery::settle`]: the worker decides, the queue acts.

pub mod amqp;
mod embedded;
mod handlers;
pub mod message;
pub mod metrics;
mod recorder;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use webhooks_model::{RetrySchedule, Topology};
use webhooks_store::{AttemptRecord, Store, queue::QueueStore};

pub use amqp::Pending;
pub use message::{DecodeError, DeliveryMessage, Message, PARK_LIMIT};

/// Faults a test injects into a running process, as a crash or a lost
/// message would cause them; all off unless a test turns one on. Clones
/// share their switches.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    lose_first_attempts: Arc<std::sync::atomic::AtomicBool>,
}

impl Faults {
    /// While on, first attempts handed to the relay after their commit are
    /// dropped unpublished, as when the API process is killed between the
    /// commit and the broker's confirm.
    pub fn lose_first_attempts(&self, on: bool) {
        self.lose_first_attempts.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn losing_first_attempts(&self) -> bool {
        self.lose_first_attempts.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How the queue runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The names of every exchange and queue (RabbitMQ).
    pub topology: Topology,
    /// Where RabbitMQ listens (the distributed mode): the addresses of
    /// `AMQP_URL`.
    pub brokers: amqp::Brokers,
    /// Unacknowledged messages held at once, per lane (RabbitMQ).
    pub prefetch: u16,
    /// Messages handled at once.
    pub concurrency: usize,
    /// How long a stopping consumer lets its handlers finish.
    pub shutdown_timeout: Duration,
    /// The retry schedule: how long a message put back waits.
    pub retry_schedule: RetrySchedule,
    /// The process's clock against the database's (RabbitMQ).
    pub clock: Arc<metrics::ClockMetrics>,
}

/// The queue of the deployment. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Queue {
    Broker(amqp::Broker),
    Embedded(embedded::Embedded),
}

/// What a handler decided for a message; [`Delivery::settle`] carries it
/// out. Each variant's `why` is the outcome's name in metrics and logs.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing to do and nothing to record: the message was overtaken
    /// (`superseded`), or its delivery waits for an ordered endpoint's turn
    /// (`waiting`), which the store already wrote.
    Dropped { why: &'static str },
    /// Record this, then take the message off the queue: `succeeded`,
    /// `failed`, `held`, `cancelled`.
    Settled { record: AttemptRecord, why: &'static str },
    /// The attempt failed: record it, and make `next` after `delay`
    /// (`record.next_attempt_at`).
    Retry { record: AttemptRecord, next: DeliveryMessage, delay: Duration },
    /// Put the message back for `delay` without an attempt: its endpoint was
    /// busy (`deferred`), its pace start is later (`paced`), or something
    /// failed (`parked`). `message` already counts this put-back.
    PutBack { message: DeliveryMessage, delay: Duration, why: &'static str },
    /// Its endpoint hangs: the delivery waits without a message until the
    /// endpoint answers again ([`Queue::endpoint_recovered`]) or `delay`
    /// passes.
    SetAside { message: DeliveryMessage, delay: Duration },
    /// Put back for a failure [`PARK_LIMIT`] times: give up on the message.
    /// RabbitMQ dead-letters it (the delivery stays owed, and is swept
    /// again later); the embedded queue records the delivery `failed`, with
    /// `reason` in its log.
    GiveUp { message: DeliveryMessage, reason: String },
}

/// A message handed to a dispatcher, and how to settle it.
#[derive(Debug)]
pub struct Delivery {
    pub message: DeliveryMessage,
    ticket: Ticket,
}

#[derive(Debug)]
enum Ticket {
    Broker(amqp::consumer::AmqpTicket),
    Embedded(embedded::EmbeddedTicket),
}

impl Delivery {
    /// Whether the message stands without asking the store again, and
    /// needs no turn of an ordered endpoint: the embedded queue read it from
    /// the store as it claimed it, in its turn; a broker hands out a first
    /// attempt the ingest admitted, fresh ([`DeliveryMessage::stands_unasked`]).
    /// Any other broker message may have been overtaken while it waited.
    pub fn admitted(&self) -> bool {
        match &self.ticket {
            Ticket::Broker(ticket) => self.message.stands_unasked(ticket.redelivered, webhooks_model::time::now()),
            Ticket::Embedded(_) => true,
        }
    }

    /// Carries `outcome` out: the record is committed before the message
    /// leaves the queue, so a crash repeats an attempt, never loses one.
    /// Returns the name of what was done (it differs from the outcome's when
    /// a fallback was taken: `requeued`, `dead_lettered`).
    pub async fn settle(self, outcome: Outcome) -> &'static str {
        match self.ticket {
            Ticket::Broker(ticket) => ticket.settle(self.message, outcome).await,
            Ticket::Embedded(ticket) => ticket.settle(self.message, outcome).await,
        }
    }
}

/// What a consumer hands its messages to.
pub trait Handler: Send + Sync + 'static {
    /// Handles one message to the end: decides its outcome and settles it.
    fn handle(&self, delivery: Delivery) -> impl Future<Output = ()> + Send;
    /// An endpoint changed: drop whatever is known of it.
    fn endpoint_changed(&self, endpoint_id: &str);
    /// Changes may have been missed (a reconnect, a lagging listener): drop
    /// everything known of endpoints.
    fn forget_endpoints(&self);
    /// A message was refused (unreadable, or of a version this build does
    /// not know) and dead-lettered with the reason.
    fn refused(&self) {}
}

/// The longest a put-back message waits: a saturated endpoint's backlog is
/// looked at again at least this often, whatever the retry schedule.
pub const PUT_BACK_AT_MOST: Duration = Duration::from_secs(300);

/// The wait before the next try of a message put back `parks` times
/// already: twice as long each time, from the shortest retry delay up to the
/// longest (at most [`PUT_BACK_AT_MOST`]), so a backlog behind a saturated
/// endpoint does not cycle through the shortest retry queue.
pub fn put_back_delay(schedule: &RetrySchedule, parks: u32) -> Duration {
    let delays = schedule.delays();
    let shortest = delays.iter().min().copied().unwrap_or(Duration::from_secs(1));
    let longest = delays.iter().max().copied().unwrap_or(shortest).min(PUT_BACK_AT_MOST);
    shortest.saturating_mul(1u32 << parks.min(20)).min(longest).max(shortest)
}

impl Queue {
    /// The queue over `queue_store`: RabbitMQ beside PostgreSQL's outbox, or
    /// the SQLite deliveries table. Its batched writers run on `writers`,
    /// which drain once every handle is dropped.
    pub fn new(store: Store, queue_store: QueueStore, settings: Settings, writers: &TaskTracker) -> Queue {
        let recorder = recorder::Recorder::spawn(store, writers);
        match queue_store {
            QueueStore::Outbox(outbox) => Queue::Broker(amqp::Broker::new(outbox, settings, recorder, writers)),
            QueueStore::Table(table) => Queue::Embedded(embedded::Embedded::new(table, settings, recorder)),
        }
    }

    /// Consumes until `shutdown`, handing each message to `handler`; then
    /// stops taking messages and lets those in hand finish within
    /// `shutdown_timeout` (the rest go back to the queue). `ready` says
    /// whether a broker connection serves (always true for the embedded
    /// queue).
    pub async fn consume<H: Handler>(
        &self,
        handler: Arc<H>,
        ready: watch::Sender<bool>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        match self {
            Queue::Broker(broker) => {
                broker.consume(handler, ready, shutdown).await;
                Ok(())
            }
            Queue::Embedded(embedded) => {
                ready.send_replace(true);
                embedded.consume(handler, shutdown).await
            }
        }
    }

    /// An endpoint found hung answered again: what was set aside behind it
    /// comes back now rather than at its due time.
    pub async fn endpoint_recovered(&self, endpoint_id: &str) {
        match self {
            Queue::Broker(broker) => broker.release_set_aside(endpoint_id).await,
            Queue::Embedded(embedded) => embedded.bring_forward(endpoint_id).await,
        }
    }
}

/// How committed deliveries reach the queue. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Producer {
    /// RabbitMQ, through the relay.
    Broker(amqp::relay::Publisher),
    /// The deliveries table: a commit is the enqueue.
    Embedded,
}

impl Producer {
    /// The API's side of the queue over `queue_store`: for RabbitMQ, says
    /// the process is alive (before it takes any work), then starts the
    /// relay, the heartbeat and the sweeper on `tasks`, until `shutdown`.
    pub async fn start(
        queue_store: QueueStore,
        broker: amqp::BrokerSettings,
        metrics: &metrics::QueueMetrics,
        sweep: amqp::sweeper::SweepSettings,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Producer {
        match queue_store {
            QueueStore::Outbox(outbox) => {
                Producer::Broker(amqp::produce(outbox, broker, metrics, sweep, tasks, shutdown).await)
            }
            QueueStore::Table(_) => Producer::Embedded,
        }
    }

    /// An event stamped `created_at` is about to be stored: until the
    /// returned token, handed over with its first attempts, is dropped, they
    /// are on their way (RabbitMQ: the process's `confirmed_through` stays
    /// before them, DESIGN.md "Knowing what is stranded").
    pub fn pending(&self, created_at: chrono::DateTime<chrono::Utc>) -> Arc<Pending> {
        match self {
            Producer::Broker(publisher) => publisher.pending(created_at),
            Producer::Embedded => Arc::default(),
        }
    }

    /// Hands over the first attempts of deliveries an ingest just
    /// committed, each with its event's token. RabbitMQ publishes them at
    /// once (or writes them to the outbox when it cannot); the embedded
    /// queue holds them already.
    pub async fn enqueue(&self, first_attempts: Vec<(DeliveryMessage, Arc<Pending>)>) {
        match self {
            Producer::Broker(publisher) => publisher.hand_over(first_attempts).await,
            Producer::Embedded => {}
        }
    }

    /// Something was written to the outbox: publish it now.
    pub fn wake(&self) {
        match self {
            Producer::Broker(publisher) => publisher.wake(),
            Producer::Embedded => {}
        }
    }

    /// Whether the relay holds a working broker channel; `None` for the
    /// embedded queue, which has no broker.
    pub fn broker_up(&self) -> Option<bool> {
        match self {
            Producer::Broker(publisher) => Some(publisher.broker_up()),
            Producer::Embedded => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_backs_wait_twice_as_long_each_time_up_to_the_longest_delay() {
        let schedule: RetrySchedule = "5s,2m,1m".parse().unwrap();
        let waits: Vec<u64> = (0..8).map(|parks| put_back_delay(&schedule, parks).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 120, 120, 120]);
        assert_eq!(put_back_delay(&schedule, u32::MAX), Duration::from_secs(120));
        // Never longer than five minutes, however long the schedule's delays.
        let default: RetrySchedule = webhooks_model::DEFAULT_RETRY_SCHEDULE.parse().unwrap();
        let waits: Vec<u64> = (0..10).map(|parks| put_back_delay(&default, parks).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]);
        assert_eq!(put_back_delay(&"200ms".parse().unwrap(), 3), Duration::from_millis(200));
    }
}
