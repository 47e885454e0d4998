//! `mesh bench`: a load generator for a running mesh. Closed loop (a fixed number
//! of callers, each sending as soon as its last answer arrived) or open loop (a
//! fixed rate; latency counts from the intended send time, so queueing in the
//! client or server is not hidden). Drives `Decide` or OIP `ModelInfer`.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use mesh_proto::inference as oip;
use mesh_proto::mesh::v1 as pb;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::error::RouterError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// mesh.v1.Decisions/Decide with random card/merchant keys and request features.
    Decide,
    /// inference.GRPCInferenceService/ModelInfer with one random row.
    Infer,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// gRPC address of the mesh.
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    pub addr: String,
    #[arg(long, value_enum, default_value_t = Target::Decide)]
    pub target: Target,
    #[arg(long, default_value = "fraud_mlp")]
    pub model: String,
    /// Open loop at this many requests per second (otherwise closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Callers in flight (closed loop), or the most outstanding requests (open loop).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Seconds of load (default 10 unless --requests is given).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Stop after this many requests (with --seconds too: whichever comes first).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Entity key range for Decide (card_id 1..=N, merchant m000001..).
    #[arg(long, default_value_t = 10_000)]
    pub cards: i64,
    #[arg(long, default_value_t = 1_000)]
    pub merchants: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (summary, latency histogram,
    /// percentiles and throughput per second) to this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

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
    pub codes: BTreeMap<String, u64>,
    /// Decide only: answers by source.
    pub sources: BTreeMap<String, u64>,
    /// Decide only: mean server-side stage times, µs.
    pub stages_us: BTreeMap<String, f64>,
    /// One entry per second of load, from the start of the bench; a request
    /// counts in the second it was sent (open loop: when it was due).
    pub windows: Vec<Window>,
    /// The latency distribution of all requests in log-spaced buckets.
    pub histogram: Vec<Bucket>,
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
}

/// `count` latencies in `[lower_us, upper_us)`.
#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    pub lower_us: f64,
    pub upper_us: f64,
    pub count: u64,
}

/// Width of a time-series window.
const WINDOW: Duration = Duration::from_secs(1);

struct WindowTally {
    hist: Histogram<u64>,
    errors: u64,
}

struct Tally {
    started: Instant,
    /// Seconds of load: requests are sent in `[0, load_s)`.
    load_s: f64,
    hist: Histogram<u64>,
    windows: Vec<WindowTally>,
    codes: BTreeMap<String, u64>,
    sources: BTreeMap<String, u64>,
    stages: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn new(started: Instant, load_s: f64) -> Result<Self, RouterError> {
        Ok(Self {
            started,
            load_s,
            hist: Histogram::new_with_bounds(1, 120_000_000, 3)
                .map_err(|e| RouterError::Internal(e.to_string()))?,
            windows: Vec::new(),
            codes: BTreeMap::new(),
            sources: BTreeMap::new(),
            stages: BTreeMap::new(),
        })
    }

    /// Records one latency, in the window of `intended`.
    fn record(&mut self, intended: Instant, us: u64, ok: bool) {
        let us = us.clamp(1, self.hist.high());
        let _ = self.hist.record(us);
        let last = (self.load_s / WINDOW.as_secs_f64()).ceil().max(1.0) as usize - 1;
        let since = intended.saturating_duration_since(self.started);
        // A closed-loop caller may send a hair after the end: the last window.
        let idx = ((since.as_nanos() / WINDOW.as_nanos()) as usize).min(last);
        while self.windows.len() <= idx {
            self.windows.push(WindowTally {
                // Auto-resizing with two significant digits: a window's counts
                // array only spans the latencies it saw (a few KiB), so a long
                // bench stays small.
                hist: Histogram::new(2).expect("2 significant digits is valid"),
                errors: 0,
            });
        }
        let w = &mut self.windows[idx];
        let _ = w.hist.record(us);
        if !ok {
            w.errors += 1;
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
                }
            })
            .collect()
    }
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

fn decide_request(rng: &mut impl Rng, i: u64, args: &BenchArgs) -> pb::DecideRequest {
    let card = rng.random_range(1..=args.cards.max(1));
    let merchant = format!("m{:06}", rng.random_range(1..=args.merchants.max(1)));
    let mut features: std::collections::HashMap<String, f64> = (0..32)
        .map(|j| (format!("f{j}"), rng.random::<f64>() * 2.0 - 1.0))
        .collect();
    features.insert("amount".into(), rng.random::<f64>() * 500.0);
    pb::DecideRequest {
        request_id: format!("bench-{i}"),
        model: args.model.clone(),
        entities: [
            (
                "card_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::Int64Key(card)),
                },
            ),
            (
                "merchant_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::StringKey(merchant)),
                },
            ),
        ]
        .into(),
        features,
        categorical: [(
            "merchant_category".to_string(),
            ["grocery", "travel", "electronics", "gaming"][(i % 4) as usize].to_string(),
        )]
        .into(),
        ..Default::default()
    }
}

fn infer_request(rng: &mut impl Rng, model: &str) -> oip::ModelInferRequest {
    let raw: Vec<u8> = (0..32)
        .flat_map(|_| (rng.random::<f32>() * 2.0 - 1.0).to_le_bytes())
        .collect();
    oip::ModelInferRequest {
        model_name: model.to_owned(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![1, 32],
            ..Default::default()
        }],
        raw_input_contents: vec![raw],
        ..Default::default()
    }
}

#[derive(Clone)]
struct Clients {
    decide: pb::decisions_client::DecisionsClient<tonic::transport::Channel>,
    infer:
        oip::grpc_inference_service_client::GrpcInferenceServiceClient<tonic::transport::Channel>,
}

/// Sends one request; records latency from `intended` and the outcome.
async fn one(
    c: &mut Clients,
    args: &BenchArgs,
    i: u64,
    rng: &mut rand::rngs::StdRng,
    intended: Instant,
    tally: &Mutex<Tally>,
) {
    let (code, source, timings) = match args.target {
        Target::Decide => match c.decide.decide(decide_request(rng, i, args)).await {
            Ok(r) => {
                let r = r.into_inner();
                let src = pb::AnswerSource::try_from(r.source)
                    .map(|s| {
                        s.as_str_name()
                            .trim_start_matches("ANSWER_SOURCE_")
                            .to_owned()
                    })
                    .unwrap_or_default();
                ("OK".to_owned(), Some(src), r.timings)
            }
            Err(s) => (format!("{:?}", s.code()), None, None),
        },
        Target::Infer => match c.infer.model_infer(infer_request(rng, &args.model)).await {
            Ok(_) => ("OK".to_owned(), None, None),
            Err(s) => (format!("{:?}", s.code()), None, None),
        },
    };
    let us = intended.elapsed().as_micros() as u64;
    let mut t = tally.lock();
    t.record(intended, us, code == "OK");
    *t.codes.entry(code).or_default() += 1;
    if let Some(s) = source {
        *t.sources.entry(s).or_default() += 1;
    }
    if let Some(tm) = timings {
        for (k, v) in [
            ("validate", tm.validate_us),
            ("features", tm.features_us),
            ("preprocess", tm.preprocess_us),
            ("queue", tm.queue_us),
            ("compute", tm.compute_us),
            ("postprocess", tm.postprocess_us),
            ("total", tm.total_us),
        ] {
            *t.stages.entry(k).or_default() += v;
        }
    }
}

/// Cumulative server-side statistics of the model (OIP ModelStatistics, summed
/// over versions): the Infer target's per-stage breakdown is the difference
/// between the end and the start of the run, as perf_analyzer reports it.
#[derive(Debug, Clone, Copy, Default)]
struct ServerStats {
    inferences: u64,
    queue_ns: u64,
    input_ns: u64,
    infer_ns: u64,
    output_ns: u64,
}

impl ServerStats {
    fn per_inference_since(&self, before: &Self) -> BTreeMap<String, f64> {
        let n = self.inferences.saturating_sub(before.inferences);
        if n == 0 {
            return BTreeMap::new();
        }
        let us = |a: u64, b: u64| a.saturating_sub(b) as f64 / n as f64 / 1e3;
        [
            ("queue", us(self.queue_ns, before.queue_ns)),
            ("compute_input", us(self.input_ns, before.input_ns)),
            ("compute_infer", us(self.infer_ns, before.infer_ns)),
            ("compute_output", us(self.output_ns, before.output_ns)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

async fn server_stats(c: &Clients, args: &BenchArgs) -> Option<ServerStats> {
    if args.target != Target::Infer {
        return None;
    }
    let r = c
        .infer
        .clone()
        .model_statistics(oip::ModelStatisticsRequest {
            name: args.model.clone(),
            version: String::new(),
        })
        .await
        .ok()?
        .into_inner();
    let mut s = ServerStats::default();
    for m in r.model_stats {
        s.inferences += m.inference_count;
        let i = m.inference_stats.unwrap_or_default();
        let ns = |d: Option<oip::StatisticDuration>| d.map_or(0, |d| d.ns);
        s.queue_ns += ns(i.queue);
        s.input_ns += ns(i.compute_input);
        s.infer_ns += ns(i.compute_infer);
        s.output_ns += ns(i.compute_output);
    }
    Some(s)
}

/// Seconds the load may last: `--seconds`, else unbounded with `--requests`, else 10.
fn load_seconds(args: &BenchArgs) -> Result<f64, RouterError> {
    if args.requests == Some(0) {
        return Err(RouterError::invalid("--requests must be at least 1"));
    }
    Ok(match (args.seconds, args.requests) {
        (Some(s), _) if !(s > 0.0 && s.is_finite()) => {
            return Err(RouterError::invalid(format!(
                "--seconds {s}: must be a positive number"
            )))
        }
        (Some(s), _) => s,
        (None, Some(_)) => 365.0 * 86_400.0,
        (None, None) => 10.0,
    })
}

pub async fn run(args: BenchArgs) -> Result<Report, RouterError> {
    // Bad arguments fail before any connection is tried.
    load_seconds(&args)?;
    let channel = tonic::transport::Endpoint::from_shared(args.addr.clone())
        .map_err(|e| RouterError::invalid(format!("--addr: {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| RouterError::Unavailable(format!("connecting to {}: {e}", args.addr)))?;
    let clients = Clients {
        decide: pb::decisions_client::DecisionsClient::new(channel.clone()),
        infer: oip::grpc_inference_service_client::GrpcInferenceServiceClient::new(channel),
    };
    let load_s = load_seconds(&args)?;
    let max_requests = args.requests.unwrap_or(u64::MAX);
    let server_before = server_stats(&clients, &args).await;
    let started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally::new(started, load_s)?));
    let args = Arc::new(args);
    let end = started + Duration::from_secs_f64(load_s);
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let progress = {
        let tally = tally.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let t = tally.lock();
                eprint!(
                    "\r{:>5.1} s  {:>8} requests  p99 {:>7} µs   ",
                    started.elapsed().as_secs_f64(),
                    t.hist.len(),
                    t.hist.value_at_quantile(0.99)
                );
            }
        })
    };
    match args.rate {
        None => {
            let workers: Vec<_> = (0..args.concurrency.max(1))
                .map(|w| {
                    let (mut c, tally, args, sent) =
                        (clients.clone(), tally.clone(), args.clone(), sent.clone());
                    tokio::spawn(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                        while Instant::now() < end {
                            let i = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= max_requests {
                                break;
                            }
                            one(&mut c, &args, i, &mut rng, Instant::now(), &tally).await;
                        }
                    })
                })
                .collect();
            for w in workers {
                let _ = w.await;
            }
        }
        Some(rate) => {
            // Open loop: request i is due at start + i/rate whatever happened before.
            let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1) * 64));
            let mut i: u64 = 0;
            let mut tasks = Vec::new();
            loop {
                let due = started + Duration::from_secs_f64(i as f64 / rate.max(1e-3));
                if due >= end || i >= max_requests {
                    break;
                }
                tokio::time::sleep_until(due.into()).await;
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    break;
                };
                let (mut c, tally, args) = (clients.clone(), tally.clone(), args.clone());
                tasks.push(tokio::spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(i);
                    one(&mut c, &args, i, &mut rng, due, &tally).await;
                    drop(permit);
                }));
                i += 1;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }
    progress.abort();
    eprintln!();
    let secs = started.elapsed().as_secs_f64();
    let server = match (server_before, server_stats(&clients, &args).await) {
        (Some(a), Some(b)) => b.per_inference_since(&a),
        _ => BTreeMap::new(),
    };
    let mut t = tally.lock();
    // A count-bounded run learns its length at the end.
    t.load_s = t.load_s.min(secs);
    let n = t.hist.len();
    let ok = t.codes.get("OK").copied().unwrap_or(0).max(1) as f64;
    let report = Report {
        target: format!("{:?}", args.target).to_lowercase(),
        mode: format!(
            "{}{}",
            match args.rate {
                Some(r) => format!("open loop at {r} req/s"),
                None => format!("closed loop, {} callers", args.concurrency),
            },
            args.requests
                .map(|n| format!(", {n} requests"))
                .unwrap_or_default()
        ),
        seconds: secs,
        requests: n,
        throughput: n as f64 / secs,
        p50_us: t.hist.value_at_quantile(0.5),
        p90_us: t.hist.value_at_quantile(0.9),
        p99_us: t.hist.value_at_quantile(0.99),
        p999_us: t.hist.value_at_quantile(0.999),
        max_us: t.hist.max(),
        codes: t.codes.clone(),
        sources: t.sources.clone(),
        stages_us: if t.stages.is_empty() {
            server
        } else {
            t.stages
                .iter()
                .map(|(k, v)| (k.to_string(), *v as f64 / ok))
                .collect()
        },
        windows: t.windows(),
        histogram: log_buckets(&t.hist),
    };
    if let Some(path) = &args.html {
        std::fs::write(path, crate::bench_html::render(&report))
            .map_err(|e| RouterError::Internal(format!("writing {}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(report)
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
        writeln!(f, "status      {:?}", self.codes)?;
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
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: BenchArgs,
        }
        use clap::Parser;
        P::parse_from(std::iter::once("bench").chain(args.iter().copied())).a
    }

    #[test]
    fn bench_bounds_by_time_or_count_and_names_bad_values() {
        assert_eq!(load_seconds(&parse(&[])).unwrap(), 10.0);
        assert_eq!(load_seconds(&parse(&["--seconds", "2.5"])).unwrap(), 2.5);
        assert!(load_seconds(&parse(&["--requests", "5"])).unwrap() > 1e6);
        let e = load_seconds(&parse(&["--requests", "0"])).unwrap_err();
        assert!(e.to_string().contains("--requests"), "{e}");
        let e = load_seconds(&parse(&["--seconds=-1"])).unwrap_err();
        assert!(e.to_string().contains("--seconds -1"), "{e}");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

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
}
