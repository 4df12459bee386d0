//! The fault run (`tests::faults`): the system as processes under a steady
//! stream of events while dispatchers (or standalone) are SIGKILLed, RabbitMQ
//! is stopped and started and PostgreSQL restarted; then what was lost and
//! what arrived twice.
//!
//! ```sh
//! cargo run --release -p tests --bin webhooks-faults -- --events 10000
//! ```
//!
//! It runs the service's programs as itself (`WEBHOOKS_API_BIN` and
//! `WEBHOOKS_DISPATCHER_BIN` name others), against the local PostgreSQL and
//! RabbitMQ (`TEST_DATABASE_ADMIN_URL`, `TEST_AMQP_URL`), on a fresh database
//! and queue prefix, or a fresh `DATA_DIR`. It stops the broker and restarts
//! the database others on the machine may be using: run it alone. It exits 1
//! when an accepted event did not arrive where the contract sends it, or
//! something arrived that must not (a bad signature, a misrouted event).

use std::{process::ExitCode, time::Duration};

use tests::{
    Backend,
    faults::{self, FaultOptions},
    flags::{Flags, out},
    procs::{self, Programs},
};

const USAGE: &str = "\
webhooks-faults [--backend distributed|standalone|both] [--events N] [--rate R]
                [--dispatchers N] [--kill-every SECS] [--broker-outage SECS]
                [--no-database-restart] [--settle SECS] [--receiver-fail-every N]
                [--keep-logs] [--quiet]

  --backend              which system to break (default: both, distributed first)
  --events               events offered per backend (default 10000)
  --rate                 events per second (default 100)
  --dispatchers          dispatcher processes kept running (default 3)
  --kill-every           seconds between SIGKILLs (default 4)
  --broker-outage        seconds RabbitMQ stays stopped; 0: not stopped (default 5)
  --no-database-restart  do not restart PostgreSQL
  --settle               seconds everything may take to arrive after the faults (default 180)
  --receiver-fail-every  receivers answer every n-th request 503; 0: never (default 50)
  --keep-logs            keep the processes' logs even when all is well
  --quiet                no progress lines on stderr";

fn options(flags: &Flags, backend: Backend, programs: &Programs) -> anyhow::Result<FaultOptions> {
    let defaults = FaultOptions::new(backend, programs.clone());
    let outage: f64 = flags.get("broker-outage", 5.0)?;
    Ok(FaultOptions {
        events: flags.get("events", defaults.events)?,
        rate: flags.get("rate", defaults.rate)?,
        dispatchers: flags.get("dispatchers", defaults.dispatchers)?,
        kill_every: Duration::from_secs_f64(flags.get("kill-every", defaults.kill_every.as_secs_f64())?),
        broker_outage: (outage > 0.0).then(|| Duration::from_secs_f64(outage)),
        restart_database: !flags.has("no-database-restart"),
        settle: Duration::from_secs_f64(flags.get("settle", defaults.settle.as_secs_f64())?),
        receiver_fail_every: flags.get("receiver-fail-every", defaults.receiver_fail_every)?,
        keep_logs: flags.has("keep-logs"),
        verbose: !flags.has("quiet"),
        ..defaults
    })
}

async fn run() -> anyhow::Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        out(USAGE);
        return Ok(true);
    }
    let known =
        ["backend", "events", "rate", "dispatchers", "kill-every", "broker-outage", "settle", "receiver-fail-every"];
    let flags = Flags::parse(args, &known, &["no-database-restart", "keep-logs", "quiet"])?;
    let backends = match flags.get("backend", "both".to_owned())?.as_str() {
        "distributed" => vec![Backend::Distributed],
        "standalone" => vec![Backend::Standalone],
        "both" => vec![Backend::Distributed, Backend::Standalone],
        other => anyhow::bail!("--backend {other:?}: distributed, standalone or both\n\n{USAGE}"),
    };
    let programs = Programs::this_executable()?;
    let mut passed = true;
    for backend in backends {
        let report = faults::run(options(&flags, backend, &programs)?).await?;
        out(&report.summary());
        passed &= report.passed();
    }
    Ok(passed)
}

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(exit) = procs::exec_as().await {
        return exit;
    }
    // Ctrl-C drops the run: its guards start RabbitMQ (and PostgreSQL) again,
    // and its processes, database and queues go.
    let outcome = tokio::select! {
        outcome = run() => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("webhooks-faults: {error:#}");
            ExitCode::from(2)
        }
    }
}
