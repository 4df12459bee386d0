//! The outside programs the benchmark (`webhooks-bench`) measures against:
//! nginx as the HTTPS receiver and wrk as the producer. Each is installed
//! with apt when it is missing and runs from a temporary directory of the
//! bench: its configuration, certificate, Lua script and logs live there, and
//! no configuration of the system is read or written.
//!
//! Arrivals at nginx are read from its access log (`$msec $http_x_webhook_id
//! $status` per line), which a task tails while nginx runs. `$msec` is the
//! wall clock (`CLOCK_REALTIME`, as [`wall_ms`]) with millisecond resolution,
//! taken from nginx's cached time when the request is logged, after its
//! answer.

use std::{
    collections::HashMap,
    io::Read,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, bail};
use base64::Engine;
use tokio::{
    process::{Child, Command},
    task::JoinHandle,
};

use crate::{TestCa, ca::LOCAL_NAMES, random_suffix};

/// Milliseconds since the Unix epoch by the wall clock (`CLOCK_REALTIME`):
/// the clock nginx's `$msec` reads, so the two can be subtracted.
pub fn wall_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Arrivals at a receiver: the wall-clock time ([`wall_ms`]) at which each
/// event id (`X-Webhook-Id`) first arrived.
#[derive(Debug, Default)]
pub struct Arrivals {
    count: AtomicU64,
    at: Mutex<HashMap<String, f64>>,
}

impl Arrivals {
    /// Records `id` arriving at `at_ms`; a repeat keeps the first arrival.
    pub fn record(&self, id: String, at_ms: f64) {
        let mut at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        if let std::collections::hash_map::Entry::Vacant(entry) = at.entry(id) {
            entry.insert(at_ms);
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Distinct events arrived so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The latest first arrival so far.
    pub fn last_ms(&self) -> Option<f64> {
        self.at.lock().unwrap_or_else(PoisonError::into_inner).values().copied().reduce(f64::max)
    }

    /// Runs `f` on the arrivals so far.
    pub fn with<T>(&self, f: impl FnOnce(&HashMap<String, f64>) -> T) -> T {
        f(&self.at.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A directory under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory named `<prefix>-<random>`.
    pub fn new(prefix: &str) -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", random_suffix()));
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(TempDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Finds programs, and installs the ones missing with apt-get (`apt-get
/// update` once, first), telling what it does through `say`.
#[derive(Debug, Default)]
pub struct Installer {
    updated: bool,
}

impl Installer {
    /// The path of `program`, installing the first of `packages` that apt
    /// can install when it is not on `PATH` (or in `/usr/sbin`, `/sbin`).
    pub async fn ensure(&mut self, program: &str, packages: &[&str], say: &dyn Fn(&str)) -> anyhow::Result<PathBuf> {
        if let Some(path) = find_program(program) {
            return Ok(path);
        }
        say(&format!("{program} is missing: installing it with apt-get"));
        if !self.updated {
            apt(&["update"], say).await.with_context(|| format!("{program} is missing and apt-get update failed"))?;
            self.updated = true;
        }
        let mut failures = Vec::new();
        for package in packages {
            match apt(&["install", "-y", "--no-install-recommends", package], say).await {
                Ok(()) => match find_program(program) {
                    Some(path) => {
                        say(&format!("{program} installed: {}", path.display()));
                        return Ok(path);
                    }
                    None => failures.push(format!("{package} installed, but {program} is still not found")),
                },
                Err(error) => failures.push(format!("{error:#}")),
            }
        }
        bail!("{program} is missing and could not be installed ({}); install it and run again", failures.join("; "))
    }
}

fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Runs `apt-get <args>` without questions; says the command and the
/// packages it set up, and on failure the end of what apt-get said.
async fn apt(args: &[&str], say: &dyn Fn(&str)) -> anyhow::Result<()> {
    say(&format!("  $ apt-get {}", args.join(" ")));
    let output = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .await
        .context("run apt-get (a Debian or Ubuntu system is needed to install it)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines().filter(|l| l.starts_with("Setting up ")) {
        say(&format!("    {line}"));
    }
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "apt-get {} failed ({}): {}",
            args.join(" "),
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok(())
}

/// PEM text of one DER object.
fn pem(label: &str, der: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in encoded.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

/// The id prefix of the bench's own requests to nginx (the clock check):
/// kept apart from event arrivals.
const PROBE_PREFIX: &str = "probe-";

/// nginx as an HTTPS receiver on a loopback port: one master and one worker
/// process, answering every request `200 ok`, with a certificate issued by
/// the test CA. Arrivals are read from its access log as it is written.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    pid: u32,
    dir: PathBuf,
    port: u16,
    version: String,
    arrivals: Arc<Arrivals>,
    probes: Arc<Arrivals>,
    other_status: Arc<AtomicU64>,
    tail: JoinHandle<()>,
}

/// What the clock check found: for each probe request, its `$msec` minus the
/// wall-clock time at which the bench started it.
#[derive(Debug, Clone, Copy)]
pub struct ClockCheck {
    pub probes: usize,
    /// Smallest and largest `$msec` − request start, milliseconds.
    pub min_ms: f64,
    pub max_ms: f64,
    /// Probes whose `$msec` fell outside [start − 1 ms, answer + 1 ms].
    pub outside: usize,
}

impl Nginx {
    /// Writes a configuration, certificate and key under `dir` (created) and
    /// starts `binary` on them; returns once it accepts connections.
    pub async fn start(binary: &Path, ca: &TestCa, dir: &Path) -> anyhow::Result<Nginx> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let version = Command::new(binary).arg("-V").output().await.context("run nginx -V")?;
        let build = String::from_utf8_lossy(&version.stderr).into_owned();
        let version = build.lines().next().unwrap_or("nginx").trim();
        let version = version.strip_prefix("nginx version: ").unwrap_or(version).to_owned();

        let cert = ca.issue(LOCAL_NAMES);
        let chain: String = cert.chain.iter().map(|c| pem("CERTIFICATE", c)).collect();
        std::fs::write(dir.join("cert.pem"), chain).context("write nginx cert.pem")?;
        std::fs::write(dir.join("key.pem"), pem("PRIVATE KEY", cert.key.secret_der()))
            .context("write nginx key.pem")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let config = dir.join("nginx.conf");
        std::fs::write(&config, config_text(dir, port, &build)).context("write nginx.conf")?;
        let access_log = dir.join("access.log");
        std::fs::write(&access_log, "").context("create access.log")?;

        let stderr = std::fs::File::create(dir.join("stderr.log")).context("create nginx stderr.log")?;
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let pid = child.id().context("nginx pid")?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("nginx exited at start ({status}): {}", logs(dir));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("nginx did not listen on 127.0.0.1:{port} within 15s: {}", logs(dir));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let arrivals = Arc::new(Arrivals::default());
        let probes = Arc::new(Arrivals::default());
        let other_status = Arc::new(AtomicU64::new(0));
        let tail = tokio::spawn(tail_log(access_log, arrivals.clone(), probes.clone(), other_status.clone()));
        Ok(Nginx { child, pid, dir: dir.to_owned(), port, version, arrivals, probes, other_status, tail })
    }

    /// The loopback port it listens on (HTTPS, name `localhost`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The master process; the worker is its child.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The first line of `nginx -V`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Event arrivals, as its access log tells them.
    pub fn arrivals(&self) -> Arc<Arrivals> {
        self.arrivals.clone()
    }

    /// Logged requests answered with another status than 200.
    pub fn other_status(&self) -> u64 {
        self.other_status.load(Ordering::Relaxed)
    }

    /// Compares nginx's clock with the bench's: sends `count` requests one
    /// after another, each with the wall-clock time at its start and at its
    /// answer, and reads their `$msec` back from the access log.
    pub async fn clock_check(&self, ca: &TestCa, count: usize) -> anyhow::Result<ClockCheck> {
        let roots = webhooks_net::tls::root_store(Some(ca.pem_path()))?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(webhooks_net::tls::client_config(roots)?)
            .no_proxy()
            .build()
            .context("the clock check's HTTPS client")?;
        let url = format!("https://localhost:{}/clock", self.port);
        let mut windows = Vec::with_capacity(count);
        for n in 0..count {
            let id = format!("{PROBE_PREFIX}{}-{n}", random_suffix());
            let started = wall_ms();
            let response = client
                .post(&url)
                .header("X-Webhook-Id", &id)
                .body("{}")
                .send()
                .await
                .with_context(|| format!("clock check request to nginx at {url}"))?;
            let answered = wall_ms();
            if response.status() != 200 {
                bail!("nginx answered the clock check {}: {}", response.status(), logs(&self.dir));
            }
            windows.push((id, started, answered));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while windows.iter().any(|(id, _, _)| self.probes.with(|at| !at.contains_key(id))) {
            if Instant::now() > deadline {
                bail!("the clock check's requests did not show in nginx's access log within 10s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (mut min_ms, mut max_ms, mut outside) = (f64::INFINITY, f64::NEG_INFINITY, 0);
        self.probes.with(|at| {
            for (id, started, answered) in &windows {
                let msec = at.get(id).copied().unwrap_or(f64::NAN);
                min_ms = min_ms.min(msec - started);
                max_ms = max_ms.max(msec - started);
                let inside = msec >= started - 1.0 && msec <= answered + 1.0;
                if !inside {
                    outside += 1;
                }
            }
        });
        Ok(ClockCheck { probes: count, min_ms, max_ms, outside })
    }

    /// Fast shutdown (SIGTERM to the master, which stops its worker); the
    /// directory stays for its owner to remove.
    pub async fn stop(mut self) {
        self.tail.abort();
        signal(self.pid, "TERM");
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            for pid in descendants(self.pid) {
                signal(pid, "KILL");
            }
            let _ = self.child.kill().await;
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.tail.abort();
        // Still running (an error path): the workers go first, so none is
        // left behind holding the port if the master is gone before them.
        if matches!(self.child.try_wait(), Ok(None)) {
            for pid in descendants(self.pid) {
                signal(pid, "TERM");
            }
            signal(self.pid, "TERM");
        }
    }
}

fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The processes below `root` (children, their children, …), from `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After "pid (comm) ": state, then the parent's pid.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(parents.iter().filter(|(_, ppid)| *ppid == parent).map(|(pid, _)| *pid));
        next += 1;
    }
    found.remove(0);
    found
}

/// What nginx's error log and stderr hold, for an error message.
fn logs(dir: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let text = format!("{}{}", read("stderr.log"), read("error.log"));
    let text = text.trim();
    if text.is_empty() { "nothing in its error log".into() } else { text.to_owned() }
}

/// The configuration: everything under `dir`. The temp paths of the modules
/// built in are set too, so nginx creates none of its compiled-in defaults.
fn config_text(dir: &Path, port: u16, build: &str) -> String {
    let d = dir.display();
    let temp_paths: String = ["proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .filter(|module| !build.contains(&format!("--without-http_{module}_module")))
        .map(|module| format!("    {module}_temp_path {d}/{module}_temp;\n"))
        .collect();
    format!(
        "# Written by webhooks-bench for one run.
daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;

events {{
    worker_connections 1024;
}}

http {{
    # Arrival time (wall clock, ms resolution), event id, status.
    log_format bench '$msec $http_x_webhook_id $status';
    access_log {d}/access.log bench;
    client_body_temp_path {d}/client_body_temp;
{temp_paths}    default_type text/plain;
    keepalive_timeout 75s;
    keepalive_requests 1000000;

    server {{
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        ssl_certificate {d}/cert.pem;
        ssl_certificate_key {d}/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;

        # POST is refused on static files: answer every request here.
        location / {{
            return 200 \"ok\";
        }}
    }}
}}
"
    )
}

/// Follows the access log from its start: each complete line
/// `<msec> <id> <status>` is an arrival (ids of the clock check go to
/// `probes`).
async fn tail_log(path: PathBuf, arrivals: Arc<Arrivals>, probes: Arc<Arrivals>, other_status: Arc<AtomicU64>) {
    let Ok(mut file) = std::fs::File::open(&path) else {
        tracing::warn!(path = %path.display(), "cannot open nginx's access log");
        return;
    };
    let mut pending = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut chunk) {
            Ok(0) | Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                let Some(end) = pending.iter().rposition(|b| *b == b'\n') else { continue };
                let complete: Vec<u8> = pending.drain(..=end).collect();
                for line in String::from_utf8_lossy(&complete).lines() {
                    let mut fields = line.split_whitespace();
                    let (Some(msec), Some(id), Some(status)) = (fields.next(), fields.next(), fields.next()) else {
                        continue;
                    };
                    let Ok(seconds) = msec.parse::<f64>() else { continue };
                    if status != "200" {
                        other_status.fetch_add(1, Ordering::Relaxed);
                    }
                    let target = if id.starts_with(PROBE_PREFIX) { &probes } else { &arrivals };
                    target.record(id.to_owned(), seconds * 1000.0);
                }
            }
        }
    }
}

/// How wrk drives the ingest endpoint.
#[derive(Debug, Clone, Copy)]
pub struct WrkLoad {
    pub secs: u64,
    pub threads: u64,
    pub connections: u64,
}

/// What a wrk run did.
#[derive(Debug, Clone)]
pub struct WrkRun {
    /// Wall-clock time ([`wall_ms`]) just before wrk started.
    pub started_ms: f64,
    /// Answers 201 or 202 (events accepted), counted by the script.
    pub accepted: u64,
    /// Other answers.
    pub refused: u64,
    /// wrk's own lines: requests, rate, socket errors.
    pub summary: Vec<String>,
}

/// Runs wrk against `url` (`POST /internal/events`) for `load.secs`: every
/// request a new event of `developer_id`, its `event_object_id`
/// `wrk_<tag>_<thread>_<n>` (each wrk thread has its own Lua state, so the
/// thread's number and its own counter make it unique). The script is
/// written to `dir`.
pub async fn wrk(
    binary: &Path,
    dir: &Path,
    url: &str,
    developer_id: &str,
    tag: &str,
    load: WrkLoad,
) -> anyhow::Result<WrkRun> {
    let script = dir.join(format!("ingest-{tag}.lua"));
    std::fs::write(&script, wrk_script(developer_id, tag)).context("write the wrk script")?;
    let started_ms = wall_ms();
    let output = Command::new(binary)
        .arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections.max(load.threads)))
        .arg(format!("-d{}s", load.secs))
        .args(["--timeout", "10s", "-s"])
        .arg(&script)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("run {}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("wrk failed ({}): {stdout} {}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let count = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .with_context(|| format!("no `{key}` line in wrk's output (the script's done() prints it): {stdout}"))
    };
    let (accepted, refused) = (count("bench-accepted ")?, count("bench-refused ")?);
    let summary = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("requests in") || l.starts_with("Requests/sec") || l.starts_with("Socket errors"))
        .map(str::to_owned)
        .collect();
    Ok(WrkRun { started_ms, accepted, refused, summary })
}

fn wrk_script(developer_id: &str, tag: &str) -> String {
    format!(
        r#"-- Written by webhooks-bench: each request is a new event.
local threads = {{}}
local counter = 0
local headers = {{ ["Content-Type"] = "application/json" }}

function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_number", #threads)
end

function init(args)
  accepted = 0
  refused = 0
end

function request()
  counter = counter + 1
  local id = string.format("wrk_{tag}_%d_%d", thread_number, counter)
  local body = string.format(
    '{{"developer_id":"{developer_id}","event_category":"transfer",' ..
    '"event_type":"transfer.updated.status_transitioned","event_object_id":"%s",' ..
    '"event_object_status":"payment_processed",' ..
    '"event_object":{{"id":"%s","amount":"100.00","currency":"usd","state":"payment_processed"}},' ..
    '"event_object_changes":{{"state":["pending","payment_processed"]}}}}',
    id, id)
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status == 201 or status == 202 then
    accepted = accepted + 1
  else
    refused = refused + 1
  end
end

function done(summary, latency, requests)
  local total_accepted, total_refused = 0, 0
  for _, thread in ipairs(threads) do
    total_accepted = total_accepted + (thread:get("accepted") or 0)
    total_refused = total_refused + (thread:get("refused") or 0)
  end
  io.write(string.format("bench-accepted %d\nbench-refused %d\n", total_accepted, total_refused))
end
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_wraps_at_64_columns() {
        let text = pem("CERTIFICATE", &[7u8; 100]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"-----BEGIN CERTIFICATE-----"));
        assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
        assert!(lines[1..lines.len() - 1].iter().all(|l| l.len() <= 64));
        assert_eq!(lines[1].len(), 64);
    }

    #[test]
    fn config_sets_only_the_temp_paths_of_modules_built_in() {
        let text = config_text(Path::new("/tmp/x"), 4443, "--without-http_uwsgi_module --without-http_scgi_module");
        assert!(text.contains("proxy_temp_path /tmp/x/proxy_temp;"));
        assert!(!text.contains("uwsgi_temp_path"));
        assert!(text.contains("log_format bench '$msec $http_x_webhook_id $status';"));
        assert!(text.contains("listen 127.0.0.1:4443 ssl;"));
    }
}
