//! A broker node dies, nothing is lost (API.md 8.11, README "Broker
//! cluster"). A 3-node RabbitMQ cluster of its own on loopback
//! (`tests/cluster/rabbitmq`, beside and apart from the system broker on
//! 5672); the API and two dispatchers are given the three addresses; events
//! go in at 100/s to two HTTPS endpoints. Meanwhile the node most of the
//! system's connections use is SIGKILLed, started again once it is back,
//! and then another node, one whose loss leaves every quorum queue a
//! majority, is SIGKILLed.
//!
//! Asserted: ingest keeps answering (no event given up, no pause of 5 s or
//! more between accepted events), delivery goes on within 10 s of each kill
//! (the longest gap between deliveries from the kill on), every accepted
//! event arrives where it is due, and duplicates stay under 1%. The figures
//! are printed.
//!
//! Ignored by default: it needs root (the nodes run as the `rabbitmq`
//! user), RabbitMQ's server, and about two minutes. Run it with
//!
//! ```sh
//! cargo build --workspace
//! cargo test -p tests --test broker_cluster -- --ignored --nocapture
//! ```
//!
//! Without root or without `rabbitmq-server` it fails and says so. The
//! nodes get names and ports of their own each run (`whc<random>N@localhost`,
//! AMQP on base+1..3, Erlang distribution on base+20001..3).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use webhooks_model::Category;

use tests::{
    Backend,
    procs::{Programs, Stack, StackOptions},
    producer::{self, Endpoint, Producer, Progress},
    random_suffix,
    tally::Tally,
};

const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const RATE: f64 = 100.0;
/// How long delivery may stop after a node dies (API.md 8.11).
const RESUME_WITHIN: Duration = Duration::from_secs(10);
/// The longest pause between two accepted events that counts as answering.
const INGEST_PAUSE: Duration = Duration::from_secs(5);

/// The cluster script, run as root, with the cluster's directory, node
/// name prefix and port base.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    prefix: String,
    port_base: u16,
}

impl Cluster {
    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(&self.script)
            .env("RABBITMQ_CLUSTER_PREFIX", &self.prefix)
            .env("RABBITMQ_CLUSTER_PORT_BASE", self.port_base.to_string())
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .map_err(|error| anyhow::anyhow!("cannot run {}: {error}", self.script.display()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::ensure!(
            output.status.success(),
            "{} {}: {}\n{stderr}",
            self.script.display(),
            args.join(" "),
            output.status
        );
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// A port base whose AMQP, distribution and CLI ports are free now.
    fn free_port_base() -> u16 {
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        loop {
            let base = 20_000 + 10 * (rand_u16() % 1_000);
            let mut ports =
                (1..=3).flat_map(|n| [base + n, base + 20_000 + n]).chain((0..=10).map(|n| base + 30_000 + n));
            if ports.all(free) {
                return base;
            }
        }
    }

    /// Established connections to node `n`'s AMQP port: the system's
    /// processes (the test opens none while it runs).
    fn connections(&self, n: u16) -> usize {
        let filter = format!("( sport = :{} )", self.port_base + n);
        Command::new("ss")
            .args(["-Htn", "state", "established", &filter])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(0)
    }

    /// Whether losing node `n` now would leave some quorum queue without a
    /// majority (`rabbitmq-queues check_if_node_is_quorum_critical`).
    fn quorum_critical(&self, n: u16) -> bool {
        self.run(&["ctl", &n.to_string(), "rabbitmq-queues", "check_if_node_is_quorum_critical"]).is_err()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(error) = self.run(&["down"]) {
            eprintln!("could not take the test cluster down: {error:#}");
        }
    }
}

fn rand_u16() -> u16 {
    u16::from_str_radix(&random_suffix()[..4], 16).unwrap_or(0)
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .any(|line| line.strip_prefix("Uid:").is_some_and(|ids| ids.split_whitespace().next() == Some("0")))
    })
}

/// One sample of the counters, from the start of ingest.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    accepted: u64,
    delivered: u64,
}

/// The longest stretch without a new delivery in `[from, until]`, counted
/// from `from`.
fn longest_gap(samples: &[Sample], from: Duration, until: Duration, count: impl Fn(&Sample) -> u64) -> Duration {
    let mut last_change = from;
    let mut longest = Duration::ZERO;
    let mut previous = samples.iter().take_while(|s| s.at <= from).last().map(&count);
    for sample in samples.iter().filter(|s| s.at > from && s.at <= until) {
        let now = count(sample);
        if previous.is_some_and(|p| now > p) {
            longest = longest.max(sample.at - last_change);
            last_change = sample.at;
        }
        previous = Some(now);
    }
    let end = until.min(samples.last().map_or(from, |s| s.at));
    longest.max(end.saturating_sub(last_change))
}

/// A node kill and what followed it.
#[derive(Debug)]
struct Kill {
    node: u16,
    at: Duration,
    connections: usize,
    gap: Duration,
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, rabbitmq-server and about 2 minutes; see the file's comment"]
async fn a_broker_node_dies_and_nothing_is_lost() {
    assert!(
        running_as_root(),
        "the broker cluster test needs root: its RabbitMQ nodes run as the rabbitmq user (run it as root)"
    );
    assert!(
        Path::new(RABBITMQ_SERVER).exists(),
        "the broker cluster test needs RabbitMQ's server at {RABBITMQ_SERVER} (install rabbitmq-server)"
    );
    let suffix = random_suffix();
    let cluster = Cluster {
        script: Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/rabbitmq"),
        dir: std::env::temp_dir().join(format!("webhooks-broker-cluster-{suffix}")),
        prefix: format!("whc{}x", &suffix[..6]),
        port_base: Cluster::free_port_base(),
    };
    let started = Instant::now();
    let say = |line: &str| eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    cluster.run(&["up"]).expect("the 3-node cluster does not start");
    let urls = cluster.run(&["urls"]).unwrap();
    say(&format!("cluster up: {urls}"));

    let programs = Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"));
    let options =
        StackOptions { amqp_url: Some(urls.clone()), ..StackOptions::new(Backend::Distributed, "broker-cluster") };
    let mut stack = Stack::start(programs, options).await.expect("the API starts on the cluster");
    for _ in 0..2 {
        stack.start_dispatcher().await.expect("a dispatcher starts on the cluster");
    }
    let (key, developer) = stack.create_key(None).await.unwrap();
    let mut endpoints = Vec::new();
    for (name, categories) in [("every category", &[][..]), ("transfer", &[Category::Transfer][..])] {
        let tally = Tally::start(&stack.ca, 0).await.unwrap();
        let webhook = stack.active_endpoint(&key, &tally.url(), categories).await.unwrap();
        tally.serve_endpoint(&webhook, developer, categories).unwrap();
        endpoints.push(Endpoint { name: name.into(), developer: 0, categories: categories.to_vec(), tally });
    }
    let endpoints = Arc::new(endpoints);
    say(&format!("system up, logs in {}", stack.log_dir.display()));

    let producer = Producer {
        ingest_urls: vec![stack.ingest_url()],
        token: None,
        developers: vec![developer],
        categories: vec![Category::Transfer, Category::Customer, Category::KycLink],
        run_id: format!("broker-cluster-{}", random_suffix()),
        give_up_after: Duration::from_secs(60),
        request_timeout: Duration::from_secs(15),
    };
    let progress = Arc::new(Progress::default());
    let stop = CancellationToken::new();
    let ingest_started = Instant::now();
    let producing = tokio::spawn({
        let (producer, progress, stop) = (producer.clone(), progress.clone(), stop.clone());
        async move { producer.run(u64::MAX, RATE, progress, stop).await }
    });
    // The counters every 50 ms, for the gaps.
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (samples, sampling, progress, endpoints) =
            (samples.clone(), sampling.clone(), progress.clone(), endpoints.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                let sample = Sample {
                    at: ingest_started.elapsed(),
                    accepted: progress.accepted.load(Ordering::Relaxed),
                    delivered: endpoints.iter().map(|e| e.tally.requests()).sum(),
                };
                samples.lock().unwrap().push(sample);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });

    let busiest = |exclude: Option<u16>| {
        let mut nodes: Vec<(usize, u16)> =
            (1..=3).filter(|n| Some(*n) != exclude).map(|n| (cluster.connections(n), n)).collect();
        nodes.sort();
        nodes.last().copied().unwrap()
    };
    let mut kills = Vec::new();

    tokio::time::sleep(Duration::from_secs(10)).await;
    let (connections, first) = busiest(None);
    say(&format!("kill -9 node {first} ({connections} connections of the system)"));
    cluster.run(&["kill", &first.to_string()]).unwrap();
    kills.push(Kill { node: first, at: ingest_started.elapsed(), connections, gap: Duration::ZERO });

    tokio::time::sleep(Duration::from_secs(15)).await;
    say(&format!("start node {first} again"));
    cluster.run(&["start", &first.to_string()]).expect("the killed node starts again");
    say(&format!("node {first} is back"));

    // Another node, once losing it leaves every quorum queue a majority
    // (the restarted node's members have caught up).
    let (_, second) = busiest(Some(first));
    let ready_by = Instant::now() + Duration::from_secs(90);
    while cluster.quorum_critical(second) {
        assert!(
            Instant::now() < ready_by,
            "node {second} stayed quorum-critical for 90 s after node {first} came back"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let connections = cluster.connections(second);
    say(&format!("kill -9 node {second} ({connections} connections of the system)"));
    cluster.run(&["kill", &second.to_string()]).unwrap();
    kills.push(Kill { node: second, at: ingest_started.elapsed(), connections, gap: Duration::ZERO });

    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.cancel();
    let produced = producing.await.expect("the producer panicked");
    let ingest_end = ingest_started.elapsed();
    say(&format!("ingest stopped: {} accepted, {} given up", produced.accepted.len(), produced.abandoned.len()));

    let settle_by = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = producer::missing(&produced.accepted, &endpoints);
        if missing == 0 || Instant::now() > settle_by {
            say(&format!("settled: {missing} pairs missing"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Late duplicates (messages handed back by a dead connection) may come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();

    let samples = samples.lock().unwrap().clone();
    for kill in &mut kills {
        let until = (kill.at + Duration::from_secs(30)).min(ingest_end);
        kill.gap = longest_gap(&samples, kill.at, until, |s| s.delivered);
    }
    let ingest_pause = longest_gap(&samples, Duration::from_secs(1), ingest_end, |s| s.accepted);
    let (_, total) = producer::account(&produced.accepted, &endpoints);
    let swept = stack.swept_deliveries().await.ok().flatten();
    let log_dir = stack.log_dir.clone();
    stack.shutdown(Duration::from_secs(10)).await;
    drop(cluster);

    let duplicate_share = total.duplicates as f64 / total.expected.max(1) as f64;
    let mut report = format!(
        "broker cluster: {} events accepted at {RATE}/s over {:.0}s ({} given up, longest pause between accepted \
         events {:.2}s); {} deliveries expected, {} delivered, {} lost, {} duplicates ({:.3}%); swept again: {}",
        produced.accepted.len(),
        ingest_end.as_secs_f64(),
        produced.abandoned.len(),
        ingest_pause.as_secs_f64(),
        total.expected,
        total.arrived,
        total.lost,
        total.duplicates,
        duplicate_share * 100.0,
        swept.map_or("unknown".into(), |n| n.to_string()),
    );
    for kill in &kills {
        report.push_str(&format!(
            "\n  kill -9 node {} at {:.1}s ({} connections): longest delivery gap after it {:.2}s",
            kill.node,
            kill.at.as_secs_f64(),
            kill.connections,
            kill.gap.as_secs_f64()
        ));
    }
    report.push_str(&format!("\n  logs: {}", log_dir.display()));
    eprintln!("{report}");

    assert!(produced.abandoned.is_empty(), "ingest gave events up:\n{report}");
    assert!(ingest_pause < INGEST_PAUSE, "ingest paused too long:\n{report}");
    assert!(kills.iter().all(|k| k.connections > 0), "a killed node served none of the system:\n{report}");
    assert!(kills.iter().all(|k| k.gap <= RESUME_WITHIN), "delivery stopped too long after a kill:\n{report}");
    assert_eq!(total.lost, 0, "accepted events were lost:\n{report}");
    assert_eq!(total.violations(), 0, "something arrived that must not:\n{report}");
    assert!(duplicate_share < 0.01, "too many duplicates:\n{report}");
}
