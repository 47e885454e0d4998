//! What the bench counts while it runs (latencies overall and per one-second
//! window, status codes, answer sources, server stage times) and how that becomes
//! a [`Report`].
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::report::{Bucket, Report, ServerLatency, Useful, Window};

/// An answer is `late` when it arrives more than this after its deadline: a
/// server that keeps deadlines answers within them plus the way back.
pub const LATE_GRACE: Duration = Duration::from_millis(5);

/// Width of a time-series window.
const WINDOW: Duration = Duration::from_secs(1);

struct WindowTally {
    hist: Histogram<u64>,
    errors: u64,
    /// The server's `total` of the window's answers that carried one.
    server: Option<Histogram<u64>>,
}

pub struct Tally {
    started: Instant,
    /// Seconds of load: requests are sent in `[0, load_s)`.
    load_s: f64,
    pub hist: Histogram<u64>,
    windows: Vec<WindowTally>,
    codes: BTreeMap<String, u64>,
    sources: BTreeMap<String, u64>,
    stages: BTreeMap<&'static str, u64>,
    /// The server's `total` stage time (µs) of each answer that carried one.
    server_total: Histogram<u64>,
    /// Each stage's time (µs) of those answers, and `other`: the total less the
    /// named stages.
    stage_hists: BTreeMap<&'static str, Histogram<u64>>,
    /// With a deadline: the deadline, and the model answers that arrived within it.
    useful: Option<(Duration, u64)>,
    /// With a deadline: answers of any status later than it by more than
    /// [`LATE_GRACE`], by status code (a `Cancelled` one is the client's own timer
    /// firing late: the load generator fell behind; any other came late from the
    /// server or the way back).
    late_codes: BTreeMap<String, u64>,
    /// How long after it was due each request was handed to the client (µs): the
    /// load generator's own lag, part of every latency it reports.
    send_lag: Histogram<u64>,
}

impl Tally {
    pub fn new(started: Instant, load_s: f64) -> anyhow::Result<Self> {
        Ok(Self {
            started,
            load_s,
            hist: Histogram::new_with_bounds(1, 120_000_000, 3)?,
            windows: Vec::new(),
            codes: BTreeMap::new(),
            sources: BTreeMap::new(),
            stages: BTreeMap::new(),
            server_total: Histogram::new_with_bounds(1, 120_000_000, 3)?,
            stage_hists: BTreeMap::new(),
            useful: None,
            late_codes: BTreeMap::new(),
            send_lag: Histogram::new_with_bounds(1, 120_000_000, 2)?,
        })
    }

    /// Counts useful answers against `deadline` from now on.
    pub fn with_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.useful = deadline.map(|d| (d, 0));
        self
    }

    /// Counts one answer (`us` from when it was due) as useful if it came from a
    /// model (`from_model`) within the deadline, and as late if it came more than
    /// [`LATE_GRACE`] after it, whatever it was (`code`: its status).
    pub fn useful(&mut self, us: u64, from_model: bool, code: &str) {
        if let Some((d, useful)) = &mut self.useful {
            let us = u128::from(us);
            if from_model && us <= d.as_micros() {
                *useful += 1;
            }
            if us > (*d + LATE_GRACE).as_micros() {
                *self.late_codes.entry(code.to_owned()).or_default() += 1;
            }
        }
    }

    /// Records how long after it was due a request was sent (`us`).
    pub fn send_lag(&mut self, us: u64) {
        let _ = self.send_lag.record(us.clamp(1, self.send_lag.high()));
    }

    /// The window of a request sent at `intended`, created (with those before it)
    /// when it is the first.
    fn window(&mut self, intended: Instant) -> &mut WindowTally {
        let last = (self.load_s / WINDOW.as_secs_f64()).ceil().max(1.0) as usize - 1;
        let since = intended.saturating_duration_since(self.started);
        // A closed-loop caller may send a hair after the end: the last window.
        let idx = ((since.as_nanos() / WINDOW.as_nanos()) as usize).min(last);
        while self.windows.len() <= idx {
            self.windows.push(WindowTally {
                hist: auto_histogram(),
                errors: 0,
                server: None,
            });
        }
        &mut self.windows[idx]
    }

    /// Records one latency, in the window of `intended`.
    pub fn record(&mut self, intended: Instant, us: u64, ok: bool) {
        let us = us.clamp(1, self.hist.high());
        let _ = self.hist.record(us);
        let w = self.window(intended);
        let _ = w.hist.record(us);
        if !ok {
            w.errors += 1;
        }
    }

    /// Counts one answer to the request sent at `intended`: its status code, where it
    /// came from (Decide) and the server's time per stage (Decide), summed; the `total`
    /// stage also goes into a distribution of its own, overall and in its window, and
    /// with it each stage into one of its own, `other` (the total less the named
    /// stages) too.
    pub fn count(
        &mut self,
        intended: Instant,
        code: String,
        source: Option<String>,
        stages: &[(&'static str, u64)],
    ) {
        *self.codes.entry(code).or_default() += 1;
        if let Some(s) = source {
            *self.sources.entry(s).or_default() += 1;
        }
        for (k, v) in stages {
            *self.stages.entry(*k).or_default() += *v;
        }
        let Some(total) = stages.iter().find(|(k, _)| *k == "total").map(|s| s.1) else {
            return;
        };
        let us = total.clamp(1, self.server_total.high());
        let _ = self.server_total.record(us);
        let _ = self
            .window(intended)
            .server
            .get_or_insert_with(auto_histogram)
            .record(us);
        let named = stages.iter().copied().filter(|(k, _)| *k != "total");
        let other = total.saturating_sub(named.clone().map(|(_, v)| v).sum());
        for (k, v) in named.chain([("other", other)]) {
            let _ = self
                .stage_hists
                .entry(k)
                .or_insert_with(auto_histogram)
                .record(v);
        }
    }

    /// The windows as reported.
    fn windows(&self) -> Vec<Window> {
        let load_s = self.load_s;
        let width = WINDOW.as_secs_f64();
        self.windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let t_s = i as f64 * width;
                let seconds = (load_s - t_s).clamp(1e-3, width);
                let n = w.hist.len();
                let q = |q: f64| w.hist.value_at_quantile(q);
                Window {
                    t_s,
                    seconds,
                    requests: n,
                    errors: w.errors,
                    throughput: n as f64 / seconds,
                    p50_us: q(0.5),
                    p90_us: q(0.9),
                    p99_us: q(0.99),
                    p999_us: q(0.999),
                    max_us: w.hist.max(),
                    server_p99_us: w.server.as_ref().map(|h| h.value_at_quantile(0.99)),
                    sent_to: None,
                }
            })
            .collect()
    }

    /// The report of a run that lasted `secs`. Stage times are the means over the
    /// OK answers of what the answers carried (Decide), else `server_stages`
    /// (what the server's own statistics say, for Infer).
    pub fn report(
        &mut self,
        target: String,
        mode: String,
        secs: f64,
        server_stages: BTreeMap<String, f64>,
    ) -> Report {
        // A count-bounded run learns its length at the end.
        self.load_s = self.load_s.min(secs);
        let n = self.hist.len();
        let ok = self.codes.get("OK").copied().unwrap_or(0).max(1) as f64;
        Report {
            target,
            mode,
            seconds: secs,
            requests: n,
            throughput: n as f64 / secs,
            p50_us: self.hist.value_at_quantile(0.5),
            p90_us: self.hist.value_at_quantile(0.9),
            p99_us: self.hist.value_at_quantile(0.99),
            p999_us: self.hist.value_at_quantile(0.999),
            max_us: self.hist.max(),
            codes: self.codes.clone(),
            sources: self.sources.clone(),
            useful: self.useful.map(|(d, answers)| Useful {
                deadline_ms: d.as_millis() as u64,
                answers,
                per_second: answers as f64 / secs,
                late: self.late_codes.values().sum(),
                late_codes: self.late_codes.clone(),
            }),
            send_lag_p99_us: self.send_lag.value_at_quantile(0.99),
            send_lag_max_us: self.send_lag.max(),
            stages_us: if self.stages.is_empty() {
                server_stages
            } else {
                self.stages
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v as f64 / ok))
                    .collect()
            },
            server: (!self.server_total.is_empty()).then(|| {
                let h = &self.server_total;
                ServerLatency {
                    answers: h.len(),
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                    p999_us: h.value_at_quantile(0.999),
                    max_us: h.max(),
                    stages_p99_us: self
                        .stage_hists
                        .iter()
                        .map(|(k, h)| (k.to_string(), h.value_at_quantile(0.99)))
                        .collect(),
                }
            }),
            windows: self.windows(),
            histogram: log_buckets(&self.hist),
        }
    }
}

/// A histogram that resizes to the values it sees, with two significant digits: its
/// counts array only spans the latencies recorded (a few KiB for a window), so a
/// long bench stays small.
fn auto_histogram() -> Histogram<u64> {
    Histogram::new(2).expect("2 significant digits is valid")
}

/// Splits the recorded latencies into log-spaced buckets (edges at 10^(k/n) µs,
/// rounded to 3 significant digits) from the smallest to the largest: 10, 20,
/// 50 or 100 buckets per decade, the fewest that give at least 30 buckets.
pub fn log_buckets(hist: &Histogram<u64>) -> Vec<Bucket> {
    if hist.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = (hist.min().max(1) as f64, hist.max().max(1) as f64);
    let decades = (hi.log10() - lo.log10()).max(0.0);
    let per_decade = [10u32, 20, 50, 100]
        .into_iter()
        .find(|n| decades * *n as f64 >= 30.0)
        .unwrap_or(100) as f64;
    // Through decimal text, so that the edges print as short numbers.
    let round3 = |x: f64| format!("{x:.2e}").parse::<f64>().unwrap_or(x);
    let k0 = (lo.log10() * per_decade).floor() as i64;
    let k1 = (hi.log10() * per_decade).floor() as i64 + 1;
    let mut edges: Vec<f64> = (k0..=k1)
        .map(|k| round3(10f64.powf(k as f64 / per_decade)))
        .collect();
    edges.dedup();
    let mut counts = vec![0u64; edges.len() - 1];
    for v in hist.iter_recorded() {
        let x = hist.median_equivalent(v.value_iterated_to()) as f64;
        let i = edges.partition_point(|e| *e <= x).clamp(1, counts.len());
        counts[i - 1] += v.count_at_value();
    }
    edges
        .windows(2)
        .zip(counts)
        .map(|(e, count)| Bucket {
            lower_us: e[0],
            upper_us: e[1],
            count,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bench_log_buckets_cover_every_latency() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).unwrap();
        for v in [90u64, 100, 101, 250, 251, 999, 1000, 4_000, 80_000] {
            h.record_n(v, 3).unwrap();
        }
        let b = log_buckets(&h);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), h.len());
        assert!(b.len() >= 30, "{}", b.len());
        assert!(b.first().unwrap().lower_us <= 90.0);
        assert!(b.last().unwrap().upper_us > 80_000.0);
        for w in b.windows(2) {
            assert_eq!(w[0].upper_us, w[1].lower_us);
            assert!(w[0].lower_us < w[0].upper_us);
        }
        // Edges print short (3 significant digits), e.g. 126 not 125.89254117941675.
        assert!(b.iter().all(|b| b.lower_us.to_string().len() <= 8), "{b:?}");
        // One value only: one bucket around it.
        let mut one = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).unwrap();
        one.record(500).unwrap();
        let b = log_buckets(&one);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 1);
        assert!(log_buckets(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }

    #[test]
    fn bench_windows_bucket_by_send_time() {
        let start = Instant::now();
        let mut t = Tally::new(start, 2.5).unwrap();
        let at = |s: f64| start + Duration::from_secs_f64(s);
        for i in 0..100 {
            t.record(at(0.01 * i as f64), 100 + i, true);
        }
        t.record(at(1.5), 5_000, false);
        t.record(at(2.2), 300, true);
        // Sent a hair after the end (closed loop): still in the last window.
        t.record(at(2.6), 300, true);
        let w = t.windows();
        assert_eq!(w.len(), 3);
        assert_eq!((w[0].requests, w[0].errors), (100, 0));
        assert_eq!((w[1].requests, w[1].errors), (1, 1));
        assert_eq!(w[2].requests, 2);
        assert_eq!(w[2].t_s, 2.0);
        assert!((w[2].seconds - 0.5).abs() < 1e-9);
        assert!((w[2].throughput - 4.0).abs() < 1e-9);
        assert!((149..=151).contains(&w[0].p50_us), "{}", w[0].p50_us);
        assert!(w[0].max_us >= 199);
        assert_eq!(w[1].p999_us, w[1].max_us);
        assert_eq!(t.hist.len(), 103);
        // A second with no answers in between (a stall) is an empty window.
        let mut t = Tally::new(start, 3.0).unwrap();
        t.record(at(0.1), 100, true);
        t.record(at(2.1), 100, true);
        let w = t.windows();
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[1].requests, w[1].p50_us, w[1].p999_us, w[1].max_us),
            (0, 0, 0, 0)
        );
        assert_eq!(w[1].throughput, 0.0);
    }

    #[test]
    fn bench_report_means_stages_over_ok_answers_and_trims_to_the_run() {
        let start = Instant::now();
        // Bounded by count: the load could have lasted a year, it lasted 1.5 s.
        let mut t = Tally::new(start, 365.0 * 86_400.0).unwrap();
        let at = |s: f64| start + Duration::from_secs_f64(s);
        for (i, code) in ["OK", "OK", "OK", "Unavailable"].into_iter().enumerate() {
            t.record(at(0.5 * i as f64), 100, code == "OK");
            let ok = code == "OK";
            let stages: &[(&'static str, u64)] = if ok {
                &[("compute", 30), ("total", 90)]
            } else {
                &[]
            };
            t.count(
                at(0.5 * i as f64),
                code.into(),
                ok.then(|| "MODEL".to_owned()),
                stages,
            );
        }
        let server = BTreeMap::from([("queue".to_owned(), 1.0)]);
        let r = t.report(
            "decide".into(),
            "closed loop, 1 callers".into(),
            1.5,
            server.clone(),
        );
        assert_eq!((r.requests, r.seconds, r.throughput), (4, 1.5, 4.0 / 1.5));
        assert_eq!(
            r.codes,
            BTreeMap::from([("OK".into(), 3), ("Unavailable".into(), 1)])
        );
        assert_eq!(r.sources, BTreeMap::from([("MODEL".into(), 3)]));
        // Sums over the three OK answers, not the four requests; the answers'
        // stages win over the server's statistics.
        assert_eq!(
            r.stages_us,
            BTreeMap::from([("compute".into(), 30.0), ("total".into(), 90.0)])
        );
        // Windows end where the run did: 0-1 s and a half second.
        assert_eq!(r.windows.len(), 2);
        assert!((r.windows[1].seconds - 0.5).abs() < 1e-9);
        assert_eq!(r.histogram.iter().map(|b| b.count).sum::<u64>(), 4);
        assert!(r.useful.is_none());
        // The server's own totals: one per OK answer that carried stage times.
        let srv = r.server.as_ref().unwrap();
        assert_eq!((srv.answers, srv.p50_us, srv.max_us), (3, 90, 90));
        // Each stage's own p99, and what the total has beyond the named stages.
        assert_eq!(
            srv.stages_p99_us,
            BTreeMap::from([("compute".into(), 30), ("other".into(), 60)])
        );
        // And in the window of each request's send time.
        assert_eq!(
            r.windows
                .iter()
                .map(|w| w.server_p99_us)
                .collect::<Vec<_>>(),
            [Some(90), Some(90)]
        );
        // A window whose answers carried no total has none.
        let mut t = Tally::new(start, 2.0).unwrap();
        t.record(at(0.2), 100, true);
        t.count(at(0.2), "OK".into(), None, &[("total", 40)]);
        t.record(at(1.2), 100, false);
        t.count(at(1.2), "Unavailable".into(), None, &[]);
        let w = t
            .report("decide".into(), String::new(), 2.0, BTreeMap::new())
            .windows;
        assert_eq!(
            w.iter().map(|w| w.server_p99_us).collect::<Vec<_>>(),
            [Some(40), None]
        );
        // With a deadline: model answers within it are useful; late ones and
        // fallbacks are not.
        let mut t = Tally::new(start, 2.0)
            .unwrap()
            .with_deadline(Some(Duration::from_millis(50)));
        t.useful(49_000, true, "OK");
        t.useful(50_000, true, "OK");
        t.useful(50_001, true, "OK");
        t.useful(100, false, "ResourceExhausted");
        t.useful(55_000, false, "Cancelled");
        t.useful(55_001, false, "Cancelled");
        t.useful(70_000, false, "DeadlineExceeded");
        let u = t
            .report("decide".into(), String::new(), 2.0, BTreeMap::new())
            .useful
            .unwrap();
        assert_eq!((u.deadline_ms, u.answers, u.per_second), (50, 2, 1.0));
        // Only answers more than 5 ms past the deadline are late, by status.
        assert_eq!(u.late, 2);
        assert_eq!(
            u.late_codes,
            BTreeMap::from([("Cancelled".into(), 1), ("DeadlineExceeded".into(), 1)])
        );
        // The send lag is what was recorded, whatever the answers.
        let mut t = Tally::new(start, 1.0).unwrap();
        for us in [10, 20, 30_000] {
            t.send_lag(us);
        }
        let r = t.report("infer".into(), String::new(), 1.0, BTreeMap::new());
        // No answer carried a total (Infer): no server distribution.
        assert!(r.server.is_none());
        assert!(
            (29_000..=31_000).contains(&r.send_lag_max_us),
            "{}",
            r.send_lag_max_us
        );
        // Without stage times in the answers (Infer), the server's are reported.
        let mut t = Tally::new(start, 1.0).unwrap();
        t.record(start, 100, true);
        t.count(start, "OK".into(), None, &[]);
        assert_eq!(
            t.report("infer".into(), String::new(), 1.0, server.clone())
                .stages_us,
            server
        );
    }
}
