//! Secure defaults, as an operator or a user would check them: the internal
//! listener is not left open off loopback, production keeps endpoint keys
//! sealed, slow or many clients cannot hold the public listener, a replayed
//! POST still checks the key's scope, and another spelling of an endpoint's
//! url is no change.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::json;
use tests::{ApiOptions, Backend, TestApi, WAIT};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use webhooks_config::Environment;
use webhooks_model::Scope;

/// 32 bytes, base64: a throwaway key-encryption key.
const KEK: &str = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";

/// How much later than its deadline a cut-off may come on a busy machine.
const SLACK: Duration = Duration::from_secs(10);

/// Options with further flags for the API.
fn with_args(args: &[&str]) -> ApiOptions {
    ApiOptions { extra_args: args.iter().map(|s| (*s).to_owned()).collect(), ..ApiOptions::default() }
}

/// The error an instance that must not start stopped with, as text.
async fn refused_start(options: ApiOptions) -> String {
    match TestApi::start_with(options).await {
        Ok(api) => {
            api.shutdown().await.unwrap();
            panic!("the API started");
        }
        Err(error) => format!("{error:#}"),
    }
}

/// One HTTP/1.1 answer read off a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawResponse {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// Reads one answer (its head, then a `Content-Length` body); `None` when the
/// connection closes (or is reset) before a whole head arrived.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> Option<RawResponse> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {head}"));
    let length: usize = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = buffer[end..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    Some(RawResponse { status, head, body })
}

/// Whether the peer closed (or reset) the connection: a read that ends it.
async fn closed(stream: &mut (impl AsyncRead + Unpin)) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte).await, Ok(0) | Err(_))
}

/// `GET path` on a raw connection with the given key, keeping it open.
fn get_request(path: &str, key: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nApi-Key: {key}\r\n\r\n")
}

/// Sends `GET /v0/api_keys/whoami` on `stream` and reads the answer.
async fn whoami_on(stream: &mut TcpStream, key: &str) -> Option<RawResponse> {
    stream.write_all(get_request("/v0/api_keys/whoami", key).as_bytes()).await.ok()?;
    read_response(stream).await
}

/// Writes `bytes` one a second, as a slow-loris client does, until the
/// connection breaks.
async fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>) {
    for byte in bytes {
        if writer.write_all(&[byte]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tests::test]
async fn an_internal_listener_off_loopback_needs_a_token() {
    for token in [None, Some(""), Some("   ")] {
        let mut options = with_args(&["--internal-listen-addr", "0.0.0.0:8081"]);
        options.internal_token = token.map(str::to_owned);
        let error = refused_start(options).await;
        assert!(
            error.contains("INTERNAL_LISTEN_ADDR") && error.contains("INTERNAL_TOKEN"),
            "token {token:?}: the refusal does not name both settings: {error}"
        );
    }

    let mut options = with_args(&["--internal-listen-addr", "0.0.0.0:8081"]);
    options.internal_token = Some("s3cret-token".into());
    let api = TestApi::start_with(options).await.unwrap();
    let bare = |method: Method, path: &str| api.client.request(method, format!("{}{path}", api.internal_url()));

    // The probes answer without the token, and say only up or down.
    api.send(bare(Method::GET, "/healthz")).await.expect(200);
    let ready = api.send(bare(Method::GET, "/readyz")).await;
    let body = ready.expect(200).as_object().unwrap_or_else(|| panic!("not an object: {}", ready.text()));
    let mut fields: Vec<&str> = body.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["broker", "database"], "{}", ready.text());

    // Metrics and ingest do not, and an empty bearer is no token.
    let key = api.new_developer().await;
    let event = event_input(key.developer_id(), "transfer", 1);
    for (method, path) in [(Method::GET, "/metrics"), (Method::POST, "/internal/events")] {
        let request = || bare(method.clone(), path).json(&event);
        api.send(request()).await.expect(401);
        api.send(request().header("Authorization", "Bearer ")).await.expect(401);
        api.send(request().header("Authorization", "Bearer  ")).await.expect(401);
        api.send(request().bearer_auth("s3cret")).await.expect(401);
    }
    api.send(bare(Method::GET, "/metrics").bearer_auth("s3cret-token")).await.expect(200);
    api.send(bare(Method::POST, "/internal/events").bearer_auth("s3cret-token").json(&event)).await.expect(201);

    api.shutdown().await.unwrap();
}

/// The dispatcher's listener follows the internal listener's rules: off
/// loopback it needs a token, the token guards `/metrics` but not the
/// probes, and a client that sends its head slowly is cut off.
#[tests::test(distributed)]
async fn the_dispatchers_listener_is_guarded_like_the_internal_one() {
    let api = TestApi::start().await.unwrap();
    let refused = api.start_dispatcher_with(&["--dispatcher-listen-addr", "0.0.0.0:8082"]).await.unwrap_err();
    let refused = format!("{refused:#}");
    assert!(refused.contains("DISPATCHER_LISTEN_ADDR") && refused.contains("INTERNAL_TOKEN"), "{refused}");

    let token = "dispatcher-metrics-token";
    let mut dispatcher = api
        .start_dispatcher_with(&[
            "--dispatcher-listen-addr",
            "0.0.0.0:8082",
            "--internal-token",
            token,
            "--header-read-timeout",
            "2s",
        ])
        .await
        .unwrap();
    let url = |path: &str| format!("http://{}{path}", dispatcher.addr);
    let client = reqwest::Client::new();
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(client.get(url(probe)).send().await.unwrap().status(), 200, "{probe}");
    }
    for wrong in [None, Some("Bearer nope"), Some("Bearer "), Some(token)] {
        let mut request = client.get(url("/metrics"));
        if let Some(wrong) = wrong {
            request = request.header("Authorization", wrong);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), 401, "/metrics with {wrong:?}");
        let body: serde_json::Value = answer.json().await.unwrap();
        assert!(tests::expect::error_shape_problems(&body).is_empty(), "{body}");
        assert_eq!(body["source"]["key"], "Authorization", "{body}");
    }
    let metrics = client.get(url("/metrics")).bearer_auth(token).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().await.unwrap().contains("webhooks_dispatcher_"));

    // A head that never completes is cut off at the header timeout.
    let slow = TcpStream::connect(dispatcher.addr).await.unwrap();
    let (mut reader, writer) = slow.into_split();
    let started = Instant::now();
    let trickling = tokio::spawn(trickle(writer, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n".to_vec()));
    let answer = tokio::time::timeout(Duration::from_secs(2) + SLACK, read_response(&mut reader))
        .await
        .expect("the slow client was not cut off");
    assert!(answer.is_none_or(|r| r.status == 408), "the slow client got an answer");
    assert!(started.elapsed() >= Duration::from_millis(1900), "cut off after {:?}", started.elapsed());
    trickling.abort();

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn production_refuses_to_start_without_a_key_encryption_key() {
    let production = |args: &[&str]| ApiOptions { environment: Environment::Production, ..with_args(args) };
    for args in [&[][..], &["--key-encryption-key", ""], &["--key-encryption-key", "  "]] {
        let error = refused_start(production(args)).await;
        assert!(
            error.contains("KEY_ENCRYPTION_KEY") && error.contains("production"),
            "{args:?}: the refusal does not say what is missing: {error}"
        );
    }

    let api = TestApi::start_with(production(&["--key-encryption-key", KEK])).await.unwrap();
    let key = api.new_developer().await;
    api.get("/api_keys/whoami", &key).await.expect(200);
    if api.backend == Backend::Distributed {
        // A dispatcher process checks the same (standalone delivery runs in
        // the process checked above).
        let error = format!("{:#}", api.start_dispatcher().await.expect_err("a dispatcher started without the key"));
        assert!(error.contains("KEY_ENCRYPTION_KEY"), "{error}");
        let mut dispatcher = api.start_dispatcher_with(&["--key-encryption-key", KEK]).await.unwrap();
        dispatcher.stop().await.unwrap();
    }
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_client_sending_its_headers_slowly_is_cut_off() {
    let header_timeout = Duration::from_secs(3);
    let api = TestApi::start_with(with_args(&["--header-read-timeout", "3s"])).await.unwrap();
    let key = api.new_developer().await;

    let slow = TcpStream::connect(api.public).await.unwrap();
    let connected = Instant::now();
    let (mut reader, writer) = slow.into_split();
    // About 80 bytes at one a second: over a minute unless cut off.
    let request = get_request("/v0/api_keys/whoami", key.as_str());
    let trickling = tokio::spawn(trickle(writer, request.into_bytes()));
    let cut_off = tokio::spawn(async move {
        let answer = read_response(&mut reader).await;
        (connected.elapsed(), answer)
    });

    // Meanwhile the listener serves others at once.
    let started = Instant::now();
    api.get("/api_keys/whoami", &key).await.expect(200);
    assert!(!cut_off.is_finished(), "the slow connection ended before another client was served");
    assert!(started.elapsed() < header_timeout, "another client waited {:?}", started.elapsed());

    let (after, answer) = tokio::time::timeout(header_timeout + SLACK, cut_off)
        .await
        .expect("the slow client was not cut off within the header timeout")
        .unwrap();
    assert!(after >= header_timeout - Duration::from_millis(100), "cut off after {after:?}, before the timeout");
    assert!(answer.as_ref().is_none_or(|r| r.status == 408), "the slow client got {answer:?}");
    trickling.abort();

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_request_whose_body_comes_slowly_answers_408_and_claims_nothing() {
    let request_timeout = Duration::from_secs(2);
    let mut options = with_args(&["--request-timeout", "2s"]);
    options.delivery_timeout = "1s".into();
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;

    let body = json!({ "name": "slowly sent" }).to_string();
    let head = format!(
        "POST /v0/api_keys HTTP/1.1\r\nHost: localhost\r\nApi-Key: {}\r\nIdempotency-Key: slow-body\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        key.as_str(),
        body.len()
    );
    let mut slow = TcpStream::connect(api.public).await.unwrap();
    slow.write_all(head.as_bytes()).await.unwrap();
    let sent = Instant::now();
    let (mut reader, writer) = slow.into_split();
    let trickling = tokio::spawn(trickle(writer, body.clone().into_bytes()));

    let answer = tokio::time::timeout(request_timeout + SLACK, read_response(&mut reader))
        .await
        .expect("no answer within the request timeout")
        .expect("the connection closed without an answer");
    assert!(sent.elapsed() >= request_timeout - Duration::from_millis(100), "answered after {:?}", sent.elapsed());
    assert_eq!(answer.status, 408, "{answer:?}");
    let json = answer.json();
    tests::expect::error_shape(&json);
    assert_eq!(json["code"], "timeout", "{json}");
    assert!(answer.head.to_ascii_lowercase().contains("connection: close"), "{}", answer.head);
    assert!(closed(&mut reader).await, "the connection stays open after the 408");
    trickling.abort();

    // Nothing was done, and the Idempotency-Key is still free.
    let keys = api.get("/api_keys", &key).await;
    assert_eq!(keys.expect(200)["count"], 1, "{}", keys.text());
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let created = api.post_idempotent("/api_keys", &key, "slow-body", &body).await;
    created.expect(201);
    assert!(created.headers.get("idempotent-replayed").is_none(), "a replay of the timed-out request");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_client_that_stops_reading_its_answer_is_cut_off() {
    let stall_limit = Duration::from_secs(3);
    let api = TestApi::start_with(with_args(&["--header-read-timeout", "3s"])).await.unwrap();
    let key = api.new_developer().await;
    // An answer of about 6 MB: more than the socket buffers hold (the
    // sender's grows to 4 MB on Linux).
    for n in 0..25 {
        let mut event = event_input(key.developer_id(), "transfer", n);
        event["event_object"]["padding"] = json!("x".repeat(240_000));
        api.ingest(&event).await.expect(201);
    }

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(api.public).await.unwrap();
    stream.write_all(get_request("/v0/webhook_events?limit=25", key.as_str()).as_bytes()).await.unwrap();
    // The client takes nothing for a while (what it does, not a wait for an outcome)…
    tokio::time::sleep(stall_limit + Duration::from_secs(2)).await;

    // …and then finds the answer cut short: the server gave up on it.
    let answer = tokio::time::timeout(WAIT, read_response(&mut stream))
        .await
        .expect("the connection neither answered nor closed")
        .expect("no head of an answer");
    assert_eq!(answer.status, 200, "{}", answer.head);
    let length: usize = answer
        .head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a Content-Length");
    assert!(length > 5_000_000, "the answer is only {length} bytes");
    assert!(answer.body.len() < length, "the whole answer of {length} bytes was kept waiting for the client");

    // Others are served meanwhile and afterwards.
    api.get("/api_keys/whoami", &key).await.expect(200);
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let options = with_args(&["--max-connections", "2", "--header-read-timeout", "60s"]);
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;

    let mut first = TcpStream::connect(api.public).await.unwrap();
    let mut second = TcpStream::connect(api.public).await.unwrap();
    assert_eq!(whoami_on(&mut first, key.as_str()).await.expect("an answer").status, 200);
    assert_eq!(whoami_on(&mut second, key.as_str()).await.expect("an answer").status, 200);

    // A third connection is not served while two are open…
    let mut third = TcpStream::connect(api.public).await.unwrap();
    third.write_all(get_request("/v0/api_keys/whoami", key.as_str()).as_bytes()).await.unwrap();
    let (mut third_reader, _third_writer) = third.into_split();
    let waiting = tokio::spawn(async move { read_response(&mut third_reader).await });
    // (A bounded look for an answer that must not come.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "a connection over the cap was served or dropped: {:?}", waiting.await);

    // …while those two keep working…
    assert_eq!(whoami_on(&mut first, key.as_str()).await.expect("an answer").status, 200);

    // …and it is served as soon as one closes.
    drop(first);
    let answer = tokio::time::timeout(WAIT, waiting).await.expect("the waiting connection was never served").unwrap();
    assert_eq!(answer.expect("an answer").status, 200);

    // The listener has recovered: a new connection is served once there is room.
    drop(second);
    let mut fourth = TcpStream::connect(api.public).await.unwrap();
    let answer = tokio::time::timeout(WAIT, whoami_on(&mut fourth, key.as_str())).await.expect("no answer");
    assert_eq!(answer.expect("an answer").status, 200);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_slow_client_does_not_hold_up_a_clean_stop() {
    let mut api = TestApi::start_with(with_args(&["--header-read-timeout", "60s"])).await.unwrap();
    let key = api.new_developer().await;

    let mut slow = TcpStream::connect(api.public).await.unwrap();
    slow.write_all(b"GET /v0/api_keys/whoami HTTP/1.1\r\nHo").await.unwrap();
    let mut idle = TcpStream::connect(api.public).await.unwrap();
    assert_eq!(whoami_on(&mut idle, key.as_str()).await.expect("an answer").status, 200);

    // Well within the 60 s the slow client would otherwise be given.
    let stopped = tokio::time::timeout(Duration::from_secs(20), api.stop()).await;
    stopped.expect("api::run did not return within 20 s with a slow client connected").expect("a clean stop");
    assert!(closed(&mut slow).await, "the slow connection outlived the API");
    assert!(closed(&mut idle).await, "the idle connection outlived the API");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_replayed_post_still_needs_the_scope_of_its_route() {
    let api = TestApi::start().await.unwrap();
    let owner = api.new_developer().await;
    let reader = api.key_for(owner.developer_id(), &[Scope::WebhooksRead]).await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&owner, &receiver.url()).await;
    let send_path = format!("/webhooks/{}/send", id(&webhook));
    // An answer is stored when the request did something (a 2xx).
    let event = ingest(&api, owner.developer_id(), "transfer", 0).await;

    let posts = [
        ("/webhooks", json!({ "url": receiver.url() })),
        ("/api_keys", json!({ "name": "made by the owner" })),
        (send_path.as_str(), json!({ "event_id": event_id(&event) })),
    ];
    for (n, (path, body)) in posts.iter().enumerate() {
        // The owner's answer is stored under the key…
        let stored_key = format!("owner-first-{n}");
        let first = api.post_idempotent(path, &owner, &stored_key, body).await;
        first.expect_handled();
        let replayed = api.post_idempotent(path, &owner, &stored_key, body).await;
        assert_eq!(replayed.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));

        // …but a key of the same developer without the route's scope gets
        // 403, not the stored answer.
        let refused = api.post_idempotent(path, &reader, &stored_key, body).await;
        refused.expect_error(403, "forbidden");
        assert!(refused.headers.get("idempotent-replayed").is_none(), "POST {path}: {:?}", refused.headers);

        // And the 403 of a key without the scope is not stored for the
        // developer's other keys.
        let refused_key = format!("reader-first-{n}");
        api.post_idempotent(path, &reader, &refused_key, body).await.expect_error(403, "forbidden");
        let after = api.post_idempotent(path, &owner, &refused_key, body).await;
        assert_eq!(after.status, first.status, "POST {path} after a refused key: {}", after.text());
        assert!(after.headers.get("idempotent-replayed").is_none(), "POST {path}: the 403 was replayed");
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn another_spelling_of_the_current_url_is_no_change() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let other = api.receiver().await;
    let webhook = active_endpoint(&api, &key, &receiver.url()).await;
    let path = format!("/webhooks/{}", id(&webhook));
    let port = receiver.addr().port();

    for spelling in [format!("https://LocalHost:{port}/hook"), format!("HTTPS://localhost:{port}/hook")] {
        let same = api.put(&path, &key, &json!({ "url": spelling })).await;
        let same = same.expect(200);
        assert_eq!(same["url"], receiver.url(), "{same}");
        assert_eq!(same["status"], "active", "{same}");
        assert_eq!(same["updated_at"], webhook["updated_at"], "a repeat of the url changed the endpoint: {same}");
    }
    let stored = api.stored_dump().await;
    assert!(!stored.contains("url_changed"), "a url_changed was recorded for another spelling");

    // A real change is still refused while active, and recorded once made.
    api.put(&path, &key, &json!({ "url": other.url() })).await.expect_error(409, "invalid_state");
    set_status(&api, &key, &webhook, "disabled").await;
    api.put(&path, &key, &json!({ "url": other.url() })).await.expect(200);
    assert!(api.stored_dump().await.contains("url_changed"), "a real url change left no url_changed");

    api.shutdown().await.unwrap();
}
