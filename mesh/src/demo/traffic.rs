//! The demo's traffic: callers sending `Decide` over gRPC for the planned time,
//! the drill that stalls one replica and then both at their share of the run and
//! clears them, and what each phase of the run saw.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use mesh_proto::mesh::v1 as pb;
use mesh_router::decide::Engine;
use parking_lot::Mutex;
use rand::SeedableRng;
use tokio::task::JoinHandle;

use super::world::{self, World};
use super::DemoArgs;

/// Phases of the traffic, as fractions of the run.
pub(super) const PHASES: [(&str, f64); 4] = [
    ("steady", 0.0),
    ("one replica stalled", 0.35),
    ("both replicas stalled", 0.55),
    ("recovered", 0.65),
];
/// How long a stalled replica holds every call (the decision budget is 50 ms).
const STALL: Duration = Duration::from_millis(250);

type Client = pb::decisions_client::DecisionsClient<tonic::transport::Channel>;

/// What one phase of the run saw.
#[derive(Clone)]
pub(super) struct PhaseTally {
    pub latency: Histogram<u64>,
    pub sources: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
}

impl PhaseTally {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            sources: BTreeMap::new(),
            errors: BTreeMap::new(),
        })
    }

    /// Answers that no model gave (batch score, rules, default).
    pub fn fallbacks(&self) -> u64 {
        fallbacks(&self.sources)
    }
}

/// The answers in `sources` that are not `MODEL`.
pub(super) fn fallbacks(sources: &BTreeMap<String, u64>) -> u64 {
    sources
        .iter()
        .filter(|(k, _)| *k != "MODEL")
        .map(|(_, v)| v)
        .sum()
}

/// What the traffic phase hands on.
pub(super) struct Traffic {
    /// The planned length of the run (phase boundaries are shares of it).
    pub planned: Duration,
    /// Seconds the traffic actually ran.
    pub elapsed_s: f64,
    /// One per [`PHASES`] entry.
    pub tallies: Vec<PhaseTally>,
    /// Request id and the world's hidden fraud score of every answered decision.
    pub truths: Vec<(String, f64)>,
    /// Microseconds from the start to the first model answer after the clear.
    pub first_model_after_clear_us: Option<u64>,
}

/// What the callers, the drill and the progress line share while the run lasts.
struct Shared {
    started: Instant,
    planned: Duration,
    tallies: Vec<Mutex<PhaseTally>>,
    /// Index into [`PHASES`] of the phase now running.
    phase: AtomicUsize,
    truths: Mutex<Vec<(String, f64)>>,
    next_id: AtomicUsize,
    first_model_after_clear: AtomicU64,
    /// The model the decisions use (`--model`).
    model: String,
}

impl Shared {
    fn new(planned: Duration, model: &str) -> anyhow::Result<Self> {
        Ok(Self {
            model: model.to_owned(),
            started: Instant::now(),
            planned,
            tallies: (0..PHASES.len())
                .map(|_| PhaseTally::new().map(Mutex::new))
                .collect::<anyhow::Result<_>>()?,
            phase: AtomicUsize::new(0),
            truths: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            first_model_after_clear: AtomicU64::new(u64::MAX),
        })
    }

    /// When phase `i` begins, on the planned clock.
    fn phase_start(&self, i: usize) -> Instant {
        self.started + self.planned.mul_f64(PHASES[i].1)
    }

    fn finish(&self) -> Traffic {
        Traffic {
            planned: self.planned,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            tallies: self.tallies.iter().map(|t| t.lock().clone()).collect(),
            truths: std::mem::take(&mut *self.truths.lock()),
            first_model_after_clear_us: match self.first_model_after_clear.load(Ordering::Relaxed) {
                u64::MAX => None,
                at => Some(at),
            },
        }
    }
}

/// The `[4/6]` line: how long, how many callers, and when the drill acts.
pub(super) fn announce(planned: Duration, concurrency: usize, no_stall: bool) -> String {
    format!(
        "[4/6] driving {} s of Decide traffic at concurrency {}{}",
        planned.as_secs(),
        concurrency,
        if no_stall {
            String::new()
        } else {
            format!(
                "; stalls one replica at {:.0} s, both at {:.0} s, clears at {:.0} s",
                planned.as_secs_f64() * PHASES[1].1,
                planned.as_secs_f64() * PHASES[2].1,
                planned.as_secs_f64() * PHASES[3].1
            )
        }
    )
}

/// Drives `--seconds` of Decide traffic at `--concurrency` against the mesh at
/// `grpc_addr`, with the stall drill on `engine` unless `--no-stall`.
pub(super) async fn drive(
    grpc_addr: SocketAddr,
    engine: Arc<Engine>,
    world: Arc<World>,
    args: &DemoArgs,
) -> anyhow::Result<Traffic> {
    let (concurrency, no_stall) = (args.concurrency, args.no_stall);
    let planned = Duration::from_secs(args.seconds.max(1));
    crate::outln!("{}", announce(planned, concurrency, no_stall))?;
    let client = connect(grpc_addr).await?;
    let shared = Arc::new(Shared::new(planned, &args.model)?);
    let drill = spawn_drill(engine, shared.clone(), no_stall);
    let callers: Vec<_> = (0..concurrency.max(1))
        .map(|w| tokio::spawn(caller(w, client.clone(), world.clone(), shared.clone())))
        .collect();
    let progress = spawn_progress(shared.clone());
    for c in callers {
        let _ = c.await;
    }
    progress.abort();
    drill.abort();
    Ok(shared.finish())
}

async fn connect(grpc_addr: SocketAddr) -> anyhow::Result<Client> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc_addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to the mesh at {grpc_addr}"))?;
    Ok(pb::decisions_client::DecisionsClient::new(channel))
}

/// The replicas the drill stalls at step `step` of [`PHASES`]: of the model's newest
/// version (the one answering), the first replica, then all of them, then none (the
/// faults are cleared). Older versions' replicas are left alone, so the previous version
/// can answer while the newest is stalled; whether their stacks were built yet (at
/// their first call) changes nothing.
pub(super) fn drill_targets(step: usize, model: &str, replicas: Vec<String>) -> Vec<String> {
    let prefix = format!("{model}/v");
    let version = |r: &str| -> Option<u64> {
        let rest = r.strip_prefix(&prefix)?;
        rest.split_once('/')?.0.parse().ok()
    };
    let newest = replicas.iter().filter_map(|r| version(r)).max();
    let mut replicas: Vec<String> = replicas
        .into_iter()
        .filter(|r| newest.is_some() && version(r) == newest)
        .collect();
    replicas.sort();
    match step {
        1 => replicas.into_iter().take(1).collect(),
        2 => replicas,
        _ => Vec::new(),
    }
}

/// The drill: stall, stall more, clear; each step at its share of the run.
fn spawn_drill(engine: Arc<Engine>, shared: Arc<Shared>, no_stall: bool) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut stalled: Vec<String> = Vec::new();
        for (i, (name, _)) in PHASES.iter().enumerate().skip(1) {
            tokio::time::sleep_until(shared.phase_start(i).into()).await;
            shared.phase.store(i, Ordering::Relaxed);
            if no_stall {
                continue;
            }
            let targets = drill_targets(i, &shared.model, engine.replicas());
            let at = || shared.started.elapsed().as_secs_f64();
            if targets.is_empty() {
                for r in stalled.drain(..) {
                    if let Some(f) = engine.fault(&r) {
                        f.set(Duration::ZERO, false);
                    }
                }
                eprintln!("      {:>5.1} s  {name}: faults cleared", at());
            } else {
                for r in &targets {
                    if let Some(f) = engine.fault(r) {
                        f.set(STALL, false);
                    }
                }
                eprintln!(
                    "      {:>5.1} s  {name}: {} hold every call {} ms",
                    at(),
                    targets.join(", "),
                    STALL.as_millis()
                );
                stalled = targets;
            }
        }
    })
}

/// One caller: sends a decision as soon as the last one answered, until the
/// planned end; keeps the truth of each answered transaction.
async fn caller(w: usize, mut client: Client, world: Arc<World>, shared: Arc<Shared>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + w as u64);
    let mut mine = Vec::new();
    let end = shared.started + shared.planned;
    while Instant::now() < end {
        let txn = world.transaction(&mut rng);
        let n = shared.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        let req = decide_request(n, &shared.model, &txn);
        let p = shared.phase.load(Ordering::Relaxed);
        let t = Instant::now();
        let res = client.decide(req).await;
        let us = t.elapsed().as_micros() as u64;
        let mut g = shared.tallies[p].lock();
        match res {
            Ok(r) => {
                let r = r.into_inner();
                let _ = g.latency.record(us.max(1));
                *g.sources.entry(source_name(r.source)).or_default() += 1;
                if p == PHASES.len() - 1 && r.source == pb::AnswerSource::Model as i32 {
                    let at = t.duration_since(shared.started).as_micros() as u64;
                    shared
                        .first_model_after_clear
                        .fetch_min(at, Ordering::Relaxed);
                }
                mine.push((r.request_id, txn.truth));
            }
            Err(s) => *g.errors.entry(format!("{:?}", s.code())).or_default() += 1,
        }
    }
    shared.truths.lock().extend(mine);
}

/// Once a second: decisions so far and how many fallbacks answered.
fn spawn_progress(shared: Arc<Shared>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (mut n, mut fb) = (0u64, 0u64);
            for p in &shared.tallies {
                let g = p.lock();
                n += g.latency.len();
                fb += g.fallbacks();
            }
            eprintln!(
                "      {:>5.1} s  {n:>8} decisions  {fb:>6} from fallbacks",
                shared.started.elapsed().as_secs_f64()
            );
        }
    })
}

pub(super) fn decide_request(n: u64, model: &str, t: &world::Txn) -> pb::DecideRequest {
    let mut features: std::collections::HashMap<String, f64> = t
        .extra
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("f{}", 18 + i), *v))
        .collect();
    features.insert("amount".into(), t.amount);
    pb::DecideRequest {
        request_id: format!("demo-{n:07}"),
        model: model.into(),
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

pub(super) fn source_name(s: i32) -> String {
    pb::AnswerSource::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ANSWER_SOURCE_")
                .to_owned()
        })
        .unwrap_or_else(|_| format!("SOURCE_{s}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_drill_stalls_one_then_all_of_the_newest_versions_replicas_then_clears() {
        let replicas = || {
            vec![
                "other/v1/local0".to_string(),
                "fraud_mlp/v2/local1".to_string(),
                "fraud_mlp/v1/local0".to_string(),
                "fraud_mlp/v2/local0".to_string(),
                "fraud_mlp/v1/local1".to_string(),
            ]
        };
        let m = "fraud_mlp";
        assert_eq!(drill_targets(1, m, replicas()), ["fraud_mlp/v2/local0"]);
        // The previous version's replicas, built at its first call, are left to answer.
        assert_eq!(
            drill_targets(2, m, replicas()),
            ["fraud_mlp/v2/local0", "fraud_mlp/v2/local1"]
        );
        assert!(drill_targets(3, m, replicas()).is_empty());
        // A replica of a model merely named like it is not the model's.
        assert!(drill_targets(2, m, vec!["fraud_mlp2/v1/local0".into()]).is_empty());
        assert_eq!(drill_targets(1, "other", replicas()), ["other/v1/local0"]);
        // Version 10 is newer than version 9 (numbers, not text).
        let tens = vec!["m/v9/local0".to_string(), "m/v10/local0".to_string()];
        assert_eq!(drill_targets(2, "m", tens), ["m/v10/local0"]);
    }

    #[test]
    fn the_announcement_names_the_drill_times() {
        assert_eq!(
            announce(Duration::from_secs(20), 8, false),
            "[4/6] driving 20 s of Decide traffic at concurrency 8; \
             stalls one replica at 7 s, both at 11 s, clears at 13 s"
        );
        assert_eq!(
            announce(Duration::from_secs(8), 2, true),
            "[4/6] driving 8 s of Decide traffic at concurrency 2"
        );
    }

    #[test]
    fn fallbacks_are_answers_the_model_did_not_give() {
        let mut t = PhaseTally::new().unwrap();
        t.sources = BTreeMap::from([
            ("MODEL".into(), 10),
            ("BATCH_SCORE".into(), 3),
            ("RULES".into(), 2),
        ]);
        assert_eq!(t.fallbacks(), 5);
        assert_eq!(source_name(pb::AnswerSource::Model as i32), "MODEL");
        assert_eq!(source_name(9999), "SOURCE_9999");
    }

    #[test]
    fn demo_requests_carry_the_transaction() {
        let w = World::new(5, 3, 7);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let txn = w.transaction(&mut rng);
        let r = decide_request(42, "fraud_xgb", &txn);
        assert_eq!(
            (r.request_id.as_str(), r.model.as_str()),
            ("demo-0000042", "fraud_xgb")
        );
        assert_eq!(r.features["amount"], txn.amount);
        assert_eq!(r.features.len(), txn.extra.len() + 1);
        assert!(r.features.contains_key("f18"));
        assert_eq!(
            r.entities["card_id"].key,
            Some(pb::entity_key::Key::Int64Key(txn.card))
        );
        assert_eq!(r.categorical["merchant_category"], txn.category);
    }
}
