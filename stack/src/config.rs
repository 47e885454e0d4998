//! [`StackConfig`]: the settings of the model-call stack, read from the
//! `[decisions.stack]` table of mesh.toml.
//!
//! Every field has a default, so an empty table is valid. Durations are
//! strings with a unit, the one spelling of every duration in mesh.toml:
//! `"250us"`, `"20ms"`, `"2s"`, `"1m"`, `"1h"` (also `ns`, `µs`, `min`, `d`;
//! fractions allowed: `"1.5s"`). [`parse_duration`] is that parser, for every
//! crate that reads mesh.toml. A bare integer is still read as milliseconds
//! here (the old spelling), with a deprecation notice.
//!
//! The overall deadline of a request is not a stack setting: the request
//! carries it ([`crate::HasDeadline`]); the router sets it from `[decisions]
//! deadline` and the caller's grpc-timeout.
//!
//! ```toml
//! [decisions.stack]
//! per_try_timeout = "30ms"      # one attempt on one replica
//! max_attempts = 3              # first try included; 1..=3
//! retry_model_faults = false
//! max_in_flight = 1024          # more concurrent model calls are shed
//! buffer_capacity = 0           # calls waiting for a ready replica; 0 = max_in_flight
//! load_default_rtt = "5ms"      # p2c: assumed latency of a replica not yet measured
//! load_decay = "10s"            # p2c: how fast a latency peak is forgotten
//!
//! [decisions.stack.retry_budget]
//! ratio = 0.2
//! min_per_sec = 10
//! ttl = "10s"
//!
//! [decisions.stack.breaker]
//! failure_threshold = 5
//! backoff = "500ms"
//! max_backoff = "30s"
//! multiplier = 2.0
//! ```

use std::cell::RefCell;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::error::StackError;

/// Hard cap on attempts per request (the first try plus retries).
pub const MAX_ATTEMPTS_CAP: u32 = 3;

/// Settings of the whole model-call stack.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StackConfig {
    /// Timeout of one attempt on one replica. Default 30 ms.
    #[serde(deserialize_with = "legacy_ms::per_try_timeout")]
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
    /// Requests that may wait for a ready replica in front of the balancer;
    /// the next one is refused at once with `Overloaded`.
    /// Defaults to `max_in_flight` (0 means "same as max_in_flight").
    pub buffer_capacity: usize,
    /// Latency assumed for a replica before any answer was seen (p2c load
    /// metric, peak-EWMA). Default 5 ms.
    #[serde(deserialize_with = "legacy_ms::load_default_rtt")]
    pub load_default_rtt: Duration,
    /// Time over which a latency peak (e.g. a per-try timeout) decays in the
    /// p2c load metric. Default 10 s.
    #[serde(deserialize_with = "legacy_ms::load_decay")]
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
    /// `buffer_capacity` with the `0 = max_in_flight` rule applied.
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
        if self.per_try_timeout.is_zero() {
            return bad("per_try_timeout must be > 0".into());
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
    #[serde(deserialize_with = "legacy_ms::retry_budget_ttl")]
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
    #[serde(deserialize_with = "legacy_ms::breaker_backoff")]
    pub backoff: Duration,
    /// Cap of the growing backoff. Default 30 s.
    #[serde(deserialize_with = "legacy_ms::breaker_max_backoff")]
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

/// Parses a duration with a unit: `"250ms"`, `"2s"`, `"1.5s"`, `"250us"`
/// (or `"250µs"`), `"100ns"`, `"1m"` (or `"1min"`), `"1h"`, `"1d"`; spaces
/// around the number and the unit are allowed. A number without a unit is an
/// error (it was milliseconds in some keys and microseconds in others).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    const EXAMPLE: &str = "expected a number and a unit, e.g. \"50ms\", \"2s\" or \"250us\"";
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("invalid duration {s:?}: {EXAMPLE}"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: {EXAMPLE}"))?;
    let nanos_per_unit: u64 = match unit.trim() {
        "" => return Err(format!("duration {s:?} has no unit: {EXAMPLE}")),
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {s:?} (one of ns, us, ms, s, m, h, d)"
            ))
        }
    };
    // Whole numbers are converted exactly; fractions through f64.
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(nanos_per_unit)
            .map(Duration::from_nanos)
            .ok_or_else(|| format!("duration {s:?} is too large"));
    }
    let nanos = (value * nanos_per_unit as f64).round();
    if !(nanos.is_finite() && nanos < u64::MAX as f64) {
        return Err(format!("duration {s:?} is too large"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Writes `d` the way [`parse_duration`] reads it, in the largest unit that
/// keeps it exact: `"50ms"`, `"2s"`, `"250us"`, `"1m"`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    for (unit, per) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos != 0 && nanos / per * per == nanos {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{nanos}ns")
}

/// Serde helpers for duration keys: a string with a unit, read by
/// [`parse_duration`]. Use with `#[serde(deserialize_with = "...")]`.
pub mod duration {
    use super::*;

    /// A required (or container-defaulted) `Duration` field.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationVisitor {
            legacy_ms_key: None,
        })
    }

    /// An `Option<Duration>` field (`None` when the key is absent; pair it
    /// with `#[serde(default)]`).
    pub fn option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        deserialize(d).map(Some)
    }
}

/// Duration fields of this table that also read a bare integer as
/// milliseconds (the old spelling), with a deprecation notice naming the key.
mod legacy_ms {
    use super::*;

    macro_rules! keys {
        ($($f:ident => $key:literal),* $(,)?) => {$(
            pub(super) fn $f<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
                d.deserialize_any(DurationVisitor { legacy_ms_key: Some($key) })
            }
        )*};
    }

    keys! {
        per_try_timeout => "per_try_timeout",
        load_default_rtt => "load_default_rtt",
        load_decay => "load_decay",
        retry_budget_ttl => "retry_budget.ttl",
        breaker_backoff => "breaker.backoff",
        breaker_max_backoff => "breaker.max_backoff",
    }
}

struct DurationVisitor {
    /// Set for keys that accepted a bare integer of milliseconds.
    legacy_ms_key: Option<&'static str>,
}

impl<'de> Visitor<'de> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration with a unit, such as \"50ms\", \"2s\" or \"250us\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        parse_duration(s).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
        match self.legacy_ms_key {
            Some(key) => {
                deprecated(format!(
                    "[decisions.stack] {key} = {n} (bare milliseconds) is deprecated; \
                     write {key} = \"{n}ms\""
                ));
                Ok(Duration::from_millis(n))
            }
            None => Err(E::custom(format!(
                "a duration needs a unit: write \"{n}ms\", \"{n}s\" or \"{n}us\", not {n}"
            ))),
        }
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        match u64::try_from(n) {
            Ok(n) => self.visit_u64(n),
            Err(_) => Err(E::custom(format!("a duration cannot be negative ({n})"))),
        }
    }
}

thread_local! {
    static DEPRECATIONS: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Records a deprecation notice about the configuration being deserialized on
/// this thread, for [`collect_deprecations`] to return; without one running,
/// the notice is dropped. Deserializers call this for old spellings they still
/// accept (configuration is read before logging is installed, so they cannot
/// log).
pub fn deprecated(notice: impl Into<String>) {
    let notice = notice.into();
    DEPRECATIONS.with(|d| {
        if let Some(v) = d.borrow_mut().as_mut() {
            if !v.contains(&notice) {
                v.push(notice);
            }
        }
    });
}

/// Runs `read` (which deserializes some configuration) and returns its result
/// with the deprecation notices recorded meanwhile on this thread, in order.
/// Nested calls also pass their notices to the enclosing one.
pub fn collect_deprecations<T>(read: impl FnOnce() -> T) -> (T, Vec<String>) {
    struct Restore(Option<Vec<String>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            DEPRECATIONS.with(|d| {
                let mine = d.replace(outer).unwrap_or_default();
                if let Some(outer) = d.borrow_mut().as_mut() {
                    outer.extend(mine);
                }
            });
        }
    }
    let guard = Restore(DEPRECATIONS.with(|d| d.replace(Some(Vec::new()))));
    let out = read();
    let notices = DEPRECATIONS.with(|d| d.borrow().clone().unwrap_or_default());
    drop(guard);
    (out, notices)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("500µs"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("100ns"), Ok(Duration::from_nanos(100)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration(" 20 ms "), Ok(Duration::from_millis(20)));
        assert_eq!(parse_duration("0.25ms"), Ok(Duration::from_micros(250)));
        for bad in [
            "40",
            "2w",
            "fast",
            "",
            "ms",
            "-5ms",
            "1..2s",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_duration("40").unwrap_err().contains("no unit"));
    }

    #[test]
    fn formats_what_it_parses() {
        for (d, s) in [
            (Duration::from_millis(50), "50ms"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0ns"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Ok(d));
        }
    }

    #[test]
    fn bare_milliseconds_still_read_with_a_notice() {
        let (cfg, notices) = collect_deprecations(|| {
            toml::from_str::<StackConfig>("per_try_timeout = 25\n[breaker]\nbackoff = \"1s\"\n")
        });
        let cfg = cfg.unwrap();
        assert_eq!(cfg.per_try_timeout, Duration::from_millis(25));
        assert_eq!(cfg.breaker.backoff, Duration::from_secs(1));
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(
            notices[0].contains("per_try_timeout = \"25ms\""),
            "{notices:?}"
        );
        // Without a collector the notice goes nowhere (and nothing accumulates).
        assert!(toml::from_str::<StackConfig>("per_try_timeout = 25").is_ok());
        let ((), none) = collect_deprecations(|| ());
        assert!(none.is_empty());
    }

    #[test]
    fn nested_collectors_pass_notices_out() {
        let (inner, outer) = collect_deprecations(|| {
            deprecated("a");
            let ((), inner) = collect_deprecations(|| deprecated("b"));
            inner
        });
        assert_eq!(inner, ["b"]);
        assert_eq!(outer, ["a", "b"]);
    }

    #[test]
    fn the_overall_deadline_is_not_a_stack_key() {
        let err = toml::from_str::<StackConfig>("deadline = \"80ms\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("deadline"), "{err}");
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
}
