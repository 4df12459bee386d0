//! The soak: the system under a steady load for a long time, watching the
//! processes' memory.
//!
//! ```sh
//! cargo run --release -p tests --bin webhooks-soak -- --minutes 30
//! ```
//!
//! It starts the distributed system (`webhooks-api serve` and two
//! `webhooks-dispatcher` processes, on the local PostgreSQL and RabbitMQ, a
//! fresh database and queue prefix) or `webhooks-api standalone` on a fresh
//! `DATA_DIR` (`--backend standalone`), registers a couple of HTTPS receivers
//! and sends a steady 200 events/s. Every minute it prints each process's
//! resident memory (`VmRSS` of `/proc/<pid>/status`) and what was delivered;
//! at the end, each process's memory at the start, after the first minute
//! and at the end, and how many (event, receiver) pairs were lost. It runs
//! the service's programs as itself (`WEBHOOKS_API_BIN` and
//! `WEBHOOKS_DISPATCHER_BIN` name others). It exits 1 when something was
//! lost.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    process::ExitCode,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::Context;
use tests::{
    Backend,
    faults::supervise,
    flags::{Flags, out},
    procs::{self, Memory, Programs, Stack, StackOptions},
    producer::{self, Endpoint, Producer, Progress},
    random_suffix,
    tally::Tally,
};
use tokio_util::sync::CancellationToken;

const USAGE: &str = "\
webhooks-soak [--backend distributed|standalone] [--minutes M] [--rate R]
              [--dispatchers N] [--receivers N] [--report-every SECS] [--settle SECS]

  --backend       distributed (default) or standalone
  --minutes       how long events go in (default 30)
  --rate          events per second (default 200)
  --dispatchers   dispatcher processes (distributed; default 2)
  --receivers     HTTPS receivers, each an endpoint of every category (default 2)
  --report-every  seconds between reports (default 60)
  --settle        seconds everything may take to arrive at the end (default 120)";

/// Memory samples of one process, by its name.
#[derive(Debug, Default)]
struct Samples {
    pid: u32,
    start: Option<Memory>,
    first_report: Option<Memory>,
    last: Option<Memory>,
}

fn sample_all(stack: &Stack, samples: &mut BTreeMap<String, Samples>, first_report: bool) -> String {
    let mut line = String::new();
    for proc in stack.api.iter().chain(&stack.dispatchers) {
        let memory = proc.memory();
        let entry = samples.entry(proc.name.clone()).or_default();
        if entry.pid != proc.pid {
            // A process started again: a new series.
            *entry = Samples { pid: proc.pid, start: memory, ..Samples::default() };
        }
        if first_report && entry.first_report.is_none() {
            entry.first_report = memory;
        }
        entry.last = memory.or(entry.last);
        let rss = memory.map_or("gone".to_owned(), |m| format!("{:.1} MiB", m.rss_mib()));
        let _ = write!(line, " {} {rss};", proc.name);
    }
    line
}

fn mib(memory: Option<Memory>) -> String {
    memory.map_or("-".into(), |m| format!("{:.1}", m.rss_mib()))
}

async fn soak(flags: &Flags) -> anyhow::Result<bool> {
    let backend = match flags.get("backend", "distributed".to_owned())?.as_str() {
        "distributed" => Backend::Distributed,
        "standalone" => Backend::Standalone,
        other => anyhow::bail!("--backend {other:?}: distributed or standalone\n\n{USAGE}"),
    };
    let minutes: f64 = flags.get("minutes", 30.0)?;
    let rate: f64 = flags.get("rate", 200.0)?;
    let dispatchers: usize = flags.get("dispatchers", 2)?;
    let receivers: usize = flags.get("receivers", 2)?;
    let report_every = Duration::from_secs_f64(flags.get("report-every", 60.0)?);
    let settle = Duration::from_secs_f64(flags.get("settle", 120.0)?);
    let events = (minutes * 60.0 * rate).round() as u64;

    let started = Instant::now();
    let mut options = StackOptions::new(backend, "webhooks-soak");
    // Logs at warn: a long run at info would fill the disk with little gain.
    options.rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    let log_dir = options.log_dir.clone();
    let mut stack = Stack::start(Programs::this_executable()?, options).await?;
    if backend == Backend::Distributed {
        for _ in 0..dispatchers {
            stack.start_dispatcher().await?;
        }
    }
    let (key, developer) = stack.create_key(None).await?;
    let mut endpoints = Vec::new();
    for i in 0..receivers {
        let tally = Tally::start(&stack.ca, 0).await?;
        let webhook = stack.active_endpoint(&key, &tally.url(), &[]).await?;
        tally.serve_endpoint(&webhook, developer, &[])?;
        endpoints.push(Endpoint { name: format!("receiver-{}", i + 1), developer: 0, categories: Vec::new(), tally });
    }
    let mut samples = BTreeMap::new();
    let line = sample_all(&stack, &mut samples, false);
    out(&format!(
        "soak: {backend:?}, {events} events at {rate}/s for {minutes} min to {receivers} receivers; logs in {}",
        log_dir.display()
    ));
    out(&format!("[{:>7.1}s] start:{line}", started.elapsed().as_secs_f64()));

    let producer = Producer {
        ingest_urls: vec![stack.ingest_url()],
        token: None,
        developers: vec![developer],
        categories: vec![webhooks_model::Category::Transfer, webhooks_model::Category::Customer],
        run_id: format!("soak-{}", random_suffix()),
        give_up_after: Duration::from_secs(60),
        request_timeout: Duration::from_secs(15),
    };
    let progress = Arc::new(Progress::default());
    let mut producing = tokio::spawn({
        let (producer, progress) = (producer.clone(), progress.clone());
        async move { producer.run(events, rate, progress, CancellationToken::new()).await }
    });
    let mut incidents = Vec::new();
    let mut next_report = Instant::now() + report_every;
    let mut reports = 0u64;
    let produced = loop {
        tokio::select! {
            done = &mut producing => break done.context("the producer panicked")?,
            () = tokio::time::sleep_until(next_report.into()) => {}
        }
        next_report += report_every;
        reports += 1;
        supervise(&mut stack, &mut incidents).await?;
        let memory = sample_all(&stack, &mut samples, reports == 1);
        let delivered: Vec<String> = endpoints.iter().map(|e| format!("{} {}", e.name, e.tally.distinct())).collect();
        out(&format!(
            "[{:>7.1}s] accepted {} (retried {}, abandoned {}); delivered: {};{memory}",
            started.elapsed().as_secs_f64(),
            progress.accepted.load(Ordering::Relaxed),
            progress.retried.load(Ordering::Relaxed),
            progress.abandoned.load(Ordering::Relaxed),
            delivered.join(", "),
        ));
    };
    let ingest_time = produced.elapsed;

    let settle_started = Instant::now();
    while producer::missing(&produced.accepted, &endpoints) > 0 && settle_started.elapsed() < settle {
        supervise(&mut stack, &mut incidents).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settle_time = settle_started.elapsed();
    let memory = sample_all(&stack, &mut samples, false);
    let (_, total) = producer::account(&produced.accepted, &endpoints);
    out(&format!("[{:>7.1}s] end:{memory}", started.elapsed().as_secs_f64()));
    out(
        "memory (VmRSS, MiB): process, at start, after the first report, at the end, growth since the first report, peak (VmHWM)",
    );
    for (name, s) in &samples {
        let growth = match (s.first_report, s.last) {
            (Some(first), Some(last)) => format!("{:+.1}", last.rss_mib() - first.rss_mib()),
            _ => "-".into(),
        };
        let peak = s.last.map_or("-".into(), |m| format!("{:.1}", m.peak_kib as f64 / 1024.0));
        out(&format!(
            "  {name:<14} {:>8} {:>8} {:>8} {growth:>8} {peak:>8}",
            mib(s.start),
            mib(s.first_report),
            mib(s.last)
        ));
    }
    out(&format!(
        "events: offered {events}, accepted {}, abandoned {}; pairs expected {}, arrived {}, lost {}, duplicates {}; bad signatures {}, misrouted {}",
        produced.accepted.len(),
        produced.abandoned.len(),
        total.expected,
        total.arrived,
        total.lost,
        total.duplicates,
        total.bad_signature,
        total.misrouted
    ));
    out(&format!(
        "time: ingest {:.1}s (achieved {:.1} events/s), settle {:.1}s",
        ingest_time.as_secs_f64(),
        produced.accepted.len() as f64 / ingest_time.as_secs_f64().max(0.001),
        settle_time.as_secs_f64()
    ));
    for incident in &incidents {
        out(&format!("incident: {incident}"));
    }
    stack.shutdown(Duration::from_secs(10)).await;
    let passed = total.lost == 0 && total.violations() == 0;
    if passed && incidents.is_empty() {
        let _ = std::fs::remove_dir_all(&log_dir);
    } else {
        out(&format!("logs kept in {}", log_dir.display()));
    }
    out(&format!("result: {} (lost {})", if passed { "PASS" } else { "FAIL" }, total.lost));
    Ok(passed)
}

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(exit) = procs::exec_as().await {
        return exit;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        out(USAGE);
        return ExitCode::SUCCESS;
    }
    let known = ["backend", "minutes", "rate", "dispatchers", "receivers", "report-every", "settle"];
    let outcome = match Flags::parse(args, &known, &[]) {
        Ok(flags) => tokio::select! {
            outcome = soak(&flags) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        },
        Err(error) => Err(error),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("webhooks-soak: {error:#}");
            ExitCode::from(2)
        }
    }
}
