//! Nothing looping (docs/architecture.md, "Nothing stranded, nothing looping"), on both
//! backends: a delivery that can never be processed (its endpoint's row is
//! damaged: the private key no longer opens) is parked with growing waits and
//! given up after `PARK_LIMIT` parks instead of cycling for ever. RabbitMQ
//! dead-letters the message to `{p}.dead` and the delivery stays owed (the
//! sweeper queues it again later); standalone mode records it `failed`, with
//! the reason in its log.

mod common;

use std::time::Duration;

use common::*;
use lapin::{options::QueueDeclareOptions, types::FieldTable};
use tests::{ApiOptions, Backend, TestApi, WAIT};
use webhooks_queue::PARK_LIMIT;
use webhooks_queue::amqp as broker;

#[tests::test]
async fn a_delivery_that_cannot_be_processed_stops_cycling() {
    // One short retry delay: parks wait 200 ms each, so the limit comes soon.
    let api = TestApi::start_with(ApiOptions { retry_schedule: Some("200ms".into()), ..ApiOptions::default() })
        .await
        .unwrap();
    let mut dispatcher = api.start_dispatcher().await.unwrap();
    let key = api.new_developer().await;
    let receiver = api.receiver().await;
    let endpoint = active_endpoint(&api, &key, &receiver.url()).await;
    let damage = match api.backend {
        Backend::Standalone => "UPDATE endpoints SET private_key = X'0102' WHERE id = $1",
        Backend::Distributed => "UPDATE endpoints SET private_key = '\\x0102'::bytea WHERE id = $1",
    };
    api.execute_sql(damage, &id(&endpoint)).await;
    let event = ingest(&api, key.developer_id(), "transfer", 1).await;

    match api.backend {
        Backend::Standalone => {
            let entries = eventually("the delivery is given up", WAIT, async || {
                let entries = logs(&api, &key, &endpoint, "").await;
                if entries.is_empty() { Err("no log yet".to_owned()) } else { Ok(entries) }
            })
            .await;
            assert_eq!(entries.len(), 1, "{entries:?}");
            let error = entries[0]["error"].as_str().unwrap_or_default();
            assert!(error.contains(&format!("parked {PARK_LIMIT} times")), "{error}");
            assert!(error.contains("cannot load the endpoint"), "{error}");
            assert!(entries[0]["status"].is_null());
            assert!(upcoming_ids(&api, &key, &endpoint).await.is_empty(), "failed, so no longer upcoming");
        }
        Backend::Distributed => {
            let connection = broker::connect(&api.amqp_url, "parking test").await.unwrap();
            let channel = connection.create_channel().await.unwrap();
            let dead = format!("{}.dead", api.prefix);
            eventually("the message is dead-lettered", WAIT, async || {
                let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
                let queue = channel.queue_declare(dead.as_str().into(), passive, FieldTable::default()).await;
                match queue {
                    Ok(queue) if queue.message_count() == 1 => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            let outcome = |text: &str, name: &str| {
                sample(text, &format!("webhooks_dispatcher_deliveries_total{{outcome=\"{name}\"}}")).unwrap_or(0.0)
            };
            let text = metrics(&api.client, dispatcher.addr).await;
            assert_eq!(outcome(&text, "dead_lettered"), 1.0, "{text}");
            assert_eq!(outcome(&text, "parked"), f64::from(PARK_LIMIT), "parked {PARK_LIMIT} times: {text}");
            // It stopped cycling.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let later = metrics(&api.client, dispatcher.addr).await;
            assert_eq!(outcome(&later, "parked"), f64::from(PARK_LIMIT), "{later}");
            // The delivery is still owed: the sweeper queues it again later.
            assert_eq!(upcoming_ids(&api, &key, &endpoint).await, [event_id(&event)]);
            let _ = connection.close(200, "done".into()).await;
        }
    }
    assert_eq!(receiver.count(), 0, "nothing was sent");

    dispatcher.stop().await.unwrap();
    api.shutdown().await.unwrap();
}
