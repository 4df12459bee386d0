//! A connection kept by one of the batching tasks on the delivery path (the
//! ingest writer, the dispatcher's admission checks) between its
//! statements, instead of taken from the pool for each.
//!
//! The pool checks every connection it hands out with a round trip to the
//! server, and every connection given back with another: on the path from
//! an ingest to its POST, each of these two statements cost three round
//! trips where one does the work. A kept connection is checked only when it
//! has been idle for [`CHECK_AFTER`], and is given back to the pool after
//! any error other than the server's answer to the statement.
//!
//! A server that ends a connection (a restart, a failover, an operator's
//! `pg_terminate_backend`) says so before it closes (SQLSTATE 57P01 and
//! its kin): the next statement on the kept connection reads that notice
//! instead of an answer. That statement goes again, once, on a connection
//! from the pool, so the caller sees no error where a pooled connection's
//! check would have spared it one. Going twice is safe for both statements
//! kept this way, even if the notice came while the first one ran: the
//! admission check only reads, and an ingest's events carry ids made before
//! the statement, the events' primary key, so a batch that committed after
//! all fails on them rather than storing its events twice. A statement cut
//! off by a server that went away without notice fails, as it would on a
//! pooled connection.
//!
//! A pool of fewer than [`KEEP_FROM`] connections keeps none: a connection
//! held aside there would leave too few for the rest of the process.

use std::time::{Duration, Instant};

use sqlx::{
    Connection, FromRow, PgPool, Postgres,
    pool::PoolConnection,
    postgres::{PgArguments, PgRow},
    query::QueryAs,
};
use tokio::sync::Mutex;

/// A connection idle for longer is pinged before its next statement.
const CHECK_AFTER: Duration = Duration::from_secs(1);

/// The smallest pool that keeps connections aside.
const KEEP_FROM: u32 = 4;

/// One kept connection, taken from the pool at its first statement.
#[derive(Debug, Default)]
pub(crate) struct Held {
    kept: Mutex<Option<(PoolConnection<Postgres>, Instant)>>,
}

impl Held {
    /// Fetches the rows of `statement` (made afresh for each try) on the
    /// kept connection, or on one taken from `pool` when none is kept, the
    /// kept one failed its check, or the server had ended it.
    pub(crate) async fn fetch_all<'q, O>(
        &self,
        pool: &PgPool,
        statement: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Vec<O>, sqlx::Error>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        if pool.options().get_max_connections() < KEEP_FROM {
            return statement().fetch_all(pool).await;
        }
        let mut kept = self.kept.lock().await;
        let (mut connection, reused) = match kept.take() {
            Some((connection, used)) if used.elapsed() < CHECK_AFTER => (connection, true),
            Some((mut connection, _)) => match connection.ping().await {
                Ok(()) => (connection, false),
                // Dropped: the pool's own check closes it.
                Err(_) => (pool.acquire().await?, false),
            },
            None => (pool.acquire().await?, false),
        };
        let mut result = statement().fetch_all(&mut *connection).await;
        if reused && matches!(&result, Err(error) if ended_by_server(error)) {
            tracing::info!("the database ended a kept connection; running the statement on a new one");
            connection = pool.acquire().await?;
            result = statement().fetch_all(&mut *connection).await;
        }
        match &result {
            Err(error) if !matches!(error, sqlx::Error::Database(_)) || ended_by_server(error) => {}
            _ => *kept = Some((connection, Instant::now())),
        }
        result
    }
}

/// Whether `error` is the server's notice that it ended the connection
/// (SQLSTATE class 57, operator intervention: `admin_shutdown`,
/// `crash_shutdown`, `cannot_connect_now`), sent before the statement ran.
fn ended_by_server(error: &sqlx::Error) -> bool {
    error.as_database_error().and_then(|error| error.code()).is_some_and(|code| code.starts_with("57P"))
}
