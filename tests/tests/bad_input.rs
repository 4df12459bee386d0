//! Malformed requests get a 4xx in the error shape, never a 500 or a dropped
//! connection (API.md §2, DESIGN.md "Security").

use reqwest::Method;
use serde_json::json;
use tests::TestApi;

const OVER_64_KIB: usize = 64 * 1024 + 1;

#[tests::test]
async fn malformed_json_is_400_invalid() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let put_path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    for raw in [
        r#"{"url":"#.as_bytes().to_vec(),
        b"{url: 1}".to_vec(),
        b"not json".to_vec(),
        b"{\"url\":\"https://x\"} trailing".to_vec(),
        vec![0xff, 0xfe, 0x7b, 0x7d],
        b"{\"url\":\"\xff\"}".to_vec(),
    ] {
        for (method, path) in
            [(Method::POST, "/webhooks"), (Method::PUT, put_path.as_str()), (Method::POST, "/api_keys")]
        {
            let request = api
                .request(method.clone(), path, &key)
                .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                .header("Content-Type", "application/json")
                .body(raw.clone());
            let response = api.send(request).await;
            response.expect_error(400, "invalid");
            assert_eq!(response.json["source"]["location"], "body", "{}", response.text());
        }
    }
    assert_eq!(api.get(&put_path, &key).await.expect(200), &webhook);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn json_that_is_not_an_object_is_400_invalid() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    for body in [json!([1, 2]), json!("https://localhost/"), json!(5), json!(null), json!(true)] {
        let response = api.post("/webhooks", &key, &body).await;
        response.expect_error(400, response.json["code"].as_str().unwrap_or("?"));
        assert!(matches!(response.json["code"].as_str(), Some("invalid" | "required")), "{}", response.text());
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn wrong_types_name_the_field() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let post = |path: &'static str, body: serde_json::Value| (Method::POST, path.to_owned(), body);
    let put = |body: serde_json::Value| (Method::PUT, path.clone(), body);
    let cases = [
        (post("/webhooks", json!({ "url": 5 })), "url"),
        (post("/webhooks", json!({ "url": ["https://localhost/"] })), "url"),
        (post("/webhooks", json!({ "url": { "href": "https://localhost/" } })), "url"),
        (post("/webhooks", json!({ "url": receiver.url(), "event_categories": [1] })), "event_categories"),
        (post("/webhooks", json!({ "url": receiver.url(), "event_categories": "transfer" })), "event_categories"),
        (post("/webhooks", json!({ "url": receiver.url(), "event_epoch": 0 })), "event_epoch"),
        (put(json!({ "url": 5 })), "url"),
        (put(json!({ "status": true })), "status"),
        (put(json!({ "event_categories": "transfer" })), "event_categories"),
        (put(json!({ "event_categories": [{ "name": "transfer" }] })), "event_categories"),
        (post("/api_keys", json!({ "name": 5 })), "name"),
        (post("/api_keys", json!({ "scopes": "webhooks:read" })), "scopes"),
        (post("/api_keys", json!({ "scopes": [7] })), "scopes"),
    ];
    let mut failures = Vec::new();
    for ((method, target, body), field) in cases {
        let request = api
            .request(method.clone(), &target, &key)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .json(&body);
        let response = api.send(request).await;
        response.expect_handled();
        if response.status != 400
            || response.json["code"] != "invalid"
            || response.json["source"] != json!({ "location": "body", "key": field })
        {
            failures.push(format!("{method} {target} {body} → {} {}", response.status, response.text()));
        }
    }
    assert!(
        failures.is_empty(),
        "wrong types not refused with 400 invalid source.key=<field>:\n{}",
        failures.join("\n")
    );
    assert_eq!(api.get(&path, &key).await.expect(200), &webhook);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn unknown_fields_are_refused() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let create = api.post("/webhooks", &key, &json!({ "url": receiver.url(), "colour": "red" })).await;
    create.expect_error_at(400, "invalid", "body", "colour");
    let update = api.put(&path, &key, &json!({ "status": "active", "colour": "red" })).await;
    update.expect_error_at(400, "invalid", "body", "colour");
    let new_key = api.post("/api_keys", &key, &json!({ "name": "x", "owner_id": uuid::Uuid::new_v4() })).await;
    new_key.expect_error_at(400, "invalid", "body", "owner_id");

    assert_eq!(api.get(&path, &key).await.expect(200), &webhook, "a refused PUT changed the endpoint");
    assert_eq!(api.get("/webhooks", &key).await.expect(200)["count"], 1);
    assert_eq!(api.get("/api_keys", &key).await.expect(200)["count"], 1);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_body_over_64_kib_is_413_too_large() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    // Valid JSON, padded with whitespace past the limit.
    let padded = |body: serde_json::Value| {
        let mut text = body.to_string();
        text.insert_str(1, &" ".repeat(OVER_64_KIB));
        text
    };
    let cases = [
        (Method::POST, "/webhooks".to_owned(), padded(json!({ "url": receiver.url() }))),
        (Method::POST, "/api_keys".to_owned(), padded(json!({ "name": "big" }))),
        (Method::PUT, path.clone(), padded(json!({ "event_categories": ["transfer"] }))),
    ];
    for (method, target, body) in cases {
        let request = api
            .request(method, &target, &key)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .header("Content-Type", "application/json")
            .body(body);
        api.send(request).await.expect_error(413, "too_large");
    }

    // Without a Content-Length (chunked), too.
    let chunks: Vec<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>> =
        [b"{\"name\":\"".to_vec(), vec![b'a'; OVER_64_KIB], b"\"}".to_vec()]
            .into_iter()
            .map(|chunk| Ok(hyper::body::Frame::data(bytes::Bytes::from(chunk))))
            .collect();
    let request = api
        .request(Method::POST, "/api_keys", &key)
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap(http_body_util::StreamBody::new(futures::stream::iter(chunks))));
    api.send(request).await.expect_error(413, "too_large");

    assert_eq!(api.get(&path, &key).await.expect(200), &webhook);
    assert_eq!(api.get("/webhooks", &key).await.expect(200)["count"], 1);
    assert_eq!(api.get("/api_keys", &key).await.expect(200)["count"], 1);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn json_sent_as_text_plain_is_415() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let path = format!("/webhooks/{}", webhook["id"].as_str().unwrap());

    let cases = [
        (Method::POST, "/webhooks".to_owned(), json!({ "url": receiver.url() })),
        (Method::POST, "/api_keys".to_owned(), json!({ "name": "plain" })),
        (Method::PUT, path.clone(), json!({ "status": "active" })),
    ];
    for (method, target, body) in cases {
        let request = api
            .request(method, &target, &key)
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .header("Content-Type", "text/plain")
            .body(body.to_string());
        api.send(request).await.expect_error(415, "unsupported_media_type");
    }
    assert_eq!(api.get(&path, &key).await.expect(200), &webhook);
    assert_eq!(api.get("/webhooks", &key).await.expect(200)["count"], 1);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn odd_ids_in_the_path_are_404() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let long = format!("wep_{}", "a".repeat(1996));

    let webhook_paths = [
        "/v0/webhooks/nope".to_owned(),
        "/v0/webhooks/wep_%00".to_owned(),
        "/v0/webhooks/wep_".to_owned(),
        format!("/v0/webhooks/WEP_{}", "A".repeat(32)),
        format!("/v0/webhooks/wep_{}", "0".repeat(33)),
        format!("/v0/webhooks/wep_{}%20", "0".repeat(32)),
        "/v0/webhooks/%F0%9F%92%A9".to_owned(),
        "/v0/webhooks/'%20OR%201=1--".to_owned(),
        format!("/v0/webhooks/{long}"),
    ];
    for path in &webhook_paths {
        for method in [Method::GET, Method::DELETE] {
            api.send(api.raw_request(method, path).header("Api-Key", key.as_str()))
                .await
                .expect_error(404, "not_found");
        }
        let put =
            api.raw_request(Method::PUT, path).header("Api-Key", key.as_str()).json(&json!({ "status": "active" }));
        api.send(put).await.expect_error(404, "not_found");
    }
    for path in ["/v0/api_keys/not-a-uuid", "/v0/api_keys/%00", "/v0/api_keys/00000000-0000-0000-0000-00000000000g"] {
        let response = api.send(api.raw_request(Method::DELETE, path).header("Api-Key", key.as_str())).await;
        response.expect_error(404, "not_found");
    }
    let long_key_path = format!("/v0/api_keys/{}", "9".repeat(2000));
    api.send(api.raw_request(Method::DELETE, &long_key_path).header("Api-Key", key.as_str()))
        .await
        .expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn unknown_routes_are_404_in_the_error_shape() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    for path in [
        "/",
        "/v0",
        "/v0/",
        "/v0/nothing",
        "/v1/webhooks",
        "/v0/webhooks/x/y/z",
        "/favicon.ico",
        "/v0/api_keys/whoami/extra",
    ] {
        let with_key = api.send(api.raw_request(Method::GET, path).header("Api-Key", key.as_str())).await;
        with_key.expect_error(404, "not_found");
    }

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn bad_query_values_are_400() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let id = webhook["id"].as_str().unwrap();

    let cases = [
        (format!("/webhooks/{id}/events?limit=abc"), "limit"),
        (format!("/webhooks/{id}/events?limit=-1"), "limit"),
        (format!("/webhooks/{id}/events?limit=101"), "limit"),
        (format!("/webhooks/{id}/events?limit=0"), "limit"),
        (format!("/webhooks/{id}/logs?limit=abc"), "limit"),
        (format!("/webhooks/{id}/logs?limit=-5"), "limit"),
        ("/webhook_events?limit=0".to_owned(), "limit"),
        ("/webhook_events?limit=501".to_owned(), "limit"),
        ("/webhook_events?limit=ten".to_owned(), "limit"),
        ("/webhook_events?limit=99999999999999999999".to_owned(), "limit"),
        ("/webhook_events?category=nope".to_owned(), "category"),
    ];
    let mut failures = Vec::new();
    for (path, parameter) in &cases {
        let response = api.get(path, &key).await;
        response.expect_handled();
        let good = response.status == 400
            && response.json["code"] == "invalid"
            && response.json["source"] == json!({ "location": "query", "key": parameter });
        if !good {
            failures.push(format!("GET {path} → {} {}", response.status, response.text()));
        }
    }
    assert!(failures.is_empty(), "bad query values not refused with 400 invalid source.key:\n{}", failures.join("\n"));

    api.shutdown().await.unwrap();
}

/// Whether an answer is a 4xx with a body in the error shape; a description of
/// what is wrong otherwise.
fn handled(response: &tests::ApiResponse) -> Result<(), String> {
    let problems = tests::expect::error_shape_problems(&response.json);
    if response.status >= 500 || (response.status >= 400 && !problems.is_empty()) {
        return Err(format!(
            "{} → {} {:?} ({})",
            response.request,
            response.status,
            response.text(),
            problems.join(", ")
        ));
    }
    Ok(())
}

#[tests::test]
async fn odd_requests_never_make_a_500_or_a_shapeless_error() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let mut failures = Vec::new();

    let odd_keys: Vec<reqwest::header::HeaderValue> = vec![
        reqwest::header::HeaderValue::from_bytes(b"sk-test-\xff\xfe").unwrap(),
        reqwest::header::HeaderValue::from_str(&format!("sk-test-{}", "a".repeat(10_000))).unwrap(),
        reqwest::header::HeaderValue::from_static("Bearer sk-test-abc"),
        reqwest::header::HeaderValue::from_str(&format!(" {} ", key.as_str())).unwrap(),
    ];
    for value in odd_keys {
        let response = api.send(api.raw_request(Method::GET, "/v0/api_keys/whoami").header("Api-Key", value)).await;
        failures.extend(handled(&response).err());
    }

    let odd_requests = [
        api.request(Method::POST, "/webhooks", &key)
            .header("Idempotency-Key", "x")
            .header("Content-Type", "application/json; charset=latin1")
            .body("{}"),
        api.request(Method::POST, "/webhooks", &key).header("Idempotency-Key", "y").body(""),
        api.request(Method::POST, "/webhooks", &key)
            .header("Idempotency-Key", "z")
            .header("Content-Type", "application/json"),
        api.request(Method::PUT, "/webhooks/nope", &key).header("Content-Type", "application/json").body("{"),
        api.request(Method::POST, "/webhooks", &key)
            .header("Idempotency-Key", "w")
            .header("Content-Type", "multipart/form-data; boundary=x")
            .body("--x--"),
        api.request(Method::POST, "/api_keys", &key).header("Idempotency-Key", "a\tb").json(&json!({})),
        api.request(Method::POST, "/api_keys/whoami", &key).header("Idempotency-Key", "v").json(&json!({})),
        api.request(Method::PATCH, "/webhooks", &key),
        api.request(Method::DELETE, "/webhooks", &key),
        api.request(Method::PUT, "/api_keys", &key).json(&json!({})),
        api.request(Method::GET, &format!("/webhooks?limit={}", "9".repeat(100)), &key),
        // Path ids that are not even UTF-8, and a key name PostgreSQL cannot store.
        api.request(Method::GET, "/webhooks/%FF%FE", &key),
        api.request(Method::DELETE, "/api_keys/%C0", &key),
        api.request(Method::POST, "/api_keys", &key).header("Idempotency-Key", "nul").json(&json!({"name": "a\u{0}b"})),
        // An unknown variant quoting a huge value still answers a message of at most 512 characters.
        api.request(Method::POST, "/webhooks", &key)
            .header("Idempotency-Key", "huge")
            .json(&json!({"url": "https://example.com/", "event_epoch": "x".repeat(20_000)})),
    ];
    for request in odd_requests {
        failures.extend(handled(&api.send(request).await).err());
    }

    // Deeply nested JSON is a 400, not a crash.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let request = api
        .request(Method::POST, "/webhooks", &key)
        .header("Idempotency-Key", "deep")
        .header("Content-Type", "application/json")
        .body(format!("{{\"url\":{deep}}}"));
    let response = api.send(request).await;
    if response.status != 400 {
        failures.push(format!("deeply nested JSON → {} {}", response.status, response.text()));
    }
    failures.extend(handled(&response).err());

    assert!(failures.is_empty(), "odd requests answered badly:\n{}", failures.join("\n"));
    api.get("/api_keys/whoami", &key).await.expect(200);
    api.shutdown().await.unwrap();
}

/// A time beyond what the stores keep (years before 1 or after 9999, which
/// RFC 3339 cannot write but a lenient reader takes) is 400 naming the
/// field, in a body and in a query, on both backends.
#[tests::test]
async fn a_time_out_of_range_is_400_naming_it() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let id = webhook["id"].as_str().unwrap();
    for (since, until) in [
        ("-10000-01-01T00:00:00Z", None),
        ("+10000-01-01T00:00:00Z", None),
        ("2026-11-21T00:00:00Z", Some("+275760-09-13T00:00:00Z")),
        ("0000-12-31T23:59:59Z", None),
    ] {
        let mut body = json!({ "since": since });
        if let Some(until) = until {
            body["until"] = json!(until);
        }
        let response = api.post(&format!("/webhooks/{id}/recover"), &key, &body).await;
        let named = if until.is_some() { "until" } else { "since" };
        let error = response.expect_error(400, "invalid");
        assert_eq!(
            (error["source"]["location"].as_str(), error["source"]["key"].as_str()),
            (Some("body"), Some(named))
        );
    }
    for time in ["-10000-01-01T00:00:00Z", "%2B10000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"] {
        for name in ["since", "until"] {
            let response = api.get(&format!("/webhooks/{id}/logs?{name}={time}"), &key).await;
            let error = response.expect_error(400, "invalid");
            assert_eq!(error["source"]["key"], name, "{}", response.text());
        }
    }
    api.shutdown().await.unwrap();
}
