//! The sweeper of the distributed mode: it queues again the deliveries that
//! are due and that no queue holds, whatever the queues hold besides
//! (DESIGN.md, "Knowing what is stranded").
//!
//! Every second it observes how far each work queue has got, on the
//! database's clock: the latest `enters_at` a dispatcher's worker started
//! there, or the database's now when the queue has no message ready; never
//! past what a live dispatcher still holds unstarted in its buffer. Every
//! [`SWEEP_EVERY`] (or half `SWEEP_INTERVAL`, if shorter) it sweeps each
//! queue up to the watermark it observed at least [`SweepSettings::in_flight`]
//! ago, so an attempt under way then has settled: a delivery due before that
//! watermark, with no outbox row, is in no queue. A stranded delivery is so
//! queued again within a second, the in-flight margin,
//! [`PUBLISH_ALLOWANCE`](super::PUBLISH_ALLOWANCE) and a sweep period of
//! becoming stranded: `DELIVERY_TIMEOUT` plus 14 s, less than two
//! `SWEEP_INTERVAL`s (at least 10 s, and 5 s longer than `DELIVERY_TIMEOUT`).
//! The same rounds queue again the first attempts an API process lost
//! ahead of a backlog when it died (see [`LOST_AFTER`]). What is queued again
//! goes to the swept queue, which dispatchers take first. Each batch is one
//! statement with `SKIP LOCKED`, so any number of API processes sweep side by
//! side. The same rounds queue again set-aside deliveries that are due; every
//! half `SWEEP_INTERVAL` the sweeper also walks the stalled turns of ordered
//! endpoints and refreshes the queue's gauges.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use lapin::{Channel, Connection, options::QueueDeclareOptions};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use webhooks_model::{Lane, Topology};
use webhooks_store::queue::{LostProcess, Outbox, Swept};

use super::WorkQueue;
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
/// A process not seen for this long is taken for lost: ten of its
/// heartbeats missed.
pub const LOST_AFTER: Duration = Duration::from_secs(10);
/// A lost process's first attempts are queued again only this far past the
/// watermark of their lane: a message started in the last heartbeats is in
/// no watermark yet, and must not be sent beside its copy.
const PAST_THE_WATERMARK: chrono::Duration = chrono::Duration::seconds(5);

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

/// How far each work queue had got at a moment.
#[derive(Debug, Clone, Copy)]
struct Observation {
    at: Instant,
    /// The watermark of each queue of [`WorkQueue::ALL`], on the database's
    /// clock.
    marks: [Option<DateTime<Utc>>; 3],
    /// The earliest `enters_at` a live dispatcher held unstarted in each.
    holding: [Option<DateTime<Utc>>; 3],
}

impl Observation {
    /// This observation's marks, none past what a dispatcher was seen
    /// holding in `later` ones: a message taken into a buffer just before
    /// this observation is reported held only at the dispatcher's next
    /// heartbeat, and must not be swept from under it.
    fn held_back_by<'a>(&self, later: impl Iterator<Item = &'a Observation>) -> Observation {
        let mut held = *self;
        for observation in later {
            for (mark, holding) in held.marks.iter_mut().zip(observation.holding) {
                if let (Some(at), Some(holding)) = (mark.as_mut(), holding) {
                    *at = (*at).min(holding);
                }
            }
        }
        held
    }

    fn mark(&self, queue: WorkQueue) -> Option<DateTime<Utc>> {
        let index = WorkQueue::ALL.iter().position(|q| *q == queue)?;
        self.marks[index]
    }

    /// What is due before this is in no queue of `lane` (`swept`: in the
    /// swept queue, or in the lane's where a relay of the release before
    /// put it).
    fn stranded_before(&self, lane: Lane, swept: bool) -> Option<DateTime<Utc>> {
        let mut mark = self.mark(WorkQueue::Lane(lane))?;
        if swept {
            mark = mark.min(self.mark(WorkQueue::Swept)?);
        }
        Some(mark - chrono::Duration::from_std(super::PUBLISH_ALLOWANCE).unwrap_or_default())
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
            let Some(observed) = self.observe(&mut probe).await else { continue };
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
            let settled = observations
                .front()
                .filter(|o| o.at.elapsed() >= self.settings.in_flight)
                .map(|o| o.held_back_by(observations.iter()));
            let turns = Instant::now() >= next_turns;
            self.round(settled, &observed, turns.then_some(&mut turns_after)).await;
            if turns {
                next_turns = Instant::now() + self.settings.interval / 2;
                self.gauges(settled, probe.as_ref()).await;
            }
        }
        if let Some(probe) = probe {
            let _ = probe.connection.close(200, "bye".into()).await;
        }
    }

    /// How far each work queue has got now; `None` when the store cannot
    /// say.
    async fn observe(&self, probe: &mut Option<Probe>) -> Option<Observation> {
        let at = Instant::now();
        let progress = match self.outbox.queue_progress(LOST_AFTER).await {
            Ok(progress) => progress,
            Err(error) => {
                tracing::debug!(%error, "cannot read how far the work queues have got");
                return None;
            }
        };
        let mut marks = [None; 3];
        let mut held = [None; 3];
        for (index, queue) in WorkQueue::ALL.into_iter().enumerate() {
            let of = |list: &[(String, DateTime<Utc>)]| {
                list.iter().find(|(name, _)| name == queue.as_str()).map(|(_, at)| *at)
            };
            let mut mark = of(&progress.started);
            // A queue with no message ready has handed out everything that
            // entered it before now.
            match self.ready(probe, &queue.name(&self.topology)).await {
                Ok(0) => mark = Some(progress.now),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(error = format!("{error:#}"), "cannot see the work queues");
                    *probe = None;
                    return None;
                }
            }
            // Not past what a dispatcher holds unstarted, nor past now.
            if let Some(holding) = of(&progress.holding) {
                mark = mark.map(|m| m.min(holding));
                held[index] = Some(holding);
            }
            marks[index] = mark.map(|m| m.min(progress.now));
            if let Some(mark) = marks[index] {
                let offset = (mark - progress.now).num_milliseconds() as f64 / 1000.0;
                self.metrics.watermark_offset(queue.as_str()).set(offset);
            }
        }
        Some(Observation { at, marks, holding: held })
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

    /// One round: set-aside deliveries that are due, each queue's stranded
    /// ones by `settled`, the first attempts of lost processes ahead of the
    /// watermarks `now` observed, then, with `turns_after`, the stalled
    /// turns.
    async fn round(&self, settled: Option<Observation>, now: &Observation, turns_after: Option<&mut Option<String>>) {
        let batch = self.settings.batch;
        tracing::debug!(?settled, "sweep round");
        let mut total = self.repeat(|| self.outbox.sweep_set_aside(batch)).await;
        for lane in [Lane::Default, Lane::Bulk] {
            for swept in [false, true] {
                let Some(watermark) = settled.and_then(|o| o.stranded_before(lane, swept)) else { continue };
                let found =
                    self.repeat(|| self.outbox.sweep_stranded(lane, swept, watermark, batch, SWEEP_LIMIT)).await;
                if found.queued > 0 {
                    tracing::warn!(
                        queued = found.queued,
                        lane = lane.as_str(),
                        swept,
                        "stranded deliveries queued again"
                    );
                }
                total.queued += found.queued;
                total.failed += found.failed;
            }
        }
        let lost = self.lost_first_attempts(now).await;
        total.queued += lost;
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
        metrics.swept("stranded").inc_by(total.queued - lost);
        metrics.swept("lost_process").inc_by(lost);
        metrics.swept("set_aside").inc_by(total.returned);
        metrics.swept("failed").inc_by(total.failed);
        metrics.swept("turn_released").inc_by(released);
        metrics.rounds.inc();
    }

    /// Queues again the first attempts that processes lost when they died
    /// (not seen for [`LOST_AFTER`]): those of events between what the
    /// process had confirmed and when it was last seen, not yet attempted,
    /// with no outbox row, and still ahead of their lane's watermark (those
    /// behind it are the ordinary sweep's). Then forgets the process.
    /// Returns how many it queued again.
    async fn lost_first_attempts(&self, now: &Observation) -> u64 {
        let lost = match self.outbox.lost_processes(LOST_AFTER).await {
            Ok(lost) => lost,
            Err(error) => {
                tracing::debug!(%error, "cannot read the processes");
                return 0;
            }
        };
        let mut queued = 0;
        for process in lost {
            match self.requeue_lost(&process, now).await {
                Ok(n) => {
                    queued += n;
                    tracing::warn!(
                        process = %process.id,
                        kind = process.kind,
                        last_seen = %process.seen_at,
                        queued = n,
                        "a process stopped saying it is alive; its first attempts that may be in no queue were queued again"
                    );
                    if let Err(error) = self.outbox.forget_process(process.id).await {
                        tracing::debug!(%error, "cannot forget a lost process; next round");
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "cannot queue a lost process's first attempts; next round"
                    );
                    self.metrics.round_errors.inc();
                }
            }
        }
        queued
    }

    async fn requeue_lost(&self, process: &LostProcess, now: &Observation) -> webhooks_store::StoreResult<u64> {
        // A dispatcher publishes nothing a sweep must find: its retries are
        // recorded only once confirmed, its put-backs go back to the queue.
        let Some(confirmed) = process.confirmed_through else { return Ok(0) };
        let allowance = chrono::Duration::from_std(super::PUBLISH_ALLOWANCE).unwrap_or_default();
        let until =
            process.seen_at + chrono::Duration::from_std(super::presence::EVERY).unwrap_or_default() + allowance;
        let mut queued = 0;
        for lane in [Lane::Default, Lane::Bulk] {
            let mut from = confirmed - allowance;
            if let Some(mark) = now.mark(WorkQueue::Lane(lane)) {
                from = from.max(mark + PAST_THE_WATERMARK);
            }
            if from >= until {
                continue;
            }
            let batch = self.settings.batch;
            loop {
                let n = self.outbox.requeue_first_attempts(lane, (from, until), batch).await?;
                queued += n;
                if n < batch.unsigned_abs() {
                    break;
                }
            }
        }
        Ok(queued)
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
            let stranded = match settled.and_then(|o| o.stranded_before(lane, false)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_held_back_by_what_later_observations_saw_held() {
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0);
        let observe = |marks, holding| Observation { at: Instant::now(), marks, holding };
        // The default lane had no message ready (its mark the database's
        // now) while a dispatcher had just taken one of second 10 into its
        // buffer: reported a heartbeat later.
        let settled = observe([at(100), at(100), at(100)], [None; 3]);
        let later = [observe([at(101), at(101), at(101)], [at(10), None, None]), observe([at(102); 3], [None; 3])];
        let held = settled.held_back_by(later.iter());
        assert_eq!(held.marks, [at(10), at(100), at(100)]);
        assert_eq!(settled.held_back_by(std::iter::empty()).marks, settled.marks);
        // A queue with no mark stays without one.
        let unmarked = observe([None; 3], [None; 3]).held_back_by(later.iter());
        assert_eq!(unmarked.marks, [None; 3]);
    }
}
