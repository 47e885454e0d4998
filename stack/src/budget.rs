//! [`RetryBudget`]: how many retries the stack may add, as a plain type.
//!
//! Every original request deposits one token; every retry must withdraw one.
//! A retry is allowed while
//!
//! ```text
//! retries_in_window < min_per_sec * ttl_secs + ratio * requests_in_window
//! ```
//!
//! where the window is the last `ttl`, kept as 10 slots (so counts expire in
//! steps of `ttl / 10`). This is the shape of tower's `TpsBudget` and
//! linkerd's retry budget: under a total outage, retries add at most `ratio`
//! (default 20 %) to the load, plus a small floor so that a quiet service can
//! still retry a lone failure. Time is passed in, so tests drive it.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::RetryBudgetConfig;

const SLOTS: u32 = 10;

/// A shared, thread-safe retry budget (wrap it in an `Arc`).
#[derive(Debug)]
pub struct RetryBudget {
    /// Retries allowed per request, in thousandths (0.2 -> 200).
    ratio_per_mille: u64,
    /// Retries allowed in a window regardless of traffic.
    reserve: u64,
    slot_len: Duration,
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    /// Newest slot first.
    slots: VecDeque<Slot>,
    /// Start of the newest slot.
    current_start: Instant,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    deposits: u64,
    withdrawals: u64,
}

impl RetryBudget {
    /// A budget whose window starts at `now`.
    pub fn new(cfg: &RetryBudgetConfig, now: Instant) -> Self {
        let ttl = cfg.ttl.max(Duration::from_millis(SLOTS as u64));
        let reserve = (u64::from(cfg.min_per_sec) as f64 * ttl.as_secs_f64()).round() as u64;
        RetryBudget {
            ratio_per_mille: (cfg.ratio.max(0.0) * 1000.0).round() as u64,
            reserve,
            slot_len: ttl / SLOTS,
            window: Mutex::new(Window {
                slots: std::iter::repeat_n(Slot::default(), SLOTS as usize).collect(),
                current_start: now,
            }),
        }
    }

    /// Records one original (non-retry) request.
    pub fn deposit(&self, now: Instant) {
        let mut w = self.window.lock();
        self.roll(&mut w, now);
        if let Some(s) = w.slots.front_mut() {
            s.deposits += 1;
        }
    }

    /// Takes one retry from the budget; `false` means the budget is spent and
    /// the request must not be retried.
    pub fn try_withdraw(&self, now: Instant) -> bool {
        let mut w = self.window.lock();
        self.roll(&mut w, now);
        let (deposits, withdrawals) = w.slots.iter().fold((0u64, 0u64), |(d, r), s| {
            (d + s.deposits, r + s.withdrawals)
        });
        let allowed = self.reserve + deposits * self.ratio_per_mille / 1000;
        if withdrawals < allowed {
            if let Some(s) = w.slots.front_mut() {
                s.withdrawals += 1;
            }
            true
        } else {
            false
        }
    }

    /// Retries that could be taken right now (for tests and debugging).
    pub fn available(&self, now: Instant) -> u64 {
        let mut w = self.window.lock();
        self.roll(&mut w, now);
        let (d, r) = w.slots.iter().fold((0u64, 0u64), |(d, r), s| {
            (d + s.deposits, r + s.withdrawals)
        });
        (self.reserve + d * self.ratio_per_mille / 1000).saturating_sub(r)
    }

    /// Moves the window forward to `now`, expiring old slots.
    fn roll(&self, w: &mut Window, now: Instant) {
        let elapsed = now.saturating_duration_since(w.current_start);
        let steps = (elapsed.as_nanos() / self.slot_len.as_nanos().max(1)) as u64;
        if steps == 0 {
            return;
        }
        if steps >= u64::from(SLOTS) {
            // The whole window expired: start afresh at `now`.
            w.slots.iter_mut().for_each(|s| *s = Slot::default());
            w.current_start = now;
            return;
        }
        for _ in 0..steps {
            w.slots.pop_back();
            w.slots.push_front(Slot::default());
        }
        // steps < SLOTS, so the cast is lossless.
        w.current_start += self.slot_len * steps as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ratio: f64, min_per_sec: u32, ttl_s: u64) -> RetryBudgetConfig {
        RetryBudgetConfig {
            ratio,
            min_per_sec,
            ttl: Duration::from_secs(ttl_s),
        }
    }

    #[test]
    fn reserve_alone_allows_min_per_sec_times_ttl() {
        let now = Instant::now();
        let b = RetryBudget::new(&cfg(0.2, 2, 10), now);
        let granted = (0..100).filter(|_| b.try_withdraw(now)).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn ratio_of_deposits_is_added() {
        let now = Instant::now();
        let b = RetryBudget::new(&cfg(0.2, 0, 10), now);
        for _ in 0..1000 {
            b.deposit(now);
        }
        assert_eq!(b.available(now), 200);
        let granted = (0..1000).filter(|_| b.try_withdraw(now)).count();
        assert_eq!(granted, 200);
        assert!(!b.try_withdraw(now));
    }

    #[test]
    fn zero_ratio_and_floor_allows_nothing() {
        let now = Instant::now();
        let b = RetryBudget::new(&cfg(0.0, 0, 10), now);
        b.deposit(now);
        assert!(!b.try_withdraw(now));
    }

    #[test]
    fn counts_expire_after_ttl() {
        let start = Instant::now();
        let b = RetryBudget::new(&cfg(0.5, 0, 10), start);
        for _ in 0..10 {
            b.deposit(start);
        }
        assert_eq!(b.available(start), 5);
        // Spend it all.
        while b.try_withdraw(start) {}
        assert_eq!(b.available(start), 0);
        // Half a window later both deposits and withdrawals are still counted.
        assert_eq!(b.available(start + Duration::from_secs(5)), 0);
        // After a full window everything has expired: nothing deposited, nothing owed.
        let later = start + Duration::from_secs(11);
        assert_eq!(b.available(later), 0);
        b.deposit(later);
        b.deposit(later);
        assert_eq!(b.available(later), 1);
        // A very long idle gap does not break the window.
        let much_later = start + Duration::from_secs(100_000);
        assert_eq!(b.available(much_later), 0);
        b.deposit(much_later);
        b.deposit(much_later);
        assert!(b.try_withdraw(much_later));
    }
}
