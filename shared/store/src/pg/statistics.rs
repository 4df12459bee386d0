//! Planner statistics on a server that runs without autovacuum. Each
//! connection settles on a generic plan for a statement after its fifth run
//! and keeps it until its tables are analyzed: a plan made while
//! `deliveries` was nearly empty hashes the whole table on every admission
//! check and outbox claim once it holds millions of rows (measured: 19 ms
//! per admission check at 90,000 deliveries, 250 ms per outbox claim at two
//! million). When autovacuum is off, the API analyzes a table once a tenth
//! of it changed, as autovacuum would.

use super::PgStore;
use crate::StoreResult;

/// The advisory lock that keeps several API processes from analyzing at
/// once (an arbitrary key of this service's own).
const ANALYZING: i64 = 0x7765_6268_6f6f_6b73;

impl PgStore {
    pub(crate) async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        // Autovacuum's own rule: 50 rows and a tenth of the table changed
        // since the last analyze. (Counting only rows added or removed, so
        // that tables updated in place are analyzed less, measured a third
        // fewer events/s end to end.) Only tables this role may analyze.
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT format('%I.%I', s.schemaname, s.relname) FROM pg_stat_user_tables s
               JOIN pg_class c ON c.oid = s.relid
              WHERE current_setting('autovacuum') = 'off' AND s.schemaname = current_schema()
                AND s.n_mod_since_analyze > 50 + 0.1 * greatest(s.n_live_tup, 0)
                AND pg_has_role(c.relowner, 'USAGE')
                AND pg_try_advisory_xact_lock($1)
              ORDER BY s.relname",
        )
        .bind(ANALYZING)
        .fetch_all(&mut *tx)
        .await?;
        if !stale.is_empty() {
            // A table busy with other work (an index built CONCURRENTLY, a
            // manual VACUUM) is left for a later round.
            sqlx::query("SET LOCAL lock_timeout = '1s'").execute(&mut *tx).await?;
            // Large tables take a while to sample.
            sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
            sqlx::query(&format!("ANALYZE {}", stale.join(", "))).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(stale)
    }
}
