//! The queue of one actor group: the mailbox its runner threads share. The async
//! side pushes a request (admitted or refused at once, under the queue's lock) and
//! awaits one reply; a runner that is free takes the next batch itself, formed by
//! the pure planner in `batching`. A request crosses threads twice: into the queue,
//! and back with its answer.
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
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
                closed: false,
            }),
            work: Condvar::new(),
            policy,
            meters,
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
    /// queue closed.
    pub fn next_batch(&self, slot: usize) -> Option<Vec<Pending>> {
        let mut s = self.state.lock();
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
                Decision::Idle => self.work.wait(&mut s),
                Decision::WaitUntil(at) => {
                    self.work.wait_until(&mut s, at);
                }
                Decision::Dispatch { count, rows } => {
                    let items: Vec<Pending> = s.waiting.drain(..count).collect();
                    s.rows_waiting -= rows;
                    s.running[slot] = Some((now, rows));
                    let len = s.waiting.len();
                    drop(s);
                    self.meters.queue_length.set(len as f64);
                    return Some(items);
                }
            }
        }
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
