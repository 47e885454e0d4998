//! [`StackConfig`]: the settings of the model-call stack.
//!
//! Every field has a default, so an empty `[stack]` table is valid. Durations
//! are written either as an integer number of **milliseconds** (`250`) or as a
//! string with a unit: `"500us"`, `"250ms"`, `"2s"`, `"1m"` (fractions allowed:
//! `"1.5s"`).
//!
//! ```toml
//! [router.model_call]
//! deadline = "80ms"          # cap on the overall deadline (client's grpc-timeout may be shorter)
//! per_try_timeout = "30ms"
//! max_attempts = 3
//! max_in_flight = 1024
//! load_default_rtt = "5ms"   # p2c: assumed latency of a replica not yet measured
//! load_decay = "10s"         # p2c: how fast a latency peak is forgotten
//!
//! [router.model_call.retry_budget]
//! ratio = 0.2
//! min_per_sec = 10
//! ttl = "10s"
//!
//! [router.model_call.breaker]
//! failure_threshold = 5
//! backoff = "500ms"
//! max_backoff = "30s"
//! ```

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::StackError;

/// Hard cap on attempts per request (the first try plus retries).
pub const MAX_ATTEMPTS_CAP: u32 = 3;

/// Settings of the whole model-call stack.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StackConfig {
    /// Upper bound on a request's overall deadline. The effective deadline is
    /// `min(now + deadline, client's grpc-timeout)`; the router computes it
    /// with [`StackConfig::deadline_for`]. Default 80 ms.
    #[serde(deserialize_with = "de_duration")]
    pub deadline: Duration,
    /// Timeout of one attempt on one replica. Default 30 ms.
    #[serde(deserialize_with = "de_duration")]
    pub per_try_timeout: Duration,
    /// Attempts per request, first try included; 1 disables retries.
    /// Must be in `1..=3`. Default 3.
    pub max_attempts: u32,
    /// Also retry [`StackError::ModelFault`]s (off by default: a model that
    /// failed on a request usually fails on it again).
    pub retry_model_faults: bool,
    /// Model calls allowed in flight through this stack; the next one is shed
    /// with `Overloaded`. Default 1024.
    pub max_in_flight: usize,
    /// Requests that may wait for a ready replica in front of the balancer.
    /// Defaults to `max_in_flight` (0 means "same as max_in_flight").
    pub buffer_capacity: usize,
    /// Latency assumed for a replica before any answer was seen (p2c load
    /// metric, peak-EWMA). Default 5 ms.
    #[serde(deserialize_with = "de_duration")]
    pub load_default_rtt: Duration,
    /// Time over which a latency peak (e.g. a per-try timeout) decays in the
    /// p2c load metric. Default 10 s.
    #[serde(deserialize_with = "de_duration")]
    pub load_decay: Duration,
    /// Seed of the p2c balancer's random choices; `None` (default) seeds from
    /// the OS. Set it only for reproducible tests.
    pub balance_seed: Option<u64>,
    /// The retry budget.
    pub retry_budget: RetryBudgetConfig,
    /// The per-replica circuit breaker.
    pub breaker: BreakerConfig,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            deadline: Duration::from_millis(80),
            per_try_timeout: Duration::from_millis(30),
            max_attempts: MAX_ATTEMPTS_CAP,
            retry_model_faults: false,
            max_in_flight: 1024,
            buffer_capacity: 0,
            load_default_rtt: Duration::from_millis(5),
            load_decay: Duration::from_secs(10),
            balance_seed: None,
            retry_budget: RetryBudgetConfig::default(),
            breaker: BreakerConfig::default(),
        }
    }
}

impl StackConfig {
    /// The overall deadline of a request that arrives at `now` with the
    /// client's `grpc-timeout` (if any): the earlier of the two.
    pub fn deadline_for(
        &self,
        now: tokio::time::Instant,
        grpc_timeout: Option<Duration>,
    ) -> tokio::time::Instant {
        let budget = match grpc_timeout {
            Some(t) => t.min(self.deadline),
            None => self.deadline,
        };
        now + budget
    }

    /// Buffer capacity with the `0 = max_in_flight` rule applied.
    pub fn effective_buffer_capacity(&self) -> usize {
        if self.buffer_capacity == 0 {
            self.max_in_flight.max(1)
        } else {
            self.buffer_capacity
        }
    }

    /// Checks the invariants the stack relies on.
    pub fn validate(&self) -> Result<(), StackError> {
        let bad = |m: String| Err(StackError::InvalidConfig(m));
        if !(1..=MAX_ATTEMPTS_CAP).contains(&self.max_attempts) {
            return bad(format!(
                "max_attempts must be in 1..={MAX_ATTEMPTS_CAP}, got {}",
                self.max_attempts
            ));
        }
        if self.deadline.is_zero() || self.per_try_timeout.is_zero() {
            return bad("deadline and per_try_timeout must be > 0".into());
        }
        if self.load_decay.is_zero() {
            return bad("load_decay must be > 0".into());
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight must be > 0".into());
        }
        let rb = &self.retry_budget;
        if !(rb.ratio.is_finite() && (0.0..=10.0).contains(&rb.ratio)) {
            return bad(format!(
                "retry_budget.ratio must be in 0..=10, got {}",
                rb.ratio
            ));
        }
        if rb.ttl < Duration::from_secs(1) || rb.ttl > Duration::from_secs(60) {
            return bad("retry_budget.ttl must be between 1s and 60s".into());
        }
        let b = &self.breaker;
        if b.failure_threshold == 0 {
            return bad("breaker.failure_threshold must be > 0".into());
        }
        if b.backoff.is_zero() || b.max_backoff < b.backoff {
            return bad("breaker.backoff must be > 0 and <= breaker.max_backoff".into());
        }
        if !(b.multiplier.is_finite() && b.multiplier >= 1.0) {
            return bad("breaker.multiplier must be >= 1".into());
        }
        Ok(())
    }
}

/// Retry budget: retries may add about `ratio` of the request rate, plus a
/// floor of `min_per_sec` retries per second, both counted over a sliding
/// window of `ttl` (like tower's `TpsBudget` and linkerd's retry budget).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryBudgetConfig {
    /// Retries allowed per original request (0.2 = 20 % extra). Default 0.2.
    pub ratio: f64,
    /// Retries per second allowed even without traffic. Default 10.
    pub min_per_sec: u32,
    /// Window over which requests and retries are counted. Default 10 s.
    #[serde(deserialize_with = "de_duration")]
    pub ttl: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: 0.2,
            min_per_sec: 10,
            ttl: Duration::from_secs(10),
        }
    }
}

/// Per-replica circuit breaker: `failure_threshold` consecutive failures open
/// it; after `backoff` one probe goes through; each failed probe multiplies
/// the backoff by `multiplier`, up to `max_backoff`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker. Default 5.
    pub failure_threshold: u32,
    /// First backoff after opening. Default 500 ms.
    #[serde(deserialize_with = "de_duration")]
    pub backoff: Duration,
    /// Cap of the growing backoff. Default 30 s.
    #[serde(deserialize_with = "de_duration")]
    pub max_backoff: Duration,
    /// Growth factor of the backoff per failed probe. Default 2.
    pub multiplier: f64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
        }
    }
}

/// Parses `"250ms"`, `"2s"`, `"1.5s"`, `"500us"`, `"1m"`, or a bare number of
/// milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. \"250ms\" or \"2s\""))?;
    let secs = match unit.trim() {
        "" | "ms" => value / 1e3,
        "us" | "µs" => value / 1e6,
        "s" => value,
        "m" | "min" => value * 60.0,
        other => return Err(format!("invalid duration unit {other:?} in {s:?}")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Millis(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Millis(ms) => Ok(Duration::from_millis(ms)),
        Raw::Text(s) => parse_duration(&s).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_millis(40)));
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn defaults_are_valid() {
        assert!(StackConfig::default().validate().is_ok());
    }

    #[test]
    fn rejects_more_than_three_attempts() {
        let cfg = StackConfig {
            max_attempts: 4,
            ..StackConfig::default()
        };
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn deadline_is_the_earlier_of_client_and_config() {
        let cfg = StackConfig::default();
        let now = tokio::time::Instant::now();
        assert_eq!(
            cfg.deadline_for(now, Some(Duration::from_millis(10))),
            now + Duration::from_millis(10)
        );
        assert_eq!(
            cfg.deadline_for(now, Some(Duration::from_secs(10))),
            now + cfg.deadline
        );
        assert_eq!(cfg.deadline_for(now, None), now + cfg.deadline);
    }
}
