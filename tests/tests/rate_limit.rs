//! The per-developer request limit (API.md §2: 429 `rate_limited` with
//! `Retry-After`; `RATE_LIMIT_PER_SECOND` and `RATE_LIMIT_BURST`).

use std::time::{Duration, Instant};

use serde_json::json;
use tests::{ApiOptions, DeveloperKey, TestApi};
use webhooks_model::Scope;

fn limited(per_second: u32, burst: u32) -> ApiOptions {
    let extra_args =
        vec!["--rate-limit-per-second".into(), per_second.to_string(), "--rate-limit-burst".into(), burst.to_string()];
    ApiOptions { extra_args, ..ApiOptions::default() }
}

/// Sends `GET /api_keys/whoami` with `keys` in turn until one is refused;
/// returns how many passed.
async fn exhaust(api: &TestApi, keys: &[&DeveloperKey]) -> u64 {
    let mut allowed = 0_u64;
    for key in keys.iter().cycle() {
        let answer = api.get("/api_keys/whoami", key).await;
        if answer.status == 429 {
            return allowed;
        }
        answer.expect(200);
        allowed += 1;
        assert!(allowed <= 50, "50 requests at once were never limited");
    }
    unreachable!("keys is not empty")
}

#[tests::test]
async fn a_developer_over_its_limit_gets_429_with_retry_after_and_others_do_not() {
    let api = TestApi::start_with(limited(1, 5)).await.unwrap();
    let first = api.new_developer().await;
    let second_key_of_first = api.key_for(first.developer_id(), &[Scope::Unrestricted]).await;
    let other = api.new_developer().await;

    // The burst is shared by every key of the developer: take turns until
    // refused. One more may pass for each second the requests took.
    let started = Instant::now();
    let allowed = exhaust(&api, &[&first, &second_key_of_first]).await;
    let took = started.elapsed().as_secs();
    assert!((5..=6 + took).contains(&allowed), "{allowed} requests passed a burst of 5 in {took} s");
    let refused = api.get("/api_keys/whoami", &second_key_of_first).await;
    refused.expect_error(429, "rate_limited");
    let retry_after: u64 = refused
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no whole-second Retry-After: {:?}", refused.headers));
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after} for one request per second");

    // A refused write does nothing and is not the stored answer of its
    // Idempotency-Key: the same request after the wait succeeds. The next
    // allowance may come at any moment after a refusal, so spend it again
    // right before the write, and try again in the rare case it came between.
    let mut refused_write = None;
    for attempt in 0..5 {
        exhaust(&api, &[&first]).await;
        let (idempotency_key, create) = (format!("create-{attempt}"), json!({ "name": format!("later-{attempt}") }));
        let answer = api.post_idempotent("/api_keys", &first, &idempotency_key, &create).await;
        if answer.status == 429 {
            answer.expect_error(429, "rate_limited");
            refused_write = Some((idempotency_key, create));
            break;
        }
        answer.expect(201);
    }
    let (idempotency_key, create) = refused_write.expect("a write right after a refusal was refused");
    api.get("/api_keys/whoami", &other).await.expect(200);

    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    api.post_idempotent("/api_keys", &first, &idempotency_key, &create).await.expect(201);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let keys = api.get("/api_keys", &first).await.expect(200).clone();
    let made = keys["data"].as_array().unwrap().iter().filter(|k| k["name"] == create["name"]).count();
    assert_eq!(made, 1, "the refused create made a key, or its retry did not: {keys}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_limit_of_zero_switches_limiting_off() {
    let api = TestApi::start_with(limited(0, 1)).await.unwrap();
    let key = api.new_developer().await;
    for _ in 0..20 {
        api.get("/api_keys/whoami", &key).await.expect(200);
    }
    api.shutdown().await.unwrap();
}
