//! Duplicate delivery messages in the distributed system: a broker may hand a
//! message out twice, and a retry may be published before a commit that then
//! fails. Neither may move a delivery's state backwards or fork its retry
//! chain (at-least-once allows a duplicate attempt, nothing more).

mod common;

use common::*;
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions};
use tests::{ApiOptions, Reply, TestApi, WAIT};
use webhooks_queue::DeliveryMessage;
use webhooks_queue::amqp as broker;

/// The delivery message of `event` to `endpoint` at `attempt`, as the queue
/// holds it; the delivery's id comes from the database.
async fn message(api: &TestApi, event: &serde_json::Value, endpoint: &serde_json::Value, attempt: u32) -> Vec<u8> {
    let pool = api.pool();
    let (delivery_id, generation): (i64, i32) =
        sqlx::query_as("SELECT id, generation FROM deliveries WHERE event_id = $1 AND endpoint_id = $2")
            .bind(event_id(event))
            .bind(id(endpoint))
            .fetch_one(pool)
            .await
            .unwrap();
    let message = DeliveryMessage::from(webhooks_store::DueDelivery {
        delivery_id,
        event_id: event_id(event),
        endpoint_id: id(endpoint),
        developer_id: event["event_developer_id"].as_str().unwrap().parse().unwrap(),
        attempt,
        force: false,
        generation: Some(generation),
        parks: 0,
        failures: 0,
        pace_ticket: None,
        lane: Default::default(),
        body: event.to_string(),
        event_created_at: event["event_created_at"].as_str().unwrap().parse().unwrap(),
    });
    webhooks_queue::message::encode_delivery(&message)
}

/// Publishes `payload` to the work queue, as a duplicate the broker hands out.
async fn publish(api: &TestApi, payload: &[u8]) {
    let connection = broker::connect(&api.amqp_url, "duplicates test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let queue = format!("{}.deliveries", api.prefix);
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            payload,
            broker::persistent_json(),
        )
        .await
        .unwrap();
    confirm.await.unwrap();
    let _ = connection.close(200, "done".into()).await;
}

fn outcome(text: &str, name: &str) -> f64 {
    sample(text, &format!("webhooks_dispatcher_deliveries_total{{outcome=\"{name}\"}}")).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_first_attempt_after_success_is_dropped_unsent() {
    let api =
        TestApi::start_with(ApiOptions { retry_schedule: Some("1s".into()), ..ApiOptions::default() }).await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_sequence([Reply::ok()]);
    receiver.reply_always(Reply::status(500).body("down now"));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_logs(&api, &key, &endpoint, 1).await;

    // The first attempt again, fresh: every message asks the store whether
    // it still stands before it is sent, so it is dropped unsent and success
    // stands.
    publish(&api, &message(&api, &event, &endpoint, 1).await).await;
    eventually("the duplicate is dropped", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        if outcome(&text, "superseded") >= 1.0 { Ok(()) } else { Err(text) }
    })
    .await;
    assert_eq!(receiver.count(), 1, "{:?}", received_ids(&receiver));

    // The first attempt as the ingest hands it over, admitted, handed out
    // once it is no longer fresh: it asks too, and is dropped.
    let mut copy: serde_json::Value = serde_json::from_slice(&message(&api, &event, &endpoint, 1).await).unwrap();
    copy["admitted"] = true.into();
    assert_eq!(copy["generation"], 0, "the ingest's generation");
    let accepted: chrono::DateTime<chrono::Utc> = event["event_created_at"].as_str().unwrap().parse().unwrap();
    let stale = accepted + chrono::Duration::from_std(webhooks_queue::message::ADMITTED_FOR).unwrap();
    if let Ok(wait) = (stale - chrono::Utc::now()).to_std() {
        tokio::time::sleep(wait + std::time::Duration::from_millis(50)).await;
    }
    publish(&api, &serde_json::to_vec(&copy).unwrap()).await;
    eventually("the stale copy is dropped", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        if outcome(&text, "superseded") >= 2.0 { Ok(()) } else { Err(text) }
    })
    .await;
    assert_eq!(receiver.count(), 1, "sent once: {:?}", received_ids(&receiver));
    assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty(), "the delivery is still settled");
    let statuses: Vec<_> = logs(&api, &key, &endpoint, "").await.iter().map(|l| l["status"].clone()).collect();
    assert_eq!(statuses, [200], "nothing more was attempted");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

/// Takes the next `count` messages of the work queue and hands them back to
/// the broker unacknowledged, as a dispatcher that dies before its acks
/// does, so that the broker hands them out again, marked redelivered.
/// Returns each as it was taken, with whether it was marked so then.
async fn take_and_give_back(api: &TestApi, count: u16) -> Vec<(serde_json::Value, bool)> {
    let connection = broker::connect(&api.amqp_url, "duplicates test").await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.basic_qos(count, BasicQosOptions::default()).await.unwrap();
    let queue = format!("{}.deliveries", api.prefix);
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "".into(), BasicConsumeOptions::default(), Default::default())
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..count {
        let message = consumer.next().await.expect("a message").unwrap();
        taken.push((serde_json::from_slice(&message.data).unwrap(), message.redelivered));
    }
    let _ = connection.close(200, "died before the ack".into()).await;
    taken
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ingest_admits_first_attempts_to_endpoints_that_are_not_ordered() {
    let api = TestApi::start().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let unordered = active_endpoint(&api, &key, &receiver.url()).await;
    let body = serde_json::json!({ "url": receiver.url(), "ordering": "ordered" });
    let ordered = active_endpoint_with(&api, &key, body).await;
    ingest(&api, key.developer_id(), "transfer", 1).await;

    // No dispatcher runs: read both first attempts off the work queue.
    let admitted: std::collections::HashMap<String, Option<serde_json::Value>> = take_and_give_back(&api, 2)
        .await
        .into_iter()
        .map(|(message, _)| (message["endpoint_id"].as_str().unwrap().to_owned(), message.get("admitted").cloned()))
        .collect();
    assert_eq!(admitted[&id(&unordered)], Some(true.into()), "{admitted:?}");
    assert_eq!(admitted[&id(&ordered)], None, "{admitted:?}");
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_retry_does_not_fork_the_retry_chain() {
    let api = TestApi::start_with(ApiOptions { retry_schedule: Some("20s,1s".into()), ..ApiOptions::default() })
        .await
        .unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    receiver.reply_always(Reply::status(500).body("down"));
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_logs(&api, &key, &endpoint, 1).await;

    // While the real attempt 2 waits in its retry queue, a copy of it comes now.
    publish(&api, &message(&api, &event, &endpoint, 2).await).await;
    // Three attempts in all (1, 2, 3), then failed; the other attempt 2 is dropped.
    eventually("the delivery fails after its last attempt", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        let (failed, superseded) = (outcome(&text, "failed"), outcome(&text, "superseded"));
        if failed >= 1.0 && superseded >= 1.0 { Ok(()) } else { Err(text) }
    })
    .await;
    let entries = logs(&api, &key, &endpoint, "?limit=100").await;
    let attempts: Vec<_> = entries.iter().map(|l| l["attempt"].clone()).collect();
    assert_eq!(attempts, [3, 2, 1], "one chain of attempts: {entries:?}");
    assert_eq!(receiver.count(), 3);

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_first_attempt_the_broker_hands_out_again_is_not_made_again() {
    let api = TestApi::start().await.unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;
    wait_for_logs(&api, &key, &endpoint, 1).await;
    dispatcher.stop().await.unwrap();

    // A dispatcher that recorded the attempt and died before its ack: the
    // broker hands the message out again, marked redelivered. The copy is
    // the ingest's admitted first attempt, dated so that it is still fresh
    // when the next dispatcher gets it: being redelivered, it asks, and is
    // dropped unsent.
    let mut copy: serde_json::Value = serde_json::from_slice(&message(&api, &event, &endpoint, 1).await).unwrap();
    copy["admitted"] = true.into();
    let fresh_until = chrono::Utc::now() + chrono::Duration::milliseconds(1900);
    copy["event_created_at"] = (fresh_until - chrono::Duration::seconds(1)).to_rfc3339().into();
    publish(&api, &serde_json::to_vec(&copy).unwrap()).await;
    assert_eq!(take_and_give_back(&api, 1).await, [(copy, false)], "the copy, handed out for the first time");

    dispatcher = api.start_dispatcher().await.unwrap();
    eventually("the copy is dropped", WAIT, async || {
        let text = metrics(&api.client, dispatcher.addr).await;
        if outcome(&text, "superseded") >= 1.0 { Ok(()) } else { Err(text) }
    })
    .await;
    if chrono::Utc::now() > fresh_until {
        eprintln!("the dispatcher started too late for the copy to be fresh: this run checked the age, not redelivery");
    }
    assert_eq!(receiver.count(), 1, "sent once: {:?}", received_ids(&receiver));
    assert_eq!(logs(&api, &key, &endpoint, "").await.len(), 1, "one attempt logged");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
