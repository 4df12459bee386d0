//! Acknowledging messages in bulk. Handlers report each message's fate here;
//! one task per broker session turns whatever has gathered into as few frames
//! as it can: one `basic.ack` with `multiple` for every ack below the lowest
//! message still in flight, and single nacks. An ack above that message
//! waits up to [`HOLD`] for it to settle (then one `multiple` ack covers
//! both), and goes on its own after that, so a message held by a slow attempt
//! delays the acks of the others by [`HOLD`] at most; once that message has
//! been in flight for [`STUCK`] (an attempt to an endpoint that hangs), the
//! acks above it go at once, since an ack not sent keeps its message in the
//! prefetch window. Messages finish out of order, a few at a time: acking
//! each at once cost a frame, and a wake-up of the connection's thread, for
//! most deliveries.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use lapin::{
    Channel,
    options::{BasicAckOptions, BasicNackOptions},
};
use tokio::{sync::mpsc, task::JoinHandle, time::Instant};

/// What becomes of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Done: remove it from the queue.
    Ack,
    /// Hand it back to the queue for another try.
    Requeue,
    /// Unprocessable: to the dead-letter queue.
    Reject,
}

/// Where handlers report; cheap to clone.
#[derive(Debug, Clone)]
pub struct Settler {
    fates: mpsc::UnboundedSender<(u64, Fate)>,
    /// Messages received and not settled yet, with when each came.
    in_flight: Arc<Mutex<BTreeMap<u64, Instant>>>,
}

impl Settler {
    /// Starts the settling task for `channel`. It ends once every `Settler`
    /// clone is dropped and what they reported is sent.
    pub fn start(channel: Channel) -> (Settler, JoinHandle<()>) {
        let (fates, reports) = mpsc::unbounded_channel();
        let in_flight = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn(settle(channel, reports, in_flight.clone()));
        (Settler { fates, in_flight }, task)
    }

    /// Notes a message just received, before its handler runs.
    pub fn received(&self, tag: u64) {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner).insert(tag, Instant::now());
    }

    /// Reports the fate of a received message.
    pub fn settle(&self, tag: u64, fate: Fate) {
        if self.fates.send((tag, fate)).is_err() {
            tracing::warn!(tag, "settling task gone; the broker will redeliver the message");
        }
    }
}

/// How long an ack waits for the messages before it to settle, so that one
/// `multiple` ack covers them all.
const HOLD: Duration = Duration::from_millis(20);

/// A message in flight for this long is a slow attempt, not one about to
/// end: the acks above it are not held for it.
const STUCK: Duration = Duration::from_millis(100);

async fn settle(
    channel: Channel,
    mut reports: mpsc::UnboundedReceiver<(u64, Fate)>,
    in_flight: Arc<Mutex<BTreeMap<u64, Instant>>>,
) {
    let mut batch = Vec::with_capacity(256);
    let mut held = Held::default();
    loop {
        let received = match held.next_due() {
            Some(due) => tokio::select! {
                received = reports.recv_many(&mut batch, 1024) => received,
                () = tokio::time::sleep_until(due) => 1,
            },
            None => reports.recv_many(&mut batch, 1024).await,
        };
        // The reports are closed: the session ends, and every ack goes now.
        let hold = if received == 0 { Duration::ZERO } else { HOLD };
        for (frame, what) in plan(&batch, &in_flight, &mut held, Instant::now(), hold) {
            let result = match frame {
                Frame::Ack { tag, multiple } => channel.basic_ack(tag, BasicAckOptions { multiple }).await,
                Frame::Nack { tag, requeue } => {
                    channel.basic_nack(tag, BasicNackOptions { multiple: false, requeue }).await
                }
            };
            if let Err(error) = result {
                tracing::warn!(%error, what, "could not settle; the broker will redeliver");
            }
        }
        batch.clear();
        if received == 0 {
            return;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Ack { tag: u64, multiple: bool },
    Nack { tag: u64, requeue: bool },
}

/// Acks not sent yet, by tag, with when each was reported.
#[derive(Debug, Default)]
struct Held(BTreeMap<u64, Instant>);

impl Held {
    /// When the oldest held ack is due on its own.
    fn next_due(&self) -> Option<Instant> {
        self.0.values().min().map(|at| *at + HOLD)
    }
}

/// The frames that settle `batch` and what `held` can send at `now`: nacks
/// first (a later `multiple` ack would otherwise ack them too), then one
/// `multiple` ack for every held ack below the lowest message in flight,
/// then single acks for those held longer than `hold`, or at once when that
/// lowest message is stuck. Removes the settled tags from `in_flight`.
fn plan(
    batch: &[(u64, Fate)],
    in_flight: &Mutex<BTreeMap<u64, Instant>>,
    held: &mut Held,
    now: Instant,
    hold: Duration,
) -> Vec<(Frame, &'static str)> {
    let mut in_flight = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    let mut frames = Vec::new();
    for &(tag, fate) in batch {
        in_flight.remove(&tag);
        match fate {
            Fate::Ack => {
                held.0.insert(tag, now);
            }
            Fate::Requeue => frames.push((Frame::Nack { tag, requeue: true }, "requeue")),
            Fate::Reject => frames.push((Frame::Nack { tag, requeue: false }, "reject")),
        }
    }
    let (lowest_open, hold) = match in_flight.first_key_value() {
        Some((&tag, &since)) if now.duration_since(since) >= STUCK => (tag, Duration::ZERO),
        Some((&tag, _)) => (tag, hold),
        None => (u64::MAX, hold),
    };
    let above = held.0.split_off(&lowest_open);
    let below = std::mem::replace(&mut held.0, above);
    if let Some(&highest) = below.keys().next_back() {
        frames.push((Frame::Ack { tag: highest, multiple: below.len() > 1 }, "ack"));
    }
    held.0.retain(|&tag, &mut at| {
        let due = at + hold <= now;
        if due {
            frames.push((Frame::Ack { tag, multiple: false }, "ack"));
        }
        !due
    });
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(tags: &[u64]) -> Mutex<BTreeMap<u64, Instant>> {
        let now = Instant::now();
        Mutex::new(tags.iter().map(|&tag| (tag, now)).collect())
    }

    fn frames(planned: Vec<(Frame, &'static str)>) -> Vec<Frame> {
        planned.into_iter().map(|f| f.0).collect()
    }

    #[test]
    fn acks_below_the_lowest_open_message_go_in_one_frame() {
        let in_flight = open(&[1, 2, 3, 4, 5]);
        let batch = [(2, Fate::Ack), (1, Fate::Ack), (3, Fate::Ack)];
        let frames: Vec<Frame> =
            plan(&batch, &in_flight, &mut Held::default(), Instant::now(), HOLD).into_iter().map(|f| f.0).collect();
        assert_eq!(frames, vec![Frame::Ack { tag: 3, multiple: true }]);
        assert_eq!(in_flight.lock().unwrap().keys().copied().collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn a_slow_message_delays_later_acks_a_little_and_is_never_acked_by_them() {
        let in_flight = open(&[1, 2, 3, 4, 5]);
        let mut held = Held::default();
        let start = Instant::now();
        // 1 is still running; 2 was rejected; 3 and 4 are done: held for 1.
        let frames = plan(&[(3, Fate::Ack), (2, Fate::Reject), (4, Fate::Ack)], &in_flight, &mut held, start, HOLD);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Nack { tag: 2, requeue: false }]);
        assert_eq!(held.next_due(), Some(start + HOLD));
        // 1 ends in time: one frame acks 1, 3 and 4 (2 is settled already).
        let frames = plan(&[(1, Fate::Ack)], &in_flight, &mut held, start + HOLD / 2, HOLD);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Ack { tag: 4, multiple: true }]);
        assert_eq!(held.next_due(), None);

        // 5 runs on: 6 is acked on its own once it has waited `HOLD`.
        in_flight.lock().unwrap().insert(6, start);
        let frames = plan(&[(6, Fate::Ack)], &in_flight, &mut held, start + HOLD, HOLD);
        assert!(frames.is_empty());
        let frames = plan(&[], &in_flight, &mut held, start + HOLD * 2, HOLD);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Ack { tag: 6, multiple: false }]);
        // A requeue goes at once.
        let frames = plan(&[(5, Fate::Requeue)], &in_flight, &mut held, start + HOLD * 2, HOLD);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Nack { tag: 5, requeue: true }]);
        assert!(in_flight.lock().unwrap().is_empty());
    }

    #[test]
    fn acks_above_a_stuck_message_go_at_once() {
        let start = Instant::now();
        let in_flight = Mutex::new(BTreeMap::from([(1, start), (2, start + STUCK)]));
        let mut held = Held::default();
        // 1 has been in flight for `STUCK` (its endpoint hangs): 2's ack
        // goes now, on its own, not after `HOLD`.
        let planned = plan(&[(2, Fate::Ack)], &in_flight, &mut held, start + STUCK, HOLD);
        assert_eq!(frames(planned), vec![Frame::Ack { tag: 2, multiple: false }]);
        assert_eq!(held.next_due(), None);
    }
}
