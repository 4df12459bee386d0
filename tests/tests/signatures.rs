//! Signatures a receiver checks (API.md §6, §8.2, §8.4): key rotation with
//! its overlap, the `standard` scheme verified by an independent Ed25519
//! implementation, and a switch between schemes.

mod common;

use std::time::Duration;

use base64::{Engine as _, engine::general_purpose::STANDARD};
use common::*;
use serde_json::{Value, json};
use tests::{ApiOptions, DeveloperKey, Receiver, RecordedRequest, TestApi, WAIT, expect};
use webhooks_signature::{platform as signing, platform::SIGNATURE_HEADER, platform::Verifier};

/// The overlap these tests run with: long enough to deliver during it.
const OVERLAP: Duration = Duration::from_secs(6);

async fn start() -> TestApi {
    let options = ApiOptions {
        extra_args: vec!["--key-rotation-overlap".into(), format!("{}s", OVERLAP.as_secs())],
        ..ApiOptions::default()
    };
    TestApi::start_with(options).await.unwrap()
}

/// Ingests one event and waits until `receiver` has it; returns its request.
async fn deliver_one(api: &TestApi, key: &DeveloperKey, receiver: &Receiver, n: usize) -> RecordedRequest {
    let event = ingest(api, key.developer_id(), "transfer", n).await;
    let id = event_id(&event);
    wait_for_events(receiver, std::slice::from_ref(&id), WAIT).await;
    let request = receiver.requests().into_iter().find(|r| r.header("x-webhook-id") == Some(id.as_str())).unwrap();
    assert_eq!(&request.json().unwrap(), &event);
    request
}

/// Whether `pem` verifies the request's platform signature (10-minute window).
fn platform_verifies(request: &RecordedRequest, pem: &str) -> bool {
    let header = request.header(SIGNATURE_HEADER).expect("X-Webhook-Signature");
    Verifier::from_pem(pem).unwrap().verify(header, &request.body, Some(request.received_at_ms())).is_ok()
}

/// Verifies a `standard` delivery with ed25519-dalek (not the service's own
/// code) against `whpk_…`, as the Standard Webhooks specification says.
fn standard_verifies(request: &RecordedRequest, public_key: &str) -> bool {
    let raw: [u8; 32] = STANDARD.decode(public_key.strip_prefix("whpk_").unwrap()).unwrap().try_into().unwrap();
    let key = ed25519_dalek::VerifyingKey::from_bytes(&raw).unwrap();
    let id = request.header("webhook-id").expect("webhook-id");
    let timestamp = request.header("webhook-timestamp").expect("webhook-timestamp");
    let seconds: i64 = timestamp.parse().expect("webhook-timestamp in seconds");
    assert!((seconds - request.received_at_ms() / 1000).abs() <= 60, "webhook-timestamp {seconds} is not now");
    let content = [id.as_bytes(), b".", timestamp.as_bytes(), b".", &request.body].concat();
    request.header("webhook-signature").expect("webhook-signature").split(' ').any(|entry| {
        let signature = entry.strip_prefix("v1a,").expect("a v1a entry");
        let bytes: [u8; 64] = STANDARD.decode(signature).unwrap().try_into().unwrap();
        key.verify_strict(&content, &ed25519_dalek::Signature::from_bytes(&bytes)).is_ok()
    })
}

/// The first delivery of new events (from `n` on) that carries `count`
/// signatures: a key change reaches the dispatchers with its lifecycle
/// message, within milliseconds of the API's answer (docs/behaviour.md, "Endpoint
/// controls"); every delivery after that carries them all.
async fn first_signed_by(
    api: &TestApi,
    key: &DeveloperKey,
    receiver: &Receiver,
    n: usize,
    count: usize,
    signatures: impl Fn(&RecordedRequest) -> usize,
) -> RecordedRequest {
    for attempt in 0..20 {
        let request = deliver_one(api, key, receiver, n + attempt).await;
        if signatures(&request) == count {
            // And the next one too: not a passing state.
            let next = deliver_one(api, key, receiver, n + 100 + attempt).await;
            assert_eq!(signatures(&next), count, "{:?}", next.headers);
            return next;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no delivery with {count} signatures within 20 events");
}

fn v0_count(request: &RecordedRequest) -> usize {
    request.header(SIGNATURE_HEADER).map_or(0, |h| signing::parse_header(h).map_or(0, |p| p.signatures.len()))
}

fn v1a_count(request: &RecordedRequest) -> usize {
    request.header("webhook-signature").map_or(0, |h| h.split(' ').count())
}

async fn rotate(api: &TestApi, key: &DeveloperKey, webhook: &Value) -> Value {
    api.post(&format!("/webhooks/{}/rotate_key", id(webhook)), key, &json!({})).await.expect(200).clone()
}

#[tests::test]
async fn during_a_rotation_both_keys_verify_every_delivery_then_only_the_new_one() {
    let api = start().await;
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;
    assert_eq!(webhook["signature_scheme"], "platform");
    assert!(webhook.get("previous_public_key").is_none(), "{webhook}");
    let old = pem(&webhook);

    let before = deliver_one(&api, &key, &receiver, 0).await;
    assert!(platform_verifies(&before, &old));

    let rotated = rotate(&api, &key, &webhook).await;
    let new = pem(&rotated);
    assert_ne!(new, old);
    assert!(new.starts_with("-----BEGIN PUBLIC KEY-----"), "{rotated}");
    assert_eq!(rotated["previous_public_key"], old.as_str(), "{rotated}");
    let expires = expect::timestamp(&rotated["previous_key_expires_at"]);
    let left = expires - chrono::Utc::now();
    assert!(left > chrono::Duration::zero() && left <= chrono::Duration::from_std(OVERLAP).unwrap(), "{rotated}");
    let shown = api.get(&format!("/webhooks/{}", id(&webhook)), &key).await.expect(200).clone();
    for field in ["public_key", "previous_public_key", "previous_key_expires_at", "signature_scheme"] {
        assert_eq!(shown[field], rotated[field], "{field}");
    }

    // During the overlap: one header, `t`, then the new key's `v0`, then the old one's.
    let during = first_signed_by(&api, &key, &receiver, 1, 2, v0_count).await;
    let header = during.header(SIGNATURE_HEADER).unwrap();
    let parsed = signing::parse_header(header).unwrap();
    assert_eq!(parsed.signatures.len(), 2, "{header}");
    assert!(platform_verifies(&during, &old), "a receiver holding only the old key refuses {header}");
    assert!(platform_verifies(&during, &new), "a receiver holding only the new key refuses {header}");
    let newest = signing::header_value(parsed.timestamp_ms, &parsed.signatures[0]);
    assert!(Verifier::from_pem(&new).unwrap().verify(&newest, &during.body, None).is_ok(), "not newest first");

    // After it: only the new key signs, and the old key is gone from the endpoint.
    eventually("the previous key is deleted", WAIT + OVERLAP, async || {
        let shown = api.get(&format!("/webhooks/{}", id(&webhook)), &key).await.expect(200).clone();
        if shown.get("previous_public_key").is_none() && shown.get("previous_key_expires_at").is_none() {
            Ok(())
        } else {
            Err(shown.to_string())
        }
    })
    .await;
    let after = deliver_one(&api, &key, &receiver, 2).await;
    assert_eq!(signing::parse_header(after.header(SIGNATURE_HEADER).unwrap()).unwrap().signatures.len(), 1);
    assert!(platform_verifies(&after, &new));
    assert!(!platform_verifies(&after, &old));

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn standard_deliveries_verify_with_an_independent_ed25519_and_a_scheme_switch_overlaps() {
    let api = start().await;
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook =
        active_endpoint_with(&api, &key, json!({ "url": receiver.url(), "signature_scheme": "standard" })).await;
    assert_eq!(webhook["signature_scheme"], "standard");
    let whpk = webhook["public_key"].as_str().unwrap().to_owned();
    assert!(whpk.starts_with("whpk_") && STANDARD.decode(&whpk[5..]).unwrap().len() == 32, "{webhook}");

    let first = deliver_one(&api, &key, &receiver, 0).await;
    assert_eq!(first.header("webhook-id"), first.header("x-webhook-id"));
    assert!(first.header(SIGNATURE_HEADER).is_none(), "a standard endpoint got {:?}", first.headers);
    assert!(first.header("webhook-signature").unwrap().starts_with("v1a,"));
    assert!(standard_verifies(&first, &whpk));

    // A rotation keeps the scheme: two v1a entries, each key verifies.
    let rotated = rotate(&api, &key, &webhook).await;
    let whpk2 = rotated["public_key"].as_str().unwrap().to_owned();
    assert!(whpk2.starts_with("whpk_") && whpk2 != whpk);
    let during = first_signed_by(&api, &key, &receiver, 1, 2, v1a_count).await;
    assert!(standard_verifies(&during, &whpk) && standard_verifies(&during, &whpk2));

    // Back to platform: a fresh RSA key; the Ed25519 key overlaps in its own headers.
    let switched = api
        .put(&format!("/webhooks/{}", id(&webhook)), &key, &json!({ "signature_scheme": "platform" }))
        .await
        .expect(200)
        .clone();
    assert_eq!(switched["signature_scheme"], "platform");
    assert_eq!(switched["previous_public_key"], whpk2.as_str());
    let rsa = pem(&switched);
    let both = first_signed_by(&api, &key, &receiver, 300, 1, v0_count).await;
    assert!(platform_verifies(&both, &rsa), "the new platform key does not verify");
    assert_eq!(both.header("webhook-signature").unwrap().split(' ').count(), 1);
    assert!(standard_verifies(&both, &whpk2), "the old standard key does not verify");
    assert!(!standard_verifies(&both, &whpk), "a key replaced twice still signs");

    // The same scheme again is no change.
    let same = api
        .put(&format!("/webhooks/{}", id(&webhook)), &key, &json!({ "signature_scheme": "platform" }))
        .await
        .expect(200)
        .clone();
    assert_eq!(same["public_key"], switched["public_key"]);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn rotation_and_schemes_refuse_what_they_should() {
    let api = start().await;
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let answer = api.post("/webhooks", &key, &json!({ "url": receiver.url(), "signature_scheme": "hmac" })).await;
    answer.expect_error(400, "invalid");
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let reader = api.key_for(key.developer_id(), &[webhooks_model::Scope::WebhooksRead]).await;
    api.post(&format!("/webhooks/{}/rotate_key", id(&webhook)), &reader, &json!({}))
        .await
        .expect_error(403, "forbidden");
    let other = api.new_developer().await;
    api.post(&format!("/webhooks/{}/rotate_key", id(&webhook)), &other, &json!({}))
        .await
        .expect_error(404, "not_found");
    api.delete(&format!("/webhooks/{}", id(&webhook)), &key).await.expect(200);
    api.post(&format!("/webhooks/{}/rotate_key", id(&webhook)), &key, &json!({})).await.expect_error(404, "not_found");
    api.shutdown().await.unwrap();
}
