//! The delivery decision, free of any queue, socket or database: what to do
//! with a message given its endpoint, what follows from an attempt's
//! outcome, and how long a message put back waits. The handler in
//! [`crate::worker`] gathers the facts; the queue carries the outcome out.

use std::time::Duration;

use rand::Rng;
use webhooks_model::{EndpointStatus, RetrySchedule};
use webhooks_queue::DeliveryMessage;
use webhooks_queue::{Outcome, PARK_LIMIT, PUT_BACK_AT_MOST, put_back_delay};
use webhooks_store::DeliveryState;

/// What to do with a message before any attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// Make the attempt.
    Send,
    /// The endpoint is disabled: keep the delivery as upcoming.
    Hold,
    /// The endpoint is deleted (or gone): the delivery is cancelled.
    Cancel,
}

/// The decision for a message to an endpoint in `status` (`None`: no such
/// endpoint). `send` forces one attempt even to a disabled endpoint.
pub fn before_attempt(status: Option<EndpointStatus>, force: bool) -> Before {
    match status {
        Some(EndpointStatus::Active) => Before::Send,
        Some(EndpointStatus::Disabled) if force => Before::Send,
        Some(EndpointStatus::Disabled) => Before::Hold,
        Some(EndpointStatus::Deleted) | None => Before::Cancel,
    }
}

/// What follows an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum After {
    Succeeded,
    /// Try again after `delay` with `next`.
    Retry {
        delay: Duration,
        next: DeliveryMessage,
    },
    /// That was the last attempt the schedule allows.
    Failed,
}

impl After {
    /// The delivery's state after the attempt.
    pub fn state(&self) -> DeliveryState {
        match self {
            After::Succeeded => DeliveryState::Succeeded,
            After::Retry { .. } => DeliveryState::Retrying,
            After::Failed => DeliveryState::Failed,
        }
    }

    /// The outcome's name in metrics and logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            After::Succeeded => "succeeded",
            After::Retry { .. } => "retrying",
            After::Failed => "failed",
        }
    }
}

/// The decision after an attempt of `message` that `succeeded` or not, with
/// the receiver's `Retry-After` if it sent one. A retry is a fresh attempt
/// under the endpoint's rules: `force` (from `send`) covers one attempt only.
pub fn after_attempt(
    message: &DeliveryMessage,
    succeeded: bool,
    retry_after: Option<Duration>,
    schedule: &RetrySchedule,
    max_retry_after: Duration,
) -> After {
    if succeeded {
        return After::Succeeded;
    }
    match schedule.delay_after(message.attempt) {
        Some(scheduled) => {
            After::Retry { delay: retry_delay(scheduled, retry_after, max_retry_after), next: message.next_attempt() }
        }
        None => After::Failed,
    }
}

/// Why a message goes back without an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutBack<'a> {
    /// Its endpoint has no free slot in time.
    Busy,
    /// Something failed (the reason): counts towards [`PARK_LIMIT`].
    Failed(&'a str),
}

/// The outcome of putting `message` back: each put-back waits twice as long
/// as the one before; past [`PARK_LIMIT`] failures the message is given up.
pub fn put_back(message: &DeliveryMessage, schedule: &RetrySchedule, why: PutBack<'_>) -> Outcome {
    let delay = put_back_delay(schedule, message.parks);
    match why {
        PutBack::Busy => Outcome::PutBack { message: message.put_back(false), delay, why: "deferred" },
        PutBack::Failed(reason) if message.failures >= PARK_LIMIT => {
            Outcome::GiveUp { message: message.clone(), reason: reason.to_owned() }
        }
        PutBack::Failed(_) => Outcome::PutBack { message: message.put_back(true), delay, why: "parked" },
    }
}

/// The message to set aside behind an endpoint that has hung for
/// `hung_for`, and for how long: as long as the endpoint has hung so far, at
/// least a put-back's delay and at most [`PUT_BACK_AT_MOST`], so a long-hung
/// endpoint's backlog is looked at less and less often; the endpoint's next
/// success brings it back sooner.
pub fn set_aside(
    message: &DeliveryMessage,
    schedule: &RetrySchedule,
    hung_for: Duration,
) -> (DeliveryMessage, Duration) {
    let delay = put_back_delay(schedule, message.parks).max(hung_for.min(PUT_BACK_AT_MOST));
    (message.put_back(false), delay)
}

/// The wait before the next attempt: the schedule's delay less up to 10%
/// jitter, or the receiver's `Retry-After` when that is longer (capped).
fn retry_delay(scheduled: Duration, retry_after: Option<Duration>, max_retry_after: Duration) -> Duration {
    if let Some(asked) = retry_after.filter(|asked| *asked > scheduled) {
        return asked.min(max_retry_after.max(scheduled));
    }
    let jitter = rand::rng().random_range(0.0..0.1);
    scheduled.mul_f64(1.0 - jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(attempt: u32, force: bool) -> DeliveryMessage {
        DeliveryMessage::from(webhooks_store::DueDelivery {
            delivery_id: 1,
            event_id: "wh_00".into(),
            endpoint_id: "wep_00".into(),
            developer_id: uuid::Uuid::nil(),
            attempt,
            force,
            generation: Some(2),
            parks: 0,
            failures: 0,
            pace_ticket: None,
            lane: Default::default(),
            body: "{}".into(),
            event_created_at: chrono::DateTime::from_timestamp(0, 0).unwrap(),
        })
    }

    #[test]
    fn only_active_endpoints_get_attempts_unless_forced() {
        assert_eq!(before_attempt(Some(EndpointStatus::Active), false), Before::Send);
        assert_eq!(before_attempt(Some(EndpointStatus::Disabled), false), Before::Hold);
        assert_eq!(before_attempt(Some(EndpointStatus::Disabled), true), Before::Send);
        assert_eq!(before_attempt(Some(EndpointStatus::Deleted), true), Before::Cancel);
        assert_eq!(before_attempt(None, false), Before::Cancel);
    }

    #[test]
    fn a_failure_retries_along_the_schedule_then_fails_for_good() {
        let schedule: RetrySchedule = "1s,2s".parse().unwrap();
        let cap = Duration::from_secs(3600);
        assert_eq!(after_attempt(&message(1, false), true, None, &schedule, cap), After::Succeeded);
        let After::Retry { delay, next } = after_attempt(&message(2, true), false, None, &schedule, cap) else {
            panic!("the second attempt has a retry")
        };
        assert!(delay <= Duration::from_secs(2) && delay >= Duration::from_millis(1800), "{delay:?}");
        assert_eq!((next.attempt, next.force, next.generation), (3, false, Some(2)), "a retry is not forced");
        assert_eq!(after_attempt(&message(3, false), false, None, &schedule, cap), After::Failed);
        assert_eq!(After::Failed.state(), DeliveryState::Failed);
    }

    #[test]
    fn a_put_back_counts_and_waits_longer_and_failures_are_given_up_at_the_limit() {
        let schedule: RetrySchedule = "5s,1m".parse().unwrap();
        let Outcome::PutBack { message: busy, delay, why } = put_back(&message(1, false), &schedule, PutBack::Busy)
        else {
            panic!("a busy endpoint's message goes back")
        };
        assert_eq!((busy.parks, busy.failures, delay, why), (1, 0, Duration::from_secs(5), "deferred"));
        let Outcome::PutBack { message: failed, delay, why } = put_back(&busy, &schedule, PutBack::Failed("db")) else {
            panic!("a failure puts it back")
        };
        assert_eq!((failed.parks, failed.failures, delay, why), (2, 1, Duration::from_secs(10), "parked"));
        let mut worn = failed;
        for _ in 0..PARK_LIMIT {
            if let Outcome::PutBack { message, .. } = put_back(&worn, &schedule, PutBack::Failed("db")) {
                worn = message;
            }
        }
        assert!(
            matches!(put_back(&worn, &schedule, PutBack::Failed("db")), Outcome::GiveUp { reason, .. } if reason == "db")
        );
        let (aside, delay) = set_aside(&message(1, false), &schedule, Duration::from_secs(40));
        assert_eq!((aside.parks, delay), (1, Duration::from_secs(40)));
        assert_eq!(set_aside(&message(1, false), &schedule, Duration::from_secs(3600)).1, PUT_BACK_AT_MOST);
    }

    #[test]
    fn retry_delay_jitters_down_and_honours_longer_retry_after_within_bounds() {
        let scheduled = Duration::from_secs(100);
        for _ in 0..100 {
            let delay = retry_delay(scheduled, None, Duration::from_secs(3600));
            assert!(delay <= scheduled && delay >= Duration::from_secs(90), "{delay:?}");
        }
        let cap = Duration::from_secs(3600);
        assert_eq!(retry_delay(scheduled, Some(Duration::from_secs(300)), cap), Duration::from_secs(300));
        assert_eq!(retry_delay(scheduled, Some(Duration::from_secs(86_400)), cap), cap);
        assert!(retry_delay(scheduled, Some(Duration::from_secs(1)), cap) <= scheduled);
    }
}
