//! `mesh demo`: starts the mesh in-process on loopback with the example model
//! repository, drives real gRPC traffic at it (transactions drawn from the same
//! distribution the reference fraud model was trained on, labelled by the same
//! rule), and prints what happened: throughput, latency percentiles, errors, the
//! server-side breakdown, and the model's ROC AUC on the traffic it scored.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use mesh_proto::inference as pb;
use parking_lot::Mutex;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use rand::{Rng, SeedableRng};

use crate::config::ServerConfig;
use crate::error::RouterError;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seconds of traffic.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Model repository.
    #[arg(long, default_value = "examples/models")]
    pub models: PathBuf,
}

/// One synthetic transaction: 32 standard-normal features and its fraud score
/// (the generating rule of the reference data set, before noise).
fn transaction(rng: &mut impl Rng) -> (Vec<f32>, f64) {
    let x: Vec<f32> = (0..32)
        .map(|_| {
            // Box-Muller.
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect();
    let f = |i: usize| x[i] as f64;
    let score = 1.5 * f(0) * f(1)
        + (2.0 * f(2)).sin() * f(3)
        + 0.8 * (f(4) - f(5)).max(0.0)
        + 0.5 * (f(6) * f(6) - 1.0)
        - 0.6 * f(7).abs()
        + 0.25 * (8..16).map(f).sum::<f64>() / 8f64.sqrt();
    (x, score)
}

struct Tally {
    latency: Histogram<u64>,
    codes: BTreeMap<String, u64>,
    scored: Vec<(f32, f64)>,
}

pub async fn run(args: DemoArgs) -> Result<(), RouterError> {
    let cfg = ServerConfig {
        grpc_port: 0,
        http_port: 0,
        models: args.models.clone(),
        ..ServerConfig::default()
    };
    let server = crate::server::start(&cfg).await?;
    println!(
        "mesh demo: serving {} on grpc={} http={}",
        args.models.display(),
        server.grpc_addr,
        server.http_addr
    );
    let client = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .map_err(|e| RouterError::Internal(format!("connecting to the mesh: {e}")))?;
    let tally = Arc::new(Mutex::new(Tally {
        latency: Histogram::new_with_bounds(1, 60_000_000, 3)
            .map_err(|e| RouterError::Internal(e.to_string()))?,
        codes: BTreeMap::new(),
        scored: Vec::new(),
    }));
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    println!(
        "driving {} s of traffic at concurrency {} ...",
        args.seconds, args.concurrency
    );
    let workers: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let (mut client, tally) = (client.clone(), tally.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                while Instant::now() < end {
                    let (x, score) = transaction(&mut rng);
                    let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let req = pb::ModelInferRequest {
                        model_name: "fraud_mlp".into(),
                        inputs: vec![pb::model_infer_request::InferInputTensor {
                            name: "input".into(),
                            datatype: "FP32".into(),
                            shape: vec![1, 32],
                            ..Default::default()
                        }],
                        raw_input_contents: vec![raw],
                        ..Default::default()
                    };
                    let t = Instant::now();
                    let res = client.model_infer(req).await;
                    let us = t.elapsed().as_micros() as u64;
                    let mut g = tally.lock();
                    let _ = g.latency.record(us.max(1));
                    match res {
                        Ok(r) => {
                            *g.codes.entry("OK".into()).or_default() += 1;
                            let r = r.into_inner();
                            if let Some(b) = r.raw_output_contents.first().and_then(|b| b.get(..4))
                            {
                                let p = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                                g.scored.push((p, score));
                            }
                        }
                        Err(s) => *g.codes.entry(format!("{:?}", s.code())).or_default() += 1,
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let g = tally.lock();
    let n = g.latency.len();
    println!("\n== traffic");
    println!(
        "requests    {n} in {elapsed:.1} s = {:.0} req/s",
        n as f64 / elapsed
    );
    println!(
        "latency     p50 {} µs   p99 {} µs   p99.9 {} µs   max {} µs",
        g.latency.value_at_quantile(0.5),
        g.latency.value_at_quantile(0.99),
        g.latency.value_at_quantile(0.999),
        g.latency.max()
    );
    println!("status      {:?}", g.codes);
    println!("\n== server side (fraud_mlp)");
    let core = server
        .core
        .as_ref()
        .ok_or_else(|| RouterError::Internal("no model core".into()))?;
    for m in crate::oip::grpc::statistics(core, "fraud_mlp", "")? {
        let i = m.inference_stats.unwrap_or_default();
        let avg = |d: Option<pb::StatisticDuration>| {
            let d = d.unwrap_or_default();
            if d.count == 0 {
                0.0
            } else {
                d.ns as f64 / d.count as f64 / 1000.0
            }
        };
        println!(
            "version {}   rows {}   batches {}   avg batch {:.1}   avg queue {:.1} µs   avg compute {:.1} µs",
            m.version,
            m.inference_count,
            m.execution_count,
            m.inference_count as f64 / m.execution_count.max(1) as f64,
            avg(i.queue),
            avg(i.compute_input) + avg(i.compute_infer) + avg(i.compute_output),
        );
    }
    // Label = the top 2% of scores, as the training data was labelled.
    let mut scores: Vec<f64> = g.scored.iter().map(|s| s.1).collect();
    scores.sort_by(f64::total_cmp);
    if let Some(&cut) = scores.get(scores.len() * 98 / 100) {
        let mut labelled: Vec<(f64, bool)> = g
            .scored
            .iter()
            .map(|(p, s)| (f64::from(*p), *s > cut))
            .collect();
        if let Some(auc) = mesh_prediction_log::join::stats::roc_auc(&mut labelled) {
            println!(
                "\n== model quality on this traffic\nROC AUC {auc:.3} over {} scored transactions",
                labelled.len()
            );
        }
    }
    drop(g);
    server.shutdown().await;
    Ok(())
}
