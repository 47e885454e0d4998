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
}

/// Why a waiting request leaves the queue without being computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Its deadline passed.
    Expired,
    /// Its caller went away.
    Cancelled,
}

/// Whether a waiting request stays in the queue.
pub fn triage(w: &Waiting, now: Instant) -> Option<Drop> {
    if w.cancelled {
        Some(Drop::Cancelled)
    } else if now >= w.deadline {
        Some(Drop::Expired)
    } else {
        None
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
    /// What is left of the batches running now, summed (each: the smoothed batch
    /// time less the time it has run, at least zero).
    pub running_left: Duration,
    /// Smoothed time of one batch.
    pub batch_time: Duration,
}

impl Load {
    /// Batches that will run before the new request's, the queue packed in order:
    /// the batch holding its last row, less one.
    pub fn batches_ahead(&self) -> usize {
        (self.rows_waiting + self.rows.max(1)).div_ceil(self.max_batch_size.max(1)) - 1
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
        self.expected_wait() + self.batch_time
    }
}

/// Admission by deadline: `Ok` when the answer is expected within `remaining` (the
/// time left before the request's deadline), else the expected time, so the refusal
/// can say it. An idle group (nothing running, nothing waiting) admits any request:
/// nothing is ahead of it, and running it is how the smoothed batch time is learned
/// again after an outlier (were idle groups to refuse on a stale estimate, nothing
/// would ever run to correct it).
pub fn admit(load: &Load, remaining: Duration) -> Result<(), Duration> {
    let expected = load.expected_answer();
    if expected > remaining && !load.idle() {
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
    fn triage_drops_expired_and_cancelled() {
        let t0 = Instant::now();
        let mut a = w(t0, 1, 0, 1);
        assert_eq!(triage(&a, t0), None);
        assert_eq!(
            triage(&a, t0 + Duration::from_millis(1)),
            Some(Drop::Expired)
        );
        a.cancelled = true;
        assert_eq!(triage(&a, t0), Some(Drop::Cancelled));
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
        }
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
        let big = Load { rows: 5, ..load(20, 2, 8) };
        assert_eq!(big.batches_ahead(), 3);
    }

    #[test]
    fn admission_refuses_what_cannot_be_answered_in_time() {
        let l = load(16, 2, 8);
        assert_eq!(admit(&l, Duration::from_millis(24)), Ok(()));
        assert_eq!(
            admit(&l, Duration::from_millis(23)),
            Err(Duration::from_millis(24))
        );
        // One runner busy with nothing waiting: the other one answers in a batch
        // time, which must fit.
        assert_eq!(
            admit(&load(0, 1, 4), Duration::from_millis(9)),
            Err(Duration::from_millis(10))
        );
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
