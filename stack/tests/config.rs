//! Deserializing `StackConfig` from TOML and JSON.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use mesh_stack::StackConfig;

#[test]
fn empty_table_gives_defaults() {
    let cfg: StackConfig = toml::from_str("").unwrap();
    assert_eq!(cfg, StackConfig::default());
}

#[test]
fn durations_as_strings_or_milliseconds() {
    let cfg: StackConfig = toml::from_str(
        r#"
        per_try_timeout = 25
        max_attempts = 2
        max_in_flight = 64

        [retry_budget]
        ratio = 0.1
        min_per_sec = 5
        ttl = "5s"

        [breaker]
        failure_threshold = 4
        backoff = "250ms"
        max_backoff = "1m"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.per_try_timeout, Duration::from_millis(25));
    assert_eq!(cfg.max_attempts, 2);
    assert_eq!(cfg.retry_budget.ttl, Duration::from_secs(5));
    assert_eq!(cfg.breaker.backoff, Duration::from_millis(250));
    assert_eq!(cfg.breaker.max_backoff, Duration::from_secs(60));
    assert_eq!(cfg.breaker.multiplier, 2.0);
    assert!(cfg.validate().is_ok());

    let json: StackConfig = serde_json::from_str(r#"{"per_try_timeout": "1.5s"}"#).unwrap();
    assert_eq!(json.per_try_timeout, Duration::from_millis(1500));
}

#[test]
fn unknown_fields_and_bad_units_are_errors() {
    assert!(toml::from_str::<StackConfig>("per_try_timout = 5").is_err());
    assert!(toml::from_str::<StackConfig>("per_try_timeout = \"5 parsecs\"").is_err());
}
