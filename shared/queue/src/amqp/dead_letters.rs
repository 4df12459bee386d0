//! What `{p}.dead` holds, and putting it back on the work queue (the
//! operator's `webhooks-api dead-letters list|replay`). Messages land there
//! when a dispatcher gave up on them (put back `PARK_LIMIT` times for a
//! failure, handed back `DELIVERY_LIMIT` times, unreadable, or of a version
//! it does not know). Their deliveries stay owed in the database, so the sweeper
//! queues them again in any case; replay is for not waiting, or after fixing
//! the cause. A replayed message whose delivery moved on meanwhile is dropped
//! unsent by the dispatcher (it checks the generation), so replay never sends
//! a delivery twice because of it.

use anyhow::Context as _;
use lapin::{
    BasicProperties, Channel, Confirmation,
    options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions},
    types::{AMQPValue, FieldTable},
};
use serde::Serialize;
use webhooks_model::{Lane, Topology};

use super::consumer::DEAD_REASON_HEADER;
use crate::{
    Message,
    message::{decode, encode_delivery},
};

/// One message of `{p}.dead`, as listed.
#[derive(Debug, Serialize)]
pub struct DeadLetter {
    /// The delivery it names; `None` for a message that is not a delivery.
    pub delivery_id: Option<i64>,
    pub event_id: Option<String>,
    pub endpoint_id: Option<String>,
    pub attempt: Option<u32>,
    pub parks: Option<u32>,
    /// Of those, parks for a failure.
    pub failures: Option<u32>,
    /// Why it was dead-lettered: the dispatcher's own reason, or the
    /// broker's (`rejected`, `delivery_limit`, …) from its `x-death` header,
    /// with the queue it came from.
    pub reason: Option<String>,
    pub queue: Option<String>,
    /// When it was dead-lettered, in seconds since the epoch.
    pub dead_since: Option<u64>,
    pub bytes: usize,
}

impl DeadLetter {
    fn of(data: &[u8], properties: &BasicProperties) -> DeadLetter {
        let delivery = match decode(data) {
            Ok(Message::Delivery(message)) => Some(message),
            _ => None,
        };
        let headers = properties.headers().as_ref();
        let own_reason = match headers.and_then(|h| h.inner().get(DEAD_REASON_HEADER)) {
            Some(AMQPValue::LongString(value)) => Some(value.to_string()),
            _ => None,
        };
        let death = headers.and_then(first_death);
        let text = |key: &str| match death.as_ref().and_then(|d| d.inner().get(key)) {
            Some(AMQPValue::LongString(value)) => Some(value.to_string()),
            Some(AMQPValue::ShortString(value)) => Some(value.to_string()),
            _ => None,
        };
        let dead_since = match death.as_ref().and_then(|d| d.inner().get("time")) {
            Some(AMQPValue::Timestamp(at)) => Some(*at),
            _ => None,
        };
        DeadLetter {
            delivery_id: delivery.as_ref().map(|m| m.delivery_id),
            event_id: delivery.as_ref().map(|m| m.event_id.clone()),
            endpoint_id: delivery.as_ref().map(|m| m.endpoint_id.clone()),
            attempt: delivery.as_ref().map(|m| m.attempt),
            parks: delivery.as_ref().map(|m| m.parks),
            failures: delivery.as_ref().map(|m| m.failures),
            reason: own_reason.or_else(|| text("reason")),
            queue: text("queue"),
            dead_since,
            bytes: data.len(),
        }
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
        match self.delivery_id {
            Some(id) => format!(
                "delivery {id}  event {}  endpoint {}  attempt {}  parks {} (failures {})  {} from {}",
                or_dash(self.event_id.clone()),
                or_dash(self.endpoint_id.clone()),
                or_dash(self.attempt.map(|a| a.to_string())),
                or_dash(self.parks.map(|p| p.to_string())),
                or_dash(self.failures.map(|f| f.to_string())),
                or_dash(self.reason.clone()),
                or_dash(self.queue.clone()),
            ),
            None => format!(
                "not a delivery message ({} bytes)  {} from {}",
                self.bytes,
                or_dash(self.reason.clone()),
                or_dash(self.queue.clone())
            ),
        }
    }
}

/// The newest entry of an `x-death` header.
fn first_death(headers: &FieldTable) -> Option<FieldTable> {
    match headers.inner().get("x-death") {
        Some(AMQPValue::FieldArray(deaths)) => deaths.as_slice().iter().find_map(|death| match death {
            AMQPValue::FieldTable(table) => Some(table.clone()),
            _ => None,
        }),
        _ => None,
    }
}

async fn open(brokers: &super::Brokers, topology: &Topology) -> anyhow::Result<(lapin::Connection, Channel)> {
    let connection = brokers
        .connect("webhooks-api dead-letters")
        .await
        .context("connect to RabbitMQ (AMQP_URL); dead letters exist in the distributed mode only")?;
    let channel = connection.create_channel().await?;
    super::declare(topology, &channel).await.context("declare the queues")?;
    Ok((connection, channel))
}

/// Up to `limit` messages of `{p}.dead`, oldest first; they stay there.
pub async fn list(brokers: &super::Brokers, topology: &Topology, limit: usize) -> anyhow::Result<Vec<DeadLetter>> {
    let (connection, channel) = open(brokers, topology).await?;
    let mut listed = Vec::new();
    // Each message is held unacknowledged until the channel closes, so the
    // next get returns the next one; closing hands them all back.
    while listed.len() < limit {
        let got = channel.basic_get(topology.dead().as_str().into(), BasicGetOptions { no_ack: false }).await?;
        let Some(message) = got else { break };
        listed.push(DeadLetter::of(&message.delivery.data, &message.delivery.properties));
    }
    let _ = channel.close(200, "listed".into()).await;
    let _ = connection.close(200, "bye".into()).await;
    Ok(listed)
}

/// What a replay did.
#[derive(Debug, Default, Serialize)]
pub struct Replayed {
    /// Delivery messages put back on the work queue (with their park count
    /// reset).
    pub replayed: usize,
    /// Messages left in `{p}.dead` because they are not delivery messages.
    pub kept: usize,
}

/// Moves up to `limit` delivery messages from `{p}.dead` to the work queue:
/// each is published (confirmed) before it is removed, so a failure midway
/// duplicates at most one message and loses none. `progress` is called after
/// each message.
pub async fn replay(
    brokers: &super::Brokers,
    topology: &Topology,
    limit: usize,
    mut progress: impl FnMut(&Replayed),
) -> anyhow::Result<Replayed> {
    let (connection, channel) = open(brokers, topology).await?;
    let publisher = connection.create_channel().await?;
    publisher.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut done = Replayed::default();
    while done.replayed + done.kept < limit {
        let got = channel.basic_get(topology.dead().as_str().into(), BasicGetOptions { no_ack: false }).await?;
        let Some(message) = got else { break };
        let Ok(Message::Delivery(delivery)) = decode(&message.delivery.data) else {
            // Held unacknowledged until the channel closes, then back in place.
            done.kept += 1;
            progress(&done);
            continue;
        };
        let payload = encode_delivery(&delivery.replayed());
        let confirmation = publisher
            .basic_publish(
                "".into(),
                topology.work_queue(Lane::Bulk).as_str().into(),
                BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                &payload,
                super::persistent_json(),
            )
            .await?
            .await?;
        anyhow::ensure!(
            matches!(confirmation, Confirmation::Ack(None)),
            "RabbitMQ did not take the replayed message: {confirmation:?}"
        );
        message.delivery.acker.ack(BasicAckOptions::default()).await?;
        done.replayed += 1;
        progress(&done);
    }
    let _ = channel.close(200, "replayed".into()).await;
    let _ = connection.close(200, "bye".into()).await;
    Ok(done)
}
