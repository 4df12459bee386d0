//! RabbitMQ stopped and started mid-run (API.md §5: an accepted event is
//! durable, no crash of the broker loses it; README: with RabbitMQ down the
//! API keeps accepting work and the relay drains the outbox when it is back).
//!
//! It stops the broker this machine's tests share, so no other test may run
//! meanwhile: it is the only test in its binary, `cargo test` runs binaries
//! one after another, and nextest gives it every test slot
//! (`.config/nextest.toml`). It runs wherever it can restart the broker: `rabbitmqctl`
//! at hand and permission to use it (root). `WEBHOOKS_TEST_BROKER_RESTART=0`
//! turns it off, for a machine whose broker others share.

mod common;

use std::{
    net::SocketAddr,
    process::Command,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Duration,
};

use common::*;
use tests::TestApi;

const SWITCH: &str = "WEBHOOKS_TEST_BROKER_RESTART";

/// Whether `rabbitmqctl` answers here, with the rights to stop the app.
fn can_restart_broker() -> bool {
    Command::new("rabbitmqctl").arg("status").output().is_ok_and(|o| o.status.success())
}

fn rabbitmqctl(command: &str) {
    let output = Command::new("rabbitmqctl")
        .arg(command)
        .output()
        .unwrap_or_else(|e| panic!("cannot run rabbitmqctl {command} (needs RabbitMQ's CLI, as root): {e}"));
    assert!(
        output.status.success(),
        "rabbitmqctl {command}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Makes sure the broker runs again whatever happens to the test.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").output();
    }
}

/// Waits until `/readyz` answers `status` with the broker reported as `broker`.
async fn wait_readiness(client: &reqwest::Client, name: &str, addr: SocketAddr, status: u16, broker: &str) {
    eventually(&format!("{name} /readyz answers {status}, broker {broker}"), Duration::from_secs(120), async || {
        let response = client.get(format!("http://{addr}/readyz")).send().await.map_err(|e| e.to_string())?;
        let answered = response.status().as_u16();
        let body: serde_json::Value = response.json().await.map_err(|e| e.to_string())?;
        if answered == status && body["broker"] == broker && body["database"] == "ok" {
            Ok(())
        } else {
            Err(format!("{answered} {body}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_restart_mid_run_loses_no_event() {
    if std::env::var(SWITCH).as_deref() == Ok("0") || !can_restart_broker() {
        tests::skip(&format!("this machine cannot restart RabbitMQ from here (rabbitmqctl as root), or {SWITCH}=0"));
        return;
    }
    const TOTAL: usize = 300;
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let broker_down = AtomicBool::new(false);
    let accepted_while_down = AtomicUsize::new(0);
    let ingesting = AtomicBool::new(true);
    let ingest_all = async {
        let mut events = Vec::new();
        for n in 0..TOTAL {
            let down = broker_down.load(Ordering::SeqCst);
            let answer = api.ingest(&event_input(key.developer_id(), "transfer", n)).await;
            // Accepted while the broker is down, too.
            events.push(answer.expect(201).clone());
            if down && broker_down.load(Ordering::SeqCst) {
                accepted_while_down.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ingesting.store(false, Ordering::SeqCst);
        events
    };
    let restart = async {
        wait_for_distinct(&receiver, 100, Duration::from_secs(60)).await;
        let guard = RestartOnDrop;
        rabbitmqctl("stop_app");
        broker_down.store(true, Ordering::SeqCst);
        wait_readiness(&api.client, "the API", api.internal, 503, "down").await;
        wait_readiness(&api.client, "the dispatcher", dispatcher.addr, 503, "down").await;
        eventually("events accepted while the broker is down", Duration::from_secs(60), async || {
            let accepted = accepted_while_down.load(Ordering::SeqCst);
            if accepted >= 20 || !ingesting.load(Ordering::SeqCst) { Ok(()) } else { Err(format!("{accepted}")) }
        })
        .await;
        broker_down.store(false, Ordering::SeqCst);
        rabbitmqctl("start_app");
        drop(guard);
    };
    let (events, ()) = tokio::join!(ingest_all, restart);
    let accepted_while_down = accepted_while_down.load(Ordering::SeqCst);
    assert!(accepted_while_down > 0, "no event was ingested while the broker was down");

    wait_readiness(&api.client, "the API", api.internal, 200, "ok").await;
    wait_readiness(&api.client, "the dispatcher", dispatcher.addr, 200, "ok").await;
    let distinct = wait_for_distinct(&receiver, TOTAL, Duration::from_secs(180)).await;
    let expected: std::collections::HashSet<String> = events.iter().map(event_id).collect();
    assert_eq!(distinct, expected);
    verify_all(&receiver, &endpoint);
    eprintln!("{accepted_while_down} events accepted while the broker was down; {} requests in all", receiver.count());

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
