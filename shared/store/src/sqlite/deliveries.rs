//! Delivery state and the delivery log on SQLite, written in batches. The
//! state written is also the queue's: a record releases the delivery's claim,
//! and a retry's next attempt time is when it is due again.

use uuid::{Uuid, fmt::Hyphenated};

use super::{SqliteStore, micros, queue::IN_TURN, time};
use crate::{
    Admission, AttemptRecord, Backlog, DeliveryState, LogFilter, StandingQuestion, StoreResult,
    health::{self, HealthChange, SUCCESS_PRECISION_SECONDS, day},
};
use webhooks_model::{DeliveryLog, Lane};

/// A delivery log entry as read: id, event id, event type, attempt, status,
/// response body, error, error detail, duration, time.
type LogRow =
    (Hyphenated, String, Option<String>, i32, Option<i32>, Option<String>, Option<String>, Option<String>, i64, i64);

/// Whether a delivery in `state` has no next attempt of its own.
fn settled(state: DeliveryState) -> bool {
    matches!(state, DeliveryState::Succeeded | DeliveryState::Failed | DeliveryState::Cancelled)
}

impl SqliteStore {
    pub(crate) async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let now = micros(webhooks_model::time::now());
        let mut tx = self.begin().await?;
        for (record, log) in records.iter().filter_map(|r| r.log.as_ref().map(|l| (r, l))) {
            sqlx::query(
                "INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at, error_detail)
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
                  -- A delivery retention removed (a late duplicate) has no log to keep.
                  WHERE EXISTS (SELECT 1 FROM deliveries WHERE id = $2)
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(log.id.hyphenated())
            .bind(record.delivery_id)
            .bind(&record.endpoint_id)
            .bind(&log.event_id)
            .bind(log.attempt)
            .bind(log.status)
            .bind(log.response_body.as_deref())
            .bind(log.error.as_deref())
            .bind(log.duration_ms)
            .bind(micros(log.created_at))
            .bind(log.error_detail.as_deref())
            .execute(&mut *tx)
            .await?;
        }
        for record in records {
            let next_attempt_at = record.next_attempt_at.filter(|_| !settled(record.state)).map(micros);
            // $4: the attempt just logged, if one was; it counts, and the next
            // message carries the number after it and is no longer forced.
            sqlx::query(
                "UPDATE deliveries
                    SET state = $2, next_attempt_at = $3,
                        attempts = attempts + ($4 IS NOT NULL),
                        next_attempt = coalesce($4 + 1, next_attempt),
                        force = CASE WHEN $4 IS NULL THEN force ELSE 0 END,
                        claimed = 0, parks = 0, failures = 0, pace_ticket = NULL, updated_at = $6
                  WHERE id = $1 AND state NOT IN ('cancelled', 'succeeded')
                    AND ($5 IS NULL OR generation = $5) AND ($4 IS NULL OR $4 >= next_attempt)",
            )
            .bind(record.delivery_id)
            .bind(record.state.as_str())
            .bind(next_attempt_at)
            .bind(record.log.as_ref().map(|l| l.attempt))
            .bind(record.generation)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        record_health(&mut tx, &health::changes(records)).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn backlog(&self) -> StoreResult<Backlog> {
        let now = micros(webhooks_model::time::now());
        // No set-aside here: a delivery put back behind a hanging endpoint is
        // simply due later. Due means due, unclaimed and in turn; waiting
        // means behind an earlier unsettled delivery of its ordered endpoint.
        let (default, bulk, waiting, recoveries): (Option<i64>, Option<i64>, i64, i64) = sqlx::query_as(&format!(
            "SELECT (SELECT min(d.next_attempt_at) FROM deliveries d
                      WHERE d.lane = 'default' AND d.state IN ('pending', 'retrying') AND d.claimed = 0
                        AND d.next_attempt_at <= $1 AND {IN_TURN}),
                    (SELECT min(d.next_attempt_at) FROM deliveries d
                      WHERE d.lane = 'bulk' AND d.state IN ('pending', 'retrying') AND d.claimed = 0
                        AND d.next_attempt_at <= $1 AND {IN_TURN}),
                    (SELECT count(*) FROM deliveries d
                      WHERE d.state IN ('pending', 'retrying') AND NOT {IN_TURN}),
                    (SELECT count(*) FROM recoveries WHERE state = 'running')"
        ))
        .bind(now)
        .fetch_one(&self.reader)
        .await?;
        let mut oldest_due = Vec::new();
        for (lane, at) in [(Lane::Default, default), (Lane::Bulk, bulk)] {
            if let Some(at) = at {
                oldest_due.push((lane, time(at)?));
            }
        }
        Ok(Backlog { oldest_due, waiting, set_aside: 0, recoveries })
    }

    pub(crate) async fn admissions(&self, questions: &[StandingQuestion]) -> StoreResult<Vec<Admission>> {
        // One process, one file: a statement per question costs no round trip.
        let mut reader = self.reader.acquire().await?;
        let mut standings = Vec::with_capacity(questions.len());
        for question in questions {
            // `next_attempt` is one past the last attempt recorded.
            let answer: Option<(bool, bool)> = sqlx::query_as(
                "SELECT ($2 IS NULL OR generation = $2) AND state NOT IN ('succeeded', 'cancelled')
                        AND $3 >= next_attempt,
                        coalesce((SELECT ordering = 'ordered' FROM endpoints e WHERE e.id = endpoint_id), 0)
                   FROM deliveries WHERE id = $1",
            )
            .bind(question.delivery_id)
            .bind(question.generation)
            .bind(question.attempt)
            .fetch_optional(&mut *reader)
            .await?;
            standings.push(match answer {
                Some((true, ordered)) => Admission::Go { ordered },
                _ => Admission::Superseded,
            });
        }
        Ok(standings)
    }

    pub(crate) async fn list_logs(
        &self,
        endpoint_id: &str,
        limit: i64,
        starting_after: Option<Uuid>,
        filter: &LogFilter,
    ) -> StoreResult<Option<Vec<DeliveryLog>>> {
        let cursor: Option<i64> = match starting_after {
            None => None,
            Some(id) => {
                let at =
                    sqlx::query_scalar("SELECT created_at FROM delivery_attempts WHERE id = $1 AND endpoint_id = $2")
                        .bind(id.hyphenated())
                        .bind(endpoint_id)
                        .fetch_optional(&self.reader)
                        .await?;
                match at {
                    None => return Ok(None),
                    at => at,
                }
            }
        };
        // One statement per shape, so the cursor is an index condition (see
        // `list_events`).
        // The event type is read from the stored event (its body is the
        // `Event` as delivered).
        let sql = format!(
            "SELECT a.id, a.event_id, json_extract(e.body, '$.event_type'), a.attempt, a.status, a.response_body,
                    a.error, a.error_detail, a.duration_ms, a.created_at
               FROM delivery_attempts a LEFT JOIN events e ON e.id = a.event_id
              WHERE a.endpoint_id = $1{}
                AND ($5 IS NULL OR coalesce(a.error IS NULL AND a.status BETWEEN 200 AND 299, 0) = $5)
                AND ($6 IS NULL OR json_extract(e.body, '$.event_type') = $6)
                AND ($7 IS NULL OR a.event_id = $7)
                AND ($8 IS NULL OR a.created_at >= $8)
                AND ($9 IS NULL OR a.created_at < $9)
              ORDER BY a.created_at DESC, a.id DESC LIMIT $4",
            if cursor.is_some() { " AND (a.created_at, a.id) < ($2, $3)" } else { "" }
        );
        let rows: Vec<LogRow> = sqlx::query_as(&sql)
            .bind(endpoint_id)
            .bind(cursor)
            .bind(starting_after.map(|id| id.hyphenated()))
            .bind(limit)
            .bind(filter.succeeded)
            .bind(filter.event_type.as_deref())
            .bind(filter.event_id.as_deref())
            .bind(filter.since.map(micros))
            .bind(filter.until.map(micros))
            .fetch_all(&self.reader)
            .await?;
        let logs = rows
            .into_iter()
            .map(
                |(
                    id,
                    event_id,
                    event_type,
                    attempt,
                    status,
                    response_body,
                    error,
                    error_detail,
                    duration_ms,
                    created_at,
                )| {
                    Ok(DeliveryLog {
                        id: id.into_uuid(),
                        event_id,
                        event_type,
                        attempt,
                        status,
                        response_body,
                        error,
                        error_detail,
                        duration_ms,
                        created_at: time(created_at)?,
                    })
                },
            )
            .collect::<StoreResult<_>>()?;
        Ok(Some(logs))
    }
}

/// Writes a batch's health changes (see `store/health.rs`): successes first,
/// then the failures after them.
async fn record_health(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, changes: &[HealthChange]) -> StoreResult<()> {
    // Microseconds, as every stored time here.
    let precision = (SUCCESS_PRECISION_SECONDS * 1e6) as i64;
    for change in changes {
        if let Some(at) = change.succeeded_at {
            sqlx::query(
                "INSERT INTO endpoint_health AS h (endpoint_id, last_success_at) VALUES ($1, $2)
                 ON CONFLICT (endpoint_id) DO UPDATE
                    SET last_success_at = max(coalesce(h.last_success_at, 0), excluded.last_success_at),
                        failing_since = CASE WHEN h.last_failure_at IS NULL OR h.last_failure_at <= excluded.last_success_at
                                             THEN NULL ELSE h.failing_since END,
                        failing_days = CASE WHEN h.last_failure_at IS NULL OR h.last_failure_at <= excluded.last_success_at
                                            THEN 0 ELSE h.failing_days END
                  WHERE (h.failing_since IS NOT NULL
                         AND (h.last_failure_at IS NULL OR h.last_failure_at <= excluded.last_success_at))
                     OR h.last_success_at IS NULL
                     OR h.last_success_at < excluded.last_success_at - $3",
            )
            .bind(&change.endpoint_id)
            .bind(micros(at))
            .bind(precision)
            .execute(&mut **tx)
            .await?;
        }
        if let Some(failures) = change.failures {
            let (first_day, last_day) = (day(failures.first_at), day(failures.last_at));
            sqlx::query(
                "INSERT INTO endpoint_health AS h (endpoint_id, failing_since, last_failure_at, failing_days, last_failure_day)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (endpoint_id) DO UPDATE
                    SET last_failure_at = max(coalesce(h.last_failure_at, 0), excluded.last_failure_at),
                        failing_since = coalesce(h.failing_since, excluded.failing_since),
                        failing_days = CASE WHEN h.failing_since IS NULL THEN excluded.failing_days
                                            ELSE h.failing_days + (excluded.last_failure_day > h.last_failure_day) END,
                        last_failure_day = max(coalesce(h.last_failure_day, 0), excluded.last_failure_day)",
            )
            .bind(&change.endpoint_id)
            .bind(micros(failures.first_at))
            .bind(micros(failures.last_at))
            .bind(1 + i32::from(last_day > first_day))
            .bind(last_day)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(())
}
