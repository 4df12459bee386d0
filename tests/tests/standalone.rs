//! Standalone mode as a process, run the way a newcomer runs it
//! (`webhooks-api standalone`, API.md §8.1): the first start prints a key, the
//! operator's `keys create` works on its `DATA_DIR`, and a kill -9 in the
//! middle of a steady stream of events loses none of the accepted ones.

mod common;

use std::{
    collections::HashSet,
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::*;
use serde_json::{Value, json};
use tests::{Receiver, Reply, TestCa, random_suffix};
use tokio::{
    io::AsyncReadExt,
    process::{Child, Command},
};
use uuid::Uuid;

/// The `webhooks-api` program as built by `cargo test` for this package.
fn api_binary() -> PathBuf {
    std::env::var_os("WEBHOOKS_API_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_api-process")), PathBuf::from)
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port")
}

/// A data directory and the settings a standalone process runs with.
struct Setup {
    data_dir: PathBuf,
    ca: TestCa,
    public: SocketAddr,
    internal: SocketAddr,
    client: reqwest::Client,
}

impl Setup {
    fn new() -> Setup {
        tests::init();
        Setup {
            data_dir: std::env::temp_dir().join(format!("webhooks-standalone-{}", random_suffix())),
            ca: TestCa::new().expect("a CA"),
            public: free_addr(),
            internal: free_addr(),
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(30))
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(api_binary());
        command
            .args(args)
            .env_clear()
            .env("DATA_DIR", &self.data_dir)
            .env("API_LISTEN_ADDR", self.public.to_string())
            .env("INTERNAL_LISTEN_ADDR", self.internal.to_string())
            .env("TLS_EXTRA_ROOTS", self.ca.pem_path())
            .env("TARGET_ALLOW_PRIVATE", "true")
            .env("RETRY_SCHEDULE", "1s,1s,2s")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Starts `webhooks-api standalone` and waits until it is ready.
    async fn start(&self) -> Child {
        let mut child = self.command(&["standalone"]).spawn().expect("start webhooks-api standalone");
        let ready = eventually("standalone answers /readyz", Duration::from_secs(60), async || {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                panic!("webhooks-api standalone exited before it was ready: {status}");
            }
            match self.client.get(format!("http://{}/readyz", self.internal)).send().await {
                Ok(response) if response.status() == 200 => Ok(()),
                Ok(response) => Err(response.status().to_string()),
                Err(error) => Err(error.to_string()),
            }
        });
        ready.await;
        child
    }

    fn api(&self, path: &str) -> String {
        format!("http://{}/v0{path}", self.public)
    }

    async fn ingest(&self, developer_id: Uuid, n: usize) -> Option<String> {
        let response = self
            .client
            .post(format!("http://{}/internal/events", self.internal))
            .json(&event_input(developer_id, "transfer", n))
            .send()
            .await
            .ok()?;
        if response.status() != 201 {
            return None;
        }
        let event: Value = response.json().await.ok()?;
        Some(event_id(&event))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Reads what the process printed on stdout so far, once it has exited.
async fn stdout_of(child: &mut Child) -> String {
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = tokio::time::timeout(Duration::from_secs(5), stdout.read_to_string(&mut out)).await;
    }
    out
}

/// The first line of stdout: the key JSON the first start prints.
async fn first_line(child: &mut Child) -> Value {
    let stdout = child.stdout.as_mut().expect("stdout is piped");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while stdout.read(&mut byte).await.expect("read stdout") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("a line on stdout");
    serde_json::from_slice(&line).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&line)))
}

async fn kill(child: &mut Child) {
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("the killed process's status");
    assert!(!status.success(), "{status}");
}

async fn active_endpoint_at(setup: &Setup, key: &str, receiver: &Receiver) -> Value {
    let created: Value = setup
        .client
        .post(setup.api("/webhooks"))
        .header("Api-Key", key)
        .header("Idempotency-Key", Uuid::new_v4().to_string())
        .json(&json!({ "url": receiver.url() }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let path = format!("/webhooks/{}", id(&created));
    let activated = setup.client.put(setup.api(&path)).header("Api-Key", key).json(&json!({"status": "active"}));
    let activated: Value = activated.send().await.unwrap().json().await.unwrap();
    assert_eq!(activated["status"], "active", "{activated}");
    activated
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_start_prints_a_key_and_the_operators_keys_work_on_its_data_dir() {
    let setup = Setup::new();
    let mut first = setup.start().await;
    let printed = first_line(&mut first).await;
    let key = printed["key"].as_str().unwrap_or_else(|| panic!("no key: {printed}")).to_owned();
    assert!(key.starts_with("sk-test-"), "{printed}");
    assert_eq!(printed["api_key"]["scopes"], json!(["platform:api_unrestricted"]), "{printed}");
    let whoami = setup.client.get(setup.api("/api_keys/whoami")).header("Api-Key", &key).send().await.unwrap();
    assert_eq!(whoami.status(), 200);

    // `keys create` on the same DATA_DIR, while standalone runs.
    let developer = printed["api_key"]["owner_id"].as_str().unwrap().to_owned();
    let made = setup
        .command(&["keys", "create", "--developer-id", &developer, "--scopes", "webhooks:read"])
        .output()
        .await
        .expect("run keys create");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let made: Value = serde_json::from_slice(&made.stdout).expect("keys create prints JSON");
    let scoped = made["key"].as_str().unwrap();
    let whoami: Value = setup
        .client
        .get(setup.api("/api_keys/whoami"))
        .header("Api-Key", scoped)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(whoami["owner_id"].as_str(), Some(developer.as_str()), "{whoami}");

    // A second process on the same directory is refused while the first runs.
    let second = setup.command(&["standalone"]).output().await.expect("run a second standalone");
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another webhooks-api standalone"));

    // A restart prints no new key and keeps the old ones.
    kill(&mut first).await;
    let mut again = setup.start().await;
    let whoami = setup.client.get(setup.api("/api_keys/whoami")).header("Api-Key", &key).send().await.unwrap();
    assert_eq!(whoami.status(), 200);
    kill(&mut again).await;
    assert_eq!(stdout_of(&mut again).await, "", "a restart prints no key");
}

/// The data directory holds endpoints' private keys: standalone makes it,
/// and every file in it, readable by its own user only, whatever the umask.
#[tokio::test(flavor = "multi_thread")]
async fn the_data_dir_and_its_files_are_the_operators_alone() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new();
    let mut first = setup.start().await;
    first_line(&mut first).await;
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&setup.data_dir), 0o700, "DATA_DIR {}", setup.data_dir.display());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&setup.data_dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_file() {
            assert_eq!(mode(&entry.path()) & 0o077, 0, "{name} is open to others: {:o}", mode(&entry.path()));
        }
        names.push(name);
    }
    for expected in ["webhooks.db", "webhooks.db-wal", "lock"] {
        assert!(names.iter().any(|name| name == expected), "{expected} not in {names:?}");
    }
    kill(&mut first).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_mid_stream_loses_no_accepted_event() {
    let setup = Setup::new();
    let receiver = Receiver::start(&setup.ca).await.unwrap();
    // Slow answers, so the kill lands with attempts in flight and events queued.
    receiver.reply_always(Reply::ok().after(Duration::from_millis(50)));
    let mut process = setup.start().await;
    let printed = first_line(&mut process).await;
    let key = printed["key"].as_str().unwrap().to_owned();
    let developer: Uuid = printed["api_key"]["owner_id"].as_str().unwrap().parse().unwrap();
    let endpoint = active_endpoint_at(&setup, &key, &receiver).await;

    // A steady 100 events/s for 4 s in all; the process dies after 1.5 s and
    // comes back at once. Only what was answered 201 counts as accepted.
    let accepted: Arc<Mutex<HashSet<String>>> = Arc::default();
    let setup = Arc::new(setup);
    let producer = {
        let (setup, accepted) = (setup.clone(), accepted.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut attempts = Vec::new();
            for n in 0..400 {
                tick.tick().await;
                let setup = setup.clone();
                let accepted = accepted.clone();
                attempts.push(tokio::spawn(async move {
                    if let Some(id) = setup.ingest(developer, n).await {
                        accepted.lock().unwrap().insert(id);
                    }
                }));
            }
            futures::future::join_all(attempts).await;
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kill(&mut process).await;
    let at_kill = accepted.lock().unwrap().len();
    let mut process = setup.start().await;
    producer.await.unwrap();

    let accepted = accepted.lock().unwrap().clone();
    assert!(at_kill > 50 && accepted.len() > at_kill, "accepted {at_kill} before the kill, {} in all", accepted.len());
    let arrived = eventually("every accepted event arrives", Duration::from_secs(90), async || {
        let arrived = distinct_ids(&receiver);
        let missing = accepted.difference(&arrived).count();
        if missing == 0 { Ok(arrived) } else { Err(format!("{missing} of {} still missing", accepted.len())) }
    })
    .await;
    verify_all(&receiver, &endpoint);
    // The internal listener serves delivery's metrics beside the API's.
    let metrics = setup.client.get(format!("http://{}/metrics", setup.internal)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let succeeded = sample(&metrics, "webhooks_dispatcher_deliveries_total{outcome=\"succeeded\"}");
    assert!(succeeded.is_some_and(|n| n >= 1.0), "no delivery metrics on /metrics:\n{metrics}");
    let ingested = sample(&metrics, "webhooks_api_events_accepted_total");
    assert!(ingested.is_some_and(|n| n >= 1.0), "no API metrics on /metrics:\n{metrics}");
    eprintln!(
        "{} events accepted ({at_kill} before the kill), {} distinct arrived, {} requests in all",
        accepted.len(),
        arrived.len(),
        receiver.count()
    );
    kill(&mut process).await;
}

/// Stops `child` with SIGTERM and returns what it logged on stderr; asserts a
/// clean exit.
async fn stop_and_read_stderr(child: &mut Child) -> String {
    let pid = child.id().expect("a running process").to_string();
    let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.expect("stops").expect("status");
    assert!(status.success(), "SIGTERM ended it with {status}");
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(5), stderr.read_to_string(&mut err)).await;
    }
    err
}

#[tokio::test(flavor = "multi_thread")]
async fn starts_and_clean_stops_log_no_warnings_and_no_colour_to_a_file() {
    let setup = Setup::new();
    for start in ["first", "second"] {
        let mut child = setup.command(&["standalone"]).env("RUST_LOG", "info").spawn().expect("start");
        eventually("standalone answers /readyz", Duration::from_secs(60), async || {
            match setup.client.get(format!("http://{}/readyz", setup.internal)).send().await {
                Ok(response) if response.status() == 200 => Ok(()),
                Ok(response) => Err(response.status().to_string()),
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
        let log = stop_and_read_stderr(&mut child).await;
        assert!(log.contains("INFO"), "the {start} start logged nothing at info:\n{log}");
        assert!(!log.contains('\u{1b}'), "colour codes in a log that is not a terminal:\n{log}");
        let bad: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
        assert!(bad.is_empty(), "the {start} start and stop logged:\n{}", bad.join("\n"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_database_or_broker_is_named_with_what_to_do() {
    let closed = free_addr();
    let run = |args: &[&str], env: (&str, String)| {
        std::process::Command::new(api_binary())
            .args(args)
            .env_clear()
            .env(env.0, env.1)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .output()
            .expect("run webhooks-api")
    };
    let database = format!("postgres://postgres:secret@{closed}/webhooks");
    let output = run(&["migrate"], ("DATABASE_URL", database));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("cannot reach PostgreSQL at postgres://postgres:***@{closed}")), "{stderr}");
    assert!(stderr.contains("webhooks-api standalone") && !stderr.contains("secret"), "{stderr}");

    let broker = format!("amqp://guest:guest@{closed}/%2f");
    let output = run(&["dead-letters", "list"], ("AMQP_URL", broker));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("cannot reach RabbitMQ at amqp://guest:***@{closed}")), "{stderr}");
    assert!(stderr.contains("webhooks-api standalone"), "{stderr}");
}

/// Runs `args` on the setup's `DATA_DIR` (or in `dir` with no `DATA_DIR`)
/// and returns its exit success, stdout and stderr.
async fn run_command(setup: &Setup, args: &[&str], dir: Option<&std::path::Path>) -> (bool, String, String) {
    let mut command = setup.command(args);
    if let Some(dir) = dir {
        command.env_remove("DATA_DIR").current_dir(dir);
    }
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not finish within 30 s"))
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// The first hour's traps, each as a newcomer meets it: the operator's
/// commands say what they did and what to set, errors tell the truth, and
/// `--help` of a client command shows what it uses.
#[tokio::test(flavor = "multi_thread")]
async fn the_command_line_says_what_it_did_and_what_to_set() {
    let setup = Setup::new();
    let mut first = setup.start().await;
    let printed = first_line(&mut first).await;
    let developer = printed["api_key"]["owner_id"].as_str().unwrap().to_owned();

    // A key without --developer-id is for a new developer, and says so;
    // `keys list` shows who there is, never the keys themselves.
    let (ok, out, err) = run_command(&setup, &["keys", "create"], None).await;
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let new_developer = made["api_key"]["owner_id"].as_str().unwrap().to_owned();
    assert_ne!(new_developer, developer);
    assert!(err.contains("new developer") && err.contains(&new_developer) && err.contains("keys list"), "{err}");
    let (ok, out, err) = run_command(&setup, &["keys", "list"], None).await;
    assert!(ok, "{err}");
    assert!(out.contains(&developer) && out.contains(&new_developer), "{out}");
    assert!(!out.contains(printed["key"].as_str().unwrap()) && !out.contains(made["key"].as_str().unwrap()), "{out}");

    // From a folder with no store and nothing set: at once, what to set.
    let elsewhere = std::env::temp_dir().join(format!("webhooks-elsewhere-{}", random_suffix()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let started = std::time::Instant::now();
    let (ok, _, err) = run_command(&setup, &["keys", "create"], Some(&elsewhere)).await;
    assert!(!ok);
    assert!(err.contains("DATA_DIR") && err.contains("DATABASE_URL"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "it took {:?} to say so", started.elapsed());
    // The dead-letter commands know standalone mode has no broker.
    let (ok, _, err) = run_command(&setup, &["dead-letters", "list"], None).await;
    assert!(!ok && err.contains("standalone mode") && err.contains("no dead-letter queue"), "{err}");
    std::fs::remove_dir_all(&elsewhere).unwrap();

    // An event over MAX_EVENT_BYTES: the service's answer, with the limit
    // and its setting.
    let big = json!({
        "developer_id": developer, "event_category": "transfer",
        "event_type": "transfer.updated.status_transitioned", "event_object_id": "tr_big",
        "event_object": { "id": "tr_big", "pad": "x".repeat(300_000) },
    });
    let file = setup.data_dir.join("big-event.json");
    std::fs::write(&file, big.to_string()).unwrap();
    let url = format!("http://{}", setup.internal);
    let (ok, _, err) =
        run_command(&setup, &["events", "send", "--internal-url", &url, file.to_str().unwrap()], None).await;
    assert!(!ok);
    assert!(err.contains("413") && err.contains("262144") && err.contains("MAX_EVENT_BYTES"), "{err}");
    assert!(!err.contains("is the service running"), "{err}");
    let public = setup.client.post(setup.api("/webhooks")).header("Api-Key", printed["key"].as_str().unwrap());
    let refused = public.header("Idempotency-Key", "big").json(&big).send().await.unwrap();
    assert_eq!(refused.status(), 413);
    let body: Value = refused.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("MAX_REQUEST_BYTES"), "{body}");

    // A second instance on the same ports says who holds them.
    let other = Setup::new();
    let mut second = other.command(&["standalone"]);
    second.env("API_LISTEN_ADDR", setup.public.to_string());
    let output = second.output().await.unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(err.contains("another process has it") && err.contains("API_LISTEN_ADDR"), "{err}");

    // A client command's help shows the settings it uses, not the server's.
    for args in
        [&["endpoints", "list", "--help"][..], &["keys", "create", "--help"], &["dead-letters", "list", "--help"]]
    {
        let (ok, out, _) = run_command(&setup, args, None).await;
        assert!(ok, "{args:?}");
        for server in ["RETRY_SCHEDULE", "DELIVERY_TIMEOUT", "TLS_EXTRA_ROOTS", "DATABASE_MAX_CONNECTIONS"] {
            assert!(!out.contains(server), "{args:?} --help shows {server}:\n{out}");
        }
        assert!(!out.contains("[`"), "a rustdoc link in {args:?} --help:\n{out}");
        assert!(out.lines().count() < 60, "{args:?} --help has {} lines", out.lines().count());
    }
    kill(&mut first).await;
}

/// The next steps the first start prints run as printed, in the folder it
/// runs in, once the development receiver it names is up.
#[tokio::test(flavor = "multi_thread")]
async fn the_printed_next_steps_work_as_printed() {
    let setup = Setup::new();
    let folder = setup.data_dir.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    let mut receiver = Command::new(api_binary());
    receiver.arg("receiver").current_dir(&folder).stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
    let mut receiver = receiver.spawn().unwrap();
    eventually("the receiver's CA", tests::WAIT, async || {
        if folder.join("webhooks-receiver/ca.pem").exists() { Ok(()) } else { Err("no ca.pem yet".to_owned()) }
    })
    .await;

    let mut command = setup.command(&["standalone"]);
    command
        .env_remove("DATA_DIR")
        .env("TLS_EXTRA_ROOTS", "webhooks-receiver/ca.pem")
        .env("INTERNAL_LISTEN_ADDR", setup.internal.to_string())
        .current_dir(&folder);
    let mut service = command.spawn().unwrap();
    let printed = first_line(&mut service).await;
    let mut stderr = service.stderr.take().unwrap();
    let mut text = String::new();
    let mut chunk = [0u8; 4096];
    while !text.contains("docs/quickstart.md") {
        let n = tokio::time::timeout(Duration::from_secs(30), stderr.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "stderr ended before the next steps: {text}");
        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    let steps = &text[text.find("  export KEY=").expect("the export line")..text.find("docs/quickstart.md").unwrap()];
    let key = printed["key"].as_str().unwrap();
    let script: String = steps
        .lines()
        .filter(|line| line.trim() != "webhooks-api receiver")
        .map(|line| if line.contains("export KEY=") { format!("export KEY={key}") } else { line.to_owned() })
        .collect::<Vec<_>>()
        .join("\n");
    let run = |script: String| {
        let folder = folder.clone();
        async move { Command::new("bash").arg("-euc").arg(script).current_dir(folder).output().await.expect("run bash") }
    };
    let output = run(script.clone()).await;
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{script}\n{out}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("wep_") && out.contains("\"status\":\"active\""), "{out}");
    // The log of step 4 fills once the attempt is recorded: run it again.
    let step4 = script.lines().skip_while(|line| !line.contains("# 4.")).collect::<Vec<_>>().join("\n");
    let endpoint = out.lines().find(|line| line.starts_with("wep_")).unwrap().trim().to_owned();
    eventually("the delivery in the log", tests::WAIT, async || {
        let output = run(format!("export KEY={key} ENDPOINT={endpoint}\n{step4}")).await;
        let out = String::from_utf8_lossy(&output.stdout).into_owned();
        if out.contains("\"status\":200") { Ok(()) } else { Err(out) }
    })
    .await;
    kill(&mut service).await;
    kill(&mut receiver).await;
}
