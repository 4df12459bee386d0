//! A connection kept by one of the batching tasks on the delivery path (the
//! ingest writer, the dispatcher's admission checks) between its
//! statements, instead of taken from the pool for each. Each has one user,
//! its batching task; a second caller would wait for it.
//!
//! The pool checks every connection it hands out with a round trip to the
//! server, and every connection given back with another: on the path from
//! an ingest to its POST, each of these two statements cost three round
//! trips where one does the work. A kept connection is checked only when it
//! has been idle for [`CHECK_AFTER`], goes back to the pool when it is older
//! than the pool's `max_lifetime`, and after any error but the server's
//! answer to the statement (a refused constraint, say).
//!
//! A kept connection the server ended (a restart, a failover, an operator's
//! `pg_terminate_backend`) fails the next statement: with the server's
//! notice (SQLSTATE 57P01 and its kin), or with a broken pipe when the
//! write meets the closed socket. That statement then goes again, once, on
//! a connection from the pool, so the caller sees no error where a pooled
//! connection's check would have spared it one. Going twice is safe for
//! both statements kept this way: the admission check only reads, and an
//! ingest's events carry ids made before the statement, the events' primary
//! key, so a batch that committed after all would fail on them rather than
//! store its events twice.
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
    kept: Mutex<Option<Kept>>,
}

#[derive(Debug)]
struct Kept {
    connection: PoolConnection<Postgres>,
    taken: Instant,
    used: Instant,
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
        if pool.options().get_max_connections() < KEEP_FROM || pool.is_closed() {
            return statement().fetch_all(pool).await;
        }
        let mut kept = self.kept.lock().await;
        let lifetime = pool.options().get_max_lifetime().unwrap_or(Duration::MAX);
        let (mut connection, mut taken, reused) = match kept.take() {
            Some(old) if old.taken.elapsed() >= lifetime => (pool.acquire().await?, Instant::now(), false),
            Some(Kept { connection, taken, used }) if used.elapsed() < CHECK_AFTER => (connection, taken, true),
            Some(Kept { mut connection, taken, .. }) => match connection.ping().await {
                Ok(()) => (connection, taken, false),
                // Dropped: the pool's own check closes it.
                Err(_) => (pool.acquire().await?, Instant::now(), false),
            },
            None => (pool.acquire().await?, Instant::now(), false),
        };
        let mut result = statement().fetch_all(&mut *connection).await;
        if reused && matches!(&result, Err(error) if !answered(error)) {
            tracing::info!("a kept database connection failed; running the statement on a new one");
            (connection, taken) = (pool.acquire().await?, Instant::now());
            result = statement().fetch_all(&mut *connection).await;
        }
        if result.as_ref().err().is_none_or(answered) {
            *kept = Some(Kept { connection, taken, used: Instant::now() });
        }
        result
    }

    /// Gives the kept connection back to the pool (before it closes).
    pub(crate) async fn release(&self) {
        self.kept.lock().await.take();
    }
}

/// Whether `error` is the server's answer to the statement on a connection
/// that goes on: not a broken connection, and not the server's notice that
/// it ended the connection (SQLSTATE class 57P: `admin_shutdown`,
/// `crash_shutdown`, `cannot_connect_now`, ...), which comes before a
/// statement runs or while it runs, rolled back.
fn answered(error: &sqlx::Error) -> bool {
    let Some(error) = error.as_database_error() else { return false };
    !error.code().is_some_and(|code| code.starts_with("57P") || code.starts_with("08"))
}
