//! The harness's parts fit together: an event accepted by the API reaches a
//! receiver through a dispatcher, signed with the endpoint's key.

use serde_json::json;
use tests::TestApi;
use webhooks_signature::platform::SIGNATURE_HEADER;

#[tests::test]
async fn an_event_reaches_an_active_endpoint_signed() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let webhook = api.create_endpoint(&key, &receiver.url()).await;
    let id = webhook["id"].as_str().unwrap();
    api.put(&format!("/webhooks/{id}"), &key, &json!({ "status": "active" })).await.expect(200);

    let accepted = api
        .ingest(&json!({
            "developer_id": key.developer_id(),
            "event_category": "transfer",
            "event_type": "transfer.updated.status_transitioned",
            "event_object_id": "tr_1",
            "event_object": { "id": "tr_1", "state": "payment_processed" },
            "event_object_status": "payment_processed",
        }))
        .await;
    let event = accepted.expect(201).clone();

    let requests = receiver.wait_for(1).await.unwrap();
    let delivery = &requests[0];
    assert_eq!(delivery.method, "POST");
    assert_eq!(delivery.path, "/hook");
    assert!(delivery.header(SIGNATURE_HEADER).is_some());
    assert_eq!(delivery.header("x-webhook-id"), event["event_id"].as_str());
    assert_eq!(delivery.json().unwrap(), event, "the body is the Event as the API answered it");
    receiver.verify_with(webhook["public_key"].as_str().unwrap()).unwrap();

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
