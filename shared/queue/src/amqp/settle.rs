//! Acknowledging messages in bulk. Handlers report each message's fate here;
//! one task per broker session turns whatever has gathered into as few frames
//! as it can: one `basic.ack` with `multiple` for every ack below the lowest
//! message still in flight, and single nacks. An ack above that message waits
//! for it to settle (then one `multiple` ack covers both), since each frame
//! costs the broker about as much as the message it settles. It goes on its own
//! only when waiting would cost more than the frame: once that message has been
//! in flight for [`STUCK`] (an attempt to an endpoint that hangs), or once the
//! acks waiting fill a quarter of the prefetch window, as an ack not sent keeps
//! its message in the window. Under a full CPU every message is in flight for a
//! while (the window ÷ the deliveries per second: 150 ms for two dispatchers
//! sharing two cores), so "slow" is judged by those two bounds, not by a short
//! hold.

use std::{
    collections::{BTreeMap, BTreeSet},
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
    /// Starts the settling task for `channel`, whose prefetch window is
    /// `window` messages. It ends once every `Settler` clone is dropped and
    /// what they reported is sent.
    pub fn start(channel: Channel, window: u16) -> (Settler, JoinHandle<()>) {
        let (fates, reports) = mpsc::unbounded_channel();
        let in_flight = Arc::new(Mutex::new(BTreeMap::new()));
        let task = tokio::spawn(settle(channel, reports, in_flight.clone(), held_at_most(window)));
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

/// A message in flight for this long is a slow attempt, not one about to
/// end: the acks above it are not held for it. Far above the time a message
/// waits for a core in a busy dispatcher, far below `DELIVERY_TIMEOUT`.
const STUCK: Duration = Duration::from_secs(1);

/// The least time between two rounds of frames: acks reported meanwhile go
/// in the next round's one `multiple` ack.
const TICK: Duration = Duration::from_millis(10);

/// Acks held above a message in flight, at most: a quarter of the window.
fn held_at_most(window: u16) -> usize {
    (usize::from(window) / 4).max(1)
}

async fn settle(
    channel: Channel,
    mut reports: mpsc::UnboundedReceiver<(u64, Fate)>,
    in_flight: Arc<Mutex<BTreeMap<u64, Instant>>>,
    at_most: usize,
) {
    let mut batch = Vec::with_capacity(256);
    let mut held = Held::default();
    loop {
        let received = match held.due {
            Some(due) => tokio::select! {
                received = reports.recv_many(&mut batch, 1024) => received,
                () = tokio::time::sleep_until(due) => 1,
            },
            None => reports.recv_many(&mut batch, 1024).await,
        };
        // The reports are closed: the session ends, and every ack goes now.
        let at_most = if received == 0 { 0 } else { at_most };
        let frames = plan(&batch, &in_flight, &mut held, Instant::now(), at_most);
        let sent = !frames.is_empty();
        for (frame, what) in frames {
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
        if sent {
            tokio::time::sleep(TICK).await;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Ack { tag: u64, multiple: bool },
    Nack { tag: u64, requeue: bool },
}

/// Acks not sent yet, above the lowest message in flight.
#[derive(Debug, Default)]
struct Held {
    tags: BTreeSet<u64>,
    /// When that message will have been in flight for [`STUCK`], while acks
    /// are held for it.
    due: Option<Instant>,
}

/// The frames that settle `batch` and what `held` can send at `now`: nacks
/// first (a later `multiple` ack would otherwise ack them too), then one
/// `multiple` ack for every held ack below the lowest message in flight,
/// then single acks for those above it when it is stuck or more than
/// `at_most` are held. Removes the settled tags from `in_flight`.
fn plan(
    batch: &[(u64, Fate)],
    in_flight: &Mutex<BTreeMap<u64, Instant>>,
    held: &mut Held,
    now: Instant,
    at_most: usize,
) -> Vec<(Frame, &'static str)> {
    let mut in_flight = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    let mut frames = Vec::new();
    for &(tag, fate) in batch {
        in_flight.remove(&tag);
        match fate {
            Fate::Ack => {
                held.tags.insert(tag);
            }
            Fate::Requeue => frames.push((Frame::Nack { tag, requeue: true }, "requeue")),
            Fate::Reject => frames.push((Frame::Nack { tag, requeue: false }, "reject")),
        }
    }
    let (lowest_open, stuck_at) = match in_flight.first_key_value() {
        Some((&tag, &since)) => (tag, since + STUCK),
        None => (u64::MAX, now),
    };
    let above = held.tags.split_off(&lowest_open);
    let below = std::mem::replace(&mut held.tags, above);
    if let Some(&highest) = below.last() {
        frames.push((Frame::Ack { tag: highest, multiple: below.len() > 1 }, "ack"));
    }
    if stuck_at <= now || held.tags.len() > at_most {
        frames
            .extend(std::mem::take(&mut held.tags).into_iter().map(|tag| (Frame::Ack { tag, multiple: false }, "ack")));
    }
    held.due = (!held.tags.is_empty()).then_some(stuck_at);
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
        let frames = frames(plan(&batch, &in_flight, &mut Held::default(), Instant::now(), 64));
        assert_eq!(frames, vec![Frame::Ack { tag: 3, multiple: true }]);
        assert_eq!(in_flight.lock().unwrap().keys().copied().collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn acks_above_a_message_in_flight_wait_for_it_and_it_is_never_acked_by_them() {
        let start = Instant::now();
        let in_flight = Mutex::new((1..=5).map(|tag| (tag, start)).collect());
        let mut held = Held::default();
        // 1 is still running; 2 was rejected; 3 and 4 are done: held for 1.
        let frames = plan(&[(3, Fate::Ack), (2, Fate::Reject), (4, Fate::Ack)], &in_flight, &mut held, start, 64);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Nack { tag: 2, requeue: false }]);
        assert_eq!(held.due, Some(start + STUCK), "until 1 is stuck");
        // 1 ends before: one frame acks 1, 3 and 4 (2 is settled already).
        let frames = plan(&[(1, Fate::Ack)], &in_flight, &mut held, start + STUCK / 2, 64);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Ack { tag: 4, multiple: true }]);
        assert_eq!(held.due, None);
        // A requeue goes at once.
        let frames = plan(&[(5, Fate::Requeue)], &in_flight, &mut held, start + STUCK, 64);
        assert_eq!(frames.into_iter().map(|f| f.0).collect::<Vec<_>>(), vec![Frame::Nack { tag: 5, requeue: true }]);
        assert!(in_flight.lock().unwrap().is_empty());
    }

    #[test]
    fn acks_above_a_stuck_message_go_on_their_own() {
        let start = Instant::now();
        let in_flight = Mutex::new(BTreeMap::from([(1, start), (2, start), (3, start + STUCK)]));
        let mut held = Held::default();
        // 1 has been in flight for half of `STUCK`: 2 waits for it.
        assert!(plan(&[(2, Fate::Ack)], &in_flight, &mut held, start + STUCK / 2, 64).is_empty());
        // It has been for `STUCK` (its endpoint hangs): 2 goes, on its own,
        // and so does every later ack above it.
        let planned = plan(&[], &in_flight, &mut held, start + STUCK, 64);
        assert_eq!(frames(planned), vec![Frame::Ack { tag: 2, multiple: false }]);
        assert_eq!(held.due, None);
        let planned = plan(&[(3, Fate::Ack)], &in_flight, &mut held, start + STUCK, 64);
        assert_eq!(frames(planned), vec![Frame::Ack { tag: 3, multiple: false }]);
    }

    #[test]
    fn acks_held_past_their_share_of_the_window_go_on_their_own() {
        let in_flight = open(&(1..=6).collect::<Vec<_>>());
        let mut held = Held::default();
        let now = Instant::now();
        // 1 runs on; up to 3 acks above it wait.
        assert!(plan(&[(2, Fate::Ack), (3, Fate::Ack), (4, Fate::Ack)], &in_flight, &mut held, now, 3).is_empty());
        let planned = plan(&[(5, Fate::Ack)], &in_flight, &mut held, now, 3);
        let singles = (2..=5).map(|tag| Frame::Ack { tag, multiple: false }).collect::<Vec<_>>();
        assert_eq!(frames(planned), singles, "a fourth: they go, each on its own");
        assert_eq!(held.due, None);
        // The session ends: whatever is held goes.
        assert!(plan(&[(6, Fate::Ack)], &in_flight, &mut held, now, 3).is_empty());
        let planned = plan(&[], &in_flight, &mut held, now, 0);
        assert_eq!(frames(planned), vec![Frame::Ack { tag: 6, multiple: false }]);
        assert_eq!(held_at_most(256), 64);
    }
}
