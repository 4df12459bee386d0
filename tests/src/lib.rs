//! The black-box test harness: the real API (its `run` function) on port 0,
//! against the real PostgreSQL and RabbitMQ, with HTTPS receivers.
//!
//! - [`db`]: a fresh database per test, dropped afterwards;
//! - [`broker`]: a queue prefix per test with its clean-up, and
//!   [`broker::LifecycleTap`], a listener on the lifecycle exchange;
//! - [`ca`]: a throwaway certificate authority and the server certificates it
//!   (or nobody) issues;
//! - [`receiver`]: an HTTPS server that records what it gets, answers as told
//!   and checks signatures as a user's receiver would;
//! - [`api`]: [`api::TestApi`], one running API instance with its own database,
//!   prefix and CA, and request helpers;
//! - [`dispatcher`]: a dispatcher beside a [`api::TestApi`], for delivery tests;
//! - [`expect`]: the contract's shapes (error bodies, timestamps, ids);
//! - [`procs`]: the system as processes (API, dispatchers, standalone),
//!   for the tools that kill and restart them;
//! - [`tally`]: a counting receiver for long runs; [`producer`]: events at a
//!   steady rate with idempotent retries, and the accounting of a run;
//! - [`faults`]: the fault run (`webhooks-faults`, `tests/tests/faults.rs`);
//!   [`flags`]: the tool binaries' flags;
//! - [`outside`]: nginx and wrk, the outside programs the benchmark
//!   (`webhooks-bench`) measures against.
//!
//! Every test builds its own [`api::TestApi`], so tests share nothing but the
//! servers. Use `#[tokio::test(flavor = "multi_thread")]`: clean-up after a
//! failed test waits for the API to stop, which needs a second worker.
//!
//! Environment: `TEST_DATABASE_ADMIN_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and `TEST_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`).

pub mod api;
pub mod broker;
pub mod ca;
pub mod db;
pub mod dispatcher;
pub mod expect;
pub mod faults;
pub mod flags;
mod flight;
pub use flight::recorded_lines;
pub mod outside;
pub mod procs;
pub mod producer;
pub mod receiver;
pub mod tally;

use std::{future::Future, sync::Once, time::Duration};

pub use api::{ApiOptions, ApiResponse, Backend, DeveloperKey, TestApi};
pub use broker::LifecycleTap;
pub use ca::{ServerCert, TestCa};
pub use dispatcher::TestDispatcher;
pub use receiver::{Receiver, RecordedRequest, Reply};
pub use webhooks_test_macros::test;

/// Says on the terminal that the running test cannot run here, and why.
/// Written past the test harness's capture of output, so that a skipped
/// test shows as skipped in every run, not as a silent pass; and appended to
/// the file `TEST_SKIPPED_LOG` names, for a runner that keeps each test's
/// output to itself (`tests/run` prints that file at the end).
pub fn skip(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("a test");
    let line = format!("SKIPPED {name} ({:?}): {reason}\n", Backend::current());
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("TEST_SKIPPED_LOG") {
        // One write of one line to a file opened for appending: lines of
        // tests in other processes do not interleave.
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
        let _ = file.and_then(|mut file| file.write_all(line.as_bytes()));
    }
}

/// How long any wait in the harness lasts before the test fails: generous,
/// because the machine is shared with builds.
pub const WAIT: Duration = Duration::from_secs(30);

/// Process-wide set-up: the TLS crypto provider (reqwest is built without
/// one), a tracing subscriber that shows what `RUST_LOG` asks for and the
/// flight recorder that a hung test dumps. Idempotent.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let shown = tracing_subscriber::fmt::layer().with_test_writer().with_filter(filter);
        let recorded = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_thread_names(true)
            .with_writer(flight::Recorder)
            .with_filter(flight::filter());
        let _ = tracing_subscriber::registry().with(shown).with(recorded).try_init();
    });
}

/// 16 random lowercase hex digits, for names that must not collide between
/// tests running side by side.
pub fn random_suffix() -> String {
    let mut id = uuid::Uuid::new_v4().simple().to_string();
    id.truncate(16);
    id
}

/// Runs `future` to completion on a runtime of its own, on a thread of its own.
///
/// Clean-up code in `Drop` uses it: it may run inside a test's runtime (where
/// blocking on that runtime would deadlock) or after it is gone.
pub(crate) fn block_on_aside<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let thread = std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(async {
            if tokio::time::timeout(WAIT, future).await.is_err() {
                tracing::warn!("test clean-up timed out");
            }
        }),
        Err(error) => tracing::warn!(%error, "no runtime for test clean-up"),
    });
    let _ = thread.join();
}
