//! The sweeper of the distributed mode: it queues again the deliveries that
//! are due and that no queue holds, whatever the queues hold besides
//! (DESIGN.md, "Knowing what is stranded").
//!
//! Every second it observes how far each lane has got: the watermark the
//! dispatchers wrote (the latest `enters_at` they received), or now when the
//! lane's work queue has no message ready. Every [`SWEEP_EVERY`] (or half
//! `SWEEP_INTERVAL`, if shorter) it sweeps each lane up to the watermark it
//! observed at least [`SweepSettings::in_flight`] ago, so an attempt under
//! way then has settled: a delivery due before that watermark, with no
//! outbox row, is in no queue. A stranded delivery is so queued again within
//! a second, the in-flight margin, [`PUBLISH_ALLOWANCE`](super::PUBLISH_ALLOWANCE)
//! and a sweep period of becoming stranded: `DELIVERY_TIMEOUT` plus 14 s, less
//! than two `SWEEP_INTERVAL`s (at least 10 s, and 5 s longer than
//! `DELIVERY_TIMEOUT`). Each batch is one statement with `SKIP LOCKED`, so any
//! number of API processes sweep side by side. The same rounds queue again
//! set-aside deliveries that are due; every half `SWEEP_INTERVAL` the sweeper
//! also walks the stalled turns of ordered endpoints and refreshes the queue's
//! gauges.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use lapin::{Channel, Connection, options::QueueDeclareOptions};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use webhooks_model::{Lane, Topology};
use webhooks_store::queue::{Outbox, Swept};

use crate::metrics::SweepMetrics;

/// Batches per sweep of a lane at most; the rest waits for the next round.
const ROUND: usize = 40;
/// Sweeps without an attempt in between after which a delivery is failed.
pub const SWEEP_LIMIT: i32 = 5;
/// How often the lanes are observed.
const OBSERVE_EVERY: Duration = Duration::from_secs(1);
/// How often the lanes are swept at most.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Stranded deliveries counted at most for the gauge.
const COUNT_AT_MOST: i64 = 1_000_000;

/// How the sweeper runs.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// `SWEEP_INTERVAL`: a stranded delivery is queued again within two.
    pub interval: Duration,
    /// `SWEEP_BATCH`: deliveries or endpoints per statement.
    pub batch: i64,
    /// The longest a message may be in a dispatcher's hands (its slot and
    /// pace waits, `DELIVERY_TIMEOUT`, its record): a watermark is used only
    /// once it is this old.
    pub in_flight: Duration,
}

/// What the sweeper needs.
pub(crate) struct Sweeper {
    pub(crate) outbox: Outbox,
    pub(crate) brokers: super::Brokers,
    pub(crate) topology: Topology,
    pub(crate) settings: SweepSettings,
    /// Wakes the relay once something was queued.
    pub(crate) relay_wake: Arc<Notify>,
    pub(crate) metrics: Arc<SweepMetrics>,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// How far each lane had got at a moment.
#[derive(Debug, Clone, Copy)]
struct Observation {
    at: Instant,
    default: Option<DateTime<Utc>>,
    bulk: Option<DateTime<Utc>>,
}

impl Observation {
    /// What is due before this is in no queue of `lane`.
    fn stranded_before(&self, lane: Lane) -> Option<DateTime<Utc>> {
        let mark = match lane {
            Lane::Default => self.default,
            Lane::Bulk => self.bulk,
        };
        Some(mark? - chrono::Duration::from_std(super::PUBLISH_ALLOWANCE).unwrap_or_default())
    }
}

/// A broker channel kept open between observations.
struct Probe {
    connection: Connection,
    channel: Channel,
}

impl Sweeper {
    /// Observes and sweeps until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut observations: VecDeque<Observation> = VecDeque::new();
        let mut probe: Option<Probe> = None;
        let mut turns_after: Option<String> = None;
        let sweep_every = SWEEP_EVERY.min(self.settings.interval / 2);
        let mut next_sweep = Instant::now() + sweep_every;
        let mut next_turns = Instant::now() + self.settings.interval / 2;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(OBSERVE_EVERY) => {}
            }
            let observed = self.observe(&mut probe).await;
            observations.push_back(observed);
            // Keep what the next sweep can use: everything younger than the
            // in-flight margin, and the youngest older one.
            while observations.len() > 1 && observations[1].at.elapsed() >= self.settings.in_flight {
                observations.pop_front();
            }
            if Instant::now() < next_sweep {
                continue;
            }
            next_sweep = Instant::now() + sweep_every;
            let settled = observations.front().filter(|o| o.at.elapsed() >= self.settings.in_flight).copied();
            let turns = Instant::now() >= next_turns;
            self.round(settled, turns.then_some(&mut turns_after)).await;
            if turns {
                next_turns = Instant::now() + self.settings.interval / 2;
                self.gauges(settled, probe.as_ref()).await;
            }
        }
        if let Some(probe) = probe {
            let _ = probe.connection.close(200, "bye".into()).await;
        }
    }

    /// How far each lane has got now.
    async fn observe(&self, probe: &mut Option<Probe>) -> Observation {
        let at = Instant::now();
        let now = webhooks_model::time::now();
        let mut observation = Observation { at, default: None, bulk: None };
        match self.outbox.lane_watermarks().await {
            Ok(marks) => {
                for (lane, mark) in marks {
                    match lane {
                        Lane::Default => observation.default = Some(mark),
                        Lane::Bulk => observation.bulk = Some(mark),
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "cannot read the lane watermarks"),
        }
        // A lane with no message ready has handed out everything that
        // entered it before now.
        for lane in [Lane::Default, Lane::Bulk] {
            match self.ready(probe, &self.topology.work_queue(lane)).await {
                Ok(0) => {
                    let mark = match lane {
                        Lane::Default => &mut observation.default,
                        Lane::Bulk => &mut observation.bulk,
                    };
                    *mark = Some(mark.map_or(now, |m| m.max(now)));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(error = format!("{error:#}"), "cannot see the work queues");
                    *probe = None;
                    break;
                }
            }
        }
        observation
    }

    /// Messages ready in `queue`.
    async fn ready(&self, probe: &mut Option<Probe>, queue: &str) -> anyhow::Result<u32> {
        if probe.as_ref().is_none_or(|p| !p.channel.status().connected()) {
            let connection = self.brokers.connect("webhooks-api sweeper").await?;
            let channel = connection.create_channel().await?;
            *probe = Some(Probe { connection, channel });
        }
        let Some(Probe { channel, .. }) = probe else { anyhow::bail!("no channel") };
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        Ok(channel.queue_declare(queue.into(), passive, Default::default()).await?.message_count())
    }

    /// One round: set-aside deliveries that are due, each lane's stranded
    /// ones by `settled`, then, with `turns_after`, the stalled turns.
    async fn round(&self, settled: Option<Observation>, turns_after: Option<&mut Option<String>>) {
        let batch = self.settings.batch;
        tracing::debug!(?settled, "sweep round");
        let mut total = self.repeat(|| self.outbox.sweep_set_aside(batch)).await;
        for lane in [Lane::Default, Lane::Bulk] {
            let Some(watermark) = settled.and_then(|o| o.stranded_before(lane)) else { continue };
            let swept = self.repeat(|| self.outbox.sweep_stranded(lane, watermark, batch, SWEEP_LIMIT)).await;
            if swept.queued > 0 {
                tracing::warn!(queued = swept.queued, lane = lane.as_str(), "stranded deliveries queued again");
            }
            total.queued += swept.queued;
            total.failed += swept.failed;
        }
        if total.returned > 0 {
            tracing::info!(returned = total.returned, "deliveries set aside behind hanging endpoints queued again");
        }
        if total.failed > 0 {
            tracing::error!(failed = total.failed, "deliveries queued again {SWEEP_LIMIT} times in vain; failed");
        }
        // After the sweep: a head it failed hands its endpoint's turn on now.
        let released = match turns_after {
            Some(after) => self.release_turns(after).await,
            None => 0,
        };
        if released > 0 {
            tracing::info!(released, "waiting deliveries of ordered endpoints released");
        }
        if total.queued + total.returned + released > 0 {
            self.relay_wake.notify_one();
        }
        let metrics = &self.metrics;
        metrics.swept("stranded").inc_by(total.queued);
        metrics.swept("set_aside").inc_by(total.returned);
        metrics.swept("failed").inc_by(total.failed);
        metrics.swept("turn_released").inc_by(released);
        metrics.rounds.inc();
    }

    /// Runs one sweep statement batch after batch until one comes back short
    /// (or [`ROUND`] batches), adding up what they did.
    async fn repeat<F, Fut>(&self, mut sweep: F) -> Swept
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = webhooks_store::StoreResult<Swept>>,
    {
        let mut total = Swept::default();
        for _ in 0..ROUND {
            match sweep().await {
                Ok(swept) => {
                    total.queued += swept.queued;
                    total.returned += swept.returned;
                    total.failed += swept.failed;
                    if swept.queued + swept.returned + swept.failed < self.settings.batch.unsigned_abs() {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = format!("{error:#}"), "sweep failed; trying next round");
                    self.metrics.round_errors.inc();
                    break;
                }
            }
        }
        total
    }

    /// Walks the ordered endpoints with waiting deliveries from where the
    /// last round stopped, [`ROUND`] batches at most, releasing the turns
    /// no settling handed on; starts over once it reached the end.
    async fn release_turns(&self, after: &mut Option<String>) -> u64 {
        let mut released = 0;
        for _ in 0..ROUND {
            match self.outbox.release_stalled_turns(after.as_deref(), self.settings.batch).await {
                Ok((n, last)) => {
                    released += n;
                    *after = last;
                    if after.is_none() {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = format!("{error:#}"), "cannot release waiting deliveries");
                    self.metrics.round_errors.inc();
                    break;
                }
            }
        }
        released
    }

    /// The gauges of what waits unseen.
    async fn gauges(&self, settled: Option<Observation>, probe: Option<&Probe>) {
        for lane in [Lane::Default, Lane::Bulk] {
            let stranded = match settled.and_then(|o| o.stranded_before(lane)) {
                Some(watermark) => self.outbox.count_stranded(lane, watermark, COUNT_AT_MOST).await.unwrap_or(0),
                None => 0,
            };
            self.metrics.stranded(lane).set(stranded);
        }
        if let Ok(rows) = self.outbox.count_rows().await {
            self.metrics.outbox_rows.set(rows);
        }
        if let Some(Probe { channel, .. }) = probe {
            let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
            if let Ok(dead) =
                channel.queue_declare(self.topology.dead().as_str().into(), passive, Default::default()).await
            {
                self.metrics.dead_letters.set(i64::from(dead.message_count()));
            }
        }
    }
}
