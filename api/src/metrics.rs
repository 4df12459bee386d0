//! Prometheus metrics of the API: requests by route and status, latency,
//! the queue's relay and sweeper, and the backlog the store holds.

use std::time::Instant;

use axum::{
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use webhooks_queue::metrics::LaneLabels;

use crate::state::AppState;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// The API's metrics, registered in its own registry (no globals, so several
/// instances can share a process in tests).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// The queue's producer side: the relay and the sweeper (distributed
    /// mode).
    pub queue: webhooks_queue::metrics::QueueMetrics,
    /// Events accepted on `/internal/events`.
    pub events_accepted: Counter,
    /// Events per ingest transaction.
    pub ingest_batch_size: Histogram,
    /// Events accepted with a type the catalog does not know
    /// (`EVENT_CATALOG_STRICT=false`).
    pub unknown_event_types: Counter,
    /// What waits, refreshed every few seconds.
    pub backlog: BacklogMetrics,
}

/// What waits, as the store has it: the gauges an operator alerts on.
#[derive(Debug, Default)]
pub struct BacklogMetrics {
    oldest_due: Family<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    waiting: Gauge,
    set_aside: Gauge,
    recoveries: Gauge,
}

impl BacklogMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "oldest_due_seconds",
            "How long the oldest delivery due in each lane has been due (0: none is)",
            self.oldest_due.clone(),
        );
        registry.register(
            "deliveries_waiting",
            "Deliveries waiting for an ordered endpoint's turn",
            self.waiting.clone(),
        );
        registry.register(
            "deliveries_set_aside",
            "Deliveries set aside behind a hanging endpoint",
            self.set_aside.clone(),
        );
        registry.register("recoveries_running", "Recoveries running", self.recoveries.clone());
    }

    /// Shows `backlog` as it was at `now`.
    pub fn show(&self, backlog: &webhooks_store::Backlog, now: chrono::DateTime<chrono::Utc>) {
        for lane in [webhooks_model::Lane::Default, webhooks_model::Lane::Bulk] {
            let due = backlog.oldest_due.iter().find(|(l, _)| *l == lane).map(|(_, at)| *at);
            let age = due.and_then(|at| (now - at).to_std().ok()).map_or(0.0, |d| d.as_secs_f64());
            self.oldest_due.get_or_create(&LaneLabels { lane: lane.as_str() }).set(age);
        }
        self.waiting.set(backlog.waiting);
        self.set_aside.set(backlog.set_aside);
        self.recoveries.set(backlog.recoveries);
    }
}

impl Metrics {
    /// Fresh, registered metrics.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("webhooks_api");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let queue = webhooks_queue::metrics::QueueMetrics::default();
        let events_accepted = Counter::default();
        let unknown_event_types = Counter::default();
        let ingest_batch_size = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]);
        registry.register("http_requests", "HTTP requests by route, method and status", requests.clone());
        registry.register("http_request_duration_seconds", "HTTP request latency by route", latency.clone());
        queue.register(&mut registry);
        registry.register("events_accepted", "Events accepted for delivery", events_accepted.clone());
        registry.register(
            "unknown_event_types_accepted",
            "Events accepted with an event_type the catalog does not know (EVENT_CATALOG_STRICT=false)",
            unknown_event_types.clone(),
        );
        registry.register("ingest_batch_size", "Events stored per ingest transaction", ingest_batch_size.clone());
        let backlog = BacklogMetrics::default();
        backlog.register(&mut registry);
        Metrics { registry, requests, latency, queue, events_accepted, ingest_batch_size, unknown_event_types, backlog }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, delivery: Option<&dispatcher::metrics::Metrics>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if let Some(delivery) = delivery {
            let _ = encode_registry(&mut out, delivery.registry());
        }
        let _ = encode_eof(&mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Counts and times every request, labelled by its route template (never the
/// raw path, which would explode the label space).
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = match request.method().as_str() {
        known @ ("GET" | "POST" | "PUT" | "DELETE" | "PATCH" | "HEAD" | "OPTIONS") => known,
        _ => "OTHER",
    }
    .to_owned();
    let response = next.run(request).await;
    let metrics = &state.metrics;
    metrics
        .requests
        .get_or_create(&RequestLabels {
            route: route.clone(),
            method: method.clone(),
            status: response.status().as_u16(),
        })
        .inc();
    metrics.latency.get_or_create(&RouteLabels { route, method }).observe(started.elapsed().as_secs_f64());
    response
}
