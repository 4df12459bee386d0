//! The processes of the distributed mode, as the database knows them
//! (DESIGN.md, "One clock" and "Knowing what is stranded"): each says once a
//! second that it is alive, what its host clock says, how far its first
//! attempts are confirmed (an API) and how far its workers have got in each
//! work queue (a dispatcher). The statement answers with the database's
//! clock, which the process takes as its own.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::StoreResult;

/// What a process says of itself once a second.
#[derive(Debug, Clone, PartialEq)]
pub struct Presence {
    pub id: Uuid,
    /// `api` or `dispatcher`.
    pub kind: &'static str,
    /// How far its host clock is ahead of the database's (negative: behind),
    /// as last measured.
    pub host_clock_ahead: chrono::Duration,
    /// An API: every first attempt of an event it committed before this was
    /// confirmed by the broker or written to the outbox.
    pub confirmed_through: Option<DateTime<Utc>>,
    /// A dispatcher: per work queue (`default`, `bulk`, `swept`), the latest
    /// `enters_at` its workers started and the earliest still waiting in its
    /// buffer.
    pub queues: Vec<QueueMark>,
}

/// How far one dispatcher has got in one work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueMark {
    pub queue: &'static str,
    pub started_through: Option<DateTime<Utc>>,
    pub holding_since: Option<DateTime<Utc>>,
}

/// A process not seen for a while: stopped, killed, or cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostProcess {
    pub id: Uuid,
    pub kind: String,
    pub confirmed_through: Option<DateTime<Utc>>,
    pub seen_at: DateTime<Utc>,
}

/// How far the work queues have got, as the sweeper reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueProgress {
    /// The database's now.
    pub now: DateTime<Utc>,
    /// Per queue, the latest `enters_at` any dispatcher started.
    pub started: Vec<(String, DateTime<Utc>)>,
    /// Per queue, the earliest `enters_at` a live dispatcher holds unstarted.
    pub holding: Vec<(String, DateTime<Utc>)>,
}

impl PgStore {
    /// Writes `presence` and answers with the database's clock, read as late
    /// in the statement as it can be. A time of the process's is kept no
    /// later than the database's now, and a time it does not have stays
    /// NULL (`least` alone would make it now).
    pub(crate) async fn process_seen(&self, presence: &Presence) -> StoreResult<DateTime<Utc>> {
        let queues: Vec<&str> = presence.queues.iter().map(|q| q.queue).collect();
        let started: Vec<Option<DateTime<Utc>>> = presence.queues.iter().map(|q| q.started_through).collect();
        let holding: Vec<Option<DateTime<Utc>>> = presence.queues.iter().map(|q| q.holding_since).collect();
        let micros = presence.host_clock_ahead.num_microseconds().unwrap_or(0);
        Ok(sqlx::query_scalar(
            "WITH seen AS (
                 INSERT INTO processes AS p (id, kind, started_at, seen_at, host_clock_ahead, confirmed_through)
                 VALUES ($1, $2, now(), now(), make_interval(secs => $3::float8 / 1e6),
                         CASE WHEN $4 IS NULL THEN NULL ELSE least($4, now()) END)
                 ON CONFLICT (id) DO UPDATE
                    SET seen_at = now(), host_clock_ahead = excluded.host_clock_ahead,
                        confirmed_through = excluded.confirmed_through
                 RETURNING 1),
             marks AS (
                 INSERT INTO queue_marks AS m (process_id, queue, started_through, holding_since)
                 SELECT $1, q.queue, CASE WHEN q.started IS NULL THEN NULL ELSE least(q.started, now()) END, q.holding
                   FROM unnest($5::text[], $6::timestamptz[], $7::timestamptz[]) AS q(queue, started, holding)
                 ON CONFLICT (process_id, queue) DO UPDATE
                    SET started_through = greatest(m.started_through, excluded.started_through),
                        holding_since = excluded.holding_since
                 RETURNING 1),
             -- The lanes' watermarks as sweepers of the release before read them.
             lanes AS (
                 UPDATE lane_watermarks w SET received_through = least(q.started, now())
                   FROM unnest($5::text[], $6::timestamptz[]) AS q(queue, started)
                  WHERE w.lane = q.queue AND q.started IS NOT NULL AND w.received_through < least(q.started, now())
                 RETURNING 1)
             SELECT clock_timestamp()
               FROM (SELECT count(*) FROM seen) s, (SELECT count(*) FROM marks) m, (SELECT count(*) FROM lanes) l",
        )
        .bind(presence.id)
        .bind(presence.kind)
        .bind(micros as f64)
        .bind(presence.confirmed_through)
        .bind(queues)
        .bind(started)
        .bind(holding)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The processes not seen for `after`, oldest first.
    pub(crate) async fn lost_processes(&self, after: std::time::Duration) -> StoreResult<Vec<LostProcess>> {
        type Row = (Uuid, String, Option<DateTime<Utc>>, DateTime<Utc>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, kind, confirmed_through, seen_at FROM processes
              WHERE seen_at < now() - make_interval(secs => $1) ORDER BY seen_at",
        )
        .bind(after.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, kind, confirmed_through, seen_at)| LostProcess { id, kind, confirmed_through, seen_at })
            .collect())
    }

    /// Forgets a process that was lost, and what it held.
    pub(crate) async fn forget_process(&self, id: Uuid) -> StoreResult<()> {
        sqlx::query(
            "WITH marks AS (DELETE FROM queue_marks WHERE process_id = $1)
             DELETE FROM processes WHERE id = $1",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// How far the work queues have got: the started marks of every
    /// dispatcher (and the watermarks dispatchers of the release before
    /// wrote), and the holds of those seen within `live`, each clamped to
    /// the database's now.
    pub(crate) async fn queue_progress(&self, live: std::time::Duration) -> StoreResult<QueueProgress> {
        type Marks = Vec<Option<DateTime<Utc>>>;
        let (now, queues, started, holding): (DateTime<Utc>, Vec<String>, Marks, Marks) = sqlx::query_as(
            "WITH marks AS (
                 SELECT m.queue, max(m.started_through) AS started,
                        min(m.holding_since) FILTER (WHERE p.seen_at >= now() - make_interval(secs => $1)) AS holding
                   FROM queue_marks m JOIN processes p ON p.id = m.process_id
                  GROUP BY m.queue
                 UNION ALL
                 SELECT lane, CASE WHEN received_through = '-infinity' THEN NULL ELSE received_through END, NULL
                   FROM lane_watermarks),
             queues AS (
                 SELECT queue,
                        CASE WHEN max(started) IS NULL THEN NULL ELSE least(max(started), now()) END AS started,
                        CASE WHEN min(holding) IS NULL THEN NULL ELSE least(min(holding), now()) END AS holding
                   FROM marks GROUP BY queue)
             SELECT now(), coalesce(array_agg(queue), '{}'), coalesce(array_agg(started), '{}'),
                    coalesce(array_agg(holding), '{}')
               FROM queues",
        )
        .bind(live.as_secs_f64())
        .fetch_one(&self.pool)
        .await?;
        let pick = |marks: Vec<Option<DateTime<Utc>>>| -> Vec<(String, DateTime<Utc>)> {
            queues.iter().zip(marks).filter_map(|(queue, at)| Some((queue.clone(), at?))).collect()
        };
        Ok(QueueProgress { now, started: pick(started), holding: pick(holding) })
    }
}
