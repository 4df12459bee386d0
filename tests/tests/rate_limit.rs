//! The per-developer request limit (API.md §2: 429 `rate_limited` with
//! `Retry-After`; `RATE_LIMIT_PER_SECOND` and `RATE_LIMIT_BURST`).

use std::time::{Duration, Instant};

use serde_json::json;
use shared::model::Scope;
use tests::{ApiOptions, TestApi};

fn limited(per_second: u32, burst: u32) -> ApiOptions {
    let extra_args =
        vec!["--rate-limit-per-second".into(), per_second.to_string(), "--rate-limit-burst".into(), burst.to_string()];
    ApiOptions { extra_args, ..ApiOptions::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_developer_over_its_limit_gets_429_with_retry_after_and_others_do_not() {
    let api = TestApi::start_with(limited(1, 5)).await.unwrap();
    let first = api.new_developer().await;
    let second_key_of_first = api.key_for(first.developer_id(), &[Scope::Unrestricted]).await;
    let other = api.new_developer().await;

    // The burst is shared by every key of the developer: take turns until
    // refused. One more may pass for each second the requests took.
    let started = Instant::now();
    let mut allowed = 0_u64;
    loop {
        let key = if allowed.is_multiple_of(2) { &first } else { &second_key_of_first };
        let answer = api.get("/api_keys/whoami", key).await;
        if answer.status == 429 {
            break;
        }
        answer.expect(200);
        allowed += 1;
        assert!(allowed <= 50, "50 requests at once were never limited");
    }
    let took = started.elapsed().as_secs();
    assert!((5..=6 + took).contains(&allowed), "{allowed} requests passed a burst of 5 in {took} s");

    // A refused write does nothing and is not the stored answer of its
    // Idempotency-Key: the same request after the wait succeeds.
    let create = json!({ "name": "later" });
    api.post_idempotent("/api_keys", &first, "create-later", &create).await.expect_error(429, "rate_limited");
    let refused = api.get("/api_keys/whoami", &second_key_of_first).await;
    refused.expect_error(429, "rate_limited");
    let retry_after: u64 = refused
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no whole-second Retry-After: {:?}", refused.headers));
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after} for one request per second");
    api.get("/api_keys/whoami", &other).await.expect(200);

    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    api.post_idempotent("/api_keys", &first, "create-later", &create).await.expect(201);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let keys = api.get("/api_keys", &first).await.expect(200).clone();
    let named_later = keys["data"].as_array().unwrap().iter().filter(|k| k["name"] == "later").count();
    assert_eq!(named_later, 1, "the refused create made no key: {keys}");

    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_of_zero_switches_limiting_off() {
    let api = TestApi::start_with(limited(0, 0)).await.unwrap();
    let key = api.new_developer().await;
    for _ in 0..50 {
        api.get("/api_keys/whoami", &key).await.expect(200);
    }
    api.shutdown().await.unwrap();
}
