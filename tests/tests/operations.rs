//! Operator settings and process behaviour: private keys sealed at rest with
//! `KEY_ENCRYPTION_KEY` (API.md §6, §7), production keys (§1), and a stopping
//! dispatcher finishing the attempt it holds (§7), and delivery refusing to
//! start with a key that cannot open the stored keys.

mod common;

use std::time::Duration;

use common::*;
use tests::{ApiOptions, Reply, TestApi, WAIT};
use webhooks_config::Environment;
use webhooks_model::Scope;

/// 32 bytes, base64: a throwaway key-encryption key.
const KEK: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";

#[tests::test]
async fn private_keys_are_sealed_at_rest_and_deliveries_still_verify() {
    let options = ApiOptions { extra_args: vec!["--key-encryption-key".into(), KEK.into()], ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let mut dispatcher = api.start_dispatcher_with(&["--key-encryption-key", KEK]).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    assert!(!endpoint.to_string().contains("PRIVATE KEY"), "{endpoint}");

    let stored = api.store.load_endpoint(&id(&endpoint)).await.unwrap().expect("the endpoint is stored").private_key;
    assert_eq!(stored.first(), Some(&2), "the private key is stored sealed, naming its key (format byte 2)");
    // PKCS#8 of an RSA key starts SEQUENCE, INTEGER 0, SEQUENCE { rsaEncryption }: never in the clear.
    let rsa_encryption = [0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    assert!(!stored.windows(rsa_encryption.len()).any(|w| w == rsa_encryption), "the PKCS#8 key is in the clear");

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_events(&receiver, &[event_id(&event)], WAIT).await;
    verify_all(&receiver, &endpoint);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_production_deployment_issues_and_accepts_live_keys_only() {
    // Production refuses to start without a key-encryption key.
    let options = ApiOptions {
        environment: Environment::Production,
        extra_args: vec!["--key-encryption-key".into(), KEK.into()],
        ..ApiOptions::default()
    };
    let api = TestApi::start_with(options).await.unwrap();
    let live = api.new_developer().await;
    assert!(live.as_str().starts_with("sk-live-"), "{}", live.as_str());
    let whoami = api.get("/api_keys/whoami", &live).await.expect(200).clone();
    assert_eq!(whoami["prefix"], "sk-live", "{whoami}");
    let created = api.post("/api_keys", &live, &serde_json::json!({})).await.expect(201).clone();
    assert!(created["key"].as_str().unwrap().starts_with("sk-live-"), "{created}");

    let test_key = api.issue_key(Environment::Sandbox, live.developer_id(), &[Scope::Unrestricted]).await;
    api.get("/api_keys/whoami", &test_key).await.expect_error(401, "invalid");
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_stopping_dispatcher_finishes_the_attempt_it_holds() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::ok().after(Duration::from_secs(2)));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    let metrics = format!("http://{}/metrics", dispatcher.addr);
    eventually("an attempt in flight", WAIT, async || {
        let text = api
            .client
            .get(&metrics)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        if text.lines().any(|l| l == "webhooks_dispatcher_in_flight 1") { Ok(()) } else { Err(text) }
    })
    .await;

    dispatcher.stop().await.unwrap();
    // The attempt finished and was recorded before the dispatcher returned.
    let entries = logs(&api, &key, &endpoint, "").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["status"], 200, "{}", entries[0]);
    assert_eq!(entries[0]["event_id"], event["event_id"]);
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty());
    assert_eq!(receiver.count(), 1);
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn delivery_refuses_to_start_with_a_key_that_cannot_open_the_stored_keys() {
    let options = ApiOptions { extra_args: vec!["--key-encryption-key".into(), KEK.into()], ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;

    let other = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let refused = api.start_dispatcher_with(&["--key-encryption-key", other]).await.expect_err("started");
    let message = format!("{refused:#}");
    assert!(message.contains("KEY_ENCRYPTION_KEY cannot open"), "{message}");
    assert!(message.contains(&id(&endpoint)), "{message}");

    // With the right key it starts and delivers.
    let mut dispatcher = api.start_dispatcher_with(&["--key-encryption-key", KEK]).await.unwrap();
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_events(&receiver, &[event_id(&event)], WAIT).await;
    verify_all(&receiver, &endpoint);
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// On a server without autovacuum, the API analyzes the tables that changed
/// as autovacuum would: without it, each connection keeps the plans it made
/// while the tables were empty, and scans them whole once they are large.
#[tests::test(distributed)]
async fn without_autovacuum_the_api_analyzes_the_tables_that_changed() {
    let api = TestApi::start().await.unwrap();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum").fetch_one(api.pool()).await.unwrap();
    if autovacuum != "off" {
        tests::skip("the server runs autovacuum, which analyzes the tables itself");
        return;
    }
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    active_endpoint(&api, &key, &receiver.url()).await;
    ingest_many(&api, key.developer_id(), "customer", 200, 8).await;
    eventually("events and deliveries are analyzed", WAIT, async || {
        // The partitions that hold the rows (the history is kept by day).
        let analyzed: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT split_part(s.relname::text, '_p', 1) FROM pg_stat_user_tables s
              WHERE s.relid IN (SELECT DISTINCT tableoid FROM events UNION SELECT DISTINCT tableoid FROM deliveries)
                AND s.last_analyze IS NOT NULL ORDER BY 1",
        )
        .fetch_all(api.pool())
        .await
        .unwrap();
        if analyzed == ["deliveries", "events"] { Ok(()) } else { Err(format!("analyzed so far: {analyzed:?}")) }
    })
    .await;
    api.shutdown().await.unwrap();
}
