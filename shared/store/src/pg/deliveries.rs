//! Delivery state and the delivery log on PostgreSQL, written in batches.

use chrono::{DateTime, Utc};
use uuid::Uuid;
use webhooks_model::Lane;

use super::PgStore;
use crate::{
    Admission, AttemptRecord, Backlog, DeliveryState, LogFilter, Parked, StandingQuestion, StoreResult,
    health::{self, Failures, HealthChange, SUCCESS_PRECISION_SECONDS, day},
};
use webhooks_model::DeliveryLog;

/// A delivery log entry as read: id, event id, event type, attempt, status,
/// response body, error, error detail, duration, time.
type LogRow = (
    Uuid,
    String,
    Option<String>,
    i32,
    Option<i16>,
    Option<String>,
    Option<String>,
    Option<String>,
    i32,
    DateTime<Utc>,
);

/// An event's type, `e` the event: the column, or for an event stored
/// before it had one, its body's.
const EVENT_TYPE: &str = "coalesce(e.event_type, e.body::jsonb ->> 'event_type')";

/// A delivery log entry `a` that failed, as the failure indexes have it
/// (`history::FAILED`: the planner matches the two).
pub(super) const FAILED_ATTEMPT: &str = "(a.error IS NOT NULL OR a.status IS NULL OR a.status < 200 OR a.status > 299)";

/// How an outcome ranks among outcomes of one delivery: its generation, its
/// attempt, then success.
fn newest_first(record: &AttemptRecord) -> (Option<i32>, Option<i32>, bool) {
    (record.generation, record.log.as_ref().map(|l| l.attempt), record.state == DeliveryState::Succeeded)
}

/// The writes of a batch of outcomes whose deliveries `{deliveries}` holds,
/// in one statement: the attempts' log entries, then each delivery's state. With `$17` true it writes only when
/// no endpoint of the batch (`$16`) is ordered, and returns how many are:
/// the common case is then one round trip, with no transaction around it.
/// An ordered endpoint's settling must take its turn lock before it writes
/// (see `turns.rs`), so a batch with one goes the transactional way, where
/// the lock is taken first and this runs with `$17` false.
///
/// Settled deliveries stay settled, and only a newer attempt than the last
/// one recorded moves the state (see `AttemptRecord`). A delivery retention
/// removed (a late duplicate) has no log to keep.
const RECORD: &str = "
    WITH ordered AS (
        SELECT id FROM endpoints WHERE $17 AND id = ANY($16) AND ordering = 'ordered'
    ), logs AS (
        INSERT INTO delivery_attempts
               (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at,
                error_detail, event_type)
        SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::int4[], $6::int2[], $7::text[],
                             $8::text[], $9::int4[], $10::timestamptz[], $18::text[], $19::text[])
               AS l(id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error, duration_ms, created_at,
                    error_detail, event_type)
         WHERE EXISTS (SELECT 1 FROM {deliveries} d WHERE d.id = l.delivery_id)
           AND NOT EXISTS (SELECT 1 FROM ordered)
        -- A batch whose commit the client did not hear of is recorded again
        -- one by one: its log entries are there already.
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), states AS (
        UPDATE {deliveries} d
           SET state = u.state, next_attempt_at = u.next_attempt_at,
               attempts = d.attempts + (u.attempt IS NOT NULL)::int,
               last_attempt = coalesce(u.attempt, d.last_attempt),
               last_attempt_generation = CASE WHEN u.attempt IS NULL THEN d.last_attempt_generation
                                              ELSE d.generation END,
               sweeps = 0, swept = false, updated_at = now()
          FROM unnest($11::int8[], $12::text[], $13::timestamptz[], $14::int4[], $15::int4[])
               AS u(id, state, next_attempt_at, attempt, generation)
         WHERE d.id = u.id AND d.state NOT IN ('cancelled', 'succeeded')
           AND (u.generation IS NULL OR d.generation = u.generation)
           AND (u.attempt IS NULL OR d.last_attempt_generation <> d.generation OR u.attempt > d.last_attempt)
           AND NOT EXISTS (SELECT 1 FROM ordered)
        RETURNING 1
    )
    SELECT count(*) FROM ordered";

/// Whether each message still stands, and whether its endpoint is ordered;
/// `{deliveries}` holds their deliveries.
const ADMISSIONS: &str = "SELECT coalesce((q.generation IS NULL OR d.generation = q.generation)
                     AND d.state NOT IN ('succeeded', 'cancelled')
                     AND (d.last_attempt_generation <> d.generation OR q.attempt > d.last_attempt), false),
            coalesce(ep.ordering = 'ordered', false)
       FROM unnest($1::int8[], $2::int4[], $3::int4[]) WITH ORDINALITY AS q(id, generation, attempt, n)
       LEFT JOIN {deliveries} d ON d.id = q.id
       LEFT JOIN endpoints ep ON ep.id = d.endpoint_id
      ORDER BY q.n";

impl PgStore {
    pub(crate) async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let health = health::changes(records);
        let mut records: Vec<&AttemptRecord> = records.iter().collect();
        records.sort_by_key(|r| r.delivery_id);
        // One outcome per delivery: of several in a batch (duplicates), the
        // newest, success first; one UPDATE may not apply two rows to one.
        records.dedup_by(|later, kept| {
            if later.delivery_id != kept.delivery_id {
                return false;
            }
            if newest_first(later) > newest_first(kept) {
                std::mem::swap(later, kept);
            }
            true
        });
        // One statement per table that holds the deliveries (a batch
        // across midnight has two).
        for (table, group) in self.by_deliveries_table(&records, |r| r.event_id.as_str()) {
            let group: Vec<&AttemptRecord> = group.into_iter().map(|(_, record)| *record).collect();
            self.record_in(&table, &group).await?;
        }
        // Health is written after the commit, one endpoint per statement:
        // each statement locks one health row, so concurrent dispatchers
        // never wait on each other in a cycle, and a healthy endpoint's row
        // is not locked at all (see `record_health`). A failure here loses
        // a health update, never a delivery outcome.
        if let Err(error) = self.record_health(&health).await {
            tracing::warn!(%error, "could not update endpoint health");
        }
        Ok(())
    }

    /// Records `records` (one per delivery), whose deliveries `table` holds.
    async fn record_in(&self, table: &str, records: &[&AttemptRecord]) -> StoreResult<()> {
        let logs: Vec<(&AttemptRecord, &DeliveryLog)> =
            records.iter().filter_map(|r| r.log.as_ref().map(|l| (*r, l))).collect();
        let mut endpoints: Vec<&str> = records.iter().map(|r| r.endpoint_id.as_str()).collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        let statement = RECORD.replace("{deliveries}", table);
        let record = |unless_ordered: bool| {
            sqlx::query_scalar::<_, i64>(&statement)
                .bind(logs.iter().map(|(_, l)| l.id).collect::<Vec<_>>())
                .bind(logs.iter().map(|(r, _)| r.delivery_id).collect::<Vec<_>>())
                .bind(logs.iter().map(|(r, _)| r.endpoint_id.as_str()).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.event_id.as_str()).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.attempt).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.status.and_then(|s| i16::try_from(s).ok())).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.response_body.as_deref()).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.error.as_deref()).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| i32::try_from(l.duration_ms).unwrap_or(i32::MAX)).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.created_at).collect::<Vec<_>>())
                .bind(records.iter().map(|r| r.delivery_id).collect::<Vec<_>>())
                .bind(records.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
                .bind(records.iter().map(|r| r.next_attempt_at).collect::<Vec<_>>())
                .bind(records.iter().map(|r| r.log.as_ref().map(|l| l.attempt)).collect::<Vec<_>>())
                .bind(records.iter().map(|r| r.generation).collect::<Vec<_>>())
                .bind(endpoints.clone())
                .bind(unless_ordered)
                .bind(logs.iter().map(|(_, l)| l.error_detail.as_deref()).collect::<Vec<_>>())
                .bind(logs.iter().map(|(_, l)| l.event_type.as_deref()).collect::<Vec<_>>())
        };
        let ordered_in_batch = record(true).fetch_one(&self.pool).await?;
        if ordered_in_batch > 0 {
            let mut tx = self.pool.begin().await?;
            // Settling a delivery of an endpoint ordered as stored now may
            // hand the turn on (one switched to `none` since had its waiting
            // deliveries released by the switch).
            let ordered: Vec<String> =
                sqlx::query_scalar("SELECT id FROM endpoints WHERE id = ANY($1) AND ordering = 'ordered'")
                    .bind(&endpoints)
                    .fetch_all(&mut *tx)
                    .await?;
            if !ordered.is_empty() {
                super::turns::lock_turns(&mut tx, &ordered.iter().map(String::as_str).collect::<Vec<_>>()).await?;
            }
            record(false).fetch_one(&mut *tx).await?;
            // A settled delivery of an ordered endpoint hands the turn on.
            if !ordered.is_empty() {
                self.release_turns(&mut tx, &ordered, false).await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    pub(crate) async fn defer_parked(&self, parked: &[Parked]) -> StoreResult<()> {
        for (table, group) in self.by_deliveries_table(parked, |p| p.event_id.as_str()) {
            let ids: Vec<i64> = group.iter().map(|(_, p)| p.delivery_id).collect();
            let generations: Vec<Option<i32>> = group.iter().map(|(_, p)| p.generation).collect();
            let untils: Vec<DateTime<Utc>> = group.iter().map(|(_, p)| p.until).collect();
            let set_aside: Vec<bool> = group.iter().map(|(_, p)| p.set_aside).collect();
            // A set-aside delivery was seen by a dispatcher: the sweeps that
            // found it stranded before count no more.
            sqlx::query(&format!(
                "UPDATE {table} d SET next_attempt_at = u.until, set_aside = u.set_aside, swept = false,
                        sweeps = CASE WHEN u.set_aside THEN 0 ELSE d.sweeps END, updated_at = now()
                   FROM unnest($1::int8[], $2::int4[], $3::timestamptz[], $4::bool[])
                        AS u(id, generation, until, set_aside)
                  WHERE d.id = u.id AND (u.generation IS NULL OR d.generation = u.generation)
                    AND d.state IN ('pending', 'retrying')"
            ))
            .bind(ids)
            .bind(generations)
            .bind(untils)
            .bind(set_aside)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    pub(crate) async fn backlog(&self) -> StoreResult<Backlog> {
        let (default, bulk, waiting, set_aside, recoveries): (
            Option<DateTime<Utc>>,
            Option<DateTime<Utc>>,
            i64,
            i64,
            i64,
        ) = sqlx::query_as(
            "SELECT (SELECT min(next_attempt_at) FROM deliveries
                      WHERE state IN ('pending', 'retrying') AND NOT set_aside AND lane = 'default'
                        AND next_attempt_at <= now()),
                    (SELECT min(next_attempt_at) FROM deliveries
                      WHERE state IN ('pending', 'retrying') AND NOT set_aside AND lane = 'bulk'
                        AND next_attempt_at <= now()),
                    (SELECT count(*) FROM deliveries WHERE state = 'waiting'),
                    (SELECT count(*) FROM deliveries WHERE set_aside AND state IN ('pending', 'retrying')),
                    (SELECT count(*) FROM recoveries WHERE state = 'running')",
        )
        .fetch_one(&self.pool)
        .await?;
        let oldest_due = [(Lane::Default, default), (Lane::Bulk, bulk)]
            .into_iter()
            .filter_map(|(lane, at)| Some((lane, at?)))
            .collect();
        Ok(Backlog { oldest_due, waiting, set_aside, recoveries })
    }

    pub(crate) async fn admissions(&self, questions: &[StandingQuestion]) -> StoreResult<Vec<Admission>> {
        let mut admissions = vec![Admission::Superseded; questions.len()];
        for (table, group) in self.by_deliveries_table(questions, |q| q.event_id.as_str()) {
            let ids: Vec<i64> = group.iter().map(|(_, q)| q.delivery_id).collect();
            let generations: Vec<Option<i32>> = group.iter().map(|(_, q)| q.generation).collect();
            let attempts: Vec<i32> = group.iter().map(|(_, q)| q.attempt).collect();
            let statement = ADMISSIONS.replace("{deliveries}", &table);
            let answers = self
                .held
                .admissions
                .fetch_all(&self.pool, || {
                    sqlx::query_as::<_, (bool, bool)>(&statement).bind(&ids).bind(&generations).bind(&attempts)
                })
                .await?;
            for ((index, _), (current, ordered)) in group.iter().zip(answers) {
                admissions[*index] = if current { Admission::Go { ordered } } else { Admission::Superseded };
            }
        }
        Ok(admissions)
    }

    pub(crate) async fn list_logs(
        &self,
        endpoint_id: &str,
        limit: i64,
        starting_after: Option<Uuid>,
        filter: &LogFilter,
    ) -> StoreResult<Option<Vec<DeliveryLog>>> {
        let cursor: Option<DateTime<Utc>> = match starting_after {
            None => None,
            Some(id) => {
                let at =
                    sqlx::query_scalar("SELECT created_at FROM delivery_attempts WHERE id = $1 AND endpoint_id = $2")
                        .bind(id)
                        .bind(endpoint_id)
                        .fetch_optional(&self.pool)
                        .await?;
                match at {
                    None => return Ok(None),
                    at => at,
                }
            }
        };
        // Each filter is a condition an index serves (`pg/history.rs`):
        // written only when asked for, so the plan is made for the filters
        // at hand. The type comes with each entry; entries from before it
        // did take their event's.
        let mut conditions = vec!["a.endpoint_id = $1"];
        if cursor.is_some() {
            conditions.push("(a.created_at, a.id) < ($2, $3)");
        }
        match filter.succeeded {
            Some(true) => conditions.push("a.error IS NULL AND a.status BETWEEN 200 AND 299"),
            Some(false) => conditions.push(FAILED_ATTEMPT),
            None => {}
        }
        if filter.event_type.is_some() {
            if self.layout().partitioned {
                conditions.push("a.event_type = $6");
            } else {
                // Not converted yet (`pg/history.rs`): entries from before
                // they carried the type are matched by their event's.
                conditions.push(
                    "(a.event_type = $6 OR (a.event_type IS NULL AND EXISTS (
                         SELECT 1 FROM events e WHERE e.id = a.event_id AND {EVENT_TYPE} = $6)))",
                );
            }
        }
        if filter.event_id.is_some() {
            // By the delivery: its attempts are one index away.
            conditions.push(
                "a.delivery_id = (SELECT d.id FROM deliveries d WHERE d.event_id = $7 AND d.endpoint_id = $1)
                 AND a.event_id = $7",
            );
        }
        if filter.since.is_some() {
            conditions.push("a.created_at >= $8");
        }
        if filter.until.is_some() {
            conditions.push("a.created_at < $9");
        }
        let rows: Vec<LogRow> = sqlx::query_as(&format!(
            "SELECT a.id, a.event_id, coalesce(a.event_type, (SELECT {EVENT_TYPE} FROM events e WHERE e.id = a.event_id)),
                    a.attempt, a.status, a.response_body, a.error, a.error_detail, a.duration_ms, a.created_at
               FROM delivery_attempts a
              WHERE {conditions}
              ORDER BY a.created_at DESC, a.id DESC LIMIT $4",
            conditions = conditions.join(" AND ")
        )
        .replace("{EVENT_TYPE}", EVENT_TYPE))
        // Planned with the actual cursor each time (see `list_events`).
        .persistent(false)
        .bind(endpoint_id)
        .bind(cursor)
        .bind(starting_after)
        .bind(limit)
        .bind(filter.succeeded)
        .bind(filter.event_type.as_deref())
        .bind(filter.event_id.as_deref())
        .bind(filter.since)
        .bind(filter.until)
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(
            rows.into_iter()
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
                        DeliveryLog {
                            id,
                            event_id,
                            event_type,
                            attempt,
                            status: status.map(i32::from),
                            response_body,
                            error,
                            error_detail,
                            duration_ms: i64::from(duration_ms),
                            created_at,
                        }
                    },
                )
                .collect(),
        ))
    }
}

impl PgStore {
    /// Writes a batch's health changes (see `store/health.rs`), each endpoint
    /// in its own statement: its success first, then the failures after it.
    async fn record_health(&self, changes: &[HealthChange]) -> StoreResult<()> {
        for change in changes {
            if let Some(at) = change.succeeded_at
                && self.written_successes.must_write(&change.endpoint_id, at)
            {
                // The row is locked only when it changes: a success that
                // ends a streak, or one a second after the last written.
                sqlx::query(
                    "WITH created AS (
                         INSERT INTO endpoint_health (endpoint_id, last_success_at) VALUES ($1, $2)
                         ON CONFLICT (endpoint_id) DO NOTHING RETURNING 1)
                     UPDATE endpoint_health h
                        SET last_success_at = GREATEST(h.last_success_at, $2),
                            failing_since = CASE WHEN h.last_failure_at IS NULL OR h.last_failure_at <= $2
                                                 THEN NULL ELSE h.failing_since END,
                            failing_days = CASE WHEN h.last_failure_at IS NULL OR h.last_failure_at <= $2
                                                THEN 0 ELSE h.failing_days END
                      WHERE h.endpoint_id = $1 AND NOT EXISTS (SELECT 1 FROM created)
                        AND ((h.failing_since IS NOT NULL AND (h.last_failure_at IS NULL OR h.last_failure_at <= $2))
                             OR h.last_success_at IS NULL
                             OR h.last_success_at < $2 - make_interval(secs => $3))",
                )
                .bind(&change.endpoint_id)
                .bind(at)
                .bind(SUCCESS_PRECISION_SECONDS)
                .execute(&self.pool)
                .await?;
                self.written_successes.wrote(&change.endpoint_id, at);
            }
            if let Some(failures) = change.failures {
                self.written_successes.failed(&change.endpoint_id);
                write_failures(&self.pool, &change.endpoint_id, failures).await?;
            }
        }
        Ok(())
    }
}

/// Starts or continues an endpoint's failing streak.
async fn write_failures(pool: &sqlx::PgPool, endpoint_id: &str, failures: Failures) -> StoreResult<()> {
    let (first_day, last_day) = (day(failures.first_at), day(failures.last_at));
    sqlx::query(
        "INSERT INTO endpoint_health AS h (endpoint_id, failing_since, last_failure_at, failing_days, last_failure_day)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (endpoint_id) DO UPDATE
            SET last_failure_at = GREATEST(h.last_failure_at, excluded.last_failure_at),
                failing_since = coalesce(h.failing_since, excluded.failing_since),
                failing_days = CASE WHEN h.failing_since IS NULL THEN excluded.failing_days
                                    ELSE h.failing_days + (excluded.last_failure_day > h.last_failure_day)::int END,
                last_failure_day = GREATEST(h.last_failure_day, excluded.last_failure_day)",
    )
    .bind(endpoint_id)
    .bind(failures.first_at)
    .bind(failures.last_at)
    .bind(1 + i32::from(last_day > first_day))
    .bind(last_day)
    .execute(pool)
    .await?;
    Ok(())
}
