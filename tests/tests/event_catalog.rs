//! The event catalog (API.md §8.9): types as data, read by developers,
//! changed by the operator without a restart, checked at ingest, and the
//! narrowing of endpoints by type.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use tests::{ApiOptions, ApiResponse, TestApi, WAIT, expect};

/// `PUT /internal/event_types/{name}` with `body`.
async fn put_type(api: &TestApi, name: &str, body: &Value) -> ApiResponse {
    api.send(api.internal_request(Method::PUT, &format!("/internal/event_types/{name}")).json(body)).await
}

/// A type of a new category `payout` whose object needs a string `amount`.
fn payout_type() -> Value {
    json!({
        "category": "payout",
        "description": "A payout to a bank account was sent.",
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["id", "amount"],
            "properties": {
                "id": {"type": "string"},
                "amount": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"},
                "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}}
            }
        },
        "example": {"id": "po_1", "amount": "10.00"}
    })
}

/// An ingest body of `event_type` (in `category`) with `object`.
fn typed_input(developer: uuid::Uuid, category: &str, event_type: &str, object: Value) -> Value {
    json!({
        "developer_id": developer,
        "event_category": category,
        "event_type": event_type,
        "event_object_id": object["id"].clone(),
        "event_object": object,
    })
}

#[track_caller]
fn assert_event_type(event_type: &Value) {
    for field in ["name", "category", "description"] {
        assert!(event_type[field].as_str().is_some_and(|s| !s.is_empty()), "{field} of {event_type}");
    }
    assert!(event_type["schema"].is_object(), "{event_type}");
    assert!(event_type["example"].is_object(), "{event_type}");
    assert!(event_type["deprecated"].is_boolean(), "{event_type}");
    expect::timestamp(&event_type["created_at"]);
    expect::timestamp(&event_type["updated_at"]);
}

#[tests::test]
async fn the_default_catalog_lists_every_contract_category_with_schemas_and_examples() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;

    let listed = api.get("/event_types", &key).await;
    let body = listed.expect(200);
    let data = body["data"].as_array().unwrap();
    assert_eq!(body["count"].as_u64(), Some(data.len() as u64), "{body}");
    for event_type in data {
        assert_event_type(event_type);
    }
    for category in [
        "customer",
        "kyc_link",
        "transfer",
        "external_account",
        "liquidation_address",
        "liquidation_address.drain",
        "virtual_account",
        "virtual_account.activity",
        "static_memo.activity",
        "platform_wallet.activity",
        "card_account",
        "card_transaction",
        "card_withdrawal",
        "posted_card_account_transaction",
    ] {
        assert!(data.iter().any(|t| t["category"] == category), "no type of {category}");
    }

    let one = api.get("/event_types/transfer.updated.status_transitioned", &key).await;
    let one = one.expect(200);
    assert_event_type(one);
    assert_eq!(one["category"], "transfer");
    api.get("/event_types/no.such.type", &key).await.expect_error(404, "not_found");
    // Any valid key reads it; no key does not.
    let scoped = api.new_developer_key(&[webhooks_model::Scope::WebhooksRead]).await;
    api.get("/event_types", &scoped).await.expect(200);
    api.send(api.raw_request(Method::GET, "/v0/event_types")).await.expect_error(401, "required");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn ingest_refuses_unknown_types_wrong_categories_and_objects_that_break_the_schema() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let developer = key.developer_id();

    let unknown = typed_input(developer, "transfer", "transfer.teleported", json!({"id": "tr_1"}));
    api.ingest(&unknown).await.expect_error_at(400, "invalid", "body", "event_type");

    let wrong_category =
        typed_input(developer, "customer", "transfer.updated.status_transitioned", json!({"id": "tr_1", "state": "x"}));
    api.ingest(&wrong_category).await.expect_error_at(400, "invalid", "body", "event_category");

    // The default transfer schema wants `amount` as a decimal string.
    let bad_amount =
        typed_input(developer, "transfer", "transfer.created", json!({"id": "tr_1", "amount": 100, "currency": "usd"}));
    let refused = api.ingest(&bad_amount).await;
    let error = refused.expect_error_at(400, "invalid", "body", "event_object");
    assert!(error["message"].as_str().unwrap().contains("\"/amount\""), "{error}");

    // A status transition without its state breaks the schema at the root.
    let no_state = typed_input(developer, "transfer", "transfer.updated.status_transitioned", json!({"id": "tr_1"}));
    let error = api.ingest(&no_state).await.expect_error_at(400, "invalid", "body", "event_object").clone();
    assert!(error["message"].as_str().unwrap().contains("state"), "{error}");

    // The catalog's own example goes through.
    let example = api.get("/event_types/transfer.created", &key).await.expect(200)["example"].clone();
    api.ingest(&typed_input(developer, "transfer", "transfer.created", example)).await.expect(201);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_type_put_on_the_internal_listener_is_accepted_at_once_without_a_restart() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let developer = key.developer_id();
    let object = json!({"id": "po_7", "amount": "12.50"});

    api.ingest(&typed_input(developer, "payout", "payout.sent", object.clone())).await.expect_error_at(
        400,
        "invalid",
        "body",
        "event_type",
    );

    let created = put_type(&api, "payout.sent", &payout_type()).await;
    let created = created.expect(201).clone();
    assert_event_type(&created);
    assert_eq!(created["name"], "payout.sent");
    assert_eq!(created["category"], "payout");
    assert_eq!(created["deprecated"], false);

    let event = api.ingest(&typed_input(developer, "payout", "payout.sent", object.clone())).await.expect(201).clone();
    assert_eq!(event["event_type"], "payout.sent");
    // Accepted with an Idempotency-Key before the type tightens below.
    let keyed = || {
        api.internal_request(Method::POST, "/internal/events")
            .header("Idempotency-Key", "payout-po-7")
            .json(&typed_input(developer, "payout", "payout.sent", object.clone()))
    };
    let accepted = api.send(keyed()).await.expect(201).clone();
    assert_eq!(event["event_category"], "payout");
    assert_eq!(api.get("/event_types/payout.sent", &key).await.expect(200)["category"], "payout");

    // A change replaces the type (200) and its compiled schema with it.
    let mut stricter = payout_type();
    stricter["schema"]["required"] = json!(["id", "amount", "currency"]);
    stricter["example"]["currency"] = json!("usd");
    stricter["deprecated"] = json!(true);
    let changed = put_type(&api, "payout.sent", &stricter).await.expect(200).clone();
    assert_eq!(changed["deprecated"], true);
    assert_eq!(changed["created_at"], created["created_at"]);
    let error = api
        .ingest(&typed_input(developer, "payout", "payout.sent", json!({"id": "po_8", "amount": "1.00"})))
        .await
        .expect_error_at(400, "invalid", "body", "event_object")
        .clone();
    assert!(error["message"].as_str().unwrap().contains("currency"), "{error}");
    // Its repeat still answers what it got: an accepted event stays accepted.
    let repeated = api.send(keyed()).await;
    assert_eq!(repeated.expect(201)["event_id"], accepted["event_id"], "{}", repeated.text());
    let listed = api.get("/event_types", &key).await.expect(200).clone();
    let payout = listed["data"].as_array().unwrap().iter().find(|t| t["name"] == "payout.sent").cloned();
    assert_eq!(payout.map(|t| t["deprecated"].clone()), Some(json!(true)), "deprecated types are listed");

    // Nested pointers are named too.
    let nested = json!({"id": "po_9", "amount": "1.00", "currency": "usd", "lines": [{"qty": 1}, {"qty": "two"}]});
    let error = api
        .ingest(&typed_input(developer, "payout", "payout.sent", nested))
        .await
        .expect_error_at(400, "invalid", "body", "event_object")
        .clone();
    assert!(error["message"].as_str().unwrap().contains("\"/lines/1/qty\""), "{error}");

    // The new category is a category like the others.
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({"url": receiver.url(), "event_categories": ["payout"]})).await;
    assert_eq!(webhook["event_categories"], json!(["payout"]));

    api.shutdown().await.unwrap();
}

#[tests::test(distributed)]
async fn a_second_api_instance_on_the_same_database_sees_a_new_type() {
    // Distributed only: one process holds a standalone data directory.
    let api = TestApi::start().await.unwrap();
    let listeners = api::Listeners {
        public: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        internal: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
    let second_internal = listeners.internal.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(api::run(api.config.clone(), listeners, stop.clone()));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let ready = format!("http://{second_internal}/readyz");
    eventually("the second instance is ready", WAIT, async || match client.get(&ready).send().await {
        Ok(response) if response.status() == 200 => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;

    let key = api.new_developer().await;
    put_type(&api, "payout.sent", &payout_type()).await.expect(201);
    let input = typed_input(key.developer_id(), "payout", "payout.sent", json!({"id": "po_1", "amount": "3.00"}));
    let answer = client.post(format!("http://{second_internal}/internal/events")).json(&input).send().await.unwrap();
    let status = answer.status();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(status, 201, "the second instance refused the new type: {body}");
    assert_eq!(body["event_type"], "payout.sent");

    stop.cancel();
    second.await.unwrap().unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn the_operator_s_bad_types_are_refused_in_the_error_shape() {
    let api = TestApi::start().await.unwrap();

    let mut broken_example = payout_type();
    broken_example["example"] = json!({"id": "po_1", "amount": 10});
    let error =
        put_type(&api, "payout.sent", &broken_example).await.expect_error_at(400, "invalid", "body", "example").clone();
    assert!(error["message"].as_str().unwrap().contains("/amount"), "{error}");

    let mut not_a_schema = payout_type();
    not_a_schema["schema"] = json!({"type": "banana"});
    put_type(&api, "payout.sent", &not_a_schema).await.expect_error_at(400, "invalid", "body", "schema");

    let mut bad_category = payout_type();
    bad_category["category"] = json!("Pay Outs");
    put_type(&api, "payout.sent", &bad_category).await.expect_error_at(400, "invalid", "body", "category");

    put_type(&api, "Payout%20Sent", &payout_type()).await.expect_error_at(400, "invalid", "path", "name");

    let mut unknown_field = payout_type();
    unknown_field["colour"] = json!("red");
    put_type(&api, "payout.sent", &unknown_field).await.expect_error(400, "invalid");
    put_type(&api, "payout.sent", &json!({"category": "payout"})).await.expect_error(400, "required");
    let not_json =
        api.internal_request(Method::PUT, "/internal/event_types/payout.sent").header("content-type", "text/plain");
    let answer = api.send(not_json.body("category=payout")).await;
    assert!((400..500).contains(&answer.status), "{}", answer.text());

    // Nothing was stored.
    let key = api.new_developer().await;
    api.get("/event_types/payout.sent", &key).await.expect_error(404, "not_found");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_lenient_catalog_accepts_unknown_types_of_known_categories_and_counts_them() {
    let options =
        ApiOptions { extra_args: vec!["--event-catalog-strict".into(), "false".into()], ..Default::default() };
    let api = TestApi::start_with(options).await.unwrap();
    let key = api.new_developer().await;
    let developer = key.developer_id();

    let unknown = typed_input(developer, "transfer", "transfer.teleported", json!({"id": "tr_1"}));
    api.ingest(&unknown).await.expect(201);
    let nowhere = typed_input(developer, "teleport", "teleport.done", json!({"id": "tp_1"}));
    api.ingest(&nowhere).await.expect_error_at(400, "invalid", "body", "event_category");
    // Known types are still checked.
    let bad = typed_input(developer, "transfer", "transfer.created", json!({"id": "tr_1", "amount": 1}));
    api.ingest(&bad).await.expect_error_at(400, "invalid", "body", "event_object");

    let metrics = api.send(api.internal_request(Method::GET, "/metrics")).await.text();
    assert!(metrics.lines().any(|l| l == "webhooks_api_unknown_event_types_accepted_total 1"), "{metrics}");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn an_endpoint_narrowed_by_type_gets_only_those_types() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let developer = key.developer_id();
    let (narrow_rx, all_rx) = (api.receiver().await, api.receiver().await);
    let narrow = active_endpoint_with(
        &api,
        &key,
        json!({
            "url": narrow_rx.url(),
            "event_categories": ["transfer"],
            "event_types": ["transfer.updated.status_transitioned", "transfer.created"],
        }),
    )
    .await;
    let mut types: Vec<&str> = narrow["event_types"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    types.sort_unstable();
    assert_eq!(types, ["transfer.created", "transfer.updated.status_transitioned"], "{narrow}");
    let all = active_endpoint(&api, &key, &all_rx.url()).await;
    assert_eq!(all["event_types"], json!([]), "{all}");

    let wanted = ingest(&api, developer, "transfer", 1).await;
    let other_type = api
        .ingest(&typed_input(developer, "transfer", "transfer.updated", json!({"id": "tr_2"})))
        .await
        .expect(201)
        .clone();
    let other_category = ingest(&api, developer, "customer", 3).await;
    let every: Vec<String> = [&wanted, &other_type, &other_category].into_iter().map(event_id).collect();
    wait_for_events(&all_rx, &every, WAIT).await;
    wait_for_events(&narrow_rx, &[event_id(&wanted)], WAIT).await;
    assert_eq!(received_ids(&narrow_rx), [event_id(&wanted)], "the narrowed endpoint got another type");
    verify_all(&narrow_rx, &narrow);
    send(&api, &key, &narrow, &event_id(&other_type)).await.expect_error_at(400, "invalid", "body", "event_id");

    // Widening by PUT lets the next event of that type through.
    let widened =
        api.put(&format!("/webhooks/{}", id(&narrow)), &key, &json!({ "event_types": [] })).await.expect(200).clone();
    assert_eq!(widened["event_types"], json!([]));
    let next = api
        .ingest(&typed_input(developer, "transfer", "transfer.updated", json!({"id": "tr_4"})))
        .await
        .expect(201)
        .clone();
    wait_for_events(&narrow_rx, &[event_id(&next)], WAIT).await;

    // Narrowing again drops what waits of the other types: disabled, the
    // endpoint holds one event of each type as upcoming; narrowed to one
    // type, only that one stays.
    set_status(&api, &key, &narrow, "disabled").await;
    let kept = api
        .ingest(&typed_input(developer, "transfer", "transfer.created", json!({"id": "tr_5"})))
        .await
        .expect(201)
        .clone();
    let dropped = api
        .ingest(&typed_input(developer, "transfer", "transfer.updated", json!({"id": "tr_6"})))
        .await
        .expect(201)
        .clone();
    wait_upcoming(&api, &key, &narrow, &event_id(&dropped), true).await;
    let narrowed = json!({ "event_types": ["transfer.created"] });
    api.put(&format!("/webhooks/{}", id(&narrow)), &key, &narrowed).await.expect(200);
    wait_upcoming(&api, &key, &narrow, &event_id(&dropped), false).await;
    wait_upcoming(&api, &key, &narrow, &event_id(&kept), true).await;

    // Unknown types, and types outside the endpoint's categories, are refused.
    let body = json!({ "url": narrow_rx.url(), "event_types": ["transfer.teleported"] });
    api.post("/webhooks", &key, &body).await.expect_error_at(400, "invalid", "body", "event_types");
    let body = json!({ "url": narrow_rx.url(), "event_categories": ["customer"], "event_types": ["transfer.created"] });
    api.post("/webhooks", &key, &body).await.expect_error_at(400, "invalid", "body", "event_types");
    let body = json!({ "event_types": "transfer.created" });
    api.put(&format!("/webhooks/{}", id(&narrow)), &key, &body).await.expect_error_at(
        400,
        "invalid",
        "body",
        "event_types",
    );
    // New categories alone must still hold the types the endpoint keeps.
    let body = json!({ "event_categories": ["customer"] });
    api.put(&format!("/webhooks/{}", id(&narrow)), &key, &body).await.expect_error_at(
        400,
        "invalid",
        "body",
        "event_types",
    );
    let body = json!({ "event_categories": ["transfer", "customer"] });
    api.put(&format!("/webhooks/{}", id(&narrow)), &key, &body).await.expect(200);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_test_event_is_the_type_s_example_signed_sent_once_and_stored_nowhere() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    // Disabled, as every endpoint starts: a test event goes all the same.
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    assert_eq!(webhook["status"], "disabled");
    let example = api.get("/event_types/transfer.created", &key).await.expect(200)["example"].clone();

    let path = format!("/webhooks/{}/test", id(&webhook));
    let answer = api.post(&path, &key, &json!({ "event_type": "transfer.created" })).await;
    let log = answer.expect(200).clone();
    assert_eq!(log["attempt"], 1, "{log}");
    assert_eq!(log["status"], 200, "{log}");
    assert!(log["error"].is_null(), "{log}");
    expect::timestamp(&log["created_at"]);

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "one attempt");
    verify_all(&receiver, &webhook);
    let body = requests[0].json().unwrap();
    assert_eq!(body["test"], true, "{body}");
    assert_eq!(body["event_type"], "transfer.created");
    assert_eq!(body["event_category"], "transfer");
    assert_eq!(body["event_object"], example);
    assert_eq!(body["event_developer_id"], json!(key.developer_id()));
    assert_eq!(body["event_id"], log["event_id"]);
    assert_eq!(requests[0].header("x-webhook-id"), log["event_id"].as_str());

    // Not one of the developer's events, not upcoming, not logged.
    assert!(webhook_events(&api, &key, "").await.is_empty());
    assert!(upcoming_ids(&api, &key, &webhook).await.is_empty());
    assert!(logs(&api, &key, &webhook, "").await.is_empty());

    // A receiver that fails is answered as it failed, and not retried.
    receiver.reply_always(tests::Reply::status(500));
    let failed = api.post(&path, &key, &json!({ "event_type": "customer.created" })).await.expect(200).clone();
    assert_eq!(failed["status"], 500, "{failed}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 2, "a failed test event is not retried");

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn a_test_event_of_the_standard_scheme_verifies_with_its_key() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url(), "signature_scheme": "standard" })).await;
    let path = format!("/webhooks/{}/test", id(&webhook));
    api.post(&path, &key, &json!({ "event_type": "card_transaction.created" })).await.expect(200);
    let request = receiver.requests().pop().expect("the test event");
    let public_key = webhook["public_key"].as_str().unwrap();
    assert!(public_key.starts_with("whpk_"), "{webhook}");
    let headers: Vec<(String, Vec<u8>)> =
        request.headers.iter().map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec())).collect();
    webhooks_signature::verify::verify_request(&headers, &request.body, public_key, request.received_at_ms())
        .expect("the test event verifies with the endpoint's key");
    assert_eq!(request.json().unwrap()["test"], true);

    api.shutdown().await.unwrap();
}

#[tests::test]
async fn test_events_answer_404_for_others_endpoints_and_4xx_for_bad_bodies() {
    let api = TestApi::start().await.unwrap();
    let (key, other) = (api.new_developer().await, api.new_developer().await);
    let receiver = api.receiver().await;
    let webhook = create(&api, &key, json!({ "url": receiver.url() })).await;
    let path = format!("/webhooks/{}/test", id(&webhook));

    api.post(&path, &other, &json!({ "event_type": "transfer.created" })).await.expect_error(404, "not_found");
    let missing = format!("/webhooks/wep_{}/test", uuid::Uuid::new_v4().simple());
    api.post(&missing, &key, &json!({ "event_type": "transfer.created" })).await.expect_error(404, "not_found");
    api.post(&path, &key, &json!({ "event_type": "transfer.teleported" })).await.expect_error_at(
        400,
        "invalid",
        "body",
        "event_type",
    );
    api.post(&path, &key, &json!({})).await.expect_error_at(400, "required", "body", "event_type");
    api.post(&path, &key, &json!({ "event_type": 7 })).await.expect_error_at(400, "invalid", "body", "event_type");
    api.post(&path, &key, &json!({ "event_type": "transfer.created", "extra": 1 })).await.expect_error(400, "invalid");
    let reader = api.key_for(key.developer_id(), &[webhooks_model::Scope::WebhooksRead]).await;
    api.post(&path, &reader, &json!({ "event_type": "transfer.created" })).await.expect_error(403, "forbidden");
    assert_eq!(receiver.count(), 0, "nothing was sent");

    api.shutdown().await.unwrap();
}
