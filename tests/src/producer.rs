//! A producer at a steady rate, as a platform service publishes events:
//! `POST /internal/events` with an `Idempotency-Key` per event, retried with
//! the same key while the service is down or answers 5xx, 408, 409 or 429.
//! An event counts as accepted when a request for it got a 2xx. And the
//! accounting of a run: which (event, endpoint) pairs had to arrive, and
//! which did, how often.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use webhooks_model::{Category, categories_include};

use crate::tally::{Tally, event_key};

/// What a producer sends, and how hard it tries.
#[derive(Debug, Clone)]
pub struct Producer {
    /// `http://<internal>/internal/events` of each API process: event n
    /// goes to the `n % len`-th first, and a retry to the next one, as
    /// behind a load balancer.
    pub ingest_urls: Vec<String>,
    /// `INTERNAL_TOKEN`, sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// Event n is of developer `n % len`.
    pub developers: Vec<Uuid>,
    /// Event n is of category `(n / developers) % len`.
    pub categories: Vec<Category>,
    /// Makes the `Idempotency-Key`s of this run: `<run_id>-<n>`.
    pub run_id: String,
    /// How long one event is retried before the producer gives it up.
    pub give_up_after: Duration,
    /// The time limit of one request.
    pub request_timeout: Duration,
}

/// Live counters of a producer.
#[derive(Debug, Default)]
pub struct Progress {
    /// Events whose first request went out.
    pub offered: AtomicU64,
    /// Events answered 2xx.
    pub accepted: AtomicU64,
    /// Requests that failed and were sent again.
    pub retried: AtomicU64,
    /// 2xx answers that said `Idempotent-Replayed: true`.
    pub replayed: AtomicU64,
    /// Events given up.
    pub abandoned: AtomicU64,
}

/// An event the service accepted.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    pub n: u64,
    /// Its `event_id`, as [`event_key`] reads it.
    pub id: u128,
    /// An index into [`Producer::developers`].
    pub developer: usize,
    pub category: Category,
    /// Requests it took.
    pub tries: u32,
}

/// An event the producer gave up.
#[derive(Debug, Clone)]
pub struct Abandoned {
    pub n: u64,
    pub tries: u32,
    /// The last failure.
    pub last: String,
}

/// What a producer run did.
#[derive(Debug, Default)]
pub struct Produced {
    pub accepted: Vec<Accepted>,
    pub abandoned: Vec<Abandoned>,
    /// From the first request to the last answer.
    pub elapsed: Duration,
}

enum Outcome {
    Accepted(Accepted),
    Abandoned(Abandoned),
}

impl Producer {
    /// Event n's developer (an index) and category.
    pub fn event_of(&self, n: u64) -> (usize, Category) {
        let developers = self.developers.len().max(1) as u64;
        let categories = self.categories.len().max(1) as u64;
        let developer = (n % developers) as usize;
        let category = self.categories.get(((n / developers) % categories) as usize).copied();
        (developer, category.unwrap_or(Category::Transfer))
    }

    /// The body of event n.
    pub fn body(&self, n: u64) -> Value {
        let (developer, category) = self.event_of(n);
        let object = format!("obj_{}_{n}", self.run_id);
        json!({
            "developer_id": self.developers[developer],
            "event_category": category.as_str(),
            "event_type": format!("{}.updated.status_transitioned", category.as_str()),
            "event_object_id": object,
            "event_object": { "id": object, "n": n, "amount": "100.00", "currency": "usd", "state": "payment_processed" },
            "event_object_status": "payment_processed",
            "event_object_changes": { "state": ["pending", "payment_processed"] },
        })
    }

    /// Offers `events` events at `rate` per second (each retried until it is
    /// accepted or given up) and waits for every one of them to settle.
    /// `stop` ends the offering early; what is under way still settles.
    pub async fn run(&self, events: u64, rate: f64, progress: Arc<Progress>, stop: CancellationToken) -> Produced {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(self.request_timeout)
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        let this = Arc::new(self.clone());
        let started = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = JoinSet::new();
        let mut produced = Produced::default();
        for n in 0..events {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.cancelled() => break,
            }
            progress.offered.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(this.clone().offer(client.clone(), n, progress.clone()));
            // Collect as we go, so finished tasks do not pile up.
            while let Some(done) = tasks.try_join_next() {
                produced.push(done);
            }
        }
        while let Some(done) = tasks.join_next().await {
            produced.push(done);
        }
        produced.elapsed = started.elapsed();
        produced.accepted.sort_by_key(|a| a.n);
        produced
    }

    /// Sends event n until it is accepted or given up.
    async fn offer(self: Arc<Self>, client: reqwest::Client, n: u64, progress: Arc<Progress>) -> Outcome {
        let (developer, category) = self.event_of(n);
        let body = self.body(n);
        let key = format!("{}-{n}", self.run_id);
        let first = Instant::now();
        let mut pause = Duration::from_millis(100);
        let mut tries = 0u32;
        loop {
            tries += 1;
            let url = &self.ingest_urls[(n as usize + tries as usize - 1) % self.ingest_urls.len().max(1)];
            let mut request = client.post(url).header("Idempotency-Key", &key).json(&body);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let sent = request.send().await;
            let failure = match sent {
                Ok(response) if response.status().is_success() => {
                    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
                    match response.json::<Value>().await {
                        Ok(event) => match event["event_id"].as_str().and_then(event_key) {
                            Some(id) => {
                                progress.accepted.fetch_add(1, Ordering::Relaxed);
                                if replayed {
                                    progress.replayed.fetch_add(1, Ordering::Relaxed);
                                }
                                return Outcome::Accepted(Accepted { n, id, developer, category, tries });
                            }
                            None => format!("2xx without an event_id: {event}"),
                        },
                        // The answer was cut short: ask again.
                        Err(error) => format!("2xx, body unreadable: {error}"),
                    }
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap_or_default();
                    if !(status >= 500 || matches!(status, 408 | 409 | 429)) {
                        progress.abandoned.fetch_add(1, Ordering::Relaxed);
                        return Outcome::Abandoned(Abandoned { n, tries, last: format!("{status} {text}") });
                    }
                    format!("{status} {text}")
                }
                Err(error) => format!("no answer: {error}"),
            };
            if first.elapsed() > self.give_up_after {
                progress.abandoned.fetch_add(1, Ordering::Relaxed);
                return Outcome::Abandoned(Abandoned { n, tries, last: failure });
            }
            progress.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

impl Produced {
    fn push(&mut self, done: Result<Outcome, tokio::task::JoinError>) {
        match done {
            Ok(Outcome::Accepted(accepted)) => self.accepted.push(accepted),
            Ok(Outcome::Abandoned(abandoned)) => self.abandoned.push(abandoned),
            Err(error) => self.abandoned.push(Abandoned { n: u64::MAX, tries: 0, last: error.to_string() }),
        }
    }
}

/// An endpoint of a run: whose (an index into [`Producer::developers`]),
/// which categories (empty: all), and the tally behind it.
#[derive(Debug)]
pub struct Endpoint {
    pub name: String,
    pub developer: usize,
    pub categories: Vec<Category>,
    pub tally: Tally,
}

impl Endpoint {
    /// Whether the contract says an accepted event goes to this endpoint
    /// (every endpoint is active from before the first event).
    pub fn wants(&self, event: &Accepted) -> bool {
        event.developer == self.developer && categories_include(&self.categories, event.category)
    }
}

/// The accounting of one endpoint, or of all together.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Account {
    /// Pairs (accepted event, endpoint) the contract says must arrive.
    pub expected: u64,
    /// Of those, the pairs delivered (answered 2xx) at least once.
    pub arrived: u64,
    /// Expected but never delivered.
    pub lost: u64,
    /// Deliveries (answered 2xx) beyond one per pair.
    pub duplicates: u64,
    /// Events delivered that no 2xx answered to the producer (given up
    /// while the service had in fact made them, or a retry that made a
    /// second event).
    pub unaccepted: u64,
    /// Requests answered 503 on purpose.
    pub refused: u64,
    pub bad_signature: u64,
    pub misrouted: u64,
    pub unexpected_early: u64,
}

impl Account {
    fn add(&mut self, other: &Account) {
        self.expected += other.expected;
        self.arrived += other.arrived;
        self.lost += other.lost;
        self.duplicates += other.duplicates;
        self.unaccepted += other.unaccepted;
        self.refused += other.refused;
        self.bad_signature += other.bad_signature;
        self.misrouted += other.misrouted;
        self.unexpected_early += other.unexpected_early;
    }

    /// Whether anything arrived that must not (a bad signature, another
    /// developer's or category's event).
    pub fn violations(&self) -> u64 {
        self.bad_signature + self.misrouted + self.unexpected_early
    }
}

/// Counts, per endpoint and in all, what had to arrive and what did.
pub fn account(accepted: &[Accepted], endpoints: &[Endpoint]) -> (Vec<Account>, Account) {
    let mut total = Account::default();
    let per_endpoint: Vec<Account> = endpoints
        .iter()
        .map(|endpoint| {
            let wanted: HashSet<u128> = accepted.iter().filter(|e| endpoint.wants(e)).map(|e| e.id).collect();
            let account = endpoint.tally.with_counts(|counts| {
                let arrived = wanted.iter().filter(|id| counts.delivered.contains_key(id)).count() as u64;
                Account {
                    expected: wanted.len() as u64,
                    arrived,
                    lost: wanted.len() as u64 - arrived,
                    duplicates: counts.delivered.values().map(|n| u64::from(n.saturating_sub(1))).sum(),
                    unaccepted: counts.delivered.keys().filter(|id| !wanted.contains(id)).count() as u64,
                    refused: counts.refused,
                    bad_signature: counts.bad_signature,
                    misrouted: counts.misrouted,
                    unexpected_early: counts.unexpected_early,
                }
            });
            total.add(&account);
            account
        })
        .collect();
    (per_endpoint, total)
}

/// How many expected pairs have not arrived yet.
pub fn missing(accepted: &[Accepted], endpoints: &[Endpoint]) -> u64 {
    endpoints
        .iter()
        .map(|endpoint| {
            endpoint.tally.with_counts(|counts| {
                accepted.iter().filter(|e| endpoint.wants(e) && !counts.delivered.contains_key(&e.id)).count() as u64
            })
        })
        .sum()
}
