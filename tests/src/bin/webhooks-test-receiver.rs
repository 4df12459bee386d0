//! An HTTPS webhook receiver as a process, for tests written in another
//! language (the dashboard's browser tests, `tests/browser/run`): a throwaway
//! CA and a [`tests::Receiver`] that answers every request 200 with
//! `{"received":true}` (503 under `/fail/`, for failed attempts), each
//! request saved as a JSON file that the test reads.
//!
//! ```text
//! webhooks-test-receiver DIR
//! ```
//!
//! Writes the CA certificate to `DIR/ca.pem` (for `TLS_EXTRA_ROOTS`), prints
//! one JSON line on stdout, `{"base_url": "https://127.0.0.1:PORT", "ca_pem":
//! "DIR/ca.pem"}`, then saves the Nth request (from 1) as
//! `DIR/requests/N.json`: `{"method", "path", "headers": [[name, value], …],
//! "body_base64", "received_at_ms"}`, the body exactly as received. Each file
//! appears whole (written aside, then renamed). Runs until SIGTERM or SIGINT.

use std::{io::Write, path::Path, time::Duration};

use anyhow::Context;
use base64::Engine;
use tests::{Receiver, RecordedRequest, Reply, TestCa};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tests::init();
    let dir = std::env::args_os().nth(1).context("usage: webhooks-test-receiver DIR")?;
    let dir = Path::new(&dir);
    let requests_dir = dir.join("requests");
    std::fs::create_dir_all(&requests_dir).with_context(|| format!("create {}", requests_dir.display()))?;

    let ca = TestCa::new()?;
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca.pem()).with_context(|| format!("write {}", ca_pem.display()))?;
    let receiver = Receiver::start(&ca).await?;
    receiver.reply_with(|request, _| {
        if request.path.starts_with("/fail/") {
            Reply::status(503).body("unavailable")
        } else {
            Reply::ok().header("Content-Type", "application/json").body(r#"{"received":true}"#)
        }
    });
    let ready = serde_json::json!({
        "base_url": format!("https://127.0.0.1:{}", receiver.port()),
        "ca_pem": ca_pem,
    });
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{ready}")?;
    stdout.flush()?;
    drop(stdout);

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut saved = 0;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            arrived = receiver.wait_for_within(saved + 1, Duration::from_secs(3600)) => {
                let Ok(requests) = arrived else { continue };
                for request in &requests[saved..] {
                    saved += 1;
                    save(&requests_dir, saved, request)?;
                }
            }
        }
    }
    Ok(())
}

fn save(dir: &Path, number: usize, request: &RecordedRequest) -> anyhow::Result<()> {
    let headers: Vec<[String; 2]> = request
        .headers
        .iter()
        .map(|(name, value)| [name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()])
        .collect();
    let record = serde_json::json!({
        "method": request.method,
        "path": request.path,
        "headers": headers,
        "body_base64": base64::engine::general_purpose::STANDARD.encode(&request.body),
        "received_at_ms": request.received_at_ms(),
    });
    let aside = dir.join(format!("{number}.json.tmp"));
    let path = dir.join(format!("{number}.json"));
    std::fs::write(&aside, serde_json::to_vec(&record)?).with_context(|| format!("write {}", aside.display()))?;
    std::fs::rename(&aside, &path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}
