//! The receiver kits (kits/) against real deliveries of a running system:
//! every kit's CLI (Node, Python, Go, Rust) accepts each delivery, in both
//! schemes and with either key during a rotation's overlap, and refuses it
//! with a changed body. `kits/run commands` sets the kits up and names the
//! CLIs.

mod common;

use std::{path::Path, process::Command};

use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, DeveloperKey, Receiver, RecordedRequest, TestApi, WAIT};

/// The kits' CLIs, one command line each, as `kits/run commands` prints them.
fn kit_commands() -> Vec<Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = Command::new(root.join("kits/run")).arg("commands").output().expect("run kits/run commands");
    assert!(output.status.success(), "kits/run commands: {}", String::from_utf8_lossy(&output.stderr));
    let commands: Vec<Vec<String>> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert!(commands.len() >= 4, "expected the Node, Python, Go and Rust CLIs: {commands:?}");
    commands
}

/// Runs `command` over a captured request with `key`; returns its exit code
/// and its line.
fn run_kit(command: &[String], dir: &Path, request: &RecordedRequest, body: &[u8], key: &str) -> (i32, String) {
    let headers: serde_json::Map<String, Value> = request
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.into())))
        .collect();
    std::fs::write(dir.join("headers.json"), Value::Object(headers).to_string()).unwrap();
    std::fs::write(dir.join("body"), body).unwrap();
    std::fs::write(dir.join("key"), key).unwrap();
    let output = Command::new(&command[0])
        .args(&command[1..])
        .arg("--headers")
        .arg(dir.join("headers.json"))
        .arg("--body")
        .arg(dir.join("body"))
        .arg("--key")
        .arg(dir.join("key"))
        .output()
        .expect("run a kit");
    let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.code().unwrap_or(-1), format!("{line} {}", String::from_utf8_lossy(&output.stderr).trim()))
}

/// Every kit accepts `request` with each of `keys` as `genuine: <scheme>
/// signature`, and refuses it with one byte of the body changed.
fn every_kit_agrees(commands: &[Vec<String>], request: &RecordedRequest, keys: &[&str], scheme: &str) {
    let dir = std::env::temp_dir().join(format!("webhooks-kits-{}", tests::random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut changed = request.body.to_vec();
    let at = changed.iter().position(|b| b.is_ascii_digit()).expect("a digit in the event");
    changed[at] = if changed[at] == b'9' { b'8' } else { changed[at] + 1 };
    for command in commands {
        for key in keys {
            let (code, line) = run_kit(command, &dir, request, &request.body, key);
            assert_eq!(
                (code, line.starts_with(&format!("genuine: {scheme} signature"))),
                (0, true),
                "{command:?}: {line}"
            );
            let (code, line) = run_kit(command, &dir, request, &changed, key);
            assert_eq!((code, line.starts_with("refused: no signature matches")), (1, true), "{command:?}: {line}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn deliver(api: &TestApi, key: &DeveloperKey, receiver: &Receiver, n: usize) -> RecordedRequest {
    let event = ingest(api, key.developer_id(), "transfer", n).await;
    let id = event_id(&event);
    wait_for_events(receiver, std::slice::from_ref(&id), WAIT).await;
    receiver.requests().into_iter().find(|r| r.header("x-webhook-id") == Some(id.as_str())).unwrap()
}

/// The first delivery from event `n` on whose headers satisfy `ready`: a key
/// change reaches the dispatchers with its lifecycle message, within
/// milliseconds of the API's answer.
async fn deliver_when(
    api: &TestApi,
    key: &DeveloperKey,
    receiver: &Receiver,
    n: usize,
    ready: impl Fn(&RecordedRequest) -> bool,
) -> RecordedRequest {
    for k in 0..20 {
        let request = deliver(api, key, receiver, n + k).await;
        if ready(&request) {
            return request;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no delivery as expected within 20 events");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kit_verifies_real_deliveries_in_both_schemes_and_through_a_rotation() {
    let commands = tokio::task::spawn_blocking(kit_commands).await.unwrap();
    let options = ApiOptions { extra_args: vec!["--key-rotation-overlap".into(), "1h".into()], ..Default::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;

    let platform = active_endpoint(&api, &key, &receiver.url()).await;
    let request = deliver(&api, &key, &receiver, 0).await;
    every_kit_agrees(&commands, &request, &[&pem(&platform)], "platform");

    let rotated =
        api.post(&format!("/webhooks/{}/rotate_key", id(&platform)), &key, &json!({})).await.expect(200).clone();
    let two = |r: &RecordedRequest| r.header("x-webhook-signature").is_some_and(|h| h.matches(",v0=").count() == 2);
    let request = deliver_when(&api, &key, &receiver, 10, two).await;
    every_kit_agrees(&commands, &request, &[&pem(&platform), &pem(&rotated)], "platform");

    // To the standard scheme: during the overlap both header sets are sent,
    // and each key verifies its own.
    let switched = api
        .put(&format!("/webhooks/{}", id(&platform)), &key, &json!({ "signature_scheme": "standard" }))
        .await
        .expect(200)
        .clone();
    let whpk = switched["public_key"].as_str().unwrap().to_owned();
    let request = deliver_when(&api, &key, &receiver, 40, |r| r.header("webhook-signature").is_some()).await;
    every_kit_agrees(&commands, &request, &[&whpk], "standard");
    every_kit_agrees(&commands, &request, &[&pem(&rotated)], "platform");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
