//! [`BreakerState`]: the circuit breaker's state machine, as a plain type.
//!
//! ```text
//!            N consecutive failures
//!   Closed ─────────────────────────▶ Open ──(backoff over)──▶ HalfOpen
//!     ▲                                 ▲                          │ one probe
//!     │            probe succeeded      │   probe failed (backoff  │
//!     └─────────────────────────────────┼───────── × multiplier) ◀─┘
//!                                       └──────────────────────────┘
//! ```
//!
//! * Closed: every request is let through; a success resets the count of
//!   consecutive failures, a failure adds one; at `failure_threshold` the
//!   breaker opens with the base backoff.
//! * Open: nothing is let through until `open_until`; then the next check
//!   moves it to HalfOpen.
//! * HalfOpen: exactly one request (the probe) is let through; while it runs
//!   nothing else is. Success closes the breaker and resets the backoff;
//!   failure (or the probe being dropped unanswered) re-opens it with the
//!   backoff multiplied, capped at `max_backoff`. A neutral outcome
//!   (overload) lets another probe through.
//!
//! Outcomes of ordinary calls that started before the breaker opened are
//! ignored once it is no longer Closed. Time is passed in; there is no I/O.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerConfig;

/// The three states, with the values the `mesh_router_breaker_state` gauge uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerPhase {
    /// Requests flow (gauge 0).
    Closed,
    /// Requests are refused until the backoff is over (gauge 1).
    Open,
    /// One probe is allowed (gauge 2).
    HalfOpen,
}

impl BreakerPhase {
    /// Value of the `mesh_router_breaker_state` gauge.
    pub fn gauge_value(self) -> f64 {
        match self {
            BreakerPhase::Closed => 0.0,
            BreakerPhase::Open => 1.0,
            BreakerPhase::HalfOpen => 2.0,
        }
    }

    /// Label value of `to` in `mesh_router_breaker_transitions_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerPhase::Closed => "closed",
            BreakerPhase::Open => "open",
            BreakerPhase::HalfOpen => "half_open",
        }
    }
}

/// A state change, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// State before.
    pub from: BreakerPhase,
    /// State after.
    pub to: BreakerPhase,
    /// When the breaker opened: how long it stays open.
    pub backoff: Option<Duration>,
}

/// What the breaker says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: an ordinary call.
    Normal,
    /// HalfOpen: this call is the one probe.
    Probe,
    /// Refused. `until` is when the backoff ends (Open), or `None` while the
    /// probe is in flight (the probe's outcome decides).
    Rejected {
        /// End of the backoff, if the breaker is Open.
        until: Option<Instant>,
    },
}

/// How a call ended, as far as the breaker is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The replica answered.
    Success,
    /// The replica failed in a way that counts against it.
    Failure,
    /// Neither (e.g. the replica was overloaded).
    Neutral,
    /// The call's future was dropped before it finished.
    Abandoned,
}

/// The state machine of one replica's breaker.
#[derive(Debug, Clone)]
pub struct BreakerState {
    cfg: BreakerConfig,
    phase: BreakerPhase,
    consecutive_failures: u32,
    open_until: Instant,
    /// Backoff used by the last opening (grows with failed probes).
    backoff: Duration,
    probe_in_flight: bool,
}

impl BreakerState {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        let backoff = cfg.backoff;
        BreakerState {
            cfg,
            phase: BreakerPhase::Closed,
            consecutive_failures: 0,
            open_until: Instant::now(),
            backoff,
            probe_in_flight: false,
        }
    }

    /// Current state.
    pub fn phase(&self) -> BreakerPhase {
        self.phase
    }

    /// Consecutive failures counted so far while Closed.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Whether the probe is in flight (HalfOpen and nothing else may pass).
    pub fn probe_in_flight(&self) -> bool {
        self.phase == BreakerPhase::HalfOpen && self.probe_in_flight
    }

    /// Whether a request arriving at `now` would be let through (or would be
    /// once this breaker is polled: an Open breaker whose backoff is over).
    /// Does not change state.
    pub fn would_admit(&self, now: Instant) -> bool {
        match self.phase {
            BreakerPhase::Closed => true,
            BreakerPhase::Open => now >= self.open_until,
            BreakerPhase::HalfOpen => !self.probe_in_flight,
        }
    }

    /// Readiness check: what a request arriving at `now` may do, without
    /// taking the probe slot. Moves Open to HalfOpen once the backoff is over.
    pub fn check(&mut self, now: Instant) -> (Admission, Option<Transition>) {
        let t = self.maybe_half_open(now);
        let a = match self.phase {
            BreakerPhase::Closed => Admission::Normal,
            BreakerPhase::Open => Admission::Rejected {
                until: Some(self.open_until),
            },
            BreakerPhase::HalfOpen if self.probe_in_flight => Admission::Rejected { until: None },
            BreakerPhase::HalfOpen => Admission::Probe,
        };
        (a, t)
    }

    /// A call is being made at `now`: like [`check`](Self::check), but a
    /// `Probe` answer takes the probe slot.
    pub fn start_call(&mut self, now: Instant) -> (Admission, Option<Transition>) {
        let (a, t) = self.check(now);
        if a == Admission::Probe {
            self.probe_in_flight = true;
        }
        (a, t)
    }

    /// Records how a call (a probe if `probe`) ended at `now`.
    pub fn record(&mut self, now: Instant, probe: bool, outcome: Outcome) -> Option<Transition> {
        if probe {
            if self.phase != BreakerPhase::HalfOpen || !self.probe_in_flight {
                return None; // stale (cannot happen with one Breaker per state)
            }
            self.probe_in_flight = false;
            match outcome {
                Outcome::Success => {
                    self.consecutive_failures = 0;
                    self.backoff = self.cfg.backoff;
                    Some(self.go(BreakerPhase::Closed, None))
                }
                Outcome::Failure | Outcome::Abandoned => Some(self.reopen(now)),
                Outcome::Neutral => None,
            }
        } else {
            if self.phase != BreakerPhase::Closed {
                return None; // started before the breaker opened: ignore
            }
            match outcome {
                Outcome::Success => {
                    self.consecutive_failures = 0;
                    None
                }
                Outcome::Failure => {
                    self.consecutive_failures += 1;
                    if self.consecutive_failures >= self.cfg.failure_threshold {
                        Some(self.open(now, self.cfg.backoff))
                    } else {
                        None
                    }
                }
                Outcome::Neutral | Outcome::Abandoned => None,
            }
        }
    }

    /// Opens the breaker at once (the replica's readiness check failed).
    pub fn trip(&mut self, now: Instant) -> Option<Transition> {
        match self.phase {
            BreakerPhase::Closed => Some(self.open(now, self.cfg.backoff)),
            BreakerPhase::HalfOpen => {
                self.probe_in_flight = false;
                Some(self.reopen(now))
            }
            BreakerPhase::Open => None,
        }
    }

    fn maybe_half_open(&mut self, now: Instant) -> Option<Transition> {
        if self.phase == BreakerPhase::Open && now >= self.open_until {
            self.probe_in_flight = false;
            Some(self.go(BreakerPhase::HalfOpen, None))
        } else {
            None
        }
    }

    fn reopen(&mut self, now: Instant) -> Transition {
        let grown = self.backoff.mul_f64(self.cfg.multiplier);
        self.open(now, grown.min(self.cfg.max_backoff))
    }

    fn open(&mut self, now: Instant, backoff: Duration) -> Transition {
        self.backoff = backoff;
        self.open_until = now + backoff;
        self.consecutive_failures = 0;
        self.go(BreakerPhase::Open, Some(backoff))
    }

    fn go(&mut self, to: BreakerPhase, backoff: Option<Duration>) -> Transition {
        let from = self.phase;
        self.phase = to;
        Transition { from, to, backoff }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
        }
    }

    fn fail_n(b: &mut BreakerState, now: Instant, n: u32) -> Option<Transition> {
        let mut last = None;
        for _ in 0..n {
            assert_eq!(b.start_call(now).0, Admission::Normal);
            last = b.record(now, false, Outcome::Failure);
        }
        last
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let now = Instant::now();
        let mut b = BreakerState::new(cfg());
        assert!(fail_n(&mut b, now, 2).is_none());
        assert_eq!(b.phase(), BreakerPhase::Closed);
        let t = fail_n(&mut b, now, 1).expect("third failure opens");
        assert_eq!((t.from, t.to), (BreakerPhase::Closed, BreakerPhase::Open));
        assert_eq!(t.backoff, Some(Duration::from_secs(1)));
        assert_eq!(
            b.check(now).0,
            Admission::Rejected {
                until: Some(now + Duration::from_secs(1))
            }
        );
    }

    #[test]
    fn a_success_resets_the_count_and_overload_does_not() {
        let now = Instant::now();
        let mut b = BreakerState::new(cfg());
        fail_n(&mut b, now, 2);
        b.record(now, false, Outcome::Success);
        assert_eq!(b.consecutive_failures(), 0);
        fail_n(&mut b, now, 2);
        b.record(now, false, Outcome::Neutral);
        assert_eq!(b.consecutive_failures(), 2);
        assert!(fail_n(&mut b, now, 1).is_some());
    }

    #[test]
    fn exactly_one_probe_after_backoff_and_success_closes() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(cfg());
        fail_n(&mut b, t0, 3);
        let before = t0 + Duration::from_millis(999);
        assert!(matches!(b.start_call(before).0, Admission::Rejected { .. }));
        let after = t0 + Duration::from_secs(1);
        let (a, t) = b.start_call(after);
        assert_eq!(a, Admission::Probe);
        assert_eq!(t.map(|t| t.to), Some(BreakerPhase::HalfOpen));
        // A second request while the probe is in flight is refused.
        assert_eq!(b.start_call(after).0, Admission::Rejected { until: None });
        assert!(!b.would_admit(after));
        let t = b.record(after, true, Outcome::Success).expect("closes");
        assert_eq!(
            (t.from, t.to),
            (BreakerPhase::HalfOpen, BreakerPhase::Closed)
        );
        assert_eq!(b.start_call(after).0, Admission::Normal);
    }

    #[test]
    fn failed_probes_reopen_with_growing_capped_backoff() {
        let mut now = Instant::now();
        let mut b = BreakerState::new(cfg());
        fail_n(&mut b, now, 3);
        let mut seen = vec![];
        for _ in 0..4 {
            now += b.backoff;
            assert_eq!(b.start_call(now).0, Admission::Probe);
            let t = b.record(now, true, Outcome::Failure).expect("reopens");
            assert_eq!((t.from, t.to), (BreakerPhase::HalfOpen, BreakerPhase::Open));
            seen.push(t.backoff.map(|d| d.as_secs()));
        }
        assert_eq!(seen, vec![Some(2), Some(4), Some(5), Some(5)]);
        // Success resets the backoff to the base value.
        now += b.backoff;
        assert_eq!(b.start_call(now).0, Admission::Probe);
        b.record(now, true, Outcome::Success);
        let t = fail_n(&mut b, now, 3).expect("opens");
        assert_eq!(t.backoff, Some(Duration::from_secs(1)));
    }

    #[test]
    fn abandoned_probe_reopens_and_neutral_probe_frees_the_slot() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(cfg());
        fail_n(&mut b, t0, 3);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.start_call(t1).0, Admission::Probe);
        assert_eq!(b.record(t1, true, Outcome::Neutral), None);
        assert_eq!(b.start_call(t1).0, Admission::Probe);
        let t = b.record(t1, true, Outcome::Abandoned).expect("reopens");
        assert_eq!(t.to, BreakerPhase::Open);
    }

    #[test]
    fn late_outcomes_of_ordinary_calls_are_ignored_once_open() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(cfg());
        fail_n(&mut b, t0, 3);
        assert_eq!(b.record(t0, false, Outcome::Success), None);
        assert_eq!(b.phase(), BreakerPhase::Open);
    }

    #[test]
    fn trip_opens_immediately() {
        let t0 = Instant::now();
        let mut b = BreakerState::new(cfg());
        let t = b.trip(t0).expect("opens");
        assert_eq!(t.to, BreakerPhase::Open);
        assert_eq!(b.trip(t0), None);
    }
}
