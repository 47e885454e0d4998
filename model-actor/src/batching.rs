//! Batch formation and admission as pure functions: whether a request can still be
//! answered in time, what to drop, when to dispatch, how many requests to take, and
//! how to glue rows together and split results apart. No threads, no candle: the
//! queue (`batcher`) calls these and tests call them directly.
use std::time::{Duration, Instant};

/// What the planner needs to know about a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub rows: usize,
    pub enqueued_at: Instant,
    pub deadline: Instant,
    /// The caller went away (its reply channel is closed).
    pub cancelled: bool,
}

/// Batching settings of one model version.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub max_batch_size: usize,
    /// How long the oldest request may wait for company; zero means never wait.
    pub max_queue_delay: Duration,
    /// Time a batch needs to run, kept free before a request's deadline: a request
    /// is dispatched no later than `deadline - compute_reserve`, and one that can no
    /// longer finish in time is dropped instead of computed.
    pub compute_reserve: Duration,
    /// How long a runner with nothing to do spins (yielding) before it sleeps.
    pub idle_spin: Duration,
}

/// Why a waiting request leaves the queue without being computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Its deadline passed.
    Expired,
    /// A batch started now (taking the expected batch time) would end after its
    /// deadline: computing it would spend the runner on an answer nobody takes.
    WouldBeLate,
    /// Its caller went away.
    Cancelled,
}

/// Whether a waiting request stays in the queue, a batch started `now` expected to
/// take `batch_time`.
pub fn triage(w: &Waiting, now: Instant, batch_time: Duration) -> Option<Drop> {
    if w.cancelled {
        Some(Drop::Cancelled)
    } else if now >= w.deadline {
        Some(Drop::Expired)
    } else if now + batch_time > w.deadline {
        Some(Drop::WouldBeLate)
    } else {
        None
    }
}

/// What a batch costs, learned from the batches that ran: the line `time = fixed +
/// per_row x rows`, fitted by least squares with exponential forgetting (weight
/// 1/8 on the newest batch). A compute-heavy model costs about the same per row
/// whatever the batch; a small one costs mostly per batch: the line covers both,
/// so the time of a full batch is known even while only small batches run.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    /// Exponentially weighted means of rows, seconds, rows², rows x seconds.
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
    measured: bool,
}

/// Weight of the newest batch in [`Cost`].
const COST_WEIGHT: f64 = 1.0 / 8.0;

impl Cost {
    /// Before any batch ran: `guess` for a batch of any size.
    pub fn new(guess: Duration) -> Self {
        let t = guess.as_secs_f64();
        Self {
            n: 1.0,
            t,
            nn: 1.0,
            nt: t,
            measured: false,
        }
    }

    /// Learns from one batch of `rows` rows that took `took`. The first one
    /// replaces the initial guess.
    pub fn observe(&mut self, rows: usize, took: Duration) {
        let (n, t) = (rows.max(1) as f64, took.as_secs_f64());
        let w = if self.measured { COST_WEIGHT } else { 1.0 };
        self.n += w * (n - self.n);
        self.t += w * (t - self.t);
        self.nn += w * (n * n - self.nn);
        self.nt += w * (n * t - self.nt);
        self.measured = true;
    }

    /// The fitted line `(fixed, per_row)` in seconds, both at least zero. While the
    /// batches seen were all about one size, the time is taken as proportional to
    /// the rows (the larger estimate for larger batches).
    fn line(&self) -> (f64, f64) {
        let var = self.nn - self.n * self.n;
        if var < 0.25 {
            return (0.0, self.t / self.n.max(1.0));
        }
        let per_row = (self.nt - self.n * self.t) / var;
        let fixed = self.t - per_row * self.n;
        if per_row < 0.0 {
            (self.t, 0.0)
        } else if fixed < 0.0 {
            (0.0, self.nt / self.nn)
        } else {
            (fixed, per_row)
        }
    }

    /// The expected time of a batch of `rows` rows.
    pub fn time(&self, rows: usize) -> Duration {
        let (fixed, per_row) = self.line();
        Duration::from_secs_f64((fixed + per_row * rows as f64).clamp(0.0, 3600.0))
    }
}

/// What admission knows about the queue of one actor group when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Rows already waiting (ahead of the new request).
    pub rows_waiting: usize,
    /// Rows of the new request.
    pub rows: usize,
    /// Rows per batch at most.
    pub max_batch_size: usize,
    /// Runner threads of the group.
    pub runners: usize,
    /// Runners computing a batch now.
    pub busy: usize,
    /// What is left of the batches running now, summed (each: its expected time
    /// less the time it has run, at least zero).
    pub running_left: Duration,
    /// Expected time of a full batch.
    pub batch_time: Duration,
    /// Expected time of the batch the new request will be in.
    pub own_batch: Duration,
}

impl Load {
    /// Batches that will run before the new request's, the queue packed in order:
    /// the batch holding its last row, less one.
    pub fn batches_ahead(&self) -> usize {
        (self.rows_waiting + self.rows.max(1)).div_ceil(self.max_batch_size.max(1)) - 1
    }

    /// Rows of the batch the new request will be in (the queue packed in order),
    /// at least its own.
    pub fn own_batch_rows(&self) -> usize {
        let total = self.rows_waiting + self.rows.max(1);
        (total - self.batches_ahead() * self.max_batch_size.max(1)).max(self.rows)
    }

    /// How long the new request waits for a runner: none while a runner is free for
    /// its batch, else what is left of the running batches plus the batches ahead,
    /// shared among the runners.
    pub fn expected_wait(&self) -> Duration {
        let ahead = self.batches_ahead();
        let runners = self.runners.max(1);
        if ahead < runners.saturating_sub(self.busy) {
            return Duration::ZERO;
        }
        let work = self.running_left + self.batch_time.saturating_mul(ahead as u32);
        work / runners as u32
    }

    /// Nothing running, nothing waiting.
    pub fn idle(&self) -> bool {
        self.busy == 0 && self.rows_waiting == 0
    }

    /// When the new request's answer is expected, from now: its wait plus its own batch.
    pub fn expected_answer(&self) -> Duration {
        self.expected_wait() + self.own_batch
    }
}

/// The share of the time left before its deadline within which a request's answer
/// must be expected to be admitted: 4/5. The rest absorbs the estimate's error
/// (batch times vary with what else runs on the machine). Under overload the queue
/// fills up to the admission limit, so every admitted request sits at it: with no
/// headroom, any batch slower than the estimate would make them late.
pub const ADMISSION_HEADROOM: (u32, u32) = (4, 5);

/// Admission by deadline: `Ok` when the answer is expected within
/// [`ADMISSION_HEADROOM`] of `remaining` (the time left before the request's
/// deadline), else the expected time, so the refusal can say it. An idle group
/// (nothing running, nothing waiting) admits any request: nothing is ahead of it,
/// and running it is how the batch cost is learned again after an outlier (were
/// idle groups to refuse on a stale estimate, nothing would ever run to correct it).
pub fn admit(load: &Load, remaining: Duration) -> Result<(), Duration> {
    let expected = load.expected_answer();
    let (num, den) = ADMISSION_HEADROOM;
    if expected > remaining * num / den && !load.idle() {
        Err(expected)
    } else {
        Ok(())
    }
}

/// What the batcher does next with a queue that holds only live requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing waits.
    Idle,
    /// Take the first `count` requests (FIFO) as one batch of `rows` rows.
    Dispatch { count: usize, rows: usize },
    /// Not yet: check again at this instant unless something arrives first.
    WaitUntil(Instant),
}

/// Decides on the queue (oldest first). The first requests that fit in
/// `max_batch_size` rows form the candidate batch. It goes now when it is full
/// (it reached the limit, or the next request would not fit), when the oldest
/// request has waited `max_queue_delay`, or when waiting longer would put a
/// member's deadline at risk; otherwise the answer is when to look again.
pub fn decide(queue: impl IntoIterator<Item = Waiting>, now: Instant, policy: &Policy) -> Decision {
    let mut count = 0;
    let mut rows = 0;
    let mut oldest: Option<Instant> = None;
    let mut earliest_deadline: Option<Instant> = None;
    let mut more_waiting = false;
    for w in queue {
        if count > 0 && rows + w.rows > policy.max_batch_size {
            more_waiting = true;
            break;
        }
        count += 1;
        rows += w.rows;
        oldest = Some(oldest.map_or(w.enqueued_at, |o| o.min(w.enqueued_at)));
        earliest_deadline = Some(earliest_deadline.map_or(w.deadline, |d| d.min(w.deadline)));
        if rows >= policy.max_batch_size {
            more_waiting = true;
            break;
        }
    }
    let (Some(oldest), Some(deadline)) = (oldest, earliest_deadline) else {
        return Decision::Idle;
    };
    let go_at = (oldest + policy.max_queue_delay)
        .min(deadline.checked_sub(policy.compute_reserve).unwrap_or(now));
    if more_waiting || now >= go_at {
        Decision::Dispatch { count, rows }
    } else {
        Decision::WaitUntil(go_at)
    }
}

/// Concatenates row-major parts into one batch buffer.
pub fn assemble<'a>(parts: impl IntoIterator<Item = &'a [f32]>, capacity: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(capacity);
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// Splits a batch output of `cols` values per row back into per-request parts of
/// `rows[i]` rows each. Returns `None` when the sizes disagree.
pub fn split(output: &[f32], cols: usize, rows: &[usize]) -> Option<Vec<Vec<f32>>> {
    if rows.iter().sum::<usize>() * cols != output.len() {
        return None;
    }
    let mut rest = output;
    Some(
        rows.iter()
            .map(|r| {
                let (head, tail) = rest.split_at(r * cols);
                rest = tail;
                head.to_vec()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: usize, delay_us: u64) -> Policy {
        Policy {
            max_batch_size: max,
            max_queue_delay: Duration::from_micros(delay_us),
            idle_spin: Duration::ZERO,
            compute_reserve: Duration::from_micros(100),
        }
    }

    fn w(t0: Instant, rows: usize, at_us: u64, deadline_ms: u64) -> Waiting {
        Waiting {
            rows,
            enqueued_at: t0 + Duration::from_micros(at_us),
            deadline: t0 + Duration::from_millis(deadline_ms),
            cancelled: false,
        }
    }

    #[test]
    fn empty_queue_is_idle() {
        let t0 = Instant::now();
        assert_eq!(decide([], t0, &policy(8, 100)), Decision::Idle);
    }

    #[test]
    fn zero_delay_dispatches_at_once() {
        let t0 = Instant::now();
        let q = [w(t0, 1, 0, 100)];
        assert_eq!(
            decide(q, t0, &policy(8, 0)),
            Decision::Dispatch { count: 1, rows: 1 }
        );
    }

    #[test]
    fn waits_for_company_until_the_oldest_has_waited_the_delay() {
        let t0 = Instant::now();
        let q = [w(t0, 1, 0, 100), w(t0, 2, 50, 100)];
        let at = t0 + Duration::from_micros(60);
        assert_eq!(
            decide(q, at, &policy(8, 500)),
            Decision::WaitUntil(t0 + Duration::from_micros(500))
        );
        let later = t0 + Duration::from_micros(500);
        assert_eq!(
            decide(q, later, &policy(8, 500)),
            Decision::Dispatch { count: 2, rows: 3 }
        );
    }

    #[test]
    fn a_full_batch_goes_without_waiting() {
        let t0 = Instant::now();
        let q = [w(t0, 4, 0, 100), w(t0, 4, 1, 100), w(t0, 1, 2, 100)];
        assert_eq!(
            decide(q, t0, &policy(8, 10_000)),
            Decision::Dispatch { count: 2, rows: 8 }
        );
    }

    #[test]
    fn a_request_that_does_not_fit_closes_the_batch() {
        let t0 = Instant::now();
        let q = [w(t0, 5, 0, 100), w(t0, 5, 1, 100)];
        assert_eq!(
            decide(q, t0, &policy(8, 10_000)),
            Decision::Dispatch { count: 1, rows: 5 }
        );
    }

    #[test]
    fn a_close_deadline_cuts_the_wait_short() {
        let t0 = Instant::now();
        // Deadline in 1 ms, delay 5 ms: must go by deadline - reserve.
        let q = [w(t0, 1, 0, 1)];
        let p = policy(8, 5_000);
        assert_eq!(
            decide(q, t0, &p),
            Decision::WaitUntil(t0 + Duration::from_micros(900))
        );
        assert_eq!(
            decide(q, t0 + Duration::from_micros(900), &p),
            Decision::Dispatch { count: 1, rows: 1 }
        );
    }

    #[test]
    fn triage_drops_expired_late_and_cancelled() {
        let t0 = Instant::now();
        let mut a = w(t0, 1, 0, 1);
        let none = Duration::ZERO;
        assert_eq!(triage(&a, t0, none), None);
        assert_eq!(
            triage(&a, t0 + Duration::from_millis(1), none),
            Some(Drop::Expired)
        );
        // A 600 µs batch started at 300 µs ends in time (deadline 1 ms); at 500 µs not.
        let batch = Duration::from_micros(600);
        assert_eq!(triage(&a, t0 + Duration::from_micros(300), batch), None);
        assert_eq!(
            triage(&a, t0 + Duration::from_micros(500), batch),
            Some(Drop::WouldBeLate)
        );
        a.cancelled = true;
        assert_eq!(triage(&a, t0, none), Some(Drop::Cancelled));
    }

    fn load(rows_waiting: usize, busy: usize, running_left_ms: u64) -> Load {
        Load {
            rows_waiting,
            rows: 1,
            max_batch_size: 8,
            runners: 2,
            busy,
            running_left: Duration::from_millis(running_left_ms),
            batch_time: Duration::from_millis(10),
            own_batch: Duration::from_millis(10),
        }
    }

    fn us(d: Duration) -> u128 {
        d.as_micros()
    }

    #[test]
    fn cost_learns_a_fixed_and_a_per_row_part() {
        // 1 ms a batch plus 0.5 ms a row, seen on batches of 1 to 8 rows.
        let mut c = Cost::new(Duration::from_micros(50));
        assert_eq!(us(c.time(8)), 50 * 8);
        for i in 0..64 {
            let rows = 1 + i % 8;
            c.observe(rows, Duration::from_micros(1000 + 500 * rows as u64));
        }
        assert!((us(c.time(1)) as i64 - 1500).abs() <= 5, "{:?}", c.time(1));
        assert!((us(c.time(8)) as i64 - 5000).abs() <= 5, "{:?}", c.time(8));
        // A full batch is known from small ones: 64 rows were never seen.
        assert!(
            (us(c.time(64)) as i64 - 33_000).abs() <= 40,
            "{:?}",
            c.time(64)
        );
    }

    #[test]
    fn cost_of_one_batch_size_is_proportional_and_the_first_replaces_the_guess() {
        let mut c = Cost::new(Duration::from_secs(1));
        c.observe(4, Duration::from_millis(8));
        assert_eq!(c.time(4), Duration::from_millis(8));
        assert_eq!(c.time(8), Duration::from_millis(16));
        // Then it moves by an eighth of the difference per batch.
        c.observe(4, Duration::from_millis(16));
        assert_eq!(c.time(4), Duration::from_millis(9));
        // Noise never makes a cost negative.
        let mut c = Cost::new(Duration::ZERO);
        for (rows, ms) in [(1, 9), (8, 1), (2, 7), (7, 2)] {
            c.observe(rows, Duration::from_millis(ms));
        }
        assert!(c.time(1) > Duration::ZERO && c.time(64) > Duration::ZERO);
    }

    #[test]
    fn a_free_runner_means_no_wait() {
        // Nothing running: the request's batch starts at once.
        assert_eq!(load(0, 0, 0).expected_wait(), Duration::ZERO);
        // One of two runners busy, fewer than a full batch waiting: the free one.
        assert_eq!(load(7, 1, 4).expected_wait(), Duration::ZERO);
        assert_eq!(load(7, 1, 4).expected_answer(), Duration::from_millis(10));
    }

    #[test]
    fn expected_wait_shares_the_work_ahead_among_the_runners() {
        // Both runners busy (3 + 5 ms left), 2 full batches waiting (16 rows):
        // (8 ms + 2 x 10 ms) / 2 runners = 14 ms, answered 10 ms later.
        let l = load(16, 2, 8);
        assert_eq!(l.batches_ahead(), 2);
        assert_eq!(l.expected_wait(), Duration::from_millis(14));
        assert_eq!(l.expected_answer(), Duration::from_millis(24));
        // A partial batch ahead is one the request joins, not one it waits for,
        // unless the request's rows do not fit in it.
        assert_eq!(load(20, 2, 8).batches_ahead(), 2);
        assert_eq!(load(20, 2, 8).own_batch_rows(), 5);
        let big = Load {
            rows: 5,
            ..load(20, 2, 8)
        };
        assert_eq!(big.batches_ahead(), 3);
        assert_eq!(big.own_batch_rows(), 5);
    }

    #[test]
    fn admission_refuses_what_cannot_be_answered_in_time() {
        // Expected in 24 ms: admitted with 30 ms left (24 is 4/5 of 30), not with 29.
        let l = load(16, 2, 8);
        assert_eq!(admit(&l, Duration::from_millis(30)), Ok(()));
        assert_eq!(
            admit(&l, Duration::from_millis(29)),
            Err(Duration::from_millis(24))
        );
        // One runner busy with nothing waiting: the other one answers in a batch
        // time, which must fit.
        assert_eq!(
            admit(&load(0, 1, 4), Duration::from_millis(12)),
            Err(Duration::from_millis(10))
        );
        assert_eq!(admit(&load(0, 1, 4), Duration::from_millis(13)), Ok(()));
        // An idle group admits even what its estimate says is late: that is how
        // an estimate spoiled by one slow batch gets corrected.
        assert_eq!(admit(&load(0, 0, 0), Duration::from_millis(1)), Ok(()));
    }

    #[test]
    fn assemble_and_split_round_trip() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0];
        let batch = assemble([&a[..], &b[..]], 6);
        assert_eq!(batch, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let parts = split(&batch, 2, &[2, 1]).unwrap();
        assert_eq!(parts, vec![vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0]]);
        assert!(split(&batch, 2, &[2, 2]).is_none());
    }
}
