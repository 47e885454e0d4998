#![allow(clippy::manual_is_multiple_of)]
//! Writes a demo prediction log, a labels file and the join's JSON, for the DuckDB check:
//!
//! ```text
//! cargo run -p mesh-prediction-log --example demo_log -- /tmp/demo
//! python3 prediction-log/tests/duckdb_check.py --logs /tmp/demo/log \
//!     --labels /tmp/demo/labels.csv --join /tmp/demo/join.json
//! ```
//! Three versions (primary, canary, shadow), noisy scores with ties, fallbacks, several
//! segments, plus label anomalies: unknown ids, duplicates, invalid labels, missing labels.

use anyhow::Context;
use mesh_prediction_log::commands::{run_join, JoinArgs};
use mesh_prediction_log::{
    source, FeatureUsed, LogConfig, PredictionLog, PredictionRecord, Role, StageMicros,
};
use std::io::Write;
use std::path::PathBuf;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: demo_log <out-dir>")?,
    );
    let n: u64 = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let logs = out.join("log");
    std::fs::create_dir_all(&out)?;
    let mut cfg = LogConfig::new(&logs);
    cfg.segment_max_bytes = 1 << 20;
    let (log, writer) = PredictionLog::start(cfg)?;
    let mut rng = Rng(42);
    let mut labels = csv::Writer::from_path(out.join("labels.csv"))?;
    labels.write_record(["request_id", "label"])?;
    for i in 0..n {
        let id = format!("req-{i:07}");
        let fraud = rng.unit() < 0.1;
        let roles: &[(&str, Role, f64)] = if i % 10 == 0 {
            &[("4", Role::Canary, 0.25)]
        } else {
            &[("3", Role::Primary, 0.35), ("5", Role::Shadow, 0.6)]
        };
        for (version, role, noise) in roles {
            let mut r = PredictionRecord::new(id.clone(), "fraud", *version, *role);
            let raw = if fraud { 0.7 } else { 0.3 } + (rng.unit() - 0.5) * 2.0 * noise;
            // Rounded to 2 decimals so there are many ties.
            let score = (raw.clamp(0.0, 1.0) * 100.0).round() / 100.0;
            r.score = Some(score);
            r.entity_keys = vec![("card_id".into(), format!("card-{}", i % 5000))];
            r.features = Some(vec![FeatureUsed {
                name: "amount_7d".into(),
                value: Some(rng.unit() * 1000.0),
                status: "PRESENT".into(),
                event_time_us: Some(r.ts_us - 60_000_000),
            }]);
            if *role != Role::Shadow {
                r.decision = Some(
                    if score >= 0.8 {
                        "decline"
                    } else if score >= 0.5 {
                        "review"
                    } else {
                        "approve"
                    }
                    .into(),
                );
            }
            r.source = match rng.next() % 100 {
                0 => source::RULES,
                1 => source::PREVIOUS_VERSION,
                _ => source::MODEL,
            }
            .into();
            let st = StageMicros {
                validate: 2 + rng.next() % 5,
                features: 20 + rng.next() % 200,
                preprocess: 3 + rng.next() % 5,
                queue: rng.next() % 500,
                compute: 10 + rng.next() % 40,
                postprocess: 1 + rng.next() % 3,
                total: 0,
            };
            r.stages = StageMicros {
                total: st.sum_of_stages() + rng.next() % 20,
                ..st
            };
            log.record_wait(r).await?;
        }
        // 10% of requests never get a label; some get two; a few are garbage.
        match i % 20 {
            0 | 3 => {}
            7 => {
                labels.write_record([id.as_str(), if fraud { "1" } else { "0" }])?;
                labels.write_record([id.as_str(), if fraud { "1" } else { "0" }])?;
            }
            _ => labels.write_record([id.as_str(), if fraud { "1" } else { "0" }])?,
        }
        if i % 1000 == 0 {
            labels.write_record([format!("unknown-{i}").as_str(), "1"])?;
            labels.write_record([id.as_str(), "maybe"])?;
        }
    }
    labels.flush()?;
    let stats = log.shutdown().await?;
    writer.join()?;
    let args = JoinArgs {
        logs: logs.clone(),
        labels: out.join("labels.csv"),
        key: "request_id".into(),
        label: "label".into(),
        thresholds: vec![],
        include_wal: false,
        protocol: None,
        json: true,
    };
    let mut json = std::fs::File::create(out.join("join.json"))?;
    run_join(&args, &mut json)?;
    json.flush()?;
    let mut stdout = std::io::stdout();
    run_join(
        &JoinArgs {
            json: false,
            ..args
        },
        &mut stdout,
    )?;
    eprintln!(
        "wrote {} records ({} segments) to {}",
        stats.written,
        stats.segments,
        logs.display()
    );
    Ok(())
}
