//! The fault run (`tests::faults`, the `webhooks-faults` tool) small: 1,000
//! events per backend at a steady rate while the system is broken under
//! them, and not one accepted event may be missing where the contract sends
//! it (API.md §5: at-least-once; README: duplicates after a crash are
//! possible, losses are not). Duplicates are reported, not failed.
//!
//! - distributed: dispatcher processes SIGKILLed every 3 s and replaced,
//!   RabbitMQ stopped for 4 s, PostgreSQL restarted;
//! - standalone: the `webhooks-api standalone` process SIGKILLed every 3 s
//!   and started again on its `DATA_DIR`.
//!
//! The distributed run stops the broker and restarts the database this
//! machine's tests share, so no other test may run meanwhile: under
//! `cargo test` the two take turns (a lock) and test binaries run one after
//! another; under nextest each takes every test slot (`.config/nextest.toml`).
//! The distributed run needs
//! `rabbitmqctl` with the rights to use it (root), and restarts PostgreSQL
//! where `pg_lsclusters` shows the tests' cluster (otherwise it says so and
//! leaves it be). `WEBHOOKS_TEST_FAULTS=0` turns both off, for a machine
//! whose services others share.

use std::time::Duration;

use tests::{
    Backend,
    faults::{self, FaultOptions},
    procs::Programs,
};

const SWITCH: &str = "WEBHOOKS_TEST_FAULTS";

/// One run at a time: each takes most of the machine's two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn switched_off() -> bool {
    std::env::var(SWITCH).as_deref() == Ok("0")
}

fn small(backend: Backend) -> FaultOptions {
    let programs = Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"));
    FaultOptions {
        events: 1_000,
        rate: 50.0,
        dispatchers: 3,
        kill_every: Duration::from_secs(3),
        broker_outage: Some(Duration::from_secs(4)),
        settle: Duration::from_secs(90),
        ..FaultOptions::new(backend, programs)
    }
}

async fn run_and_check(options: FaultOptions) {
    let report = tokio::time::timeout(Duration::from_secs(300), faults::run(options))
        .await
        .expect("the fault run did not end within 5 minutes")
        .expect("the fault run could not be made");
    let summary = report.summary();
    eprintln!("{summary}");
    assert!(report.accepted > 0, "nothing was accepted:\n{summary}");
    assert!(report.kills > 0, "nothing was killed:\n{summary}");
    assert_eq!(report.total.lost, 0, "accepted events were lost:\n{summary}");
    assert_eq!(report.total.violations(), 0, "something arrived that must not:\n{summary}");
}

#[tokio::test(flavor = "multi_thread")]
async fn distributed_kills_and_outages_lose_no_accepted_event() {
    if switched_off() || !faults::can_restart_broker() {
        tests::skip(&format!("this machine cannot restart RabbitMQ from here (rabbitmqctl as root), or {SWITCH}=0"));
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    run_and_check(small(Backend::Distributed)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_kill_9s_lose_no_accepted_event() {
    if switched_off() {
        tests::skip(&format!("{SWITCH}=0"));
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    run_and_check(small(Backend::Standalone)).await;
}
