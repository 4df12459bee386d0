//! Recoveries on PostgreSQL (see `recoveries.rs`): a job row per recovery,
//! one running per endpoint (a unique index), held by one API process at a
//! time through a lease it renews with each batch.

use std::time::Duration;

use uuid::Uuid;

use super::PgStore;
use crate::recoveries::{COLUMNS, RecoveryRow};
use crate::{
    NewRecovery, Recoverable, Recovery, RecoveryStart, RecoveryStep, StoreError, StoreResult, events::RecoveryBatch,
};

/// The unique index that allows one running recovery per endpoint.
const ONE_RUNNING: &str = "recoveries_one_running";

impl PgStore {
    pub(crate) async fn start_recovery(&self, new: &NewRecovery) -> StoreResult<RecoveryStart> {
        let (after, until) = new.range();
        let started: Result<RecoveryRow, sqlx::Error> = sqlx::query_as(&format!(
            "INSERT INTO recoveries (id, endpoint_id, developer_id, since, until, state, total, api_key_id,
                                     after_sequence, until_sequence, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $9, now(), now())
             RETURNING {COLUMNS}"
        ))
        .bind(new.id)
        .bind(&new.endpoint_id)
        .bind(new.developer_id)
        .bind(new.window.since)
        .bind(new.window.until)
        .bind(new.total())
        .bind(new.api_key_id)
        .bind(after)
        .bind(until)
        .fetch_one(&self.pool)
        .await;
        match started {
            Ok(row) => Ok(RecoveryStart::Started(row.into())),
            Err(error) if error.as_database_error().and_then(|e| e.constraint()) == Some(ONE_RUNNING) => {
                let running: Option<RecoveryRow> = sqlx::query_as(&format!(
                    "SELECT {COLUMNS} FROM recoveries WHERE endpoint_id = $1 AND state = 'running'"
                ))
                .bind(&new.endpoint_id)
                .fetch_optional(&self.pool)
                .await?;
                // Finished in between: a retry of the call starts one.
                running
                    .map(|row| RecoveryStart::Running(row.into()))
                    .ok_or_else(|| StoreError::Corrupt("a running recovery ended while another started".into()))
            }
            Err(error) => Err(error.into()),
        }
    }

    pub(crate) async fn count_recovery(&self, id: Uuid, counted: &Recoverable) -> StoreResult<()> {
        let (after, until) = counted.range();
        sqlx::query(crate::recoveries::COUNTED)
            .bind(id)
            .bind(counted.total())
            .bind(after)
            .bind(until)
            .bind(counted.reason())
            .bind(webhooks_model::time::now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn latest_recovery(&self, endpoint_id: &str) -> StoreResult<Option<Recovery>> {
        let row: Option<RecoveryRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM recoveries WHERE endpoint_id = $1 ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(endpoint_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Into::into))
    }

    pub(crate) async fn claim_recoveries(
        &self,
        owner: Uuid,
        lease: Duration,
        limit: i64,
    ) -> StoreResult<Vec<Recovery>> {
        let free = "owner = $1 OR lease_until IS NULL OR lease_until < now()";
        let rows: Vec<RecoveryRow> = sqlx::query_as(&format!(
            "UPDATE recoveries SET owner = $1, lease_until = now() + make_interval(secs => $2)
              WHERE id IN (SELECT id FROM recoveries
                            WHERE id IN ({TURNS}) AND state = 'running'
                              AND (owner = $1 OR lease_until IS NULL OR lease_until < now())
                              FOR UPDATE SKIP LOCKED)
              RETURNING {COLUMNS}",
            TURNS = crate::recoveries::TURNS.replace("{free}", free)
        ))
        .bind(owner)
        .bind(lease.as_secs_f64())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    pub(crate) async fn recovery_step(
        &self,
        recovery: &Recovery,
        owner: Uuid,
        batch: i64,
        lease: Duration,
    ) -> StoreResult<RecoveryStep> {
        let endpoint = self.get_endpoint(recovery.developer_id, &recovery.endpoint_id).await?;
        let mut tx = self.pool.begin().await?;
        let held: Option<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT after_sequence, until_sequence FROM recoveries
              WHERE id = $1 AND owner = $2 AND state = 'running' FOR UPDATE",
        )
        .bind(recovery.id)
        .bind(owner)
        .fetch_optional(&mut *tx)
        .await?;
        let range = match held {
            None => return Ok(RecoveryStep { queued: 0, done: true }),
            Some((after, Some(until))) => (after, until),
            // Counted without its range (an older API stored it): the first
            // batch fixes the window as a range of the developer's event
            // sequences, which the batches then walk.
            Some((_, None)) => {
                sqlx::query_as(
                    "UPDATE recoveries r
                        SET after_sequence = greatest(r.after_sequence, coalesce(b.first - 1, 0)),
                            until_sequence = coalesce(b.last, 0)
                       FROM (SELECT min(sequence) AS first, max(sequence) AS last FROM events
                              WHERE developer_id = $2 AND created_at >= $3 AND created_at < $4) b
                      WHERE r.id = $1
                  RETURNING r.after_sequence, r.until_sequence",
                )
                .bind(recovery.id)
                .bind(recovery.developer_id)
                .bind(recovery.window.since)
                .bind(recovery.window.until)
                .fetch_one(&mut *tx)
                .await?
            }
        };
        let done = match endpoint {
            // Deleted since: nothing more to queue.
            None => RecoveryBatch { queued: 0, last_sequence: None },
            Some(endpoint) => super::events::recover_batch(&mut tx, &endpoint, recovery.window, range, batch).await?,
        };
        match done.last_sequence {
            Some(last) => {
                sqlx::query(
                    "UPDATE recoveries SET after_sequence = $2, queued = queued + $3, last_error = NULL,
                            lease_until = now() + make_interval(secs => $4), updated_at = now()
                      WHERE id = $1",
                )
                .bind(recovery.id)
                .bind(last)
                .bind(i64::try_from(done.queued).unwrap_or(i64::MAX))
                .bind(lease.as_secs_f64())
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query(
                    "UPDATE recoveries SET state = 'done', owner = NULL, lease_until = NULL, last_error = NULL,
                            updated_at = now(), finished_at = now()
                      WHERE id = $1",
                )
                .bind(recovery.id)
                .execute(&mut *tx)
                .await?;
            }
        }
        if done.queued > 0 {
            // A relay in another process publishes them at the commit.
            sqlx::query("SELECT pg_notify($1, '')").bind(super::OUTBOX_CHANNEL).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(RecoveryStep { queued: done.queued, done: done.last_sequence.is_none() })
    }

    pub(crate) async fn recovery_failed(&self, id: Uuid, error: &str) -> StoreResult<()> {
        sqlx::query("UPDATE recoveries SET last_error = $2, updated_at = now() WHERE id = $1")
            .bind(id)
            .bind(error)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn release_recoveries(&self, owner: Uuid) -> StoreResult<()> {
        sqlx::query("UPDATE recoveries SET owner = NULL, lease_until = NULL WHERE owner = $1 AND state = 'running'")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
