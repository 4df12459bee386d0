//! The key-encryption key rotates without an outage (docs/operations.md, "Rotating the
//! key-encryption key"), run as an operator runs it, as processes: endpoints
//! sealed under one key (one of them in the format of releases before key
//! ids), a restart with the new key listed first, `keys reseal` while the
//! service runs, a restart with the new key alone, and every endpoint still
//! delivers, its previous key too. Delivery refuses to start with keys that
//! cannot open what is stored, saying which key ids it needs.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tests::{
    ApiOptions, Backend, Receiver, TestApi,
    procs::{Programs, Stack, StackOptions},
};
use uuid::Uuid;
use webhooks_keys::{KeyCipher, Resealed, SealedBy};
use webhooks_store::{KeyReseal, KeySlot};

/// The key the endpoints are first sealed with, in hex.
const OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
/// The key that replaces it, in base64.
const NEW: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";

/// The id of `key`, as blobs, logs and messages name it.
fn key_id(key: &str) -> String {
    KeyCipher::new(Some(key)).unwrap().sealing_key().unwrap().to_string()
}

/// Stops every process of the system, the way a restart begins.
async fn stop(stack: &mut Stack) {
    let mut stopping: Vec<_> = stack.dispatchers.drain(..).collect();
    stopping.extend(stack.api.take());
    for proc in stopping {
        proc.terminate(Duration::from_secs(10)).await;
    }
}

/// Starts the system (API, and a dispatcher in the distributed mode) with
/// `KEY_ENCRYPTION_KEY=keys`.
async fn start(stack: &mut Stack, keys: &str) {
    stack.set_env("KEY_ENCRYPTION_KEY", keys);
    stack.start_api().await.unwrap();
    if stack.backend == Backend::Distributed {
        stack.start_dispatcher().await.unwrap();
    }
}

/// Starts delivery with `KEY_ENCRYPTION_KEY=keys` beside the running system
/// (a further dispatcher), or in place of it (the standalone process, which
/// is stopped first), expecting a refusal; returns what it logged. The
/// system runs with `running` again afterwards.
async fn refused(stack: &mut Stack, keys: &str, running: &str) -> String {
    if stack.backend == Backend::Standalone {
        stop(stack).await;
    }
    stack.set_env("KEY_ENCRYPTION_KEY", keys);
    let (name, started) = match stack.backend {
        Backend::Distributed => {
            let started = stack.start_dispatcher().await;
            (format!("dispatcher-{}", stack.dispatchers_started()), started)
        }
        Backend::Standalone => ("standalone".to_owned(), stack.start_api().await),
    };
    assert!(started.is_err(), "delivery started with a KEY_ENCRYPTION_KEY that opens nothing stored");
    let log = stack.log(&name);
    stack.set_env("KEY_ENCRYPTION_KEY", running);
    if stack.backend == Backend::Standalone {
        start(stack, running).await;
    }
    log
}

/// `POST /webhooks` with `body` and `PUT` it active; the `Webhook`.
async fn active_stack_endpoint(stack: &Stack, key: &str, body: Value) -> Value {
    let api = stack.api_url();
    let created = stack.client.post(format!("{api}/webhooks")).header("Api-Key", key);
    let created = created.header("Idempotency-Key", Uuid::new_v4().to_string()).json(&body).send().await.unwrap();
    let status = created.status();
    let created: Value = created.json().await.unwrap();
    assert_eq!(status, 201, "{created}");
    let path = format!("{api}/webhooks/{}", id(&created));
    let active = json!({ "status": "active" });
    let updated = stack.client.put(&path).header("Api-Key", key).json(&active).send().await.unwrap();
    assert_eq!(updated.status(), 200);
    updated.json().await.unwrap()
}

/// Ingests event `n` and waits until every receiver has it.
async fn deliver(stack: &Stack, developer: Uuid, n: usize, receivers: &[&Receiver]) {
    let response = stack.client.post(stack.ingest_url()).json(&event_input(developer, "transfer", n)).send().await;
    let event: Value = response.unwrap().json().await.unwrap();
    for receiver in receivers {
        wait_for_events(receiver, &[event_id(&event)], tests::WAIT).await;
    }
}

/// Whether every request `receiver` got verifies with `public_key` (either
/// scheme), as the endpoint's owner verifies them.
fn verifies_all(receiver: &Receiver, public_key: &str) -> bool {
    let key = webhooks_signature::verify::ReceiverKey::parse(public_key).unwrap();
    receiver.requests().iter().all(|request| {
        let headers: Vec<(&str, &str)> =
            request.headers.iter().filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?))).collect();
        key.verify(&headers, &request.body, request.received_at_ms()).is_ok()
    })
}

/// Rewrites endpoint `id`'s current key in the format releases before key
/// ids wrote (`0x01`, no key id): the same ciphertext under the same
/// associated data, without the id.
async fn make_unnamed(stack: &Stack, id: &str) {
    let select = "SELECT private_key FROM endpoints WHERE id = $1";
    let update = "UPDATE endpoints SET private_key = $2 WHERE id = $1";
    let unnamed = |named: Vec<u8>| {
        assert_eq!(named[0], 2, "sealed naming its key");
        [&[1u8][..], &named[webhooks_keys::NAMED_HEAD_LEN..]].concat()
    };
    match (stack.database_url(), stack.data_dir()) {
        (Some(url), _) => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            let named: Vec<u8> = sqlx::query_scalar(select).bind(id).fetch_one(&pool).await.unwrap();
            sqlx::query(update).bind(id).bind(unnamed(named)).execute(&pool).await.unwrap();
            pool.close().await;
        }
        (None, Some(dir)) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(dir.join(webhooks_store::open::DATABASE_FILE))
                .busy_timeout(Duration::from_secs(10));
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            let named: Vec<u8> = sqlx::query_scalar(select).bind(id).fetch_one(&pool).await.unwrap();
            sqlx::query(update).bind(id).bind(unnamed(named)).execute(&pool).await.unwrap();
            pool.close().await;
        }
        (None, None) => unreachable!("a stack runs on a database or a data directory"),
    }
}

/// `keys reseal --batch 2` on the running system: its JSON summary, and
/// what it wrote to stderr.
async fn reseal(stack: &Stack) -> (Value, String) {
    let output = stack.command(&["keys", "reseal", "--batch", "2"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "keys reseal: {}: {stderr}", output.status);
    let summary = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (summary, stderr)
}

#[tests::test]
async fn the_key_encryption_key_rotates_without_an_outage() {
    let backend = Backend::current();
    let programs = Programs::at(env!("CARGO_BIN_EXE_api-process"), env!("CARGO_BIN_EXE_dispatcher-process"));
    let options = StackOptions {
        env: vec![("KEY_ENCRYPTION_KEY".into(), OLD.into())],
        ..StackOptions::new(backend, "kek-rotation")
    };
    let mut stack = Stack::start(programs, options).await.unwrap();
    if backend == Backend::Distributed {
        stack.start_dispatcher().await.unwrap();
    }
    let (key, developer) = stack.create_key(None).await.unwrap();

    // Under the old key: a platform endpoint, a standard one, one rotated
    // (its previous key signs beside the new one), one whose key is stored
    // as releases before key ids stored it, and one deleted.
    let mut receivers = Vec::new();
    for _ in 0..5 {
        receivers.push(Receiver::start(&stack.ca).await.unwrap());
    }
    let [platform, standard, rotated, unnamed, created_later] = &receivers[..] else { unreachable!() };
    let platform_webhook = active_stack_endpoint(&stack, &key, json!({ "url": platform.url() })).await;
    let standard_webhook =
        active_stack_endpoint(&stack, &key, json!({ "url": standard.url(), "signature_scheme": "standard" })).await;
    let rotated_webhook = active_stack_endpoint(&stack, &key, json!({ "url": rotated.url() })).await;
    let rotate = format!("{}/webhooks/{}/rotate_key", stack.api_url(), id(&rotated_webhook));
    let rotation = stack.client.post(&rotate).header("Api-Key", &key).header("Idempotency-Key", "rotate");
    let rotated_webhook: Value = rotation.json(&json!({})).send().await.unwrap().json().await.unwrap();
    assert!(rotated_webhook["previous_public_key"].is_string(), "{rotated_webhook}");
    let unnamed_webhook = active_stack_endpoint(&stack, &key, json!({ "url": unnamed.url() })).await;
    let deleted = active_stack_endpoint(&stack, &key, json!({ "url": created_later.url() })).await;
    let path = format!("{}/webhooks/{}", stack.api_url(), id(&deleted));
    assert_eq!(stack.client.delete(&path).header("Api-Key", &key).send().await.unwrap().status(), 200);
    make_unnamed(&stack, &id(&unnamed_webhook)).await;
    deliver(&stack, developer, 1, &[platform, standard, rotated, unnamed]).await;

    // The new key first, the old one still listed: new endpoint keys are
    // sealed with the new key, and everything stored still opens.
    stop(&mut stack).await;
    start(&mut stack, &format!("{NEW},{OLD}")).await;
    let later_webhook = active_stack_endpoint(&stack, &key, json!({ "url": created_later.url() })).await;
    deliver(&stack, developer, 2, &[platform, standard, rotated, unnamed, created_later]).await;

    // Without the old key, delivery refuses to start, naming what it needs.
    let log = refused(&mut stack, NEW, &format!("{NEW},{OLD}")).await;
    let (old_id, new_id) = (key_id(OLD), key_id(NEW));
    assert!(log.contains("KEY_ENCRYPTION_KEY cannot open stored endpoint private keys"), "{log}");
    assert!(log.contains(&format!("3 endpoints hold keys sealed with key id {old_id}")), "{log}");
    assert!(log.contains("1 endpoint holds keys sealed without a key id"), "{log}");
    assert!(log.contains(&format!("Configured key ids: {new_id}.")), "{log}");

    // Reseal while the system runs; a second run finds nothing to do.
    let (summary, progress) = reseal(&stack).await;
    let expected = json!({
        "key_id": new_id, "endpoints": 5, "resealed": 5, "skipped": 1, "changed": 0, "failed": 0, "failures": [],
    });
    assert_eq!(summary, expected, "platform, standard, rotated (both keys) and unnamed resealed: {progress}");
    assert!(progress.contains("keys reseal: 2 endpoints read"), "progress per batch of 2: {progress}");
    let (again, _) = reseal(&stack).await;
    assert_eq!((again["resealed"].as_u64(), again["skipped"].as_u64()), (Some(0), Some(6)), "{again}");
    deliver(&stack, developer, 3, &[platform, standard, rotated, unnamed, created_later]).await;

    // The new key alone: every endpoint delivers, signed with its keys.
    stop(&mut stack).await;
    start(&mut stack, NEW).await;
    deliver(&stack, developer, 4, &[platform, standard, rotated, unnamed, created_later]).await;
    let webhooks = [&platform_webhook, &standard_webhook, &rotated_webhook, &unnamed_webhook, &later_webhook];
    for (receiver, webhook) in [platform, standard, rotated, unnamed, created_later].into_iter().zip(webhooks) {
        assert!(verifies_all(receiver, webhook["public_key"].as_str().unwrap()), "{webhook}");
    }
    let previous = rotated_webhook["previous_public_key"].as_str().unwrap();
    assert!(verifies_all(rotated, previous), "the previous key still signs during its overlap");

    // The old key alone now opens nothing of what is stored.
    let log = refused(&mut stack, OLD, NEW).await;
    assert!(log.contains(&format!("5 endpoints hold keys sealed with key id {new_id}")), "{log}");
    assert!(log.contains(&format!("Configured key ids: {old_id}.")), "{log}");

    // No process logged a key.
    for entry in std::fs::read_dir(&stack.log_dir).unwrap() {
        let path = entry.unwrap().path();
        let log = std::fs::read_to_string(&path).unwrap();
        assert!(!log.contains(OLD) && !log.contains(&NEW[..20]), "{} holds a key", path.display());
    }
    stack.shutdown(Duration::from_secs(10)).await;
}

/// What `keys reseal` writes goes only where the blob it read still stands:
/// a rotation and a delete made between its read and its write are neither
/// undone nor brought back.
#[tests::test]
async fn a_reseal_never_undoes_a_rotation_or_a_delete_made_meanwhile() {
    let options = ApiOptions { extra_args: vec!["--key-encryption-key".into(), OLD.into()], ..ApiOptions::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let (kept_receiver, rotated_receiver) = (api.receiver().await, api.receiver().await);
    let kept = active_endpoint(&api, &key, &kept_receiver.url()).await;
    let rotated = active_endpoint(&api, &key, &rotated_receiver.url()).await;
    let deleted = active_endpoint(&api, &key, &api.receiver().await.url()).await;

    let read = api.store.sealed_keys("", 100).await.unwrap();
    assert_eq!(read.len(), 3);
    let rotation = api.post(&format!("/webhooks/{}/rotate_key", id(&rotated)), &key, &json!({})).await;
    let rotated = rotation.expect(200).clone();
    api.delete(&format!("/webhooks/{}", id(&deleted)), &key).await.expect(200);

    let cipher = KeyCipher::new(Some(&format!("{NEW},{OLD}"))).unwrap();
    let reseals: Vec<KeyReseal> = read
        .iter()
        .map(|keys| match cipher.reseal(&keys.current, keys.endpoint_id.as_bytes()).unwrap() {
            Resealed::Sealed(resealed) => KeyReseal {
                endpoint_id: keys.endpoint_id.clone(),
                slot: KeySlot::Current,
                sealed: keys.current.clone(),
                resealed,
            },
            Resealed::Current => panic!("sealed with the old key"),
        })
        .collect();
    let written = api.store.reseal_keys(&reseals).await.unwrap();
    let written: Vec<&str> =
        reseals.iter().zip(written).filter(|(_, w)| *w).map(|(r, _)| r.endpoint_id.as_str()).collect();
    assert_eq!(written, [id(&kept)], "only the endpoint that did not change");

    let now = api.store.sealed_keys("", 100).await.unwrap();
    let sealed_by = |keys: &webhooks_store::SealedKeys| {
        (keys.endpoint_id.clone(), SealedBy::of(&keys.current), keys.previous.as_deref().map(SealedBy::of))
    };
    let (old, new) = (SealedBy::Key(cipher.key_ids().nth(1).unwrap()), SealedBy::Key(cipher.sealing_key().unwrap()));
    let mut expected = vec![(id(&kept), new, None), (id(&rotated), old, Some(old))];
    expected.sort();
    assert_eq!(now.iter().map(sealed_by).collect::<Vec<_>>(), expected, "the deleted endpoint has no key again");
    let rotated_now = api.store.load_endpoint(&id(&rotated)).await.unwrap().unwrap();
    assert_eq!(rotated_now.public_key_pem, pem(&rotated), "the rotation stands");

    // Both still deliver, signed with their keys.
    let mut dispatcher = api.start_dispatcher_with(&["--key-encryption-key", &format!("{NEW},{OLD}")]).await.unwrap();
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    for (receiver, webhook) in [(&kept_receiver, &kept), (&rotated_receiver, &rotated)] {
        wait_for_events(receiver, &[event_id(&event)], tests::WAIT).await;
        verify_all(receiver, webhook);
    }
    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
