//! Handling one delivery message, whichever queue it came from: whether it
//! still stands, the endpoint, its slots and pace, the signed attempt, and
//! from all of it an [`Outcome`], which the queue carries out
//! ([`Delivery::settle`]). What to do at each step is decided in
//! [`crate::decide`]; the handler never knows which queue runs.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use tracing::Instrument;
use webhooks_config::CommonConfig;
use webhooks_model::DeliveryLog;
use webhooks_queue::{Delivery, DeliveryMessage, Handler, Outcome, Queue};
use webhooks_store::{Admission, AttemptRecord, DeliveryState, StandingQuestion, Store, Turn};

use crate::{
    cache::{Endpoint, EndpointCache},
    config::DeliveryConfig,
    decide::{self, After, Before, PutBack},
    deliver,
    metrics::Metrics,
    slots::{Full, Signal},
};

/// What every message handler shares, whatever the queue.
#[derive(Debug)]
pub struct Context {
    pub common: CommonConfig,
    pub delivery: DeliveryConfig,
    pub client: reqwest::Client,
    pub cache: EndpointCache,
    /// Whether a message may be sent now, asked in batches.
    pub admissions: crate::admission::Admissions,
    /// For the few reads outside the cache.
    pub store: Store,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    /// Attempts in flight per endpoint, under limits that adapt.
    pub slots: crate::slots::Slots,
}

/// The dispatcher as the queue sees it: each message is decided here and
/// settled by the queue.
#[derive(Debug, Clone)]
pub struct Worker(pub Arc<Context>);

impl Handler for Worker {
    async fn handle(&self, delivery: Delivery) {
        let message = &delivery.message;
        let span = tracing::info_span!("delivery", event_id = %message.event_id, endpoint_id = %message.endpoint_id, attempt = message.attempt);
        async {
            let context = &self.0;
            let decided = decide_for(context, &delivery.message, delivery.admitted()).await;
            let done = delivery.settle(decided.outcome).await;
            context.metrics.outcome(done);
            // The endpoint answered after it was found hung: what was set
            // aside behind it comes back now.
            let recovered = match decided.then {
                Then::Nothing => None,
                Then::Release(endpoint_id) => Some(endpoint_id),
                Then::ReleaseIfRecovered(endpoint_id, recoveries) => {
                    context.slots.recovered_since(&endpoint_id, recoveries).then_some(endpoint_id)
                }
            };
            if let Some(endpoint_id) = recovered {
                context.queue.endpoint_recovered(&endpoint_id).await;
            }
        }
        .instrument(span)
        .await;
    }

    fn endpoint_changed(&self, endpoint_id: &str) {
        self.0.cache.invalidate(endpoint_id);
    }

    fn forget_endpoints(&self) {
        self.0.cache.clear();
    }

    fn refused(&self) {
        self.0.metrics.outcome("dead_lettered");
    }
}

/// A message's outcome, and what follows once the queue carried it out.
#[derive(Debug)]
struct Decided {
    outcome: Outcome,
    then: Then,
}

#[derive(Debug)]
enum Then {
    Nothing,
    /// The endpoint answered after it was found hung.
    Release(String),
    /// The endpoint was found hung: should it have answered since
    /// `recoveries` (while the set-aside was written), release it after all.
    ReleaseIfRecovered(String, u64),
}

impl From<Outcome> for Decided {
    fn from(outcome: Outcome) -> Decided {
        Decided { outcome, then: Then::Nothing }
    }
}

/// `admitted`: the queue read the delivery from the store as it handed it
/// out, and handed it out in its turn (the embedded queue's claim).
async fn decide_for(context: &Context, message: &DeliveryMessage, admitted: bool) -> Decided {
    let schedule = &context.common.retry_schedule;
    let received = webhooks_model::time::now();
    // Whether the message may be sent now, as the store has it at the
    // attempt: not overtaken (by `send`, a recovery or the sweeper, which
    // queue the delivery again under a new generation; by success; by a
    // newer attempt), and whether its endpoint is ordered now, whatever a
    // cache says.
    let mut ordered = false;
    if !admitted {
        let attempt = i32::try_from(message.attempt).unwrap_or(i32::MAX);
        let question = StandingQuestion {
            delivery_id: message.delivery_id,
            event_id: message.event_id.clone(),
            generation: message.generation,
            attempt,
        };
        match context.admissions.ask(question).await {
            Ok(Admission::Go { ordered: now }) => ordered = now,
            Ok(Admission::Superseded) => {
                tracing::debug!("message superseded; dropped");
                return Outcome::Dropped { why: "superseded" }.into();
            }
            Err(error) => return failed(context, message, "cannot load the delivery", &error),
        }
    }
    let cached = match context.cache.get(&message.endpoint_id).await {
        Ok(endpoint) => endpoint,
        Err(error) => return failed(context, message, "cannot load the endpoint", &error),
    };
    let endpoint = match cached.filter(|e| decide::before_attempt(Some(e.status), message.force) == Before::Send) {
        Some(endpoint) => endpoint,
        // Holding or cancelling is final, so check the database itself rather
        // than a cache entry a lifecycle message may not have reached.
        None => {
            let fresh = match context.cache.reload(&message.endpoint_id).await {
                Ok(fresh) => fresh,
                Err(error) => return failed(context, message, "cannot load the endpoint", &error),
            };
            match (decide::before_attempt(fresh.as_ref().map(|e| e.status), message.force), fresh) {
                (Before::Send, Some(endpoint)) => endpoint,
                (Before::Hold, _) => {
                    return Outcome::Settled { record: record(message, DeliveryState::Held), why: "held" }.into();
                }
                (_, _) => {
                    let cancelled = record(message, DeliveryState::Cancelled);
                    return Outcome::Settled { record: cancelled, why: "cancelled" }.into();
                }
            }
        }
    };

    // An ordered endpoint's delivery goes in its turn only; one forced by
    // `send` goes at once.
    if ordered && !message.force {
        match context.store.take_turn(message.delivery_id, message.generation, &endpoint.id).await {
            Ok(Turn::Go) => {}
            Ok(Turn::Wait) => {
                tracing::debug!("an earlier delivery is unsettled; waiting for the turn");
                return Outcome::Dropped { why: "waiting" }.into();
            }
            Err(error) => return failed(context, message, "cannot take the turn", &error),
        }
    }

    let mut slot = match context.slots.take(&endpoint.id).await {
        Ok(slot) => slot,
        // A message forced by `send` is never set aside: it would come
        // back without its `force`.
        Err(Full::Hung { since, recoveries }) if !message.force => {
            let (message, delay) = decide::set_aside(message, schedule, since);
            return Decided {
                outcome: Outcome::SetAside { message, delay },
                then: Then::ReleaseIfRecovered(endpoint.id.clone(), recoveries),
            };
        }
        Err(Full::Busy | Full::Hung { .. }) => return decide::put_back(message, schedule, PutBack::Busy).into(),
    };

    // The pace after the slot: a ticket taken is a start used, not a hole
    // left by a message that found the endpoint full.
    match pace(context, &endpoint, message).await {
        Ok(None) => {}
        Ok(Some((booked, wait))) => return Outcome::PutBack { message: booked, delay: wait, why: "paced" }.into(),
        Err(error) => return failed(context, message, "cannot book the pace", &error),
    }
    // The endpoint's mean attempt duration, which tells whether a slot comes
    // in time, counts from here: not the wait for the pace.
    slot.begin();

    if message.attempt == 1 {
        let lag = (received - message.event_created_at).to_std().unwrap_or_default();
        context.metrics.queue_lag.observe(lag.as_secs_f64());
    }
    context.metrics.in_flight.inc();
    let allow_private = context.common.target_allow_private;
    let timeout = context.common.delivery_timeout;
    let signed_at = webhooks_model::time::now();
    let mut attempt = deliver::attempt(
        &context.client,
        &endpoint,
        &message.event_id,
        &message.body,
        allow_private,
        signed_at,
        timeout,
    )
    .await;
    context.metrics.in_flight.dec();
    context.metrics.attempt_duration.observe(attempt.duration.as_secs_f64());
    let recovered = slot.report(Signal::of(attempt.succeeded(), attempt.status, attempt.error));
    drop(slot);
    let ended = signed_at + chrono::Duration::from_std(attempt.duration).unwrap_or_default();
    if endpoint.rate_limit_per_second.is_some() && matches!(attempt.status, Some(429 | 503)) {
        let paused_until = attempt
            .retry_after
            .and_then(|wait| chrono::Duration::from_std(wait.min(context.delivery.max_retry_after)).ok())
            .map(|wait| ended + wait);
        if let Err(error) = context.store.slow_pace(&endpoint.id, paused_until).await {
            tracing::warn!(%error, "cannot slow the endpoint's pace");
        }
    }

    let after = decide::after_attempt(
        message,
        attempt.succeeded(),
        attempt.retry_after,
        schedule,
        context.delivery.max_retry_after,
    );
    let mut record = record(message, after.state());
    record.log = Some(DeliveryLog {
        // The attempt's time on the one clock: the delivery log's partitions
        // are ranges of ids.
        id: webhooks_model::ids::new_v7(),
        event_id: message.event_id.clone(),
        event_type: message.event_type(),
        attempt: i32::try_from(message.attempt).unwrap_or(i32::MAX),
        status: attempt.status.map(i32::from),
        response_body: attempt.response_body.take(),
        error: attempt.error.map(str::to_owned),
        error_detail: attempt.error_detail.take(),
        duration_ms: i64::try_from(attempt.duration.as_millis()).unwrap_or(i64::MAX),
        // The clock of endpoint health, which counts the days of failures.
        created_at: context.common.clock.now(),
    });
    tracing::debug!(status = ?attempt.status, error = ?attempt.error, outcome = after.outcome(), "attempt made");
    let outcome = match after {
        After::Retry { delay, next } => {
            record.next_attempt_at = chrono::Duration::from_std(delay).ok().map(|d| ended + d);
            Outcome::Retry { record, next, delay }
        }
        after => Outcome::Settled { record, why: after.outcome() },
    };
    Decided { outcome, then: if recovered { Then::Release(endpoint.id.clone()) } else { Then::Nothing } }
}

/// Something failed before the attempt (`reason`): the message goes back
/// for a later try without counting an attempt, so a long database outage
/// cannot exhaust the retry schedule; past `PARK_LIMIT` such put-backs, it
/// is given up.
fn failed(context: &Context, message: &DeliveryMessage, reason: &str, error: &dyn std::fmt::Display) -> Decided {
    tracing::error!(error = format!("{error:#}"), "{reason}");
    decide::put_back(message, &context.common.retry_schedule, PutBack::Failed(reason)).into()
}

/// The record of `message` settling in `state`, without a log entry yet.
fn record(message: &DeliveryMessage, state: DeliveryState) -> AttemptRecord {
    AttemptRecord {
        delivery_id: message.delivery_id,
        event_id: message.event_id.clone(),
        state,
        next_attempt_at: None,
        log: None,
        endpoint_id: message.endpoint_id.clone(),
        generation: message.generation,
    }
}

/// The longest an attempt to an endpoint paced at `limit` per second waits
/// for its start while holding a dispatcher slot: 1.5 s, or 32 starts' worth
/// (so a fast pace does not fill a dispatcher with waiting attempts), and at
/// least 50 ms. A later start is waited for in the queue, and the message
/// comes back 80% of this before its start: a retry queue's timing is coarse
/// (dead-lettering takes up to hundreds of milliseconds), so the last
/// stretch is waited here and the starts keep their spacing.
fn pace_window(limit: Option<u32>) -> Duration {
    let tickets = Duration::from_secs(32) / limit.unwrap_or(1).max(1);
    tickets.clamp(Duration::from_millis(50), Duration::from_millis(1500))
}

/// A ticket whose start passed longer ago than this when its message came
/// back missed it: the message takes a new one rather than go at once, so
/// late arrivals never bunch above the pace.
const PACE_MISSED: Duration = Duration::from_millis(50);

/// Waits for the attempt's start in its endpoint's pace, taking a ticket
/// unless the message carries one (then its start is read again: a throttle
/// may have moved it). `Some` when the start is too far off to wait for here:
/// the message to put back, with its ticket, and for how long.
async fn pace(
    context: &Context,
    endpoint: &Endpoint,
    message: &DeliveryMessage,
) -> anyhow::Result<Option<(DeliveryMessage, Duration)>> {
    let kept = match message.pace_ticket {
        Some(ticket) => context.store.pace_start(&endpoint.id, ticket).await?.map(|start| (ticket, start)),
        None => None,
    };
    let now = webhooks_model::time::now();
    let missed = |start: DateTime<Utc>| (now - start).to_std().is_ok_and(|late| late > PACE_MISSED);
    let (ticket, start) = match (kept, endpoint.rate_limit_per_second) {
        (Some((ticket, start)), _) if !missed(start) => (ticket, start),
        (_, Some(limit)) => {
            let ticket = context.store.take_pace(&endpoint.id, limit).await?;
            (ticket.number, ticket.start)
        }
        // A ticket of a limit since removed, or of a schedule that is gone.
        (_, None) => return Ok(None),
    };
    let wait = (start - webhooks_model::time::now()).to_std().unwrap_or_default();
    let window = pace_window(endpoint.rate_limit_per_second);
    if wait > window {
        let early = window * 4 / 5;
        return Ok(Some((message.with_pace_ticket(ticket), wait - early)));
    }
    tokio::time::sleep(wait).await;
    Ok(None)
}
