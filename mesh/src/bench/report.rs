//! What `mesh bench` reports: the types the load generator fills, the JSON
//! (`--json`) and HTML (`--html`, [`super::html`]) reports serialize, and the
//! plain-text form printed by default. Nothing here depends on the rest of the
//! bench.
use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub mode: String,
    pub seconds: f64,
    pub requests: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// How long after they were due requests were sent (the load generator's own
    /// lag, inside every latency above): its p99 and max.
    pub send_lag_p99_us: u64,
    pub send_lag_max_us: u64,
    pub codes: BTreeMap<String, u64>,
    /// Decide only: answers by source.
    pub sources: BTreeMap<String, u64>,
    /// Decide only: mean server-side stage times, µs.
    pub stages_us: BTreeMap<String, f64>,
    /// Decide only: the distribution of the server's own `total` (from the request's
    /// arrival to its answer, as the answers carry it): the part of the latency above
    /// spent inside the server, the rest being the way there and back and the load
    /// generator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerLatency>,
    /// `--deadline-ms` runs: the model answers that arrived within the deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub useful: Option<Useful>,
    /// One entry per second of load, from the start of the bench; a request
    /// counts in the second it was sent (open loop: when it was due).
    pub windows: Vec<Window>,
    /// The latency distribution of all requests in log-spaced buckets.
    pub histogram: Vec<Bucket>,
}

/// Useful answers: answered by a model (Infer: any OK; Decide: source MODEL or
/// PREVIOUS_VERSION) within the deadline, counted from when the request was due.
#[derive(Debug, Clone, Serialize)]
pub struct Useful {
    pub deadline_ms: u64,
    pub answers: u64,
    pub per_second: f64,
    /// Answers of any status that arrived more than 5 ms after the deadline.
    pub late: u64,
    /// `late` by status code (`Cancelled`: the client's own timer fired late).
    pub late_codes: BTreeMap<String, u64>,
}

/// Percentiles of the server's `total` stage time over the OK answers that carried it.
#[derive(Debug, Clone, Serialize)]
pub struct ServerLatency {
    pub answers: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Each stage's own p99 over the same answers (they do not add up: a slow
    /// request is rarely slow in every stage), and `other`: the total less the named
    /// stages (waiting for a thread between them, reading the request, writing the
    /// answer's record).
    pub stages_p99_us: BTreeMap<String, u64>,
}

/// The requests sent in one window `[t_s, t_s + seconds)` of the bench.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub t_s: f64,
    /// Length of the window: 1 s, less for the last one.
    pub seconds: f64,
    pub requests: u64,
    /// Requests that did not answer OK.
    pub errors: u64,
    /// Requests per second in this window.
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Decide: the p99 of the server's own `total` over the window's OK answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_p99_us: Option<u64>,
    /// With `--alternate-addr`: the server this second's requests went to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_to: Option<String>,
}

/// `count` latencies in `[lower_us, upper_us)`.
#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    pub lower_us: f64,
    pub upper_us: f64,
    pub count: u64,
}

/// One server's seconds of an alternating run (`--alternate-addr`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSeconds {
    pub addr: String,
    /// Seconds sent to it (a last window shorter than half a second is left out).
    pub seconds: usize,
    /// The median over those seconds of each second's p99.
    pub p99_us: u64,
    /// Decide: the median over those seconds of each second's server p99.
    pub server_p99_us: Option<u64>,
}

impl ServerSeconds {
    /// "ADDR: N seconds, per-second p99 median X[, the server's own Y]", the line the
    /// text and HTML reports give each server, with `addr` and the times as the
    /// caller writes them.
    pub fn describe(&self, addr: &str, us: impl Fn(u64) -> String) -> String {
        format!(
            "{addr}: {} seconds, per-second p99 median {}{}",
            self.seconds,
            us(self.p99_us),
            self.server_p99_us
                .map(|p| format!(", the server's own {}", us(p)))
                .unwrap_or_default()
        )
    }
}

impl Report {
    /// With `--alternate-addr`, each server's seconds, in the order the run first
    /// sent to them; empty otherwise.
    pub fn by_server(&self) -> Vec<ServerSeconds> {
        fn median(mut v: Vec<u64>) -> Option<u64> {
            v.sort_unstable();
            v.get(v.len() / 2).copied()
        }
        let mut out: Vec<ServerSeconds> = Vec::new();
        for w in &self.windows {
            let Some(addr) = &w.sent_to else { continue };
            if !out.iter().any(|s| &s.addr == addr) {
                let whole = self
                    .windows
                    .iter()
                    .filter(|x| x.sent_to.as_ref() == Some(addr) && x.seconds >= 0.5);
                out.push(ServerSeconds {
                    addr: addr.clone(),
                    seconds: whole.clone().count(),
                    p99_us: median(whole.clone().map(|x| x.p99_us).collect()).unwrap_or(0),
                    server_p99_us: median(whole.filter_map(|x| x.server_p99_us).collect()),
                });
            }
        }
        out
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} · {} · {:.1} s", self.target, self.mode, self.seconds)?;
        writeln!(
            f,
            "requests    {}  ({:.0} req/s)",
            self.requests, self.throughput
        )?;
        writeln!(
            f,
            "latency µs  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            self.p50_us, self.p90_us, self.p99_us, self.p999_us, self.max_us
        )?;
        writeln!(
            f,
            "send lag µs p99 {}  max {}  (the load generator's own delay)",
            self.send_lag_p99_us, self.send_lag_max_us
        )?;
        writeln!(f, "status      {:?}", self.codes)?;
        if let Some(u) = &self.useful {
            writeln!(
                f,
                "useful      {}  ({:.0}/s): model answers within the {} ms deadline; {} answers over 5 ms late {:?}",
                u.answers, u.per_second, u.deadline_ms, u.late, u.late_codes
            )?;
        }
        if !self.sources.is_empty() {
            writeln!(f, "sources     {:?}", self.sources)?;
        }
        if !self.stages_us.is_empty() {
            let s: Vec<String> = self
                .stages_us
                .iter()
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect();
            writeln!(f, "server µs   {}", s.join("  "))?;
        }
        for s in self.by_server() {
            writeln!(f, "{}", s.describe(&s.addr, |v| format!("{v} µs")))?;
        }
        if let Some(s) = &self.server {
            writeln!(
                f,
                "server total µs p50 {}  p99 {}  p99.9 {}  max {}  (arrival to answer, the server's own clock)",
                s.p50_us, s.p99_us, s.p999_us, s.max_us
            )?;
            if !s.stages_p99_us.is_empty() {
                let by: Vec<String> = s
                    .stages_p99_us
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                writeln!(
                    f,
                    "server p99 µs by stage  {}  (each its own p99; other: the total less the stages)",
                    by.join("  ")
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sources: &[(&str, u64)], stages: &[(&str, f64)]) -> Report {
        Report {
            target: "decide".into(),
            mode: "closed loop, 2 callers".into(),
            seconds: 1.5,
            requests: 10,
            throughput: 8.0,
            p50_us: 1,
            p90_us: 2,
            p99_us: 3,
            p999_us: 4,
            max_us: 5,
            send_lag_p99_us: 6,
            send_lag_max_us: 7,
            codes: BTreeMap::from([("OK".into(), 10)]),
            sources: sources.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            stages_us: stages.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            server: None,
            useful: None,
            windows: Vec::new(),
            histogram: Vec::new(),
        }
    }

    #[test]
    fn bench_text_report_shows_sources_stages_and_server_total_only_when_present() {
        let plain = report(&[], &[]).to_string();
        assert_eq!(
            plain,
            "decide · closed loop, 2 callers · 1.5 s\n\
             requests    10  (8 req/s)\n\
             latency µs  p50 1  p90 2  p99 3  p99.9 4  max 5\n\
             send lag µs p99 6  max 7  (the load generator's own delay)\n\
             status      {\"OK\": 10}\n"
        );
        let full = report(&[("MODEL", 10)], &[("compute", 12.4), ("total", 80.6)]).to_string();
        assert!(full.contains("sources     {\"MODEL\": 10}\n"), "{full}");
        assert!(
            full.ends_with("server µs   compute 12  total 81\n"),
            "{full}"
        );
        let mut with_server = report(&[], &[("total", 80.6)]);
        with_server.server = Some(ServerLatency {
            answers: 10,
            p50_us: 70,
            p99_us: 900,
            p999_us: 1_500,
            max_us: 2_000,
            stages_p99_us: BTreeMap::new(),
        });
        let text = with_server.to_string();
        assert!(
            text.ends_with("server total µs p50 70  p99 900  p99.9 1500  max 2000  (arrival to answer, the server's own clock)\n"),
            "{text}"
        );
        with_server.server.as_mut().unwrap().stages_p99_us =
            BTreeMap::from([("compute".into(), 40), ("other".into(), 700)]);
        let text = with_server.to_string();
        assert!(
            text.ends_with("server p99 µs by stage  compute 40  other 700  (each its own p99; other: the total less the stages)\n"),
            "{text}"
        );
        let mut with_deadline = report(&[], &[]);
        with_deadline.useful = Some(Useful {
            deadline_ms: 50,
            answers: 9,
            per_second: 6.0,
            late: 1,
            late_codes: BTreeMap::from([("Cancelled".into(), 1)]),
        });
        let text = with_deadline.to_string();
        assert!(
            text.ends_with("useful      9  (6/s): model answers within the 50 ms deadline; 1 answers over 5 ms late {\"Cancelled\": 1}\n"),
            "{text}"
        );
    }
}
