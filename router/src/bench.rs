//! `mesh bench`: a load generator for a running mesh. Closed loop (a fixed number
//! of callers, each sending as soon as its last answer arrived) or open loop (a
//! fixed rate; latency counts from the intended send time, so queueing in the
//! client or server is not hidden). Drives `Decide` or OIP `ModelInfer`.
use std::collections::BTreeMap;
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
    /// Seconds of load.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Entity key range for Decide (card_id 1..=N, merchant m000001..).
    #[arg(long, default_value_t = 10_000)]
    pub cards: i64,
    #[arg(long, default_value_t = 1_000)]
    pub merchants: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
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
}

struct Tally {
    hist: Histogram<u64>,
    codes: BTreeMap<String, u64>,
    sources: BTreeMap<String, u64>,
    stages: BTreeMap<&'static str, u64>,
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
    let _ = t.hist.record(us.max(1));
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

pub async fn run(args: BenchArgs) -> Result<Report, RouterError> {
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
    let tally = Arc::new(Mutex::new(Tally {
        hist: Histogram::new_with_bounds(1, 120_000_000, 3)
            .map_err(|e| RouterError::Internal(e.to_string()))?,
        codes: BTreeMap::new(),
        sources: BTreeMap::new(),
        stages: BTreeMap::new(),
    }));
    let args = Arc::new(args);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(args.seconds);
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
                    let (mut c, tally, args) = (clients.clone(), tally.clone(), args.clone());
                    tokio::spawn(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                        let mut i = w as u64;
                        while Instant::now() < end {
                            one(&mut c, &args, i, &mut rng, Instant::now(), &tally).await;
                            i += args.concurrency as u64;
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
                if due >= end {
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
    let t = tally.lock();
    let n = t.hist.len();
    let ok = t.codes.get("OK").copied().unwrap_or(0).max(1) as f64;
    Ok(Report {
        target: format!("{:?}", args.target).to_lowercase(),
        mode: match args.rate {
            Some(r) => format!("open loop at {r} req/s"),
            None => format!("closed loop, {} callers", args.concurrency),
        },
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
        stages_us: t
            .stages
            .iter()
            .map(|(k, v)| (k.to_string(), *v as f64 / ok))
            .collect(),
    })
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
