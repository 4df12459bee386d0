//! Planner statistics on a server that runs without autovacuum. Each
//! connection settles on a generic plan for a statement after its fifth run
//! and keeps it until its tables are analyzed: a plan made while
//! `deliveries` was nearly empty hashes the whole table on every admission
//! check and outbox claim once it holds millions of rows (measured: 19 ms
//! per admission check at 90,000 deliveries, 250 ms per outbox claim at two
//! million). Autovacuum analyzes a table once a tenth of it changed; when it
//! is off, the API does the same.

use super::PgStore;
use crate::StoreResult;

/// The advisory lock that keeps several API processes from analyzing at
/// once (an arbitrary key of this service's own).
const ANALYZING: i64 = 0x7765_6268_6f6f_6b73;

impl PgStore {
    pub(crate) async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        // Autovacuum's own rule: 50 rows and a tenth of the table changed
        // since the last analyze.
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT relname::text FROM pg_stat_user_tables
              WHERE current_setting('autovacuum') = 'off' AND schemaname = current_schema()
                AND n_mod_since_analyze > 50 + 0.1 * greatest(n_live_tup, 0)
                AND pg_try_advisory_xact_lock($1)
              ORDER BY relname",
        )
        .bind(ANALYZING)
        .fetch_all(&mut *tx)
        .await?;
        if !stale.is_empty() {
            let tables: Vec<String> = stale.iter().map(|name| format!("\"{}\"", name.replace('"', "\"\""))).collect();
            sqlx::query(&format!("ANALYZE {}", tables.join(", "))).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(stale)
    }
}
