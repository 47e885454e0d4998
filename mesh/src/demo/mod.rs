//! `mesh demo`: the whole mesh on one machine, with nothing set up beforehand.
//!
//! 1. Creates a data directory and starts the mesh on loopback from
//!    `examples/mesh.toml` with the example model repository, a new sled feature
//!    store and the prediction log in it (the config is written to `mesh.toml`).
//! 2. Fills the `card` and `merchant` views from a synthetic world ([`world`]).
//! 3. Scores every card as `mesh batch-score` does into the `fraud_scores` view,
//!    the precomputed fallback.
//! 4. Drives Decide traffic over gRPC; a third of the way in it stalls one replica
//!    of the answering (newest) version (its breaker opens, traffic moves to the
//!    other), then briefly the other one too (that version cannot answer in time: the
//!    previous version and the other fallbacks answer), then clears both
//!    ([`traffic`]).
//! 5. Stops the mesh (the prediction log closes its segments), writes the outcomes
//!    the world reveals (which transactions were fraud) and joins them with the
//!    log: AUC and fallback rate per model version.
//! 6. Prints what happened and writes `summary.json` ([`summary`]).
//!
//! [`run`] calls one function per step, in that order.
pub mod summary;
pub mod traffic;
pub mod world;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use mesh_feature_store::FeatureStore;
use mesh_model_actor::ModelRepository;
use mesh_router::config::MeshConfig;
use mesh_router::decide::Engine;

pub use summary::{PhaseSummary, Summary, VersionSummary};
use world::World;

/// The model the demo decides with unless `--model` says otherwise.
pub const DEFAULT_MODEL: &str = "fraud_mlp";
const MARKER: &str = ".mesh-demo";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Model the decisions use: any model of the repository whose `[input_spec]`
    /// reads the demo's features (the example's `fraud_mlp`, or the XGBoost
    /// `fraud_xgb`). Its deployment comes from `--config` if it has one, else the
    /// config's first deployment is moved to it.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
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

/// Where the demo writes, under `--data-dir`.
struct Paths {
    data: PathBuf,
    config: PathBuf,
    features: PathBuf,
    predictions: PathBuf,
    outcomes: PathBuf,
    join: PathBuf,
    metrics: PathBuf,
    summary: PathBuf,
}

impl Paths {
    fn new(data: &Path) -> Self {
        Self {
            data: data.to_path_buf(),
            config: data.join("mesh.toml"),
            features: data.join("features"),
            predictions: data.join("predictions"),
            outcomes: data.join("outcomes.csv"),
            join: data.join("join.json"),
            metrics: data.join("metrics.prom"),
            summary: data.join("summary.json"),
        }
    }

    /// The `files` of `summary.json`.
    fn files(&self) -> BTreeMap<String, PathBuf> {
        [
            ("data", &self.data),
            ("config", &self.config),
            ("features", &self.features),
            ("predictions", &self.predictions),
            ("outcomes", &self.outcomes),
            ("join", &self.join),
            ("metrics", &self.metrics),
            ("summary", &self.summary),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect()
    }
}

/// The running mesh and the parts of it the demo uses directly.
struct Mesh {
    server: mesh_router::server::Running,
    engine: Arc<Engine>,
    store: Arc<FeatureStore>,
    repo: Arc<ModelRepository>,
}

fn write(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let paths = Paths::new(&args.data_dir);
    let cfg = prepare(&args, &paths)?;
    let world = Arc::new(World::new(args.cards.max(1), args.merchants.max(1), 7));
    let mesh = start(&args, &cfg).await?;
    fill_features(&mesh, world.clone(), &paths.features).await?;
    batch_score(&cfg, &mesh, &world, &args.model).await?;
    let traffic = traffic::drive(mesh.server.grpc_addr, mesh.engine.clone(), world, &args).await?;
    let breaker_transitions = scrape_metrics(mesh.server.http_addr, &paths.metrics).await?;
    let log_records = stop(mesh, &paths.predictions).await?;
    let (fraud, join) = outcomes_and_join(&traffic.truths, &paths)?;
    let summary = summary::build(
        traffic,
        summary::Findings {
            concurrency: args.concurrency,
            no_stall: args.no_stall,
            breaker_transitions,
            log_records,
            fraud,
            join,
            files: paths.files(),
            model: args.model.clone(),
        },
    )?;
    write(&paths.summary, serde_json::to_string_pretty(&summary)?)?;
    crate::out!("{summary}")?;
    Ok(())
}

/// Creates (or empties, if a previous demo made it) the data directory.
fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    let io = || dir.display().to_string();
    if dir.exists() {
        let non_empty = std::fs::read_dir(dir).with_context(io)?.next().is_some();
        if non_empty && !dir.join(MARKER).exists() {
            bail!(
                "{} is not empty and was not made by `mesh demo`; pass another --data-dir",
                dir.display()
            );
        }
        std::fs::remove_dir_all(dir).with_context(io)?;
    }
    std::fs::create_dir_all(dir).with_context(io)?;
    write(
        &dir.join(MARKER),
        "made by mesh demo; emptied by the next run\n",
    )
}

/// The data directory, and the mesh configuration written into it.
fn prepare(args: &DemoArgs, paths: &Paths) -> anyhow::Result<MeshConfig> {
    prepare_dir(&paths.data)?;
    crate::outln!("mesh demo: data in {}", paths.data.display())?;
    let toml_text = mesh_toml(args, &paths.data)?;
    write(&paths.config, &toml_text)?;
    toml::from_str(&toml_text).with_context(|| format!("parsing {}", paths.config.display()))
}

/// Starts the mesh. One process owns the sled store: the mesh opens it, and the
/// demo fills it through the mesh's handle before any traffic.
async fn start(args: &DemoArgs, cfg: &MeshConfig) -> anyhow::Result<Mesh> {
    let server = mesh_router::server::start_mesh(cfg)
        .await
        .context("starting the demo mesh")?;
    let missing = |what: &str| anyhow::anyhow!("the demo mesh has no {what}");
    let mesh = Mesh {
        engine: server
            .engine
            .clone()
            .ok_or_else(|| missing("decision engine"))?,
        store: server
            .store
            .clone()
            .ok_or_else(|| missing("feature store"))?,
        repo: server
            .core
            .as_ref()
            .ok_or_else(|| missing("models"))?
            .repo
            .clone(),
        server,
    };
    crate::outln!(
        "[1/6] mesh serving {} on grpc={} http={} (metrics: http://{}/metrics)",
        args.models.display(),
        mesh.server.grpc_addr,
        mesh.server.http_addr,
        mesh.server.http_addr
    )?;
    Ok(mesh)
}

/// Writes the world's cards and merchants into the (running mesh's) store.
async fn fill_features(mesh: &Mesh, world: Arc<World>, store_dir: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    let (cards, merchants) = write_features(mesh.store.clone(), world).await?;
    crate::outln!(
        "[2/6] feature store: {cards} cards and {merchants} merchants written to {} in {:.1} s",
        store_dir.display(),
        t.elapsed().as_secs_f64()
    )?;
    Ok(())
}

async fn write_features(store: Arc<FeatureStore>, world: Arc<World>) -> anyhow::Result<(u64, u64)> {
    tokio::task::spawn_blocking(move || {
        let now = mesh_feature_store::now_micros();
        let mut counts = (0, 0);
        for (name, count) in [("card", &mut counts.0), ("merchant", &mut counts.1)] {
            let view = store
                .view(name)
                .with_context(|| format!("the demo needs view '{name}'"))?
                .clone();
            let rows = world.rows(&view, now);
            for chunk in rows.chunks(5_000) {
                let r = store
                    .write_rows(name, chunk, mesh_feature_store::Durability::Buffered)
                    .with_context(|| format!("writing view '{name}' to the feature store"))?;
                *count += r.rows_written;
            }
        }
        store.flush().context("flushing the feature store")?;
        Ok(counts)
    })
    .await
    .context("the feature writer stopped")?
}

/// The precomputed fallback, as `mesh batch-score` writes it: every card scored
/// into the deployment's batch-score view.
async fn batch_score(
    cfg: &MeshConfig,
    mesh: &Mesh,
    world: &World,
    model: &str,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let score_view = cfg
        .decisions
        .deployment(model)
        .and_then(|d| d.batch_score.as_ref())
        .map_or("fraud_scores", |b| b.view.as_str());
    let handle = mesh
        .repo
        .get(model, None)
        .with_context(|| format!("model {model}"))?;
    let keys: Vec<mesh_feature_store::EntityKey> = world
        .cards
        .iter()
        .map(|c| mesh_feature_store::EntityKey::Int64(c.id))
        .collect();
    let (scored, _) = mesh_router::offline::score_entities(
        &mesh.store,
        &handle,
        &keys,
        score_view,
        4096,
        &|_, _| {},
    )
    .await
    .with_context(|| format!("batch-scoring the cards into view '{score_view}'"))?;
    crate::outln!(
        "[3/6] batch scores: {scored} cards scored with {model} v{} into view '{score_view}' in {:.1} s",
        handle.version,
        t.elapsed().as_secs_f64()
    )?;
    Ok(())
}

/// The mesh's own /metrics, written to `metrics.prom`; its breaker transitions.
async fn scrape_metrics(
    http_addr: SocketAddr,
    file: &Path,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let metrics = http_get(http_addr, "/metrics").await.unwrap_or_default();
    write(file, &metrics)?;
    Ok(breaker_transitions(&metrics))
}

/// Stops the mesh, which closes the prediction log's open segment; the number of
/// records in the log.
async fn stop(mesh: Mesh, log_dir: &Path) -> anyhow::Result<u64> {
    mesh.server.shutdown().await;
    let mut log_records = 0u64;
    mesh_prediction_log::scan(log_dir, Default::default(), |_| log_records += 1)
        .with_context(|| format!("reading the prediction log in {}", log_dir.display()))?;
    crate::outln!(
        "[5/6] mesh stopped; prediction log: {log_records} records in {}",
        log_dir.display()
    )?;
    Ok(log_records)
}

/// `outcomes.csv`: which transactions turned out to be fraud (the top 2% of the
/// world's hidden score, as the reference data was labelled); the CSV and how
/// many are fraud.
fn outcomes_csv(truths: &[(String, f64)]) -> (String, u64) {
    let mut sorted: Vec<f64> = truths.iter().map(|t| t.1).collect();
    sorted.sort_by(f64::total_cmp);
    let cut = sorted
        .get(sorted.len() * 98 / 100)
        .copied()
        .unwrap_or(f64::INFINITY);
    let mut csv = String::from("request_id,label\n");
    let mut fraud = 0u64;
    for (id, truth) in truths {
        let label = u8::from(*truth > cut);
        fraud += u64::from(label);
        csv.push_str(&format!("{id},{label}\n"));
    }
    (csv, fraud)
}

/// Writes the outcomes and joins them with the prediction log (`join.json`);
/// how many were fraud, and the join.
fn outcomes_and_join(
    truths: &[(String, f64)],
    paths: &Paths,
) -> anyhow::Result<(u64, mesh_prediction_log::JoinReport)> {
    let (csv, fraud) = outcomes_csv(truths);
    write(&paths.outcomes, csv)?;
    let report = mesh_prediction_log::join(
        &paths.predictions,
        &paths.outcomes,
        &mesh_prediction_log::JoinOptions::default(),
    )
    .context("joining the outcomes with the prediction log")?;
    write(&paths.join, serde_json::to_string_pretty(&report)?)?;
    crate::outln!(
        "[6/6] outcomes: {} transactions, {fraud} confirmed fraud, written to {}; joined with the log",
        truths.len(),
        paths.outcomes.display()
    )?;
    Ok((fraud, report))
}

/// The demo's mesh configuration: `--config` (the example deployment, with its
/// deadline, stack, rules and batch-score fallback) with the ports, model
/// repository, store and log moved to the demo's own. Written to `<data>/mesh.toml`
/// so the same setup can be served with `mesh serve --config`.
fn mesh_toml(args: &DemoArgs, dir: &Path) -> anyhow::Result<String> {
    use toml::{Table, Value};
    let config = args.config.display();
    let text =
        std::fs::read_to_string(&args.config).with_context(|| format!("reading {config}"))?;
    let mut cfg: Table = toml::from_str(&text).with_context(|| format!("parsing {config}"))?;
    // Absolute: `mesh serve --config <data>/mesh.toml` resolves relative paths
    // against the file's directory, and these are relative to the working one.
    let path = |p: &Path| {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        Value::String(p.display().to_string())
    };
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
    // The drill's fault injection is on for the demo's own setup only, behind an
    // admin token (a fresh random one, in a file only its owner can read).
    set("admin", "token_file", path(&admin_token(dir)?));
    set("admin", "fault_injection", Value::Boolean(true));
    deploy(&mut cfg, &args.model);
    let body = toml::to_string(&cfg).with_context(|| format!("rewriting {config}"))?;
    Ok(format!(
        "# Written by `mesh demo` from {}; serve the same setup with\n# mesh serve --config {}\n{body}",
        config,
        dir.join("mesh.toml").display()
    ))
}

/// Makes sure `[decisions]` deploys `model`: kept as it is when a deployment names
/// it, else the first deployment (its batch score, canary and so on) is moved to it,
/// or a plain one is added.
fn deploy(cfg: &mut toml::Table, model: &str) {
    use toml::{Table, Value};
    let decisions = cfg
        .entry("decisions")
        .or_insert_with(|| Value::Table(Table::new()));
    let Value::Table(decisions) = decisions else {
        return;
    };
    let list = decisions
        .entry("deployments")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(list) = list else { return };
    let names = |d: &Value| d.get("model").and_then(Value::as_str) == Some(model);
    if list.iter().any(names) {
        return;
    }
    let mut first = match list.first() {
        Some(Value::Table(t)) => t.clone(),
        _ => Table::new(),
    };
    first.insert("model".into(), Value::String(model.to_owned()));
    // Versions, canaries and shadows named for another model do not carry over.
    for key in ["primary", "canary", "shadow"] {
        first.remove(key);
    }
    list.retain(|d| !names(d));
    list.insert(0, Value::Table(first));
    list.truncate(1);
}

/// Writes a random admin token to `<dir>/admin.token` (mode 0600); returns its path.
fn admin_token(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    use rand::Rng;
    let p = dir.join("admin.token");
    let mut rng = rand::rng();
    let token: String = (0..32)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(&p)
        .with_context(|| format!("writing {}", p.display()))?;
    std::io::Write::write_all(&mut f, format!("{token}\n").as_bytes())
        .with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// GET `path` from the mesh's HTTP server (plain HTTP/1.0, loopback).
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let what = || format!("GET http://{addr}{path}");
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(what)?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .with_context(what)?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.with_context(what)?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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
    fn the_demo_deploys_the_model_it_is_given() {
        let mut cfg: toml::Table = toml::from_str(
            r#"
            [[decisions.deployments]]
            model = "fraud_mlp"
            canary = { version = 2, weight = 0.1 }
            batch_score = { view = "fraud_scores", feature = "score" }
            "#,
        )
        .unwrap();
        let deployments = |cfg: &toml::Table| {
            let d: mesh_router::config::MeshConfig =
                toml::from_str(&toml::to_string(cfg).unwrap()).unwrap();
            d.decisions.deployments
        };
        // Already deployed: unchanged.
        deploy(&mut cfg, "fraud_mlp");
        assert!(deployments(&cfg)[0].canary.is_some());
        // Another model takes the deployment's place, batch score kept, canary not.
        deploy(&mut cfg, "fraud_xgb");
        let d = deployments(&cfg);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].model, "fraud_xgb");
        assert!(d[0].canary.is_none());
        assert_eq!(d[0].batch_score.as_ref().unwrap().view, "fraud_scores");
        // No [decisions] at all: one plain deployment.
        let mut empty = toml::Table::new();
        deploy(&mut empty, "fraud_lgbm");
        assert_eq!(deployments(&empty)[0].model, "fraud_lgbm");
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

    #[test]
    fn the_top_two_percent_are_fraud() {
        let truths: Vec<(String, f64)> = (0..200)
            .map(|i| (format!("demo-{i}"), f64::from(i)))
            .collect();
        let (csv, fraud) = outcomes_csv(&truths);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "request_id,label");
        assert_eq!(lines.len(), 201);
        // The cut is the 98th percentile (196): 197, 198 and 199 are above it.
        assert_eq!(fraud, 3);
        assert_eq!(lines[1], "demo-0,0");
        assert_eq!(
            &lines[197..],
            ["demo-196,0", "demo-197,1", "demo-198,1", "demo-199,1"]
        );
        assert_eq!(outcomes_csv(&[]), ("request_id,label\n".to_owned(), 0));
    }

    #[test]
    fn summary_files_name_everything_the_demo_writes() {
        let p = Paths::new(Path::new("data/demo"));
        let files = p.files();
        let keys: Vec<&str> = files.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "config",
                "data",
                "features",
                "join",
                "metrics",
                "outcomes",
                "predictions",
                "summary"
            ]
        );
        assert_eq!(files["config"], Path::new("data/demo/mesh.toml"));
        assert_eq!(files["outcomes"], Path::new("data/demo/outcomes.csv"));
        assert_eq!(files["summary"], Path::new("data/demo/summary.json"));
    }
}
