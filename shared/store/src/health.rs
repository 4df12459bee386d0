//! Endpoint health (API.md §8.3), backend-neutral: what a batch of attempt
//! outcomes changes in each endpoint's health row. Dispatchers write it with
//! the batch; the API's housekeeping disables the endpoints that have failed
//! long enough (`Store::auto_disable_failing`).

use chrono::{DateTime, Utc};

use crate::AttemptRecord;

/// An endpoint is disabled only after failed attempts on this many
/// different (UTC) days, however long `AUTO_DISABLE_AFTER` is.
pub const FAILING_DAYS: i32 = 3;

/// A healthy endpoint's `last_success_at` is rewritten at most this often
/// (every success would rewrite its row on the hot path); a success that
/// ends a failing streak is always written.
pub const SUCCESS_PRECISION_SECONDS: f64 = 1.0;

/// What one batch changes for one endpoint: its latest success, then the
/// failures after it (the streak they start or continue).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthChange {
    pub endpoint_id: String,
    pub succeeded_at: Option<DateTime<Utc>>,
    pub failures: Option<Failures>,
}

/// The failed attempts of a batch after its last success.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Failures {
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
}

/// The successes this process wrote last, per endpoint. A success less than
/// [`SUCCESS_PRECISION_SECONDS`] after the last one written, with no failure
/// recorded by this process since, would change nothing but a streak another
/// process's failure started meanwhile, which the next success written (at
/// most a second later) ends: it is not sent, so a healthy endpoint costs one
/// health statement a second, not one per batch.
#[derive(Debug, Default)]
pub struct WrittenSuccesses(std::sync::Mutex<std::collections::HashMap<String, DateTime<Utc>>>);

/// Endpoints remembered at most; past it, the memory starts over.
const REMEMBERED: usize = 10_000;

impl WrittenSuccesses {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, DateTime<Utc>>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a success of `endpoint_id` at `at` must be written.
    pub fn must_write(&self, endpoint_id: &str, at: DateTime<Utc>) -> bool {
        let precision = chrono::Duration::milliseconds((SUCCESS_PRECISION_SECONDS * 1000.0) as i64);
        self.lock().get(endpoint_id).is_none_or(|written| at - *written >= precision)
    }

    /// A success of `endpoint_id` at `at` was written.
    pub fn wrote(&self, endpoint_id: &str, at: DateTime<Utc>) {
        let mut written = self.lock();
        if written.len() >= REMEMBERED {
            written.clear();
        }
        let latest = written.get(endpoint_id).map_or(at, |earlier| at.max(*earlier));
        written.insert(endpoint_id.to_owned(), latest);
    }

    /// A failure of `endpoint_id` was written: its next success goes too.
    pub fn failed(&self, endpoint_id: &str) {
        self.lock().remove(endpoint_id);
    }
}

/// The UTC day of `at`, as days since 1970: the unit of the three-day rule.
pub fn day(at: DateTime<Utc>) -> i32 {
    i32::try_from(at.timestamp().div_euclid(86_400)).unwrap_or(i32::MAX)
}

/// The health changes of a batch, one per endpoint with an attempt in it. An
/// attempt is an outcome with a log entry; success is a 2xx without error.
pub fn changes(records: &[AttemptRecord]) -> Vec<HealthChange> {
    let mut changes: Vec<HealthChange> = Vec::new();
    let mut attempts: Vec<(&str, DateTime<Utc>, bool)> = records
        .iter()
        .filter_map(|r| r.log.as_ref().map(|log| (r.endpoint_id.as_str(), log.created_at, log.succeeded())))
        .collect();
    attempts.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
    for (endpoint_id, at, succeeded) in attempts {
        if changes.last().is_none_or(|c| c.endpoint_id != endpoint_id) {
            changes.push(HealthChange { endpoint_id: endpoint_id.to_owned(), succeeded_at: None, failures: None });
        }
        let change = changes.last_mut().expect("pushed above");
        if succeeded {
            change.succeeded_at = Some(at);
            change.failures = None;
        } else {
            let first_at = change.failures.map_or(at, |f| f.first_at);
            change.failures = Some(Failures { first_at, last_at: at });
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeliveryState;
    use webhooks_model::DeliveryLog;

    #[test]
    fn a_success_within_the_precision_of_the_last_one_written_is_not_sent_again() {
        let written = WrittenSuccesses::default();
        let at = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let ms = chrono::Duration::milliseconds;
        assert!(written.must_write("wep_a", at), "nothing written yet");
        written.wrote("wep_a", at);
        assert!(!written.must_write("wep_a", at + ms(999)));
        assert!(written.must_write("wep_a", at + ms(1000)));
        assert!(written.must_write("wep_b", at + ms(10)), "another endpoint");
        assert!(!written.must_write("wep_a", at - ms(5000)), "an older success changes nothing");
        written.failed("wep_a");
        assert!(written.must_write("wep_a", at + ms(10)), "a failure since: the next success ends the streak");
    }

    fn record(endpoint: &str, second: i64, status: i32) -> AttemptRecord {
        AttemptRecord {
            delivery_id: 1,
            event_id: "wh_1".into(),
            state: DeliveryState::Retrying,
            next_attempt_at: None,
            log: Some(DeliveryLog {
                id: webhooks_model::ids::new_v7(),
                event_id: "wh_1".into(),
                event_type: None,
                attempt: 1,
                status: Some(status),
                response_body: None,
                error: None,
                error_detail: None,
                duration_ms: 1,
                created_at: DateTime::from_timestamp(second, 0).unwrap(),
            }),
            endpoint_id: endpoint.into(),
            generation: None,
        }
    }

    #[test]
    fn failures_after_the_last_success_make_the_streak() {
        let at = |s| DateTime::from_timestamp(s, 0).unwrap();
        let batch = [record("a", 3, 500), record("a", 1, 500), record("a", 2, 200), record("b", 5, 204)];
        assert_eq!(
            changes(&batch),
            [
                HealthChange {
                    endpoint_id: "a".into(),
                    succeeded_at: Some(at(2)),
                    failures: Some(Failures { first_at: at(3), last_at: at(3) })
                },
                HealthChange { endpoint_id: "b".into(), succeeded_at: Some(at(5)), failures: None },
            ]
        );
        let only_failures = changes(&[record("a", 1, 500), record("a", 9, 503)]);
        assert_eq!(only_failures[0].failures, Some(Failures { first_at: at(1), last_at: at(9) }));
        assert_eq!(day(at(86_399)), 0);
        assert_eq!(day(at(86_400)), 1);
    }
}
