//! Attempts in flight per endpoint, under a limit that follows how the
//! endpoint answers (additive increase, multiplicative decrease).
//!
//! An endpoint starts with [`FIRST_LIMIT`] slots. Each success adds one, up
//! to `DISPATCHER_ENDPOINT_CONCURRENCY`; a sign of overload (a timeout, a
//! refused connection, a 429 or a 503) halves the limit, down to one. Only an
//! attempt that started after the last halving may halve it again, so the
//! answers to one burst of attempts count once. A hanging endpoint so ends
//! up holding one slot of the dispatcher instead of all it could take, while
//! a healthy one reaches the ceiling within a few dozen successes.
//!
//! A message that finds its endpoint full waits for a slot only while one
//! is expected within `ENDPOINT_SLOT_WAIT`, judged by the endpoint's recent
//! attempt durations and the messages already waiting, and only if a slot
//! was freed within the last such wait. Otherwise the caller puts it back:
//! in a retry queue when slots free at a known pace, just not in time
//! ([`Full::Busy`]), and also when the endpoint frees none in time but
//! answered a success within the last `DELIVERY_TIMEOUT` (it is slow, not
//! hung); set aside in the store when it frees none (nothing freed for a
//! whole wait, or a wait went by in vain) and has not succeeded for that
//! long ([`Full::Hung`]), until its next success or a due time that grows
//! the longer it hangs. A hanging endpoint's backlog therefore waits outside
//! the dispatcher's slots, and outside the broker.
//!
//! Waiting messages hold the dispatcher's handlers and its prefetch window.
//! While they fill half of its handlers and other endpoints answer, an
//! endpoint that does not answer is judged hung after a quarter of the wait
//! ([`CROWDED_SHARE`]), and the messages already waiting there are set aside
//! too: the first second of a dispatcher that starts on a backlog mixed with
//! hanging endpoints does not go by with its window full of their messages.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

/// The limit of an endpoint the dispatcher has not heard from yet.
pub const FIRST_LIMIT: usize = 4;

/// How long an endpoint that does not answer counts as hung after it freed
/// no slot in time: its messages are set aside at once meanwhile.
const SATURATED_FOR: Duration = Duration::from_secs(5);

/// While waiting messages crowd the dispatcher, a full endpoint that does
/// not answer is hung after freeing nothing for this share of the wait.
const CROWDED_SHARE: u32 = 4;

/// The weight of the newest attempt in an endpoint's mean duration.
const DURATION_WEIGHT: f64 = 0.25;

/// Endpoints remembered before the idle ones are forgotten.
const REMEMBERED: usize = 10_000;

/// Why a message found no slot at its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Slots free at a known pace, not in time for this message.
    Busy,
    /// The endpoint frees no slots: it has hung for `since` (from the first
    /// such verdict after its last success). `recoveries`: see
    /// [`Slots::recovered_since`].
    Hung { since: Duration, recoveries: u64 },
}

/// What an attempt's outcome says about the endpoint's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A 2xx: room for one more attempt at once.
    Success,
    /// A timeout, a refused connection, a 429 or a 503: too many at once.
    Overload,
    /// Anything else (a 4xx, a 500, a TLS failure): no sign either way.
    Neither,
}

impl Signal {
    /// The signal of an attempt that answered `status` or failed with
    /// `error` (the codes of `deliver::Attempt`).
    pub fn of(succeeded: bool, status: Option<u16>, error: Option<&str>) -> Signal {
        match (succeeded, status, error) {
            (true, _, _) => Signal::Success,
            (_, Some(429 | 503), _) | (_, _, Some("timeout" | "connect")) => Signal::Overload,
            _ => Signal::Neither,
        }
    }
}

/// The slots of every endpoint this dispatcher has sent to.
#[derive(Debug)]
pub struct Slots {
    ceiling: usize,
    wait: Duration,
    /// An endpoint that answered a success within this long is not hung.
    answered_within: Duration,
    endpoints: Mutex<Endpoints>,
    crowd: Arc<Crowd>,
}

/// What the endpoints share: how many of the dispatcher's handlers wait
/// for a slot, and whether any endpoint answers.
#[derive(Debug)]
struct Crowd {
    /// Messages waiting for a slot, at any endpoint.
    waiting: AtomicUsize,
    /// Half the dispatcher's handlers: more messages waiting than this crowd
    /// out those of the endpoints that answer.
    threshold: usize,
    started: Instant,
    /// When an endpoint last answered a success, in milliseconds since
    /// `started` (0: none yet).
    succeeded_ms: AtomicU64,
}

impl Crowd {
    fn now_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.duration_since(self.started).as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Whether messages waiting for slots hold half the handlers while some
    /// endpoint answered a success within `within`.
    fn crowded(&self, now: Instant, within: Duration) -> bool {
        let succeeded = self.succeeded_ms.load(Ordering::Relaxed);
        self.waiting.load(Ordering::Relaxed) >= self.threshold
            && succeeded > 0
            && Duration::from_millis(self.now_ms(now).saturating_sub(succeeded)) < within
    }
}

#[derive(Debug, Default)]
struct Endpoints {
    all: HashMap<String, Arc<Endpoint>>,
    /// The count above which idle endpoints are forgotten next.
    prune_at: usize,
}

#[derive(Debug)]
struct Endpoint {
    ceiling: usize,
    state: Mutex<State>,
    /// Notified once when a slot is freed, and to every waiting message
    /// when the endpoint is found hung.
    freed: Notify,
    crowd: Arc<Crowd>,
}

#[derive(Debug)]
struct State {
    limit: usize,
    in_flight: usize,
    waiting: usize,
    /// When the limit was last halved.
    lowered_at: Option<Instant>,
    /// Until when its messages are set aside at once (see [`SATURATED_FOR`]).
    saturated_until: Option<Instant>,
    /// When the endpoint was first found hung since its last success.
    hung_since: Option<Instant>,
    /// When it last answered a success.
    succeeded_at: Option<Instant>,
    /// How often a success followed a hang.
    recoveries: u64,
    /// When a slot was last freed, or the endpoint last went from idle to
    /// busy: a full endpoint that freed nothing for a whole wait has
    /// attempts that hang, and frees nothing in time for a waiting message.
    progress_at: Instant,
    /// Mean duration of the endpoint's recent attempts, in seconds.
    mean_secs: Option<f64>,
}

impl Endpoint {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free slot, if any; a newcomer (`queued` false) takes none while
    /// messages wait, so a freed slot goes to one that waited.
    fn try_take(self: &Arc<Self>, queued: bool) -> Option<Slot> {
        let mut state = self.state();
        if state.in_flight >= state.limit || (!queued && state.waiting > 0) {
            return None;
        }
        if state.in_flight == 0 {
            state.progress_at = Instant::now();
        }
        state.in_flight += 1;
        Some(Slot { endpoint: self.clone(), started: Instant::now() })
    }

    /// The endpoint that does not answer freed nothing in time: it is hung,
    /// and its messages are set aside at once for a while, those already
    /// waiting included.
    fn saturate(&self, mut state: MutexGuard<'_, State>, now: Instant) -> Full {
        let newly = !state.saturated(now);
        state.saturated_until = Some(now + SATURATED_FOR);
        let hung = state.hung(now);
        drop(state);
        if newly {
            self.freed.notify_waiters();
        }
        hung
    }
}

/// What a message that finds its endpoint full learns of an endpoint that
/// does not answer.
enum Verdict {
    /// A slot may still come in time.
    Wait,
    /// Found hung lately: set aside.
    Hung,
    /// Found hung now.
    Saturate,
}

impl State {
    /// Whether the endpoint answered a success within `within`: then it
    /// is slow when it frees nothing in time, not hung.
    fn answering(&self, now: Instant, within: Duration) -> bool {
        self.succeeded_at.is_some_and(|at| now.duration_since(at) < within)
    }

    fn saturated(&self, now: Instant) -> bool {
        self.saturated_until.is_some_and(|until| until > now)
    }

    fn hung(&mut self, now: Instant) -> Full {
        let since = now.duration_since(*self.hung_since.get_or_insert(now));
        Full::Hung { since, recoveries: self.recoveries }
    }
}

/// A message counted among an endpoint's waiting ones, until dropped (also
/// when its handler is dropped mid-wait).
struct Waiter<'a>(&'a Arc<Endpoint>);

impl<'a> Waiter<'a> {
    fn new(endpoint: &'a Arc<Endpoint>, state: &mut State) -> Waiter<'a> {
        state.waiting += 1;
        endpoint.crowd.waiting.fetch_add(1, Ordering::Relaxed);
        Waiter(endpoint)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.state().waiting -= 1;
        self.0.crowd.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One attempt's slot at its endpoint, freed when dropped.
#[derive(Debug)]
pub struct Slot {
    endpoint: Arc<Endpoint>,
    started: Instant,
}

impl Slot {
    /// The attempt starts now (after any wait for its pace): its duration,
    /// which the endpoint's mean follows, counts from here.
    pub fn begin(&mut self) {
        self.started = Instant::now();
    }

    /// Adjusts the endpoint's limit by the outcome of the attempt made in
    /// this slot. True for the first success after the endpoint was found
    /// hung: what was set aside behind it may go again.
    pub fn report(&self, signal: Signal) -> bool {
        let now = Instant::now();
        let mut state = self.endpoint.state();
        let secs = now.duration_since(self.started).as_secs_f64();
        state.mean_secs = Some(match state.mean_secs {
            Some(mean) => mean + DURATION_WEIGHT * (secs - mean),
            None => secs,
        });
        let mut recovered = false;
        if signal == Signal::Success {
            let crowd = &self.endpoint.crowd;
            crowd.succeeded_ms.store(crowd.now_ms(now), Ordering::Relaxed);
            state.succeeded_at = Some(now);
            recovered = state.hung_since.take().is_some();
            state.recoveries += u64::from(recovered);
        }
        match signal {
            Signal::Success if state.limit < self.endpoint.ceiling => {
                state.limit += 1;
                drop(state);
                self.endpoint.freed.notify_one();
            }
            Signal::Overload if state.lowered_at.is_none_or(|at| self.started >= at) => {
                state.limit = (state.limit / 2).max(1);
                state.lowered_at = Some(now);
            }
            Signal::Success | Signal::Overload | Signal::Neither => {}
        }
        recovered
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.endpoint.state();
        state.in_flight -= 1;
        state.progress_at = Instant::now();
        drop(state);
        self.endpoint.freed.notify_one();
    }
}

impl Slots {
    /// `ceiling`: `DISPATCHER_ENDPOINT_CONCURRENCY`; `wait`:
    /// `ENDPOINT_SLOT_WAIT`; `answered_within`: `DELIVERY_TIMEOUT`;
    /// `handlers`: the messages the dispatcher handles at once.
    pub fn new(ceiling: usize, wait: Duration, answered_within: Duration, handlers: usize) -> Slots {
        let crowd = Crowd {
            waiting: AtomicUsize::new(0),
            threshold: (handlers / 2).max(1),
            started: Instant::now(),
            succeeded_ms: AtomicU64::new(0),
        };
        Slots {
            ceiling: ceiling.max(1),
            wait,
            answered_within,
            endpoints: Mutex::new(Endpoints { all: HashMap::new(), prune_at: REMEMBERED }),
            crowd: Arc::new(crowd),
        }
    }

    fn endpoint(&self, endpoint_id: &str) -> Arc<Endpoint> {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(PoisonError::into_inner);
        // Known endpoints (nearly every delivery) cost no allocation.
        if let Some(endpoint) = endpoints.all.get(endpoint_id) {
            return endpoint.clone();
        }
        if endpoints.all.len() > endpoints.prune_at {
            // Forget endpoints with nothing under way and nothing learned
            // that matters: a throttled, saturated or hung one keeps its
            // state.
            let now = Instant::now();
            endpoints.all.retain(|_, endpoint| {
                let state = endpoint.state();
                Arc::strong_count(endpoint) > 1
                    || state.limit < FIRST_LIMIT
                    || state.saturated_until.is_some_and(|until| until > now)
                    || state.hung_since.is_some()
            });
            endpoints.prune_at = (endpoints.all.len() * 2).max(REMEMBERED);
        }
        endpoints
            .all
            .entry(endpoint_id.to_owned())
            .or_insert_with(|| {
                Arc::new(Endpoint {
                    ceiling: self.ceiling,
                    state: Mutex::new(State {
                        limit: FIRST_LIMIT.min(self.ceiling),
                        in_flight: 0,
                        waiting: 0,
                        lowered_at: None,
                        saturated_until: None,
                        hung_since: None,
                        succeeded_at: None,
                        recoveries: 0,
                        progress_at: Instant::now(),
                        mean_secs: None,
                    }),
                    freed: Notify::new(),
                    crowd: self.crowd.clone(),
                })
            })
            .clone()
    }

    /// A slot at the endpoint, or why the message is better put back: the
    /// endpoint is full and not expected to free a slot in time.
    pub async fn take(&self, endpoint_id: &str) -> Result<Slot, Full> {
        let endpoint = self.endpoint(endpoint_id);
        if let Some(slot) = endpoint.try_take(false) {
            return Ok(slot);
        }
        let waiter = {
            let mut state = endpoint.state();
            let now = Instant::now();
            let answering = state.answering(now, self.answered_within);
            match self.verdict(&state, now) {
                Verdict::Wait => {}
                Verdict::Hung => return Err(state.hung(now)),
                Verdict::Saturate => return Err(endpoint.saturate(state, now)),
            }
            // Slots free at about `limit / mean` a second; this message
            // comes after the ones already waiting. An endpoint that
            // answers below its ceiling gains a slot with every answer (a
            // dispatcher that just started, whose first attempts were slowed
            // by their handshakes), so that says too little: it waits.
            let growing = answering && state.limit < self.ceiling;
            let expected = state.mean_secs.map(|mean| mean * (state.waiting + 1) as f64 / state.limit as f64);
            if !growing && expected.is_some_and(|secs| secs > self.wait.as_secs_f64()) {
                return Err(Full::Busy);
            }
            Waiter::new(&endpoint, &mut state)
        };
        let slot = self.wait_for(&endpoint).await;
        drop(waiter);
        slot
    }

    /// Whether a message may wait at the full endpoint, judged by how it
    /// answers: an endpoint that answered a success lately always may (it
    /// is slow, not hung). One that did not is hung when it was found hung
    /// lately, freed nothing for a whole wait, or, while waiting messages
    /// crowd the dispatcher and other endpoints answer, freed nothing for a
    /// share of it.
    fn verdict(&self, state: &State, now: Instant) -> Verdict {
        if state.answering(now, self.answered_within) {
            return Verdict::Wait;
        }
        if state.saturated(now) {
            return Verdict::Hung;
        }
        let idle = now.duration_since(state.progress_at);
        let crowded = || self.crowd.crowded(now, self.wait);
        // Nothing freed for a whole wait: the first attempts of an endpoint
        // that hangs, before any of them has ended.
        if idle > self.wait || (idle >= self.wait / CROWDED_SHARE && crowded()) {
            return Verdict::Saturate;
        }
        Verdict::Wait
    }

    /// Waits for a slot at the endpoint until the wait is over, looking
    /// again at the endpoint's verdict at least every share of the wait (the
    /// dispatcher may become crowded meanwhile).
    async fn wait_for(&self, endpoint: &Arc<Endpoint>) -> Result<Slot, Full> {
        let deadline = Instant::now() + self.wait;
        let share = self.wait / CROWDED_SHARE;
        loop {
            let freed = endpoint.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = endpoint.try_take(true) {
                return Ok(slot);
            }
            let next = {
                let now = Instant::now();
                let mut state = endpoint.state();
                match self.verdict(&state, now) {
                    Verdict::Wait if now >= deadline => {
                        // A wait in vain: slow if it answered lately, else hung.
                        return Err(match state.answering(now, self.answered_within) {
                            true => Full::Busy,
                            false => endpoint.saturate(state, now),
                        });
                    }
                    Verdict::Wait => {}
                    Verdict::Hung => return Err(state.hung(now)),
                    Verdict::Saturate => return Err(endpoint.saturate(state, now)),
                }
                // The next look: when the endpoint will have freed nothing
                // for a share of the wait, or a share from now once it has.
                let idle_at_share = state.progress_at + share;
                let next = if idle_at_share > now { idle_at_share } else { now + share };
                next.min(deadline)
            };
            let _ = tokio::time::timeout_at(next, freed).await;
        }
    }

    /// Whether the endpoint succeeded after a hang since a verdict that
    /// counted `recoveries`: a message set aside by that verdict whose write
    /// ended after that success's release is released by its own handler.
    pub fn recovered_since(&self, endpoint_id: &str, recoveries: u64) -> bool {
        self.endpoint(endpoint_id).state().recoveries != recoveries
    }

    /// The endpoint's current limit.
    #[cfg(test)]
    fn limit(&self, endpoint_id: &str) -> usize {
        self.endpoint(endpoint_id).state().limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `DELIVERY_TIMEOUT`.
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// `DISPATCHER_CONCURRENCY`.
    const HANDLERS: usize = 256;

    fn limit_after(slots: &Slots, signals: &[Signal]) -> usize {
        for signal in signals {
            let slot = slots.endpoint("e").try_take(false).expect("a free slot");
            slot.report(*signal);
        }
        slots.limit("e")
    }

    #[test]
    fn successes_raise_the_limit_up_to_the_ceiling() {
        let slots = Slots::new(6, Duration::from_secs(1), TIMEOUT, HANDLERS);
        assert_eq!(slots.limit("e"), FIRST_LIMIT);
        assert_eq!(limit_after(&slots, &[Signal::Success]), FIRST_LIMIT + 1);
        assert_eq!(limit_after(&slots, &[Signal::Success; 10]), 6);
        assert_eq!(Slots::new(2, Duration::from_secs(1), TIMEOUT, HANDLERS).limit("e"), 2, "never above the ceiling");
    }

    #[test]
    fn overload_halves_the_limit_once_per_burst() {
        let slots = Slots::new(32, Duration::from_secs(1), TIMEOUT, HANDLERS);
        limit_after(&slots, &[Signal::Success; 28]);
        assert_eq!(slots.limit("e"), 32);
        // Four attempts under way when the endpoint starts to time out.
        let endpoint = slots.endpoint("e");
        let burst: Vec<Slot> = (0..4).map(|_| endpoint.try_take(false).unwrap()).collect();
        for slot in &burst {
            slot.report(Signal::Overload);
        }
        assert_eq!(slots.limit("e"), 16, "the burst counts once");
        drop(burst);
        // Later attempts, each started after the last halving.
        assert_eq!(limit_after(&slots, &[Signal::Overload; 3]), 2);
        assert_eq!(limit_after(&slots, &[Signal::Overload; 5]), 1, "never below one");
        assert_eq!(limit_after(&slots, &[Signal::Neither; 5]), 1);
        assert_eq!(limit_after(&slots, &[Signal::Success; 3]), 4, "and it recovers");
    }

    #[test]
    fn signals_of_outcomes() {
        assert_eq!(Signal::of(true, Some(200), None), Signal::Success);
        assert_eq!(Signal::of(false, Some(429), None), Signal::Overload);
        assert_eq!(Signal::of(false, Some(503), None), Signal::Overload);
        assert_eq!(Signal::of(false, None, Some("timeout")), Signal::Overload);
        assert_eq!(Signal::of(false, None, Some("connect")), Signal::Overload);
        assert_eq!(Signal::of(false, Some(500), None), Signal::Neither);
        assert_eq!(Signal::of(false, None, Some("tls")), Signal::Neither);
    }

    /// A message waiting for a slot of `e` (its only one held), on a task.
    async fn waiting_message(slots: &Arc<Slots>) -> tokio::task::JoinHandle<bool> {
        let waiter = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take("e").await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiter
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_the_waiting_message_not_a_newcomer() {
        let slots = Arc::new(Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS));
        let held = slots.take("e").await.expect("the first slot");
        let waiter = waiting_message(&slots).await;
        drop(held);
        // Freed, but owed to the waiting message: a newcomer gets none.
        assert!(slots.endpoint("e").try_take(false).is_none());
        assert!(waiter.await.unwrap(), "the freed slot went to the waiting message");
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_dropped_while_waiting_is_no_longer_counted() {
        let slots = Arc::new(Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS));
        let _held = slots.take("e").await.unwrap();
        let waiter = waiting_message(&slots).await;
        assert_eq!(slots.endpoint("e").state().waiting, 1);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(slots.endpoint("e").state().waiting, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_does_not_wait_for_a_slot_that_will_not_come_in_time() {
        let slots = Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS);
        // The endpoint's attempts take ten seconds (it hangs to the timeout).
        let slot = slots.take("e").await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        slot.report(Signal::Overload);
        drop(slot);
        let _held = slots.take("e").await.unwrap();
        let started = Instant::now();
        assert_eq!(slots.take("e").await.err(), Some(Full::Busy), "slots free, slowly");
        assert_eq!(started.elapsed(), Duration::ZERO, "parked at once, not after a wait");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_endpoint_that_freed_nothing_for_a_wait_parks_at_once() {
        let slots = Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS);
        // Idle for long, then busy: its first attempt may still free a slot.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let held = slots.take("e").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let waiter = slots.take("e");
        tokio::pin!(waiter);
        assert!(tokio::time::timeout(Duration::from_millis(100), waiter.as_mut()).await.is_err(), "it waits");
        drop(held);
        let _held = waiter.await.expect("the freed slot");
        // This attempt hangs: after a whole wait with nothing freed, a
        // message is parked at once rather than wait a second in vain.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let started = Instant::now();
        assert_eq!(slots.take("e").await.err(), Some(Full::Hung { since: Duration::ZERO, recoveries: 0 }));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_in_vain_marks_the_endpoint_saturated() {
        let slots = Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS);
        let _held = slots.take("e").await.unwrap();
        let started = Instant::now();
        assert_eq!(slots.take("e").await.err(), Some(Full::Hung { since: Duration::ZERO, recoveries: 0 }));
        assert_eq!(started.elapsed(), Duration::from_secs(1), "it waited for a slot first");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = Instant::now();
        let hung_for = Duration::from_secs(2);
        let hung = Full::Hung { since: hung_for, recoveries: 0 };
        assert_eq!(slots.take("e").await.err(), Some(hung), "hung since the first verdict");
        assert_eq!(again.elapsed(), Duration::ZERO, "then put back at once while saturated");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_endpoint_that_answered_lately_is_slow_not_hung() {
        let slots = Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS);
        let held = slots.take("e").await.unwrap();
        held.report(Signal::Success);
        // Its next attempt takes long; nothing is freed for a whole wait.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(slots.take("e").await.err(), Some(Full::Busy), "it answered 1.5 s ago");
        tokio::time::sleep(TIMEOUT).await;
        assert!(matches!(slots.take("e").await, Err(Full::Hung { .. })), "no success for a delivery timeout");
    }

    /// How long each of `waiting` messages waits at `e`, whose one attempt
    /// hangs, in a dispatcher of eight handlers: before them, endpoint `f`
    /// answered when `others_answer`.
    /// A fourth comes `late` when given.
    async fn waits_beside_a_hanging_endpoint(
        waiting: usize,
        others_answer: bool,
        late: Option<Duration>,
    ) -> Vec<(Duration, Full)> {
        let slots = Arc::new(Slots::new(1, Duration::from_secs(1), TIMEOUT, 8));
        if others_answer {
            slots.take("f").await.unwrap().report(Signal::Success);
        }
        let _hangs = slots.take("e").await.unwrap();
        let message = |after: Duration| {
            let slots = slots.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let started = Instant::now();
                let full = slots.take("e").await.expect_err("no slot");
                (started.elapsed(), full)
            })
        };
        let messages: Vec<_> = (0..waiting).map(|_| Duration::ZERO).chain(late).map(message).collect();
        let mut waits = Vec::new();
        for message in messages {
            waits.push(message.await.unwrap());
        }
        waits
    }

    #[tokio::test(start_paused = true)]
    async fn messages_crowding_the_dispatcher_at_a_hanging_endpoint_are_set_aside_sooner() {
        let hung = Full::Hung { since: Duration::ZERO, recoveries: 0 };
        // Half the handlers wait there while another endpoint answers: a
        // quarter of the wait, and all of them go at once.
        let quarter = Duration::from_millis(250);
        assert_eq!(waits_beside_a_hanging_endpoint(4, true, None).await, vec![(quarter, hung); 4]);
        // Three wait; a fourth, later, finds them crowding: it is set
        // aside at once, and so are they, without waiting out their wait.
        let late = Duration::from_millis(300);
        let waits = waits_beside_a_hanging_endpoint(3, true, Some(late)).await;
        assert_eq!(waits, [vec![(late, hung); 3], vec![(Duration::ZERO, hung)]].concat());
        // Fewer wait, or no other endpoint answers (a dispatcher starting
        // on one endpoint's backlog, slowed by its handshakes): the whole
        // wait, as it may still answer.
        let second = Duration::from_secs(1);
        assert_eq!(waits_beside_a_hanging_endpoint(3, true, None).await, vec![(second, hung); 3]);
        assert_eq!(waits_beside_a_hanging_endpoint(4, false, None).await, vec![(second, hung); 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn messages_waiting_at_a_hanging_endpoint_see_a_crowd_gather_elsewhere() {
        let slots = Arc::new(Slots::new(1, Duration::from_secs(1), TIMEOUT, 8));
        // `g` answered and is full: messages wait there (it is slow, not hung).
        let answered = slots.take("g").await.unwrap();
        answered.report(Signal::Success);
        let _hangs = slots.take("e").await.unwrap();
        let message = |endpoint: &'static str, after: Duration| {
            let slots = slots.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let started = Instant::now();
                (slots.take(endpoint).await.err(), started.elapsed())
            })
        };
        // Two wait at `e`, not a crowd yet; at 300 ms two more wait at `g`:
        // half the handlers. `e`'s messages see it at their next look.
        let at_e = [message("e", Duration::ZERO), message("e", Duration::ZERO)];
        let at_g = [message("g", Duration::from_millis(300)), message("g", Duration::from_millis(300))];
        for waiting in at_e {
            let hung = Full::Hung { since: Duration::ZERO, recoveries: 0 };
            assert_eq!(waiting.await.unwrap(), (Some(hung), Duration::from_millis(500)));
        }
        for waiting in at_g {
            waiting.abort();
        }
    }

    /// `e` full at a limit of 5 after one success, with attempts that took
    /// 10 s: a newcomer expects a wait of 2 s for a slot.
    async fn slow_first_answers(ceiling: usize) -> (Arc<Slots>, Vec<Slot>) {
        let slots = Arc::new(Slots::new(ceiling, Duration::from_secs(1), TIMEOUT, HANDLERS));
        let mut held: Vec<Slot> = (0..FIRST_LIMIT).map(|_| slots.endpoint("e").try_take(false).unwrap()).collect();
        tokio::time::sleep(Duration::from_secs(9)).await;
        held[0].report(Signal::Success);
        held.push(slots.endpoint("e").try_take(false).expect("a fifth slot"));
        (slots, held)
    }

    #[tokio::test(start_paused = true)]
    async fn an_answering_endpoint_below_its_ceiling_waits_however_slow_its_first_answers() {
        let (slots, mut held) = slow_first_answers(8).await;
        let waiter = waiting_message(&slots).await;
        drop(held.pop());
        assert!(waiter.await.unwrap(), "it waited for the next slot, not parked");
        // At its ceiling, its slots free at a known pace: parked at once.
        let (slots, _held) = slow_first_answers(FIRST_LIMIT + 1).await;
        assert_eq!(slots.take("e").await.err(), Some(Full::Busy));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_success_after_a_hang_says_the_endpoint_recovered() {
        let slots = Slots::new(1, Duration::from_secs(1), TIMEOUT, HANDLERS);
        let held = slots.take("e").await.unwrap();
        let Err(Full::Hung { recoveries, .. }) = slots.take("e").await else { panic!("not hung") };
        assert!(!held.report(Signal::Overload), "still hung");
        assert!(!slots.recovered_since("e", recoveries));
        assert!(held.report(Signal::Success), "recovered: release what was set aside");
        assert!(slots.recovered_since("e", recoveries), "a message set aside before may have missed the release");
        assert!(!held.report(Signal::Success), "once");
        drop(held);
        // Never hung: a success says nothing more.
        let other = slots.take("f").await.unwrap();
        assert!(!other.report(Signal::Success));
    }
}
