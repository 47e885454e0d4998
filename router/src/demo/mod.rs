//! `mesh demo`: the whole mesh on one machine, with nothing set up beforehand.
//!
//! 1. Creates a data directory and starts the mesh on loopback from
//!    `examples/mesh.toml` with the example model repository, a new sled feature
//!    store and the prediction log in it (the config is written to `mesh.toml`).
//! 2. Fills the `card` and `merchant` views from a synthetic world ([`world`]).
//! 3. Scores every card as `mesh batch-score` does into the `fraud_scores` view,
//!    the precomputed fallback.
//! 4. Drives Decide traffic over gRPC; a third of the way in it stalls one replica
//!    (its breaker opens, traffic moves to the other), then briefly the other one
//!    too (no replica can answer in time: fallbacks answer), then clears both.
//! 5. Stops the mesh (the prediction log closes its segments), writes the outcomes
//!    the world reveals (which transactions were fraud) and joins them with the
//!    log: AUC and fallback rate per model version.
//! 6. Prints what happened and writes `summary.json`.
pub mod world;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use mesh_proto::mesh::v1 as pb;
use parking_lot::Mutex;
use rand::SeedableRng;
use serde::Serialize;

use crate::config::MeshConfig;
use crate::error::RouterError;
use world::World;

const MODEL: &str = "fraud_mlp";
const MARKER: &str = ".mesh-demo";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seconds of traffic; the stall runs from 35% to 65% of it.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Callers in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Where the store, prediction log, outcomes and reports go. Emptied first if a
    /// previous demo made it; any other non-empty directory is refused.
    #[arg(long, default_value = "data/demo")]
    pub data_dir: PathBuf,
    /// Model repository.
    #[arg(long, default_value = "examples/models")]
    pub models: PathBuf,
    /// Mesh configuration to start from (ports, repository, store and log paths
    /// are the demo's own).
    #[arg(long, default_value = "examples/mesh.toml")]
    pub config: PathBuf,
    /// Feature views file (needs the `card`, `merchant` and `fraud_scores` views).
    #[arg(long, default_value = "examples/features/views.toml")]
    pub views: PathBuf,
    #[arg(long, default_value_t = 10_000)]
    pub cards: usize,
    #[arg(long, default_value_t = 1_000)]
    pub merchants: usize,
    /// Run without the replica stall.
    #[arg(long)]
    pub no_stall: bool,
}

fn internal(what: &str) -> impl Fn(String) -> RouterError + '_ {
    move |e| RouterError::Internal(format!("{what}: {e}"))
}

/// Creates (or empties, if a previous demo made it) the data directory.
fn prepare_dir(dir: &Path) -> Result<(), RouterError> {
    let io = |e: std::io::Error| RouterError::Internal(format!("{}: {e}", dir.display()));
    if dir.exists() {
        let non_empty = std::fs::read_dir(dir).map_err(io)?.next().is_some();
        if non_empty && !dir.join(MARKER).exists() {
            return Err(RouterError::invalid(format!(
                "{} is not empty and was not made by `mesh demo`; pass another --data-dir",
                dir.display()
            )));
        }
        std::fs::remove_dir_all(dir).map_err(io)?;
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(
        dir.join(MARKER),
        "made by mesh demo; emptied by the next run\n",
    )
    .map_err(io)
}

/// Phases of the traffic, as fractions of the run.
const PHASES: [(&str, f64); 4] = [
    ("steady", 0.0),
    ("one replica stalled", 0.35),
    ("both replicas stalled", 0.55),
    ("recovered", 0.65),
];
/// How long a stalled replica holds every call (the decision budget is 50 ms).
const STALL: Duration = Duration::from_millis(250);

struct PhaseTally {
    latency: Histogram<u64>,
    sources: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
}

impl PhaseTally {
    fn new() -> Result<Self, RouterError> {
        Ok(Self {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)
                .map_err(|e| RouterError::Internal(e.to_string()))?,
            sources: BTreeMap::new(),
            errors: BTreeMap::new(),
        })
    }
}

#[derive(Debug, Serialize)]
pub struct PhaseSummary {
    pub name: String,
    pub from_s: f64,
    pub to_s: f64,
    pub decisions: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub sources: BTreeMap<String, u64>,
    pub fallbacks: u64,
    pub errors: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct VersionSummary {
    /// Empty for answers no model version gave (batch score, rules, default).
    pub version: String,
    pub role: String,
    pub predictions: u64,
    pub labelled: u64,
    pub positives: u64,
    pub roc_auc: Option<f64>,
    pub fallback_rate: f64,
    pub sources: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub seconds: f64,
    pub concurrency: usize,
    pub decisions: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub errors: BTreeMap<String, u64>,
    pub sources: BTreeMap<String, u64>,
    pub fallbacks: u64,
    pub fallbacks_during_stall: u64,
    /// Seconds from clearing the faults to the first answer a model gave again
    /// (a breaker's half-open probe succeeding); none without a stall.
    pub model_back_after_s: Option<f64>,
    pub phases: Vec<PhaseSummary>,
    /// `replica -> state` -> count, from the mesh's own /metrics.
    pub breaker_transitions: BTreeMap<String, u64>,
    pub log_records: u64,
    pub transactions: u64,
    pub fraud: u64,
    pub versions: Vec<VersionSummary>,
    pub files: BTreeMap<String, PathBuf>,
}

/// The demo's mesh configuration: `--config` (the example deployment, with its
/// deadline, stack, rules and batch-score fallback) with the ports, model
/// repository, store and log moved to the demo's own. Written to `<data>/mesh.toml`
/// so the same setup can be served with `mesh serve --config`.
fn mesh_toml(args: &DemoArgs, dir: &Path) -> Result<String, RouterError> {
    use toml::{Table, Value};
    let err = |e: String| RouterError::InvalidArgument(format!("{}: {e}", args.config.display()));
    let text = std::fs::read_to_string(&args.config).map_err(|e| err(e.to_string()))?;
    let mut cfg: Table = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
    let path = |p: &Path| Value::String(p.display().to_string());
    let mut set = |section: &str, key: &str, v: Value| {
        let t = cfg
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(t) = t {
            t.insert(key.to_owned(), v);
        }
    };
    set("server", "grpc_port", Value::Integer(0));
    set("server", "http_port", Value::Integer(0));
    set("server", "models", path(&args.models));
    set("features", "path", path(&dir.join("features")));
    set("features", "views", path(&args.views));
    set("prediction_log", "dir", path(&dir.join("predictions")));
    let body = toml::to_string(&cfg).map_err(|e| err(e.to_string()))?;
    Ok(format!(
        "# Written by `mesh demo` from {}; serve the same setup with\n# mesh serve --config {}\n{body}",
        args.config.display(),
        dir.join("mesh.toml").display()
    ))
}

/// Writes the world's cards and merchants into the (running mesh's) store.
async fn write_features(
    store: Arc<mesh_feature_store::FeatureStore>,
    world: Arc<World>,
) -> Result<(u64, u64), RouterError> {
    tokio::task::spawn_blocking(move || {
        let err = internal("feature store");
        let now = mesh_feature_store::now_micros();
        let mut counts = (0, 0);
        for (name, count) in [("card", &mut counts.0), ("merchant", &mut counts.1)] {
            let view = store
                .view(name)
                .map_err(|e| RouterError::invalid(format!("the demo needs view '{name}': {e}")))?
                .clone();
            let rows = world.rows(&view, now);
            for chunk in rows.chunks(5_000) {
                let r = store
                    .write_rows(name, chunk, mesh_feature_store::Durability::Buffered)
                    .map_err(|e| err(e.to_string()))?;
                *count += r.rows_written;
            }
        }
        store.flush().map_err(|e| err(e.to_string()))?;
        Ok(counts)
    })
    .await
    .map_err(|e| RouterError::Internal(e.to_string()))?
}

fn decide_request(n: u64, t: &world::Txn) -> pb::DecideRequest {
    let mut features: std::collections::HashMap<String, f64> = t
        .extra
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("f{}", 18 + i), *v))
        .collect();
    features.insert("amount".into(), t.amount);
    pb::DecideRequest {
        request_id: format!("demo-{n:07}"),
        model: MODEL.into(),
        entities: [
            (
                "card_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::Int64Key(t.card)),
                },
            ),
            (
                "merchant_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::StringKey(t.merchant.clone())),
                },
            ),
        ]
        .into(),
        features,
        categorical: [("merchant_category".to_string(), t.category.to_string())].into(),
        ..Default::default()
    }
}

fn source_name(s: i32) -> String {
    pb::AnswerSource::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ANSWER_SOURCE_")
                .to_owned()
        })
        .unwrap_or_else(|_| format!("SOURCE_{s}"))
}

/// GET `path` from the mesh's HTTP server (plain HTTP/1.0, loopback).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<String, RouterError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let err = internal("reading /metrics");
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| err(e.to_string()))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .await
        .map_err(|e| err(e.to_string()))?;
    Ok(body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(body))
}

/// `mesh_router_breaker_transitions_total{replica="…",to="…"} N` lines as `replica -> to`.
fn breaker_transitions(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("mesh_router_breaker_transitions_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        if n > 0 {
            out.insert(format!("{} -> {}", label("replica"), label("to")), n);
        }
    }
    out
}

pub async fn run(args: DemoArgs) -> Result<(), RouterError> {
    let dir = args.data_dir.clone();
    prepare_dir(&dir)?;
    let store_dir = dir.join("features");
    let world = Arc::new(World::new(args.cards.max(1), args.merchants.max(1), 7));

    println!("mesh demo: data in {}", dir.display());
    // One process owns the sled store: the mesh opens it, and the demo fills it
    // through the mesh's handle before any traffic.
    let toml_text = mesh_toml(&args, &dir)?;
    let cfg_path = dir.join("mesh.toml");
    std::fs::write(&cfg_path, &toml_text).map_err(|e| internal("mesh.toml")(e.to_string()))?;
    let cfg: MeshConfig =
        toml::from_str(&toml_text).map_err(|e| internal("mesh.toml")(e.to_string()))?;
    let server = crate::server::start_mesh(&cfg).await?;
    let missing = |what: &str| RouterError::Internal(format!("the demo mesh has no {what}"));
    let engine = server
        .engine
        .clone()
        .ok_or_else(|| missing("decision engine"))?;
    let store = server
        .store
        .clone()
        .ok_or_else(|| missing("feature store"))?;
    let repo = server
        .core
        .as_ref()
        .ok_or_else(|| missing("models"))?
        .repo
        .clone();
    println!(
        "[1/6] mesh serving {} on grpc={} http={} (metrics: http://{}/metrics)",
        args.models.display(),
        server.grpc_addr,
        server.http_addr,
        server.http_addr
    );

    let t = Instant::now();
    let (cards, merchants) = write_features(store.clone(), world.clone()).await?;
    println!(
        "[2/6] feature store: {cards} cards and {merchants} merchants written to {} in {:.1} s",
        store_dir.display(),
        t.elapsed().as_secs_f64()
    );

    // The precomputed fallback, as `mesh batch-score` writes it.
    let t = Instant::now();
    let score_view = cfg
        .decisions
        .deployment(MODEL)
        .and_then(|d| d.batch_score.as_ref())
        .map_or("fraud_scores", |b| b.view.as_str());
    let handle = repo.get(MODEL, None)?;
    let keys: Vec<mesh_feature_store::EntityKey> = world
        .cards
        .iter()
        .map(|c| mesh_feature_store::EntityKey::Int64(c.id))
        .collect();
    let (scored, _) =
        crate::batch_score::score_entities(&store, &handle, &keys, score_view, 4096, false).await?;
    println!(
        "[3/6] batch scores: {scored} cards scored with {MODEL} v{} into view '{score_view}' in {:.1} s",
        handle.version,
        t.elapsed().as_secs_f64()
    );

    let run_for = Duration::from_secs(args.seconds.max(1));
    println!(
        "[4/6] driving {} s of Decide traffic at concurrency {}{}",
        run_for.as_secs(),
        args.concurrency,
        if args.no_stall {
            String::new()
        } else {
            format!(
                "; stalls one replica at {:.0} s, both at {:.0} s, clears at {:.0} s",
                run_for.as_secs_f64() * PHASES[1].1,
                run_for.as_secs_f64() * PHASES[2].1,
                run_for.as_secs_f64() * PHASES[3].1
            )
        }
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .map_err(|e| RouterError::Internal(e.to_string()))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| RouterError::Unavailable(format!("connecting to the mesh: {e}")))?;
    let client = pb::decisions_client::DecisionsClient::new(channel);

    let phases: Vec<Mutex<PhaseTally>> = (0..PHASES.len())
        .map(|_| PhaseTally::new().map(Mutex::new))
        .collect::<Result<_, _>>()?;
    let phases = Arc::new(phases);
    let phase = Arc::new(AtomicUsize::new(0));
    let truths: Arc<Mutex<Vec<(String, f64)>>> = Arc::new(Mutex::new(Vec::new()));
    let next_id = Arc::new(AtomicUsize::new(0));
    // Microseconds from the start to the first MODEL answer sent after the clear.
    let first_model_after_clear = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let started = Instant::now();
    let end = started + run_for;

    // The drill: stall, stall more, clear; each step at its share of the run.
    let control = {
        let (engine, phase) = (engine.clone(), phase.clone());
        let no_stall = args.no_stall;
        tokio::spawn(async move {
            let mut stalled: Vec<String> = Vec::new();
            for (i, (name, at)) in PHASES.iter().enumerate().skip(1) {
                tokio::time::sleep_until((started + run_for.mul_f64(*at)).into()).await;
                phase.store(i, Ordering::Relaxed);
                if no_stall {
                    continue;
                }
                let replicas: Vec<String> = engine
                    .replicas()
                    .into_iter()
                    .filter(|r| r.starts_with(&format!("{MODEL}/")))
                    .collect();
                let targets: Vec<String> = match i {
                    1 => replicas.into_iter().take(1).collect(),
                    2 => replicas,
                    _ => Vec::new(),
                };
                if targets.is_empty() {
                    for r in stalled.drain(..) {
                        if let Some(f) = engine.fault(&r) {
                            f.set(Duration::ZERO, false);
                        }
                    }
                    eprintln!(
                        "      {:>5.1} s  {name}: faults cleared",
                        started.elapsed().as_secs_f64()
                    );
                } else {
                    for r in &targets {
                        if let Some(f) = engine.fault(r) {
                            f.set(STALL, false);
                        }
                    }
                    eprintln!(
                        "      {:>5.1} s  {name}: {} hold every call {} ms",
                        started.elapsed().as_secs_f64(),
                        targets.join(", "),
                        STALL.as_millis()
                    );
                    stalled = targets;
                }
            }
        })
    };

    let workers: Vec<_> = (0..args.concurrency.max(1))
        .map(|w| {
            let mut client = client.clone();
            let first_model_after_clear = first_model_after_clear.clone();
            let (world, phases, phase, truths, next_id) = (
                world.clone(),
                phases.clone(),
                phase.clone(),
                truths.clone(),
                next_id.clone(),
            );
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + w as u64);
                let mut mine = Vec::new();
                while Instant::now() < end {
                    let txn = world.transaction(&mut rng);
                    let n = next_id.fetch_add(1, Ordering::Relaxed) as u64;
                    let req = decide_request(n, &txn);
                    let p = phase.load(Ordering::Relaxed);
                    let t = Instant::now();
                    let res = client.decide(req).await;
                    let us = t.elapsed().as_micros() as u64;
                    let mut g = phases[p].lock();
                    match res {
                        Ok(r) => {
                            let r = r.into_inner();
                            let _ = g.latency.record(us.max(1));
                            *g.sources.entry(source_name(r.source)).or_default() += 1;
                            if p == PHASES.len() - 1 && r.source == pb::AnswerSource::Model as i32 {
                                let at = t.duration_since(started).as_micros() as u64;
                                first_model_after_clear.fetch_min(at, Ordering::Relaxed);
                            }
                            mine.push((r.request_id, txn.truth));
                        }
                        Err(s) => *g.errors.entry(format!("{:?}", s.code())).or_default() += 1,
                    }
                }
                truths.lock().extend(mine);
            })
        })
        .collect();
    let progress = {
        let phases = phases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (mut n, mut fb) = (0u64, 0u64);
                for p in phases.iter() {
                    let g = p.lock();
                    n += g.latency.len();
                    fb += g
                        .sources
                        .iter()
                        .filter(|(k, _)| *k != "MODEL")
                        .map(|(_, v)| v)
                        .sum::<u64>();
                }
                eprintln!(
                    "      {:>5.1} s  {n:>8} decisions  {fb:>6} from fallbacks",
                    started.elapsed().as_secs_f64()
                );
            }
        })
    };
    for w in workers {
        let _ = w.await;
    }
    progress.abort();
    control.abort();
    let elapsed = started.elapsed().as_secs_f64();
    let metrics = http_get(server.http_addr, "/metrics")
        .await
        .unwrap_or_default();
    let metrics_file = dir.join("metrics.prom");
    std::fs::write(&metrics_file, &metrics).map_err(|e| internal("metrics.prom")(e.to_string()))?;
    let transitions = breaker_transitions(&metrics);

    // Stopping the mesh closes the prediction log's open segment.
    server.shutdown().await;
    let log_dir = dir.join("predictions");
    let mut log_records = 0u64;
    mesh_prediction_log::scan(&log_dir, Default::default(), |_| log_records += 1)
        .map_err(|e| internal("reading the prediction log")(e.to_string()))?;
    println!(
        "[5/6] mesh stopped; prediction log: {log_records} records in {}",
        log_dir.display()
    );

    // The outcomes: which transactions turned out to be fraud (the top 2% of the
    // world's hidden score, as the reference data was labelled).
    let truths = std::mem::take(&mut *truths.lock());
    let mut sorted: Vec<f64> = truths.iter().map(|t| t.1).collect();
    sorted.sort_by(f64::total_cmp);
    let cut = sorted
        .get(sorted.len() * 98 / 100)
        .copied()
        .unwrap_or(f64::INFINITY);
    let outcomes_file = dir.join("outcomes.csv");
    let mut csv = String::from("request_id,label\n");
    let mut fraud = 0u64;
    for (id, truth) in &truths {
        let label = u8::from(*truth > cut);
        fraud += u64::from(label);
        csv.push_str(&format!("{id},{label}\n"));
    }
    std::fs::write(&outcomes_file, csv).map_err(|e| internal("outcomes.csv")(e.to_string()))?;
    let report = mesh_prediction_log::join(
        &log_dir,
        &outcomes_file,
        &mesh_prediction_log::JoinOptions::default(),
    )
    .map_err(|e| internal("label join")(e.to_string()))?;
    let join_file = dir.join("join.json");
    std::fs::write(
        &join_file,
        serde_json::to_string_pretty(&report).map_err(|e| internal("join.json")(e.to_string()))?,
    )
    .map_err(|e| internal("join.json")(e.to_string()))?;
    println!(
        "[6/6] outcomes: {} transactions, {fraud} confirmed fraud, written to {}; joined with the log",
        truths.len(),
        outcomes_file.display()
    );

    // Summary.
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| RouterError::Internal(e.to_string()))?;
    let mut summary_phases = Vec::new();
    let (mut sources, mut errors) = (BTreeMap::new(), BTreeMap::new());
    for (i, (name, at)) in PHASES.iter().enumerate() {
        let g = phases[i].lock();
        let _ = all.add(&g.latency);
        let to = PHASES.get(i + 1).map_or(1.0, |p| p.1);
        // Phase boundaries as scheduled (the drill runs on the planned clock).
        let planned = run_for.as_secs_f64();
        let (from_s, to_s) = (planned * at, planned * to);
        for (k, v) in &g.sources {
            *sources.entry(k.clone()).or_insert(0u64) += v;
        }
        for (k, v) in &g.errors {
            *errors.entry(k.clone()).or_insert(0u64) += v;
        }
        summary_phases.push(PhaseSummary {
            name: name.to_string(),
            from_s,
            to_s,
            decisions: g.latency.len(),
            throughput: g.latency.len() as f64 / (to_s - from_s).max(1e-9),
            p50_us: g.latency.value_at_quantile(0.5),
            p99_us: g.latency.value_at_quantile(0.99),
            fallbacks: g
                .sources
                .iter()
                .filter(|(k, _)| *k != "MODEL")
                .map(|(_, v)| v)
                .sum(),
            sources: g.sources.clone(),
            errors: g.errors.clone(),
        });
    }
    let fallbacks = sources
        .iter()
        .filter(|(k, _)| *k != "MODEL")
        .map(|(_, v)| v)
        .sum();
    let summary = Summary {
        seconds: elapsed,
        concurrency: args.concurrency,
        decisions: all.len(),
        throughput: all.len() as f64 / elapsed,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        p999_us: all.value_at_quantile(0.999),
        max_us: all.max(),
        errors,
        sources,
        fallbacks,
        fallbacks_during_stall: summary_phases[1..3].iter().map(|p| p.fallbacks).sum(),
        model_back_after_s: match first_model_after_clear.load(Ordering::Relaxed) {
            _ if args.no_stall => None,
            u64::MAX => None,
            at => Some((at as f64 / 1e6 - summary_phases[PHASES.len() - 1].from_s).max(0.0)),
        },
        phases: summary_phases,
        breaker_transitions: transitions,
        log_records,
        transactions: truths.len() as u64,
        fraud,
        versions: report
            .groups
            .iter()
            .filter(|g| g.model == MODEL)
            .map(|g| VersionSummary {
                version: g.version.clone(),
                role: format!("{:?}", g.role).to_lowercase(),
                predictions: g.predictions,
                labelled: g.labelled,
                positives: g.positives,
                roc_auc: g.roc_auc,
                fallback_rate: g.fallback_rate,
                sources: g
                    .sources
                    .iter()
                    .map(|(k, s)| (k.clone(), s.count))
                    .collect(),
            })
            .collect(),
        files: [
            ("data", dir.clone()),
            ("config", cfg_path),
            ("features", store_dir),
            ("predictions", log_dir),
            ("outcomes", outcomes_file),
            ("join", join_file),
            ("metrics", metrics_file),
            ("summary", dir.join("summary.json")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    };
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)
            .map_err(|e| internal("summary.json")(e.to_string()))?,
    )
    .map_err(|e| internal("summary.json")(e.to_string()))?;
    print!("{summary}");
    Ok(())
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "\n== traffic: {} callers, Decide over gRPC",
            self.concurrency
        )?;
        writeln!(
            f,
            "decisions   {} in {:.1} s = {:.0}/s   errors {:?}",
            self.decisions, self.seconds, self.throughput, self.errors
        )?;
        writeln!(
            f,
            "latency     p50 {} µs   p99 {} µs   p99.9 {} µs   max {} µs",
            self.p50_us, self.p99_us, self.p999_us, self.max_us
        )?;
        writeln!(f, "answers     {:?}", self.sources)?;
        writeln!(
            f,
            "\n{:<24} {:>11} {:>10} {:>9} {:>9} {:>10}  answered by",
            "phase", "seconds", "decided/s", "p50 µs", "p99 µs", "fallbacks"
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "{:<24} {:>5.1}-{:<5.1} {:>10.0} {:>9} {:>9} {:>10}  {:?}",
                p.name, p.from_s, p.to_s, p.throughput, p.p50_us, p.p99_us, p.fallbacks, p.sources
            )?;
        }
        if let Some(s) = self.model_back_after_s {
            writeln!(
                f,
                "after the faults cleared, the model answered again within {s:.1} s (a breaker's half-open probe; probes back off while a replica keeps failing)"
            )?;
        }
        writeln!(
            f,
            "\n== circuit breakers (mesh_router_breaker_transitions_total)"
        )?;
        if self.breaker_transitions.is_empty() {
            writeln!(f, "no transitions")?;
        }
        for (k, v) in &self.breaker_transitions {
            writeln!(f, "{k:<40} {v}")?;
        }
        writeln!(
            f,
            "\n== model versions against outcomes ({} transactions, {} fraud; {} log records)",
            self.transactions, self.fraud, self.log_records
        )?;
        writeln!(
            f,
            "{:<8} {:<8} {:>11} {:>9} {:>9} {:>8}  answered by",
            "version", "role", "predictions", "labelled", "fallback", "ROC AUC"
        )?;
        for v in &self.versions {
            writeln!(
                f,
                "{:<8} {:<8} {:>11} {:>9} {:>8.1}% {:>8}  {:?}",
                if v.version.is_empty() {
                    "-"
                } else {
                    &v.version
                },
                v.role,
                v.predictions,
                v.labelled,
                v.fallback_rate * 100.0,
                v.roc_auc.map_or("-".into(), |a| format!("{a:.3}")),
                v.sources
            )?;
        }
        writeln!(f, "(version - : answers no model gave: the precomputed batch score, rules or the default)")?;
        writeln!(f, "\n== files")?;
        for (k, v) in &self.files {
            writeln!(f, "{k:<12} {}", v.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_transitions_are_read_from_prometheus_text() {
        let text = "# TYPE mesh_router_breaker_transitions_total counter\n\
            mesh_router_breaker_transitions_total{replica=\"fraud_mlp/v1/local0\",to=\"open\"} 2\n\
            mesh_router_breaker_transitions_total{replica=\"fraud_mlp/v1/local1\",to=\"closed\"} 0\n\
            mesh_router_requests_total{code=\"OK\"} 5\n";
        let t = breaker_transitions(text);
        assert_eq!(t.len(), 1);
        assert_eq!(t["fraud_mlp/v1/local0 -> open"], 2);
    }

    #[test]
    fn a_foreign_directory_is_not_emptied() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("precious.txt"), "keep").unwrap();
        let err = prepare_dir(d.path()).unwrap_err().to_string();
        assert!(err.contains("not made by `mesh demo`"), "{err}");
        assert!(d.path().join("precious.txt").exists());
        let ours = d.path().join("demo");
        prepare_dir(&ours).unwrap();
        std::fs::write(ours.join("old"), "x").unwrap();
        prepare_dir(&ours).unwrap();
        assert!(!ours.join("old").exists() && ours.join(MARKER).exists());
    }
}
