//! The internal listener (health, readiness, metrics, its bearer token) and a
//! clean stop (API.md §7).

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tests::{ApiOptions, Backend, TestApi};

#[tests::test]
async fn health_and_readiness_answer_200() {
    let api = TestApi::start().await.unwrap();

    let health = api.send(api.internal_request(Method::GET, "/healthz")).await;
    health.expect(200);

    let ready = api.send(api.internal_request(Method::GET, "/readyz")).await;
    let body = ready.expect(200);
    assert_eq!(body["database"], "ok", "{}", ready.text());
    let broker = if api.backend == Backend::Standalone { "embedded" } else { "ok" };
    assert_eq!(body["broker"], broker, "{}", ready.text());

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn metrics_count_requests_by_route() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    api.get("/api_keys/whoami", &key).await.expect(200);
    api.get("/webhooks", &key).await.expect(200);

    let metrics = api.send(api.internal_request(Method::GET, "/metrics")).await;
    metrics.expect(200);
    let text = metrics.text();
    let series: Vec<&str> = text.lines().filter(|line| line.starts_with("webhooks_api_http_requests_total{")).collect();
    assert!(!series.is_empty(), "no webhooks_api_http_requests_total series in:\n{text}");
    assert!(series.iter().all(|line| line.contains("route=\"")), "a series without a route label:\n{text}");
    assert!(
        series.iter().any(|line| line.contains("whoami")),
        "the whoami request is not counted under its route:\n{text}"
    );

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn internal_token_guards_every_internal_route_but_the_probes() {
    let api = TestApi::start_with(ApiOptions { internal_token: Some("secret".into()), ..ApiOptions::default() })
        .await
        .unwrap();
    let bare = |path: &str| api.client.get(format!("{}{path}", api.internal_url()));

    // Orchestrators probe without the token.
    for path in ["/healthz", "/readyz"] {
        api.send(bare(path)).await.expect(200);
        api.send(bare(path).bearer_auth("secret")).await.expect(200);
    }
    for path in ["/metrics", "/no-such-route"] {
        let refused = api.send(bare(path)).await;
        refused.expect_error(401, refused.json["code"].as_str().unwrap_or("?"));

        let wrong = api.send(bare(path).bearer_auth("not-the-secret")).await;
        wrong.expect_error(401, wrong.json["code"].as_str().unwrap_or("?"));

        let not_bearer = api.send(bare(path).header("Authorization", "secret")).await;
        not_bearer.expect_error(401, not_bearer.json["code"].as_str().unwrap_or("?"));

        let with_token = api.send(bare(path).bearer_auth("secret")).await;
        assert_ne!(with_token.status, 401, "{path} with the token: {}", with_token.text());
    }

    // The token guards only the internal listener; the public API still wants Api-Key.
    let key = api.new_developer().await;
    api.get("/api_keys/whoami", &key).await.expect(200);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn cancelling_the_token_stops_the_api_cleanly() {
    let mut api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    api.get("/api_keys/whoami", &key).await.expect(200);

    let stopped = tokio::time::timeout(Duration::from_secs(5), api.stop()).await;
    let result = stopped.expect("api::run did not return within 5 s of the shutdown signal");
    result.expect("api::run returned an error on shutdown");

    // The listeners are closed.
    let after = api.client.get(format!("{}/api_keys/whoami", api.base_url())).send().await;
    assert!(after.is_err(), "the public listener still answers after shutdown: {after:?}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_request_in_flight_is_answered_during_shutdown() {
    // A TCP server that accepts and never speaks TLS makes endpoint creation
    // wait for the delivery timeout: a request that is in flight when the
    // shutdown signal comes.
    let mut api =
        TestApi::start_with(ApiOptions { delivery_timeout: "2s".into(), ..ApiOptions::default() }).await.unwrap();
    let key = api.new_developer().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    let held = tokio::spawn(async move {
        let mut connected_tx = Some(connected_tx);
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
            if let Some(tx) = connected_tx.take() {
                let _ = tx.send(());
            }
        }
    });

    let in_flight = api
        .client
        .clone()
        .post(format!("{}/webhooks", api.base_url()))
        .header("Api-Key", key.as_str())
        .header("Idempotency-Key", "in-flight")
        .json(&json!({ "url": format!("https://localhost:{port}/hook") }))
        .send();
    let in_flight = tokio::spawn(in_flight);
    tokio::time::timeout(Duration::from_secs(30), connected)
        .await
        .expect("the API never connected to the endpoint under check")
        .unwrap();

    let stopped = tokio::time::timeout(Duration::from_secs(10), api.stop()).await;
    let response = in_flight.await.unwrap().expect("the request in flight was dropped instead of answered");
    assert_eq!(response.status(), 400, "the in-flight creation against a silent server");
    stopped.expect("api::run did not return").expect("api::run returned an error");

    held.abort();
    api.shutdown().await.unwrap();
}
