//! Handling one delivery message, whichever queue it came from: re-check the
//! endpoint, make the attempt under the endpoint's share of slots, record it,
//! and settle the message through its [`Ticket`] only after the record is
//! committed. What to do at each step is decided in [`crate::decide`]; the
//! queue-specific parts (acks, retry queues, the deliveries table) are behind
//! the ticket.

use std::{sync::Arc, time::Duration};

use chrono::Utc;
use tracing::Instrument;
use uuid::Uuid;
use webhooks_config::CommonConfig;
use webhooks_model::DeliveryLog;
use webhooks_queue::{DeliveryMessage, PARK_LIMIT};
use webhooks_store::{AttemptRecord, DeliveryState, RetryStanding, StandingQuestion, Store, Turn};

use crate::{
    cache::{Endpoint, EndpointCache},
    config::DeliveryConfig,
    decide::{self, After, Before},
    deliver,
    metrics::Metrics,
    recorder::Recorder,
    slots::{Full, Signal},
    source::Ticket,
};

/// What every message handler shares, whatever the queue.
#[derive(Debug)]
pub struct Context {
    pub common: CommonConfig,
    pub delivery: DeliveryConfig,
    pub client: reqwest::Client,
    pub cache: EndpointCache,
    pub recorder: Recorder,
    /// Whether a retry still stands, asked in batches.
    pub standings: crate::standing::Standings,
    /// Due times of parked deliveries, written in batches.
    pub parked: crate::parked::ParkedWrites,
    /// For the few reads outside the cache.
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Attempts in flight per endpoint, under limits that adapt.
    pub slots: crate::slots::Slots,
}

/// Handles one message to the end: its ticket is settled before this returns
/// (or, when the process stops first, the queue hands the message out again).
pub async fn handle(context: &Context, message: DeliveryMessage, ticket: Ticket) {
    let span = tracing::info_span!("delivery", event_id = %message.event_id, endpoint_id = %message.endpoint_id, attempt = message.attempt);
    process(context, message, ticket).instrument(span).await;
}

async fn process(context: &Context, message: DeliveryMessage, ticket: Ticket) {
    // A message may have been overtaken: by `send` or the sweeper (which
    // re-arm the delivery with a new generation and a message of their own),
    // by success, or by a newer attempt. Then it goes no further. Fresh first
    // attempts skip this read (theirs is the hot path): the sweeper only
    // re-arms deliveries due for longer than `SWEEP_INTERVAL`. Unless the
    // message comes again from a dispatcher that stopped or lost its broker
    // connection: its attempt may be recorded already, its ack not sent.
    if message.attempt > 1 || !fresh(&message) || ticket.redelivered() {
        let attempt = i32::try_from(message.attempt).unwrap_or(i32::MAX);
        let question = StandingQuestion { delivery_id: message.delivery_id, generation: message.generation, attempt };
        match context.standings.ask(question).await {
            Ok(RetryStanding::Current) => {}
            Ok(RetryStanding::Superseded) => {
                tracing::debug!("message superseded; dropped");
                context.metrics.outcome("superseded");
                return ticket.done();
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot load the delivery");
                return park(context, ticket, &message, "cannot load the delivery").await;
            }
        }
    }
    let cached = match context.cache.get(&message.endpoint_id).await {
        Ok(endpoint) => endpoint,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot load the endpoint");
            return park(context, ticket, &message, "cannot load the endpoint").await;
        }
    };
    let endpoint = match cached.filter(|e| decide::before_attempt(Some(e.status), message.force) == Before::Send) {
        Some(endpoint) => endpoint,
        // Holding or cancelling is final, so check the database itself rather
        // than a cache entry a lifecycle message may not have reached.
        None => {
            let fresh = match context.cache.reload(&message.endpoint_id).await {
                Ok(fresh) => fresh,
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "cannot load the endpoint");
                    return park(context, ticket, &message, "cannot load the endpoint").await;
                }
            };
            match (decide::before_attempt(fresh.as_ref().map(|e| e.status), message.force), fresh) {
                (Before::Send, Some(endpoint)) => endpoint,
                (Before::Hold, _) => {
                    return finish(context, ticket, &message, record(&message, DeliveryState::Held), "held").await;
                }
                (_, _) => {
                    let cancelled = record(&message, DeliveryState::Cancelled);
                    return finish(context, ticket, &message, cancelled, "cancelled").await;
                }
            }
        }
    };

    // An ordered endpoint's delivery goes in its turn only; one forced by
    // `send` goes at once.
    if endpoint.ordered && !message.force {
        match context.store.take_turn(message.delivery_id, message.generation, &endpoint.id).await {
            Ok(Turn::Go) => {}
            Ok(Turn::Wait) => {
                tracing::debug!("an earlier delivery is unsettled; waiting for the turn");
                context.metrics.outcome("waiting");
                return ticket.done();
            }
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot take the turn");
                return park(context, ticket, &message, "cannot take the turn").await;
            }
        }
    }

    let mut slot = match context.slots.take(&endpoint.id).await {
        Ok(slot) => slot,
        // A message forced by `send` is never set aside: it would come
        // back without its `force`.
        Err(Full::Hung { since, recoveries }) if !message.force => {
            set_aside(context, ticket, &message, since).await;
            // The endpoint answered while this was written: the release of
            // that success may have run before the write.
            if context.slots.recovered_since(&endpoint.id, recoveries) {
                release_set_aside(context, &endpoint.id).await;
            }
            return;
        }
        Err(Full::Busy | Full::Hung { .. }) => return defer(context, ticket, &message, false, "deferred").await,
    };

    // The pace after the slot: a ticket taken is a start used, not a hole
    // left by a message that found the endpoint full.
    match pace(context, &endpoint, &message).await {
        Ok(None) => {}
        Ok(Some((booked, wait))) => return ticket.defer(context, &booked, wait, "paced").await,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "cannot book the pace");
            return park(context, ticket, &message, "cannot book the pace").await;
        }
    }
    // The endpoint's mean attempt duration, which tells whether a slot comes
    // in time, counts from here: not the wait for the pace.
    slot.begin();

    if message.attempt == 1 {
        let lag = (Utc::now() - message.event_created_at).to_std().unwrap_or_default();
        context.metrics.queue_lag.observe(lag.as_secs_f64());
    }
    context.metrics.in_flight.inc();
    let allow_private = context.common.target_allow_private;
    let mut attempt = deliver::attempt(
        &context.client,
        &endpoint,
        &message.event_id,
        &message.body,
        allow_private,
        webhooks_model::time::now(),
    )
    .await;
    context.metrics.in_flight.dec();
    context.metrics.attempt_duration.observe(attempt.duration.as_secs_f64());
    let recovered = slot.report(Signal::of(attempt.succeeded(), attempt.status, attempt.error));
    drop(slot);
    if recovered {
        release_set_aside(context, &endpoint.id).await;
    }
    if endpoint.rate_limit_per_second.is_some() && matches!(attempt.status, Some(429 | 503)) {
        let paused_until = attempt
            .retry_after
            .and_then(|wait| chrono::Duration::from_std(wait.min(context.delivery.max_retry_after)).ok())
            .map(|wait| Utc::now() + wait);
        if let Err(error) = context.store.slow_pace(&endpoint.id, paused_until).await {
            tracing::warn!(%error, "cannot slow the endpoint's pace");
        }
    }

    let after = decide::after_attempt(
        &message,
        attempt.succeeded(),
        attempt.retry_after,
        &context.common.retry_schedule,
        context.delivery.max_retry_after,
    );
    let mut record = record(&message, after.state());
    record.log = Some(DeliveryLog {
        id: Uuid::now_v7(),
        event_id: message.event_id.clone(),
        attempt: i32::try_from(message.attempt).unwrap_or(i32::MAX),
        status: attempt.status.map(i32::from),
        response_body: attempt.response_body.take(),
        error: attempt.error.map(str::to_owned),
        duration_ms: i64::try_from(attempt.duration.as_millis()).unwrap_or(i64::MAX),
        // The clock of endpoint health, which counts the days of failures.
        created_at: context.common.clock.now(),
    });
    if let After::Retry { delay, next } = &after {
        if let Err(error) = ticket.schedule_retry(next, *delay).await {
            tracing::error!(error = format!("{error:#}"), "cannot schedule the retry; the message goes back");
            return ticket.requeue(context).await;
        }
        record.next_attempt_at = chrono::Duration::from_std(*delay).ok().map(|d| Utc::now() + d);
    }
    tracing::debug!(status = ?attempt.status, error = ?attempt.error, outcome = after.outcome(), "attempt made");
    finish(context, ticket, &message, record, after.outcome()).await;
}

/// The record of `message` settling in `state`, without a log entry yet.
fn record(message: &DeliveryMessage, state: DeliveryState) -> AttemptRecord {
    AttemptRecord {
        delivery_id: message.delivery_id,
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
    let missed = |start: chrono::DateTime<Utc>| (Utc::now() - start).to_std().is_ok_and(|late| late > PACE_MISSED);
    let (ticket, start) = match (kept, endpoint.rate_limit_per_second) {
        (Some((ticket, start)), _) if !missed(start) => (ticket, start),
        (_, Some(limit)) => {
            let ticket = context.store.take_pace(&endpoint.id, limit).await?;
            (ticket.number, ticket.start)
        }
        // A ticket of a limit since removed, or of a schedule that is gone.
        (_, None) => return Ok(None),
    };
    let wait = (start - Utc::now()).to_std().unwrap_or_default();
    let window = pace_window(endpoint.rate_limit_per_second);
    if wait > window {
        let early = window * 4 / 5;
        return Ok(Some((message.with_pace_ticket(ticket), wait - early)));
    }
    tokio::time::sleep(wait).await;
    Ok(None)
}

/// Commits the record, then settles the message. If the commit fails the
/// message is parked for another try: a duplicate attempt is possible, a lost
/// one is not.
async fn finish(
    context: &Context,
    ticket: Ticket,
    message: &DeliveryMessage,
    record: AttemptRecord,
    outcome: &'static str,
) {
    if context.recorder.record(record).await.is_err() {
        return park(context, ticket, message, "cannot record the outcome").await;
    }
    context.metrics.outcome(outcome);
    ticket.done();
}

/// How young a first attempt must be to skip the standing check: far below
/// any `SWEEP_INTERVAL`, far above the time from ingest to a dispatcher.
const FRESH_FOR: Duration = Duration::from_secs(10);

fn fresh(message: &DeliveryMessage) -> bool {
    (Utc::now() - message.event_created_at).to_std().is_ok_and(|age| age < FRESH_FOR)
}

/// The record of a delivery given up on: `failed`, with `reason` as the error
/// of its log entry.
pub(crate) fn given_up(message: &DeliveryMessage, reason: &str) -> AttemptRecord {
    let mut record = record(message, DeliveryState::Failed);
    record.log = Some(DeliveryLog {
        id: Uuid::now_v7(),
        event_id: message.event_id.clone(),
        attempt: i32::try_from(message.attempt).unwrap_or(i32::MAX),
        status: None,
        response_body: None,
        error: Some(format!(
            "not sent: parked {} times ({reason}); send or recover it once the cause is fixed",
            message.failures
        )),
        duration_ms: 0,
        created_at: webhooks_model::time::now(),
    });
    record
}

/// Something failed before the attempt (`reason`): put the message back for a
/// later try without counting an attempt, so a long database outage cannot
/// exhaust the retry schedule; past [`PARK_LIMIT`] such parks, give up on it.
async fn park(context: &Context, ticket: Ticket, message: &DeliveryMessage, reason: &str) {
    if message.failures >= PARK_LIMIT {
        tracing::error!(failures = message.failures, reason, "message parked too often; given up");
        return ticket.dead_letter(context, message, reason).await;
    }
    defer(context, ticket, message, true, "parked").await;
}

/// Puts the message back without counting an attempt: its endpoint has no
/// free slot, or something failed. Each park of the same attempt waits twice
/// as long, from the shortest retry delay up to the longest, so a backlog
/// behind a saturated endpoint does not cycle through the shortest retry
/// queue without bound.
async fn defer(context: &Context, ticket: Ticket, message: &DeliveryMessage, failure: bool, outcome: &'static str) {
    let delay = park_delay(context.common.retry_schedule.delays(), message.parks);
    ticket.defer(context, &message.put_back(failure), delay, outcome).await;
}

/// Its endpoint frees no slots (it has hung for `hung_for`): the message is
/// set aside for as long as the endpoint has hung so far, at least a park's
/// delay and at most [`PARK_AT_MOST`], so a long-hung endpoint's backlog is
/// looked at less and less often; the endpoint's next success brings it
/// back sooner.
async fn set_aside(context: &Context, ticket: Ticket, message: &DeliveryMessage, hung_for: Duration) {
    let delay = park_delay(context.common.retry_schedule.delays(), message.parks).max(hung_for.min(PARK_AT_MOST));
    ticket.set_aside(context, &message.put_back(false), delay).await;
}

/// Deliveries released per statement when an endpoint recovers.
const RELEASE_BATCH: u16 = 1000;

/// The endpoint answered after it was found hung: queue again what this
/// dispatcher set aside behind it (and any other's). Should this fail, the
/// sweeper queues them once due.
async fn release_set_aside(context: &Context, endpoint_id: &str) {
    let mut released = 0;
    loop {
        match context.store.release_set_aside(endpoint_id, i64::from(RELEASE_BATCH)).await {
            Ok(n) => {
                released += n;
                if n < u64::from(RELEASE_BATCH) {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot release the deliveries set aside; the sweeper will");
                break;
            }
        }
    }
    if released > 0 {
        tracing::info!(released, "endpoint answers again; deliveries set aside behind it queued again");
    }
}

/// The longest a parked message waits: a saturated endpoint's backlog is
/// looked at again at least this often, whatever the retry schedule.
const PARK_AT_MOST: Duration = Duration::from_secs(300);

/// The wait before the next try of a message parked `parks` times already.
fn park_delay(delays: &[Duration], parks: u32) -> Duration {
    let shortest = delays.iter().min().copied().unwrap_or(Duration::from_secs(1));
    let longest = delays.iter().max().copied().unwrap_or(shortest).min(PARK_AT_MOST);
    shortest.saturating_mul(1u32 << parks.min(20)).min(longest).max(shortest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parks_wait_twice_as_long_each_time_up_to_the_longest_delay() {
        let delays = [Duration::from_secs(5), Duration::from_secs(120), Duration::from_secs(60)];
        let waits: Vec<u64> = (0..8).map(|parks| park_delay(&delays, parks).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 120, 120, 120]);
        assert_eq!(park_delay(&delays, u32::MAX), Duration::from_secs(120));
        // Never longer than five minutes, however long the schedule's delays.
        let default: webhooks_model::RetrySchedule = webhooks_model::DEFAULT_RETRY_SCHEDULE.parse().unwrap();
        let waits: Vec<u64> = (0..10).map(|parks| park_delay(default.delays(), parks).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]);
        assert_eq!(park_delay(&[Duration::from_millis(200)], 3), Duration::from_millis(200));
    }
}
