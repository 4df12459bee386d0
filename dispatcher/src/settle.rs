//! Acknowledging messages in bulk. Handlers report each message's fate here;
//! one task per broker session turns whatever has gathered into as few frames
//! as it can: one `basic.ack` with `multiple` for every ack below the lowest
//! message still in flight, single acks above it, and single nacks. A message
//! held by a slow attempt therefore never delays the acks of the others.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use lapin::{
    Channel,
    options::{BasicAckOptions, BasicNackOptions},
};
use tokio::{sync::mpsc, task::JoinHandle};

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
    in_flight: Arc<Mutex<BTreeSet<u64>>>,
}

impl Settler {
    /// Starts the settling task for `channel`. It ends once every `Settler`
    /// clone is dropped and what they reported is sent.
    pub fn start(channel: Channel) -> (Settler, JoinHandle<()>) {
        let (fates, reports) = mpsc::unbounded_channel();
        let in_flight = Arc::new(Mutex::new(BTreeSet::new()));
        let task = tokio::spawn(settle(channel, reports, in_flight.clone()));
        (Settler { fates, in_flight }, task)
    }

    /// Notes a message just received, before its handler runs.
    pub fn received(&self, tag: u64) {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner).insert(tag);
    }

    /// Reports the fate of a received message.
    pub fn settle(&self, tag: u64, fate: Fate) {
        if self.fates.send((tag, fate)).is_err() {
            tracing::warn!(tag, "settling task gone; the broker will redeliver the message");
        }
    }
}

async fn settle(
    channel: Channel,
    mut reports: mpsc::UnboundedReceiver<(u64, Fate)>,
    in_flight: Arc<Mutex<BTreeSet<u64>>>,
) {
    let mut batch = Vec::with_capacity(256);
    while reports.recv_many(&mut batch, 1024).await > 0 {
        for (frames, what) in plan(&batch, &in_flight) {
            let result = match frames {
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
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Ack { tag: u64, multiple: bool },
    Nack { tag: u64, requeue: bool },
}

/// The frames that settle `batch`, nacks first (a later `multiple` ack would
/// otherwise ack them too). Removes the settled tags from `in_flight`.
fn plan(batch: &[(u64, Fate)], in_flight: &Mutex<BTreeSet<u64>>) -> Vec<(Frame, &'static str)> {
    let mut in_flight = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
    let mut frames = Vec::new();
    let mut acks = Vec::new();
    for &(tag, fate) in batch {
        in_flight.remove(&tag);
        match fate {
            Fate::Ack => acks.push(tag),
            Fate::Requeue => frames.push((Frame::Nack { tag, requeue: true }, "requeue")),
            Fate::Reject => frames.push((Frame::Nack { tag, requeue: false }, "reject")),
        }
    }
    acks.sort_unstable();
    let lowest_open = in_flight.first().copied().unwrap_or(u64::MAX);
    let (below, above): (Vec<u64>, Vec<u64>) = acks.into_iter().partition(|tag| *tag < lowest_open);
    if let Some(&highest) = below.last() {
        frames.push((Frame::Ack { tag: highest, multiple: below.len() > 1 }, "ack"));
    }
    frames.extend(above.into_iter().map(|tag| (Frame::Ack { tag, multiple: false }, "ack")));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(tags: &[u64]) -> Mutex<BTreeSet<u64>> {
        Mutex::new(tags.iter().copied().collect())
    }

    #[test]
    fn acks_below_the_lowest_open_message_go_in_one_frame() {
        let in_flight = open(&[1, 2, 3, 4, 5]);
        let frames: Vec<Frame> =
            plan(&[(2, Fate::Ack), (1, Fate::Ack), (3, Fate::Ack)], &in_flight).into_iter().map(|f| f.0).collect();
        assert_eq!(frames, vec![Frame::Ack { tag: 3, multiple: true }]);
        assert_eq!(in_flight.lock().unwrap().iter().copied().collect::<Vec<_>>(), vec![4, 5]);
    }

    #[test]
    fn a_slow_message_does_not_hold_back_later_acks_and_is_never_acked_by_them() {
        let in_flight = open(&[1, 2, 3, 4]);
        // 1 is still running; 2 was rejected; 3 and 4 are done.
        let frames: Vec<Frame> =
            plan(&[(3, Fate::Ack), (2, Fate::Reject), (4, Fate::Ack)], &in_flight).into_iter().map(|f| f.0).collect();
        assert_eq!(
            frames,
            vec![
                Frame::Nack { tag: 2, requeue: false },
                Frame::Ack { tag: 3, multiple: false },
                Frame::Ack { tag: 4, multiple: false },
            ]
        );
        let frames: Vec<Frame> = plan(&[(1, Fate::Requeue)], &in_flight).into_iter().map(|f| f.0).collect();
        assert_eq!(frames, vec![Frame::Nack { tag: 1, requeue: true }]);
        assert!(in_flight.lock().unwrap().is_empty());
    }
}
