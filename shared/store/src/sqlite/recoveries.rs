//! Recoveries on SQLite (see `recoveries.rs`). One process holds the data
//! directory: a lease only matters across its restarts, and the write lock
//! makes one running recovery per endpoint.

use std::time::Duration;

use uuid::Uuid;

use super::{SqliteStore, micros};
use crate::recoveries::{COLUMNS, RecoveryRow};
use crate::{NewRecovery, Recoverable, Recovery, RecoveryStart, RecoveryStep, StoreResult, events::RecoveryBatch};

fn now() -> i64 {
    micros(webhooks_model::time::now())
}

impl SqliteStore {
    pub(crate) async fn start_recovery(&self, new: &NewRecovery) -> StoreResult<RecoveryStart> {
        let (after, until) = new.range();
        let mut tx = self.begin().await?;
        let running: Option<RecoveryRow> =
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM recoveries WHERE endpoint_id = $1 AND state = 'running'"))
                .bind(&new.endpoint_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(running) = running {
            return Ok(RecoveryStart::Running(running.into()));
        }
        let row: RecoveryRow = sqlx::query_as(&format!(
            "INSERT INTO recoveries (id, endpoint_id, developer_id, since, until, state, total, api_key_id,
                                     after_sequence, until_sequence, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $9, $10, $10)
             RETURNING {COLUMNS}"
        ))
        .bind(new.id.hyphenated())
        .bind(&new.endpoint_id)
        .bind(new.developer_id.hyphenated())
        .bind(micros(new.window.since))
        .bind(micros(new.window.until))
        .bind(new.total())
        .bind(new.api_key_id.map(|id| id.hyphenated()))
        .bind(after)
        .bind(until)
        .bind(now())
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(RecoveryStart::Started(row.into()))
    }

    pub(crate) async fn count_recovery(&self, id: Uuid, counted: &Recoverable) -> StoreResult<()> {
        let (after, until) = counted.range();
        sqlx::query(crate::recoveries::COUNTED)
            .bind(id.hyphenated())
            .bind(counted.total())
            .bind(after)
            .bind(until)
            .bind(counted.reason())
            .bind(now())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub(crate) async fn latest_recovery(&self, endpoint_id: &str) -> StoreResult<Option<Recovery>> {
        let row: Option<RecoveryRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM recoveries WHERE endpoint_id = $1 ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(endpoint_id)
        .fetch_optional(&self.reader)
        .await?;
        Ok(row.map(Into::into))
    }

    pub(crate) async fn claim_recoveries(
        &self,
        owner: Uuid,
        lease: Duration,
        limit: i64,
    ) -> StoreResult<Vec<Recovery>> {
        let now = now();
        let until = now + i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        let rows: Vec<RecoveryRow> = sqlx::query_as(&format!(
            "UPDATE recoveries SET owner = $1, lease_until = $3
              WHERE id IN ({TURNS})
              RETURNING {COLUMNS}",
            TURNS = crate::recoveries::TURNS
                .replace("{free}", "owner = $1 OR lease_until IS NULL OR lease_until < $2")
                .replace("$3", "$4")
        ))
        .bind(owner.hyphenated())
        .bind(now)
        .bind(until)
        .bind(limit)
        .fetch_all(&self.writer)
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
        let mut tx = self.begin().await?;
        let held: Option<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT after_sequence, until_sequence FROM recoveries WHERE id = $1 AND owner = $2 AND state = 'running'",
        )
        .bind(recovery.id.hyphenated())
        .bind(owner.hyphenated())
        .fetch_optional(&mut *tx)
        .await?;
        let range = match held {
            None => return Ok(RecoveryStep { queued: 0, done: true }),
            Some((after, Some(until))) => (after, until),
            // The first batch fixes the range (see the PostgreSQL store).
            Some((_, None)) => {
                sqlx::query_as(
                    "UPDATE recoveries
                        SET after_sequence = max(after_sequence, coalesce(
                                (SELECT min(sequence) - 1 FROM events
                                  WHERE developer_id = $2 AND created_at >= $3 AND created_at < $4), 0)),
                            until_sequence = coalesce(
                                (SELECT max(sequence) FROM events
                                  WHERE developer_id = $2 AND created_at >= $3 AND created_at < $4), 0)
                      WHERE id = $1
                  RETURNING after_sequence, until_sequence",
                )
                .bind(recovery.id.hyphenated())
                .bind(recovery.developer_id.hyphenated())
                .bind(micros(recovery.window.since))
                .bind(micros(recovery.window.until))
                .fetch_one(&mut *tx)
                .await?
            }
        };
        let done = match endpoint {
            None => RecoveryBatch { queued: 0, last_sequence: None },
            Some(endpoint) => super::events::recover_batch(&mut tx, &endpoint, recovery.window, range, batch).await?,
        };
        let now = now();
        match done.last_sequence {
            Some(last) => {
                sqlx::query(
                    "UPDATE recoveries SET after_sequence = $2, queued = queued + $3, last_error = NULL,
                            lease_until = $4, updated_at = $5
                      WHERE id = $1",
                )
                .bind(recovery.id.hyphenated())
                .bind(last)
                .bind(i64::try_from(done.queued).unwrap_or(i64::MAX))
                .bind(now + i64::try_from(lease.as_micros()).unwrap_or(i64::MAX))
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query(
                    "UPDATE recoveries SET state = 'done', owner = NULL, lease_until = NULL, last_error = NULL,
                            updated_at = $2, finished_at = $2
                      WHERE id = $1",
                )
                .bind(recovery.id.hyphenated())
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        if done.queued > 0 {
            self.work.notify_one();
        }
        Ok(RecoveryStep { queued: done.queued, done: done.last_sequence.is_none() })
    }

    pub(crate) async fn recovery_failed(&self, id: Uuid, error: &str) -> StoreResult<()> {
        sqlx::query("UPDATE recoveries SET last_error = $2, updated_at = $3 WHERE id = $1")
            .bind(id.hyphenated())
            .bind(error)
            .bind(now())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub(crate) async fn release_recoveries(&self, owner: Uuid) -> StoreResult<()> {
        sqlx::query("UPDATE recoveries SET owner = NULL, lease_until = NULL WHERE owner = $1 AND state = 'running'")
            .bind(owner.hyphenated())
            .execute(&self.writer)
            .await?;
        Ok(())
    }
}
