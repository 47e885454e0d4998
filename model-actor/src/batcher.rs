//! The queue of one actor group: the mailbox its runner threads share. The async
//! side pushes a request (admitted or refused at once, under the queue's lock) and
//! awaits one reply; a runner that is free takes the next batch itself, formed by
//! the pure planner in `batching`. A request crosses threads twice: into the queue,
//! and back with its answer. With `[batching] inline_below_us`, a request that finds
//! the queue empty may instead be computed by its caller (`Queue::inline_ok`).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::batching::{admit, decide, triage, Cost, Decision, Drop, Load, Policy, Waiting};
use crate::error::ModelError;
use crate::runner::Output;
use crate::stats::Meters;

/// A request waiting for its batch. Holding it holds one admission permit, so
/// the permit returns when the request is answered or dropped.
pub struct Pending {
    pub data: Vec<f32>,
    pub rows: usize,
    pub enqueued_at: Instant,
    pub deadline: Instant,
    pub reply: oneshot::Sender<Result<Output, ModelError>>,
    pub span: tracing::Span,
    pub(crate) _permit: OwnedSemaphorePermit,
}

impl Pending {
    fn waiting(&self) -> Waiting {
        Waiting {
            rows: self.rows,
            enqueued_at: self.enqueued_at,
            deadline: self.deadline,
            cancelled: self.reply.is_closed(),
        }
    }
}

/// Why a request was not queued.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The group is stopping.
    Closed,
    /// Its answer is expected after its deadline.
    Deadline {
        expected: Duration,
        remaining: Duration,
        load: Load,
    },
}

struct State {
    waiting: VecDeque<Pending>,
    rows_waiting: usize,
    /// The batch each runner (by slot) computes, if any: when it started, its rows.
    running: Vec<Option<(Instant, usize)>>,
    /// What a batch costs (learned): admission's unit of work, and the time kept
    /// free before a member's deadline when a batch waits for company.
    cost: Cost,
    /// Runners asleep for want of work (not those waiting for a batch to fill).
    asleep: usize,
    /// How long a runner that ran out of work waits for the next request, smoothed
    /// (weight 1/8 on the newest; the first is taken as it is). A runner spins only
    /// while this is within `policy.idle_spin`: when requests come further apart, a
    /// spin would mostly end empty-handed, its CPU taken from the serving threads.
    idle_gap: Option<Duration>,
    closed: bool,
}

impl State {
    fn load(&self, now: Instant, rows: usize, max_batch_size: usize) -> Load {
        let mut busy = 0;
        let mut running_left = Duration::ZERO;
        for (started, n) in self.running.iter().flatten() {
            busy += 1;
            running_left += self
                .cost
                .time(*n)
                .saturating_sub(now.saturating_duration_since(*started));
        }
        let mut load = Load {
            rows_waiting: self.rows_waiting,
            rows,
            max_batch_size,
            runners: self.running.len(),
            busy,
            running_left,
            batch_time: self.cost.time(max_batch_size),
            own_batch: Duration::ZERO,
        };
        load.own_batch = self.cost.time(load.own_batch_rows());
        load
    }
}

pub(crate) struct Queue {
    state: Mutex<State>,
    /// Signalled when a request arrives or the queue closes.
    work: Condvar,
    policy: Policy,
    meters: Arc<Meters>,
    /// Requests ever queued: what a runner with nothing to do watches, without the
    /// lock, while it spins before sleeping.
    arrivals: AtomicU64,
}

impl Queue {
    /// A queue for `runners` runner threads; `policy.compute_reserve` is the first
    /// batch-time estimate, before any batch ran.
    pub fn new(policy: Policy, runners: usize, meters: Arc<Meters>) -> Self {
        Self {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                rows_waiting: 0,
                running: vec![None; runners.max(1)],
                cost: Cost::new(policy.compute_reserve),
                asleep: 0,
                idle_gap: None,
                closed: false,
            }),
            work: Condvar::new(),
            policy,
            meters,
            arrivals: AtomicU64::new(0),
        }
    }

    /// Queues `p` unless its answer is expected after its deadline (see
    /// [`admit`]); a refused request is dropped here, its permit with it.
    pub fn push(&self, p: Pending) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut s = self.state.lock();
        if s.closed {
            return Err(Refusal::Closed);
        }
        let load = s.load(now, p.rows, self.policy.max_batch_size);
        let remaining = p.deadline.saturating_duration_since(now);
        if let Err(expected) = admit(&load, remaining) {
            drop(s);
            self.meters.cannot_meet_deadline.increment(1);
            return Err(Refusal::Deadline {
                expected,
                remaining,
                load,
            });
        }
        s.rows_waiting += p.rows;
        s.waiting.push_back(p);
        self.arrivals.fetch_add(1, Ordering::Release);
        let len = s.waiting.len();
        drop(s);
        self.meters.queue_length.set(len as f64);
        self.work.notify_one();
        Ok(())
    }

    /// Whether a request of `rows` rows with `deadline` would be admitted now (the
    /// rule of [`Queue::push`], without queueing anything).
    pub fn would_admit(&self, rows: usize, deadline: Instant) -> Result<(), Refusal> {
        let now = Instant::now();
        let s = self.state.lock();
        if s.closed {
            return Err(Refusal::Closed);
        }
        let load = s.load(now, rows, self.policy.max_batch_size);
        drop(s);
        let remaining = deadline.saturating_duration_since(now);
        admit(&load, remaining).map_err(|expected| Refusal::Deadline {
            expected,
            remaining,
            load,
        })
    }

    /// Whether a request of `rows` rows with `deadline` may be computed on its
    /// caller's thread now, instead of queued: the queue is open and empty (no
    /// request is passed over, no batch loses a member) and a batch of its rows is
    /// expected to take at most `limit`, and to end before `deadline`.
    pub fn inline_ok(&self, rows: usize, limit: Duration, deadline: Instant) -> bool {
        let now = Instant::now();
        let s = self.state.lock();
        let cost = s.cost.time(rows);
        !s.closed && s.waiting.is_empty() && cost <= limit && now + cost <= deadline
    }

    /// A batch of `rows` rows computed outside the runners (on a caller's thread)
    /// took `took`: what the cost estimate learns from, as from a runner's batch.
    pub fn observe(&self, rows: usize, took: Duration) {
        self.state.lock().cost.observe(rows, took);
    }

    /// For runner `slot`: its batch is done (`computed`: its rows and forward-pass
    /// time, if it ran one). Called before its callers are answered, so that a
    /// caller that sends again at once finds the runner free.
    pub fn finished(&self, slot: usize, computed: Option<(usize, Duration)>) {
        let mut s = self.state.lock();
        s.running[slot] = None;
        if let Some((rows, took)) = computed {
            s.cost.observe(rows, took);
        }
    }

    /// For runner `slot`: blocks until there is a batch for it. `None` once the
    /// queue closed. With nothing to do, the runner first spins for up to
    /// `policy.idle_spin` (yielding the CPU to any other thread that wants it), then
    /// sleeps until a request arrives: under load the next request usually comes
    /// within the spin, and taking it costs no sleep and no wake-up (two context
    /// switches, the largest cost of a small model's request on a busy machine).
    /// It spins only while the smoothed wait for work after running out is within
    /// the spin (see `State::idle_gap`): at a lower rate it sleeps at once.
    pub fn next_batch(&self, slot: usize) -> Option<Vec<Pending>> {
        let mut s = self.state.lock();
        let mut spun = self.policy.idle_spin.is_zero();
        // When this runner found the queue empty.
        let mut idle_since: Option<Instant> = None;
        // Whether this call's idle spell is counted (one outcome each).
        let mut counted = false;
        loop {
            if s.closed {
                return None;
            }
            let now = Instant::now();
            self.prune_head(&mut s, now);
            let policy = Policy {
                compute_reserve: s.cost.time(self.policy.max_batch_size),
                ..self.policy
            };
            match decide(s.waiting.iter().map(Pending::waiting), now, &policy) {
                Decision::Idle => {
                    idle_since.get_or_insert(now);
                    // Once a call, while requests come within the spin.
                    if !std::mem::replace(&mut spun, true)
                        && s.idle_gap.is_none_or(|g| g <= self.policy.idle_spin)
                    {
                        counted = true;
                        let seen = self.arrivals.load(Ordering::Acquire);
                        if MutexGuard::unlocked(&mut s, || self.spin(seen)) {
                            self.meters.idle_spin_caught.increment(1);
                        } else {
                            self.meters.idle_spin_empty.increment(1);
                        }
                        continue;
                    }
                    if !std::mem::replace(&mut counted, true) {
                        self.meters.idle_slept.increment(1);
                    }
                    s.asleep += 1;
                    self.work.wait(&mut s);
                    s.asleep -= 1;
                }
                Decision::WaitUntil(at) => {
                    self.work.wait_until(&mut s, at);
                }
                Decision::Dispatch { count, rows } => {
                    let items: Vec<Pending> = s.waiting.drain(..count).collect();
                    s.rows_waiting -= rows;
                    if let Some(since) = idle_since {
                        let gap = items[0].enqueued_at.saturating_duration_since(since);
                        s.idle_gap = Some(s.idle_gap.map_or(gap, |g| (g * 7 + gap) / 8));
                    }
                    s.running[slot] = Some((now, rows));
                    let len = s.waiting.len();
                    drop(s);
                    self.meters.queue_length.set(len as f64);
                    return Some(items);
                }
            }
        }
    }

    /// Spins for up to `policy.idle_spin` or until a request arrives after
    /// `seen` arrivals (or the queue closes), yielding between looks. Whether
    /// something arrived.
    fn spin(&self, seen: u64) -> bool {
        let until = Instant::now() + self.policy.idle_spin;
        loop {
            if self.arrivals.load(Ordering::Acquire) != seen {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Runners asleep for want of work now (not spinning, not computing).
    #[cfg(test)]
    pub(crate) fn asleep(&self) -> usize {
        self.state.lock().asleep
    }

    /// Drops the requests among those the next batch would take that are dead
    /// (caller gone, deadline passed) or would be answered late (a batch started now
    /// would end after their deadline), so that the planner sees only ones worth
    /// computing. Requests further back are looked at when they come up. The last
    /// request of the queue is never dropped as "would be late": the runner has
    /// nothing better to do, and running it corrects a cost estimate that an
    /// outlier spoiled (were every request dropped on it, nothing would run again).
    fn prune_head(&self, s: &mut State, now: Instant) {
        let batch_time = s.cost.time(s.rows_waiting.min(self.policy.max_batch_size));
        let mut i = 0;
        let mut rows = 0;
        while i < s.waiting.len() && rows < self.policy.max_batch_size {
            let w = s.waiting[i].waiting();
            let why = match triage(&w, now, batch_time) {
                Some(Drop::WouldBeLate) if s.waiting.len() == 1 => None,
                other => other,
            };
            let Some(why) = why else {
                rows += w.rows;
                i += 1;
                continue;
            };
            let Some(p) = s.waiting.remove(i) else { break };
            s.rows_waiting -= p.rows;
            let answer = match why {
                Drop::Expired => "while waiting in the batch queue",
                Drop::WouldBeLate => "before its batch could finish (dropped from the batch queue)",
                Drop::Cancelled => {
                    self.meters.cancelled.increment(1);
                    continue;
                }
            };
            self.meters.expired.increment(1);
            let _ = p.reply.send(Err(ModelError::DeadlineExceeded(answer)));
        }
    }

    /// Stops the runners once they finish the batch in hand; requests still waiting
    /// are dropped (their callers get `Unavailable`).
    pub fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        self.arrivals.fetch_add(1, Ordering::Release);
        s.waiting.clear();
        s.rows_waiting = 0;
        drop(s);
        self.meters.queue_length.set(0.0);
        self.work.notify_all();
    }

    /// The expected time of a batch of `rows` rows now.
    pub fn batch_time(&self, rows: usize) -> Duration {
        self.state.lock().cost.time(rows)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use tokio::sync::Semaphore;

    use super::*;

    fn queue(idle_spin: Duration) -> Arc<Queue> {
        let policy = Policy {
            max_batch_size: 4,
            max_queue_delay: Duration::ZERO,
            compute_reserve: Duration::from_micros(50),
            idle_spin,
        };
        Arc::new(Queue::new(
            policy,
            1,
            Arc::new(Meters::new("m", 1, 0, false)),
        ))
    }

    fn pending() -> (Pending, oneshot::Receiver<Result<Output, ModelError>>) {
        let (reply, rx) = oneshot::channel();
        let p = Pending {
            data: vec![0.0],
            rows: 1,
            enqueued_at: Instant::now(),
            deadline: Instant::now() + Duration::from_secs(60),
            reply,
            span: tracing::Span::none(),
            _permit: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
        };
        (p, rx)
    }

    /// Starts a runner's `next_batch` on a thread; the instant it started comes back
    /// first, then the batch's size (`None`: the queue closed).
    fn runner(q: &Arc<Queue>) -> (Instant, thread::JoinHandle<Option<usize>>) {
        let (tx, rx) = mpsc::channel();
        let q = q.clone();
        let t = thread::spawn(move || {
            let _ = tx.send(Instant::now());
            q.next_batch(0).map(|b| b.len())
        });
        (rx.recv().unwrap(), t)
    }

    /// Queues one request and checks that the runner `t` takes it, alone.
    fn feed(q: &Queue, t: thread::JoinHandle<Option<usize>>) {
        let (p, _rx) = pending();
        q.push(p).unwrap();
        assert_eq!(t.join().unwrap(), Some(1));
    }

    /// Polls until a runner sleeps (within 10 s); when it fell asleep.
    fn asleep_at(q: &Queue) -> Instant {
        let give_up = Instant::now() + Duration::from_secs(10);
        while q.asleep() == 0 {
            assert!(Instant::now() < give_up, "the runner never went to sleep");
            thread::sleep(Duration::from_millis(1));
        }
        Instant::now()
    }

    #[test]
    fn an_idle_runner_spins_before_it_sleeps_and_takes_what_arrives_meanwhile() {
        let spin = Duration::from_millis(400);
        let q = queue(spin);
        // A request that arrives during the spin is taken by the spinning runner,
        // which never slept.
        let (_, t) = runner(&q);
        thread::sleep(Duration::from_millis(50));
        assert_eq!(q.asleep(), 0);
        feed(&q, t);
        // With nothing arriving, it sleeps once the spin is over, not before.
        let (started, t) = runner(&q);
        let slept = asleep_at(&q);
        assert!(
            slept - started >= spin,
            "asleep after {:?}, before the spin of {spin:?} was over",
            slept - started
        );
        // Closing wakes it: no batch.
        q.close();
        assert_eq!(t.join().unwrap(), None);
    }

    #[test]
    fn without_a_spin_an_idle_runner_sleeps_at_once_and_wakes_for_a_request() {
        let q = queue(Duration::ZERO);
        let (started, t) = runner(&q);
        let slept = asleep_at(&q);
        assert!(slept - started < Duration::from_secs(2));
        feed(&q, t);
        assert_eq!(q.asleep(), 0);
    }

    #[test]
    fn a_runner_spins_only_while_requests_come_within_the_spin() {
        let spin = Duration::from_millis(500);
        let q = queue(spin);
        // The next request came 1.5 s after the runner ran out of work.
        let (_, t) = runner(&q);
        thread::sleep(Duration::from_millis(1500));
        feed(&q, t);
        // So it no longer spins: out of work, it sleeps at once.
        let (started, t) = runner(&q);
        let slept = asleep_at(&q);
        assert!(
            slept - started < spin,
            "spun for {:?} though requests come 1.5 s apart",
            slept - started
        );
        feed(&q, t);
        // Requests coming a few milliseconds apart bring the spin back.
        for _ in 0..14 {
            let (_, t) = runner(&q);
            thread::sleep(Duration::from_millis(5));
            feed(&q, t);
        }
        let (started, t) = runner(&q);
        let slept = asleep_at(&q);
        assert!(
            slept - started >= spin,
            "asleep after {:?} though requests come 5 ms apart",
            slept - started
        );
        q.close();
        assert_eq!(t.join().unwrap(), None);
    }

    /// Counts the `outcome` of each [`names::RUNNER_IDLE`] counter registered with it.
    #[derive(Default)]
    struct Outcomes(Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>);

    impl Outcomes {
        fn get(&self, outcome: &str) -> u64 {
            self.0
                .lock()
                .get(outcome)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        }
    }

    impl metrics::Recorder for Outcomes {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            if key.name() != crate::stats::names::RUNNER_IDLE {
                return metrics::Counter::noop();
            }
            let outcome = key
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            metrics::Counter::from_arc(self.0.lock().entry(outcome).or_default().clone())
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    #[test]
    fn each_idle_spell_is_counted_by_its_outcome() {
        let counts = Outcomes::default();
        let q = metrics::with_local_recorder(&counts, || queue(Duration::from_millis(300)));
        // A request during the spin: caught.
        let (_, t) = runner(&q);
        thread::sleep(Duration::from_millis(30));
        feed(&q, t);
        assert_eq!(
            (
                counts.get("spin_caught"),
                counts.get("spin_empty"),
                counts.get("slept")
            ),
            (1, 0, 0)
        );
        // Nothing during the spin: empty, then asleep (not counted twice).
        let (_, t) = runner(&q);
        asleep_at(&q);
        feed(&q, t);
        assert_eq!(
            (
                counts.get("spin_caught"),
                counts.get("spin_empty"),
                counts.get("slept")
            ),
            (1, 1, 0)
        );
        // With the spin off: slept.
        let counts = Outcomes::default();
        let q = metrics::with_local_recorder(&counts, || queue(Duration::ZERO));
        let (_, t) = runner(&q);
        asleep_at(&q);
        feed(&q, t);
        assert_eq!(
            (
                counts.get("spin_caught"),
                counts.get("spin_empty"),
                counts.get("slept")
            ),
            (0, 0, 1)
        );
    }

    #[test]
    fn inline_only_on_an_open_empty_queue_cheap_enough_and_in_time() {
        let q = queue(Duration::ZERO);
        let (limit, far) = (
            Duration::from_micros(100),
            Instant::now() + Duration::from_secs(60),
        );
        // The first guess of a batch's cost is 50 µs (`compute_reserve`).
        assert!(q.inline_ok(1, limit, far));
        assert!(!q.inline_ok(1, Duration::from_micros(49), far));
        assert!(!q.inline_ok(1, limit, Instant::now() + Duration::from_micros(10)));
        // A batch learned to take 2 ms per row is over the limit.
        q.observe(1, Duration::from_millis(2));
        assert!(!q.inline_ok(1, limit, far));
        let q = queue(Duration::ZERO);
        // Something waiting: it would be passed over.
        let (p, _rx) = pending();
        q.push(p).unwrap();
        assert!(!q.inline_ok(1, limit, far));
        let q = queue(Duration::ZERO);
        q.close();
        assert!(!q.inline_ok(1, limit, far));
    }

    #[test]
    fn closing_ends_a_spin_at_once() {
        let q = queue(Duration::from_secs(30));
        let (started, t) = runner(&q);
        thread::sleep(Duration::from_millis(20));
        q.close();
        assert_eq!(t.join().unwrap(), None);
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
