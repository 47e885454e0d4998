//! What the OIP and Decide front doors share about a request: its deadline (from
//! its arrival, see [`crate::arrival`], and its `grpc-timeout`), its id, the version
//! it names, and its one log line.
use std::time::{Duration, Instant};

use crate::error::RouterError;

/// One line per request at debug; failures the server caused at warn, the
/// caller's own mistakes at debug (they are the caller's to log). The request id
/// is a field of the line itself, so a warn line carries it even when the
/// per-request span (debug level: free when debug is off) is not recorded.
/// The latency is read only when the line is written (the common answer's line is
/// at debug, off by default).
pub fn log_result<T>(result: &Result<T, RouterError>, started: Instant, request_id: &str) {
    let us = || started.elapsed().as_micros() as u64;
    match result {
        Ok(_) => tracing::debug!(request_id, latency_us = us(), "answered"),
        Err(e) if e.is_server_side() => {
            tracing::warn!(request_id, latency_us = us(), code = e.code_label(), error = %e.message(), "request failed")
        }
        Err(e) => {
            tracing::debug!(request_id, latency_us = us(), code = e.code_label(), error = %e.message(), "request rejected")
        }
    }
}

/// Shortest deadline a request may bring: no model answers sooner, so a shorter
/// one (`grpc-timeout: 0m`) is DEADLINE_EXCEEDED at once.
pub const MIN_DEADLINE: Duration = Duration::from_micros(100);

/// Longest request id a caller may send, bytes: the id is copied into every log
/// line and prediction-log record of the request.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// Refuses an id longer than [`MAX_REQUEST_ID_BYTES`].
pub fn check_request_id(id: &str) -> Result<(), RouterError> {
    if id.len() > MAX_REQUEST_ID_BYTES {
        return Err(RouterError::invalid(format!(
            "request id is {} bytes; the limit is {MAX_REQUEST_ID_BYTES}",
            id.len()
        )));
    }
    Ok(())
}

/// An id for requests that bring none: process start time and a counter.
pub fn next_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u128> = OnceLock::new();
    static N: AtomicU64 = AtomicU64::new(0);
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0)
    });
    format!("oip-{start:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// `""` means "newest ready"; anything else must be a version number.
pub fn parse_version(model: &str, v: &str) -> Result<Option<u64>, RouterError> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<u64>().map(Some).map_err(|_| {
        RouterError::NotFound(format!(
            "model '{model}' has no version '{v}' (versions are numbers)"
        ))
    })
}

/// When a request must be answered by: its arrival plus the caller's budget
/// (`grpc-timeout`, `x-mesh-timeout-ms`) or else `default`, never more than `cap`
/// (`[server] max_timeout` for OIP, `[decisions] deadline` for Decide). The clock
/// starts at arrival, before decoding: time a request spent waiting for a thread
/// counts against its deadline.
pub fn deadline(
    arrival: Instant,
    caller: Option<Duration>,
    default: Duration,
    cap: Duration,
) -> Instant {
    let budget = caller.unwrap_or(default).min(cap);
    arrival.checked_add(budget).unwrap_or(arrival)
}

/// A request whose deadline has passed before its work started at `now` (it waited
/// longer than its budget before a handler ran): answered DEADLINE_EXCEEDED at
/// once, without doing the work, saying how late it is.
pub fn check_not_expired(
    arrival: Instant,
    deadline: Instant,
    now: Instant,
) -> Result<(), RouterError> {
    if now < deadline {
        return Ok(());
    }
    Err(RouterError::DeadlineExceeded(format!(
        "the request's deadline of {} after its arrival passed before its work started ({} after arrival)",
        crate::error::ms(deadline.saturating_duration_since(arrival)),
        crate::error::ms(now.saturating_duration_since(arrival)),
    )))
}

/// An answer that is ready (at `now`) only after the deadline is not an answer: the
/// caller has stopped waiting, and it must not count as served.
pub fn check_in_time(arrival: Instant, deadline: Instant, now: Instant) -> Result<(), RouterError> {
    if now <= deadline {
        return Ok(());
    }
    Err(RouterError::DeadlineExceeded(format!(
        "the answer was ready {} after the request's deadline ({} after its arrival)",
        crate::error::ms(now.saturating_duration_since(deadline)),
        crate::error::ms(deadline.saturating_duration_since(arrival)),
    )))
}

/// The caller's deadline budget from a gRPC request's `grpc-timeout` header.
pub fn timeout_of<T>(req: &tonic::Request<T>) -> Option<Duration> {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// Parses a `grpc-timeout` header value (`<digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn deadline_counts_from_arrival_and_is_capped() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(deadline(t0, Some(ms(20)), ms(1000), ms(50)), t0 + ms(20));
        assert_eq!(deadline(t0, Some(ms(80)), ms(1000), ms(50)), t0 + ms(50));
        assert_eq!(deadline(t0, None, ms(30), ms(50)), t0 + ms(30));
        assert_eq!(deadline(t0, None, ms(1000), ms(50)), t0 + ms(50));
        // A request that waited 30 ms before its handler with a 20 ms budget is
        // already late; one with 50 ms is not, and has 20 ms left.
        let arrived = Instant::now() - ms(30);
        let now = Instant::now();
        let e = check_not_expired(
            arrived,
            deadline(arrived, Some(ms(20)), ms(1000), ms(1000)),
            now,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded);
        assert!(
            e.message().contains("20.000 ms after its arrival passed"),
            "{e}"
        );
        assert!(check_not_expired(
            arrived,
            deadline(arrived, Some(ms(50)), ms(1000), ms(1000)),
            now
        )
        .is_ok());
        let e = check_in_time(arrived, arrived + ms(10), now).unwrap_err();
        assert!(
            e.message()
                .starts_with("deadline exceeded: the answer was ready 2"),
            "{e}"
        );
        assert!(check_in_time(arrived, arrived + ms(60), now).is_ok());
    }

    #[test]
    fn versions_are_numbers() {
        assert_eq!(parse_version("m", "").unwrap(), None);
        assert_eq!(parse_version("m", "3").unwrap(), Some(3));
        assert!(matches!(
            parse_version("m", "latest"),
            Err(RouterError::NotFound(_))
        ));
    }
}
