//! The decision engine: wires the stages of a decision (`stages`: validate,
//! features, preprocess, postprocess, log; `fallback`: routing, the model call,
//! the time budgets and the fallback chain) to the model repository, the feature
//! store and the model-call stacks, and sends the shadow copies.
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_feature_store::LookupResponse;
use mesh_model_actor::{ModelConfig, ModelRepository, ServedModel, VersionHandle};
use mesh_prediction_log::Role;
use mesh_proto::mesh::v1 as pb;
use mesh_stack::{model_call_stack_with_updates, ModelCallStack, ReplicaId};
use metrics::counter;
use parking_lot::Mutex;
use tower::ServiceExt;

use super::arms::Arms;
use super::cache::VersionCache;
use super::config::DecisionsConfig;
use super::discovery::{self, Discovery, ReplicaMaker, Resolve, Target};
use super::fallback;
use super::feature_source::FeatureSource;
use super::features::FeatureUsed;
use super::meters::DecisionMeters;
use super::outcome::entities;
pub use super::outcome::{AnswerSource, Outcome, OutcomeSink, Timings};
use super::replica::{Fault, LocalReplica, ModelAnswer, ModelCall, RemoteReplica};
use super::spec::{DecisionSpec, Thresholds, Verdict};
use super::stages::{self, Item};
use super::Replica;
use crate::error::RouterError;
use crate::telemetry::names;

type Stack = ModelCallStack<ModelCall, ModelAnswer>;

/// Fault switches by replica id.
type Faults = Arc<Mutex<BTreeMap<String, Arc<Fault>>>>;

pub struct Engine {
    repo: Arc<ModelRepository>,
    /// Where stored features come from (this process's store or a features role).
    features: Option<Arc<FeatureSource>>,
    cfg: DecisionsConfig,
    /// Input specs by model, rebuilt when a reload replaced the model's config.
    specs: VersionCache<Arc<DecisionSpec>>,
    /// The last spec each model answered with, so that a model that was unloaded
    /// (or failed every load) still decides through the fallback chain with its
    /// thresholds instead of failing the request.
    /// Read per decision without a lock (an `ArcSwap` snapshot); replaced whole when
    /// a model's spec changes.
    last_specs: arc_swap::ArcSwap<std::collections::HashMap<String, Arc<DecisionSpec>>>,
    /// Model-call stacks by model and version, rebuilt when a reload replaced the
    /// version's actor groups. A stack is cloned out per call (cheap, `Clone`).
    stacks: VersionCache<Stack>,
    /// Fault switches by replica id; taken when a stack is built (or a replica
    /// joins it) and by the admin plane, never per call.
    faults: Faults,
    /// Resolves the names of `remote` entries.
    resolver: Arc<dyn Resolve>,
    /// The address sets of `remote` names, by (host, port); started at
    /// [`Engine::start_discovery`], or when a stack first needs one.
    discoveries: Mutex<HashMap<(String, u16), Discovery>>,
    sink: Option<Arc<dyn OutcomeSink>>,
    /// The decisions counters and stage histograms, kept from the first decision on.
    meters: DecisionMeters,
    /// Itself, for the shadow tasks that outlive a request.
    me: std::sync::Weak<Engine>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Sends one row through a model-call stack, ending by `deadline`.
async fn call_stack(
    stack: Stack,
    row: &Arc<Vec<f32>>,
    deadline: Instant,
) -> Result<ModelAnswer, RouterError> {
    let call = ModelCall {
        data: row.clone(),
        rows: 1,
        cols: row.len(),
        deadline: deadline.into(),
    };
    let answer = stack.oneshot(call).await.map_err(RouterError::Stack)?;
    check_scores(&answer)?;
    Ok(answer)
}

/// The fail-closed rule of a decision's score: it is a probability, so a score
/// that is not finite or not within [0, 1] is a model fault (the fallback chain
/// answers, with this as the reason), never a decision. An approve therefore only
/// ever comes from a finite probability from a named source (or from rules and
/// the configured default, which say so in the reasons).
pub(crate) fn check_scores(a: &ModelAnswer) -> Result<(), RouterError> {
    match a.scores.iter().find(|s| !(0.0..=1.0).contains(*s)) {
        Some(bad) => Err(RouterError::Internal(format!(
            "v{} answered {bad}, which is not a probability in [0, 1]; treated as a model fault",
            a.version
        ))),
        None if a.scores.is_empty() => Err(RouterError::Internal(format!(
            "v{} answered no score; treated as a model fault",
            a.version
        ))),
        None => Ok(()),
    }
}

/// Checks the decision side of a model's config before it is served: its
/// `[input_spec]` and `[decision]` parse (unknown keys are errors), the row it
/// builds is as wide as the model's input, and every `view:feature` it reads
/// exists in the feature store with a type the entry can use. A model named by a
/// deployment must have an input spec. Without a feature store (`[features]` not
/// configured) store sources are not checked: they all take defaults, which each
/// decision names in its reasons.
pub fn check_model(
    store: Option<&FeatureSource>,
    cfg: &DecisionsConfig,
    config: &ModelConfig,
) -> Result<(), String> {
    let spec = DecisionSpec::from_model(config)?;
    let Some(spec) = spec else {
        if cfg.decides_with(&config.name) {
            return Err(format!(
                "model '{}' is in [[decisions.deployments]] but its model.toml has no [input_spec], so it cannot take decisions",
                config.name
            ));
        }
        return Ok(());
    };
    if let Some(store) = store {
        spec.check_views(store.views())?;
    }
    Ok(())
}

impl Engine {
    /// Whether every configured deployment can answer from a model: its model is
    /// served, has a ready version (its pinned primary, when it names one), and
    /// has a usable input spec. `Err` names what cannot.
    pub fn ready(&self) -> Result<(), String> {
        let mut not = Vec::new();
        for d in &self.cfg.deployments {
            let served = match self.repo.model(&d.model) {
                Ok(m) => m,
                Err(_) => {
                    not.push(format!("'{}' is not loaded", d.model));
                    continue;
                }
            };
            let ready = match d.primary {
                Some(v) => self.repo.get(&d.model, Some(v)).is_ok(),
                None => served.newest().is_some(),
            };
            if !ready {
                not.push(match d.primary {
                    Some(v) => format!("'{}' has no ready version {v}", d.model),
                    None => format!("'{}' has no ready version", d.model),
                });
            } else if let Err(e) = self.spec(&served.config) {
                not.push(format!("'{}': {}", d.model, e.message()));
            }
        }
        if not.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "deployments that cannot answer: {}",
                not.join("; ")
            ))
        }
    }

    /// Whether `model` is one the engine decides for (served now or before), so
    /// that it may be a metric label; other names are client input.
    pub fn knows(&self, model: &str) -> bool {
        self.repo.model(model).is_ok() || self.last_specs.load().contains_key(model)
    }

    /// The engine over `repo`, reading stored features from `features`, resolving
    /// `remote` names with `resolver` ([`discovery::SystemResolver`] in a server).
    pub fn new(
        repo: Arc<ModelRepository>,
        features: Option<Arc<FeatureSource>>,
        cfg: DecisionsConfig,
        sink: Option<Arc<dyn OutcomeSink>>,
        resolver: Arc<dyn Resolve>,
    ) -> Result<Arc<Self>, RouterError> {
        cfg.validate().map_err(RouterError::InvalidArgument)?;
        // Every later load and reload checks the model's decision config first;
        // a refusal keeps what is served serving (the repository's rule).
        let (check_store, check_cfg) = (features.clone(), cfg.clone());
        repo.set_validator(Arc::new(move |config: &ModelConfig| {
            check_model(check_store.as_deref(), &check_cfg, config)
        }));
        if let Some(f) = &features {
            f.describe();
        }
        let engine = Arc::new_cyclic(|me| Self {
            repo,
            features,
            cfg,
            specs: VersionCache::default(),
            last_specs: Default::default(),
            stacks: VersionCache::default(),
            faults: Faults::default(),
            resolver,
            discoveries: Mutex::new(HashMap::new()),
            sink,
            meters: DecisionMeters::default(),
            me: me.clone(),
        });
        Ok(engine)
    }

    /// Resolves every `remote` name of the deployments once (each within
    /// [`discovery::RESOLVE_TIMEOUT`]) and keeps them fresh from then on, so the
    /// first decisions already balance over every address. A name that does not
    /// resolve yet starts with no address (a warning says so) and joins later.
    pub async fn start_discovery(&self) {
        for d in &self.cfg.deployments {
            for url in &d.remote {
                let Ok(t) = Target::parse(url) else { continue };
                if t.ip.is_some()
                    || self
                        .discoveries
                        .lock()
                        .contains_key(&(t.host.clone(), t.port))
                {
                    continue;
                }
                let disc =
                    Discovery::start(&t.host, t.port, self.resolver.clone(), self.cfg.discovery())
                        .await;
                tracing::info!(remote = %url, addresses = ?disc.current(), "remote replicas by name");
                self.discoveries.lock().insert((t.host, t.port), disc);
            }
        }
    }

    /// The discovery of a `remote` name, started now if it was not.
    fn discovery(&self, t: &Target) -> Discovery {
        self.discoveries
            .lock()
            .entry((t.host.clone(), t.port))
            .or_insert_with(|| {
                Discovery::spawn(&t.host, t.port, self.resolver.clone(), self.cfg.discovery())
            })
            .clone()
    }

    /// Checks the decision config of every served model ([`check_model`]: spec,
    /// width, store sources, deployments), so a broken spec fails the start instead
    /// of every decision. Models loaded after the engine was built are checked by
    /// the repository before they are swapped in.
    pub fn check_specs(&self) -> Result<(), RouterError> {
        for d in &self.cfg.deployments {
            if let Some(m) = d.models().find(|m| self.repo.model(m).is_err()) {
                return Err(RouterError::InvalidArgument(format!(
                    "[[decisions.deployments]] model = \"{}\": no model '{m}' in the repository ({})",
                    d.model,
                    self.repo.root().display()
                )));
            }
        }
        for m in self.repo.models() {
            check_model(self.features.as_deref(), &self.cfg, &m.config).map_err(|e| {
                RouterError::InvalidArgument(format!("model '{}' (model.toml): {e}", m.config.name))
            })?;
            if m.config.extra.contains_key("input_spec") {
                let spec = self.spec(&m.config)?;
                // Series at zero from the start, so rates and alerts see the first
                // fallback and the first defaulted feature.
                let reads_request = spec
                    .entries
                    .iter()
                    .any(|e| matches!(e.source, super::spec::Source::Request(_)));
                let views = spec.views.iter().map(String::as_str);
                for view in views.chain(reads_request.then_some("request")) {
                    counter!(names::DEFAULTED_FEATURES, "model" => m.config.name.clone(), "view" => view.to_owned())
                        .increment(0);
                }
                for source in [
                    AnswerSource::PreviousVersion,
                    AnswerSource::BatchScore,
                    AnswerSource::Rules,
                    AnswerSource::Default,
                ] {
                    counter!(names::FALLBACKS, "model" => m.config.name.clone(), "source" => source.as_str())
                        .increment(0);
                }
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &DecisionsConfig {
        &self.cfg
    }

    /// The fault switch of a replica (`model/v<version>/<replica>`), if it exists yet.
    pub fn fault(&self, replica: &str) -> Option<Arc<Fault>> {
        self.faults.lock().get(replica).cloned()
    }

    /// Replica ids known so far (stacks are built on first use).
    pub fn replicas(&self) -> Vec<String> {
        self.faults.lock().keys().cloned().collect()
    }

    fn spec(&self, config: &Arc<ModelConfig>) -> Result<Arc<DecisionSpec>, RouterError> {
        let spec = self.build_spec(config)?;
        let known = self
            .last_specs
            .load()
            .get(&config.name)
            .is_some_and(|s| Arc::ptr_eq(s, &spec));
        if !known {
            // Rare (start, reload): copy the small map with this model's new spec.
            self.last_specs.rcu(|m| {
                let mut m = (**m).clone();
                m.insert(config.name.clone(), spec.clone());
                m
            });
        }
        Ok(spec)
    }

    /// The spec of a served model, or the last one of a model that is not served
    /// now (unloaded, or its load failed): its decisions go down the fallback chain.
    /// A model the engine never served is NOT_FOUND.
    fn spec_of(&self, model: &str) -> Result<Arc<DecisionSpec>, RouterError> {
        match self.repo.model(model) {
            Ok(served) => self.spec(&served.config),
            Err(e) => self.last_specs.load().get(model).cloned().ok_or(e.into()),
        }
    }

    fn build_spec(&self, config: &Arc<ModelConfig>) -> Result<Arc<DecisionSpec>, RouterError> {
        let identity = [Arc::as_ptr(config) as usize];
        self.specs.get_or_build(&config.name, 0, identity, || {
            let spec = DecisionSpec::from_model(config)
                .map_err(|e| RouterError::Internal(format!("model '{}': {e}", config.name)))?
                .ok_or_else(|| {
                    RouterError::invalid(format!(
                        "model '{}' has no [input_spec], so it cannot take decisions (use ModelInfer)",
                        config.name
                    ))
                })?;
            Ok(Arc::new(spec))
        })
    }

    /// The stack over every replica of `model`/`version`, built on first use and
    /// rebuilt when a reload replaced the version's actor groups.
    pub fn stack(&self, model: &str, version: u64) -> Result<Stack, RouterError> {
        let served = self.repo.model(model)?;
        let handles = served
            .replicas
            .get(&version)
            .filter(|r| r.iter().all(|h| h.is_ready()))
            .ok_or_else(|| {
                RouterError::NotFound(format!("model '{model}' has no ready version {version}"))
            })?;
        let identity = handles.iter().map(|h| Arc::as_ptr(h) as usize);
        self.stacks.get_or_build(model, version, identity, || {
            self.build_stack(model, version, &served, handles)
        })
    }

    /// The replicas of a version (its local actor groups, the deployment's remote
    /// endpoints: one per IP address, one per address a name resolves to), each
    /// with its fault switch, under one stack. A name's replicas follow its
    /// addresses for as long as the stack lives ([`discovery::follow`]).
    fn build_stack(
        &self,
        model: &str,
        version: u64,
        served: &ServedModel,
        handles: &[Arc<VersionHandle>],
    ) -> Result<Stack, RouterError> {
        let fault = |id: &str| self.faults.lock().entry(id.to_owned()).or_default().clone();
        let mut replicas: Vec<(ReplicaId, Replica)> = Vec::new();
        for h in handles {
            let id = format!("{model}/v{version}/local{}", h.replica);
            let local = LocalReplica {
                handle: h.clone(),
                fault: fault(&id),
                try_timeout: self.cfg.stack.per_try_timeout,
            };
            replicas.push((ReplicaId::from(id), Replica::Local(local)));
        }
        let mut names = Vec::new();
        let input = &served.config.input().name;
        for url in self
            .cfg
            .deployment(model)
            .map_or(&[][..], |d| d.remote.as_slice())
        {
            let target = Target::parse(url).map_err(RouterError::InvalidArgument)?;
            if target.ip.is_some() {
                let id = format!("{model}/v{version}/{url}");
                let mut r = RemoteReplica::new(url, model, version, input)
                    .map_err(RouterError::InvalidArgument)?;
                r.fault = fault(&id);
                replicas.push((ReplicaId::from(id), Replica::Remote(r)));
                continue;
            }
            let maker = RemoteMaker {
                model: model.to_owned(),
                version,
                url: url.clone(),
                input: input.clone(),
                faults: self.faults.clone(),
            };
            let (now, rx) = self.discovery(&target).subscribe();
            replicas.extend(now.iter().filter_map(|a| maker.make(*a)));
            names.push((maker, now, rx));
        }
        let (stack, updates) = model_call_stack_with_updates(replicas, &self.cfg.stack)
            .map_err(|e| RouterError::Internal(e.to_string()))?;
        for (maker, now, rx) in names {
            discovery::follow(rx, now, updates.clone(), maker);
        }
        Ok(stack)
    }

    async fn call_model(
        &self,
        model: &str,
        version: u64,
        row: &Arc<Vec<f32>>,
        deadline: Instant,
    ) -> Result<ModelAnswer, RouterError> {
        call_stack(self.stack(model, version)?, row, deadline).await
    }

    /// Decides every request (same model) with one feature lookup; model calls run
    /// concurrently and meet in the model's batcher. The deadline counts from
    /// `arrival` (see [`crate::arrival`]): the caller's timeout capped by `[decisions]
    /// deadline`. When it passed before the work started, or before the decisions
    /// were ready, the call fails with `DeadlineExceeded` and each decision is logged
    /// with the source `DEADLINE` (never as an answer).
    pub async fn decide_batch(
        &self,
        reqs: &[pb::DecideRequest],
        (arrival, caller_timeout): (Instant, Option<Duration>),
    ) -> Result<Vec<Outcome>, RouterError> {
        let started = Instant::now();
        let budget = self.cfg.deadline();
        let deadline = crate::request::deadline(arrival, caller_timeout, budget, budget);
        let items = stages::validate(reqs, self.cfg.max_batch_items)?;
        let model = &reqs[0].model;
        let spec = self.spec_of(model)?;
        if let Err(late) = crate::request::check_not_expired(arrival, deadline, started) {
            for it in &items {
                let mut o = Outcome::new(it.req, model, Role::Primary, self.cfg.default_decision);
                o.timings.total = us(arrival.elapsed());
                stages::mark_late(&mut o, &late);
                stages::log(&o, self.sink.as_deref(), &self.meters);
            }
            return Err(late);
        }
        let mut shared = Timings {
            validate: us(started.elapsed()),
            ..Timings::default()
        };
        // Admission first: when no version of the model would take a call now, the
        // decisions go down the fallback chain without a feature lookup for nothing.
        let refused = self.admission_probe(model, deadline);

        let arms = self.arms(model);
        let t0 = Instant::now();
        // The lookup may use the time the model call would have: a remote store
        // that does not answer by then leaves the fallback reserve untouched.
        let until = fallback::model_call_deadline(deadline, budget);
        let lookup_spec = arms.lookup_spec(&spec);
        let lookup_spec = lookup_spec.as_ref().unwrap_or(&spec);
        let lookup = match refused {
            None => stages::lookup(self.features.as_deref(), lookup_spec, &items, until).await?,
            Some(_) => None,
        };
        shared.features = us(t0.elapsed());

        let futs = items.iter().enumerate().map(|(i, it)| {
            let (spec, lookup, arms) = (&spec, lookup.as_ref(), &arms);
            let refused = refused.as_deref();
            async move {
                let mut o = match refused {
                    None => {
                        self.decide_one(it, i, model, lookup, deadline, (spec, arms))
                            .await
                    }
                    Some(why) => self.not_scored(it, model, why, spec, deadline).await,
                };
                o.timings.validate = shared.validate;
                o.timings.features = shared.features;
                o.timings.total = us(arrival.elapsed());
                o
            }
        });
        let mut outcomes = futures::future::join_all(futs).await;
        let in_time = crate::request::check_in_time(arrival, deadline, Instant::now());
        for o in &mut outcomes {
            if let Err(late) = &in_time {
                stages::mark_late(o, late);
            }
            stages::log(o, self.sink.as_deref(), &self.meters);
        }
        in_time?;
        Ok(outcomes)
    }

    /// The other-model canary and shadow of `model`'s deployment, with their specs
    /// (an arm whose model is not served, or has no usable spec, is left out: the
    /// primary answers those requests).
    fn arms(&self, model: &str) -> Arms {
        let Some(d) = self.cfg.deployment(model) else {
            return Arms::default();
        };
        let with_spec = |a: &super::config::ModelArm| {
            let served = self.repo.model(&a.model).ok()?;
            Some((a.clone(), self.spec(&served.config).ok()?))
        };
        Arms {
            canary: d.canary_model.as_ref().and_then(with_spec),
            shadow: d.shadow_model.as_ref().and_then(with_spec),
        }
    }

    /// The version of `model` an arm names, or its newest ready one.
    fn arm_version(&self, model: &str, version: Option<u64>) -> Option<u64> {
        self.repo.get(model, version).ok().map(|h| h.version)
    }

    /// Why no version of `model` would take a model call with `deadline` now (each
    /// local actor group asked, see `VersionHandle::would_admit`), or `None` when
    /// one would, or when remote replicas may (they are not asked).
    fn admission_probe(&self, model: &str, deadline: Instant) -> Option<String> {
        let served = self.repo.model(model).ok()?;
        if self
            .cfg
            .deployment(model)
            .is_some_and(|d| !d.remote.is_empty())
        {
            return None;
        }
        let call_ends = fallback::model_call_deadline(deadline, self.cfg.deadline())
            .min(Instant::now() + self.cfg.stack.per_try_timeout);
        let mut why = None;
        for (v, handles) in &served.replicas {
            for h in handles.iter().filter(|h| h.is_ready()) {
                match h.would_admit(1, call_ends) {
                    Ok(()) => return None,
                    Err(e) => why = Some(format!("model v{v}: {e}")),
                }
            }
        }
        why
    }

    /// A decision the model would refuse (`why`): the batch score, then the rules.
    async fn not_scored(
        &self,
        it: &Item<'_>,
        model: &str,
        why: &str,
        spec: &DecisionSpec,
        deadline: Instant,
    ) -> Outcome {
        let mut o = Outcome::new(it.req, model, Role::Primary, self.cfg.default_decision);
        o.reasons.push(format!("not scored: {why}"));
        let bs = self
            .cfg
            .deployment(model)
            .and_then(|d| d.batch_score.as_ref());
        self.postprocess(&mut o, it, bs, None, spec, deadline).await;
        o
    }

    /// Postprocess: the model's answer through the thresholds, or else the batch
    /// score; then the rules.
    async fn postprocess(
        &self,
        o: &mut Outcome,
        it: &Item<'_>,
        bs: Option<&super::config::BatchScore>,
        answered: Option<(ModelAnswer, AnswerSource)>,
        spec: &DecisionSpec,
        deadline: Instant,
    ) {
        let t_post = Instant::now();
        match answered {
            Some((a, source)) => stages::score_answer(o, &a, source, &spec.thresholds),
            None => {
                let entities = &it.req.entities;
                let features = self.features.as_deref();
                if let Some(s) = fallback::batch_score(features, bs, entities, deadline).await {
                    stages::score_batch(o, s, &spec.thresholds);
                }
            }
        }
        stages::apply_rules(o, &self.cfg.rules, &it.req.features);
        o.timings.postprocess = us(t_post.elapsed());
    }

    /// One item from preprocess to postprocess: route (to the deployment's model or
    /// its other-model canary), build the row, score it (model, then previous
    /// versions), else the batch score; then the rules.
    async fn decide_one(
        &self,
        it: &Item<'_>,
        i: usize,
        model: &str,
        lookup: Option<&LookupResponse>,
        deadline: Instant,
        (spec, arms): (&DecisionSpec, &Arms),
    ) -> Outcome {
        let deployment = self.cfg.deployment(model);
        let canary = arms
            .canary_for(it.pinned, rand::random::<f64>)
            .and_then(|(a, s)| {
                Some((
                    a.model.as_str(),
                    s.as_ref(),
                    self.arm_version(&a.model, a.version)?,
                ))
            });
        let (model, spec, version, role) = match canary {
            Some((m, s, v)) => (m, s, Some(v), Role::Canary),
            None => {
                let newest = self.repo.get(model, None).ok().map(|h| h.version);
                let ready = |v| self.repo.get(model, Some(v)).is_ok();
                let (version, role) =
                    fallback::route(deployment, it.pinned, newest, ready, rand::random::<f64>);
                (model, spec, version, role)
            }
        };
        let mut o = Outcome::new(it.req, model, role, self.cfg.default_decision);

        let t_pre = Instant::now();
        let row = stages::preprocess(spec, it, lookup, i);
        stages::note_degraded(&mut o, lookup, i);
        o.timings.preprocess = us(t_pre.elapsed());
        let limit = deployment.and_then(|d| d.max_defaulted_features);
        let answered = match row {
            Ok((row, used)) => {
                o.features = used;
                match stages::note_defaults(&mut o, limit) {
                    Ok(()) => {
                        let route = (version, role);
                        let a = self
                            .score(it, model, route, Arc::new(row), deadline, &mut o.reasons)
                            .await;
                        if role == Role::Primary && it.pinned.is_none() {
                            self.shadow_model(it, i, lookup, arms);
                        }
                        a
                    }
                    Err(refusal) => {
                        o.reasons.push(format!("not scored: {refusal}"));
                        None
                    }
                }
            }
            Err(refusal) => {
                o.reasons.push(format!("not scored: {refusal}"));
                None
            }
        };

        let bs = deployment.and_then(|d| d.batch_score.as_ref());
        self.postprocess(&mut o, it, bs, answered, spec, deadline)
            .await;
        o
    }

    /// Stage 4 and fallback 1: the routed version (and the shadow copy), then the
    /// previous ready versions while time allows.
    async fn score(
        &self,
        it: &Item<'_>,
        model: &str,
        (version, role): (Option<u64>, Role),
        row: Arc<Vec<f32>>,
        deadline: Instant,
        reasons: &mut Vec<String>,
    ) -> Option<(ModelAnswer, AnswerSource)> {
        let row = &row;
        let call = move |v: u64, d: Instant| self.call_model(model, v, row, d);
        let budget = self.cfg.deadline();
        let routed = fallback::call_routed(model, version, deadline, budget, reasons, call).await;
        if version.is_some() {
            self.shadow(it, model, row, role);
        }
        if let Some(a) = routed {
            return Some((a, AnswerSource::Model));
        }
        let served = self.repo.model(model).ok()?;
        let versions = served.versions.keys().copied();
        fallback::previous_versions(versions, version, deadline, reasons, call)
            .await
            .map(|a| (a, AnswerSource::PreviousVersion))
    }

    /// Sends a copy to the shadow version; its answer is recorded, never returned,
    /// and nothing waits for it.
    fn shadow(&self, it: &Item<'_>, model: &str, row: &Arc<Vec<f32>>, role: Role) {
        let Some(version) = fallback::shadow_target(self.cfg.deployment(model), role, it.pinned)
        else {
            return;
        };
        self.send_shadow(it, model, version, row);
    }

    /// Sends a copy to the deployment's other-model shadow: its own row, built with
    /// its own spec from the same lookup. A row its spec refuses is not sent.
    fn shadow_model(&self, it: &Item<'_>, i: usize, lookup: Option<&LookupResponse>, arms: &Arms) {
        let Some((arm, spec)) = &arms.shadow else {
            return;
        };
        let Some(version) = self.arm_version(&arm.model, arm.version) else {
            return;
        };
        match stages::preprocess(spec, it, lookup, i) {
            Ok((row, _)) => self.send_shadow(it, &arm.model, version, &Arc::new(row)),
            Err(refusal) => {
                tracing::debug!(request_id = %it.req.request_id, model = %arm.model, %refusal, "shadow not sent")
            }
        }
    }

    fn send_shadow(&self, it: &Item<'_>, model: &str, version: u64, row: &Arc<Vec<f32>>) {
        let Some(me) = self.me.upgrade() else { return };
        let shadow = Shadow {
            request_id: it.req.request_id.clone(),
            model: model.to_owned(),
            version,
            entities: entities(it.req),
        };
        let row = row.clone();
        let budget = fallback::shadow_budget(self.cfg.deadline());
        tokio::spawn(async move {
            let t = Instant::now();
            let res = me
                .call_model(&shadow.model, version, &row, t + budget)
                .await;
            let thresholds = me
                .repo
                .model(&shadow.model)
                .ok()
                .and_then(|m| me.spec(&m.config).ok())
                .map(|s| s.thresholds);
            let o = shadow.outcome(res, thresholds, me.cfg.default_decision, t.elapsed());
            me.meters.count(&o);
            if let Some(sink) = &me.sink {
                sink.record(&o);
            }
        });
    }
}

/// The replicas of one `remote` name in one version's stack: one per address,
/// each with its fault switch (dropped when the address leaves).
struct RemoteMaker {
    model: String,
    version: u64,
    url: String,
    input: String,
    faults: Faults,
}

impl RemoteMaker {
    /// `<model>/v<version>/<url>@<address>`.
    fn id(&self, addr: SocketAddr) -> String {
        format!(
            "{}/v{}/{}@{}",
            self.model,
            self.version,
            self.url,
            addr.ip()
        )
    }
}

impl ReplicaMaker<Replica> for RemoteMaker {
    fn make(&self, addr: SocketAddr) -> Option<(ReplicaId, Replica)> {
        let id = self.id(addr);
        match RemoteReplica::at(&self.url, addr, &self.model, self.version, &self.input) {
            Ok(mut r) => {
                r.fault = self.faults.lock().entry(id.clone()).or_default().clone();
                Some((ReplicaId::from(id), Replica::Remote(r)))
            }
            Err(e) => {
                tracing::warn!(replica = %id, error = %e, "remote replica not added");
                None
            }
        }
    }

    fn retire(&self, addr: SocketAddr) -> ReplicaId {
        let id = self.id(addr);
        self.faults.lock().remove(&id);
        tracing::info!(replica = %id, "remote replica retired: its address left the name");
        ReplicaId::from(id)
    }
}

/// A request copied to the shadow version.
struct Shadow {
    request_id: String,
    model: String,
    version: u64,
    entities: Vec<(String, String)>,
}

impl Shadow {
    /// The shadow's record: its score through the thresholds (the default decision
    /// when it failed or the spec is gone), its failure as the reason.
    fn outcome(
        self,
        res: Result<ModelAnswer, RouterError>,
        thresholds: Option<Thresholds>,
        default: Verdict,
        took: Duration,
    ) -> Outcome {
        let (score, reasons) = match res {
            Ok(a) => (a.scores.first().copied(), vec![]),
            Err(e) => (None, vec![format!("shadow v{}: {e}", self.version)]),
        };
        let decision = match (score, thresholds) {
            (Some(s), Some(t)) => t.verdict(f64::from(s)),
            _ => default,
        };
        Outcome {
            request_id: self.request_id,
            model: self.model,
            version: Some(self.version),
            role: Role::Shadow,
            score,
            decision,
            source: AnswerSource::Model,
            reasons,
            features: Vec::<FeatureUsed>::new(),
            entities: self.entities,
            timings: Timings {
                total: us(took),
                ..Timings::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::answer;
    use mesh_stack::{model_call_stack, StackConfig, StackError};
    use std::sync::Mutex as StdMutex;

    #[test]
    fn only_a_finite_probability_is_a_score() {
        for ok in [0.0, 0.5, 1.0] {
            assert!(check_scores(&answer(1, ok)).is_ok());
        }
        for bad in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.01,
            1.01,
            3e38,
        ] {
            let e = check_scores(&answer(2, bad)).unwrap_err();
            assert!(
                matches!(e, RouterError::Internal(ref m) if m.contains("not a probability")),
                "{bad}: {e}"
            );
        }
        let mut empty = answer(1, 0.5);
        empty.scores.clear();
        assert!(check_scores(&empty).is_err());
    }

    /// A stack over one fake replica that answers twice the row's first value as
    /// version 3, and records the deadline of each call.
    fn fake_stack(fail: bool) -> (Stack, Arc<StdMutex<Vec<tokio::time::Instant>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let s = seen.clone();
        let svc = tower::service_fn(move |call: ModelCall| {
            s.lock().unwrap().push(call.deadline);
            async move {
                if fail {
                    return Err(StackError::ModelFault("fake fault".into()));
                }
                Ok::<_, StackError>(answer(3, call.data[0] * 2.0))
            }
        });
        let stack = model_call_stack(
            vec![(ReplicaId::from("fake/v3/local0"), svc)],
            &StackConfig::default(),
        )
        .unwrap();
        (stack, seen)
    }

    #[tokio::test]
    async fn model_call_sends_the_row_with_the_deadline() {
        let (stack, seen) = fake_stack(false);
        let deadline = Instant::now() + Duration::from_secs(2);
        let a = call_stack(stack, &Arc::new(vec![0.25, 1.0]), deadline)
            .await
            .unwrap();
        assert_eq!((a.version, a.scores.clone()), (3, vec![0.5]));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![tokio::time::Instant::from_std(deadline)]
        );
    }

    #[tokio::test]
    async fn model_call_errors_are_stack_errors() {
        let (stack, _) = fake_stack(true);
        let deadline = Instant::now() + Duration::from_secs(2);
        let e = call_stack(stack, &Arc::new(vec![1.0]), deadline)
            .await
            .unwrap_err();
        assert!(
            matches!(e, RouterError::Stack(StackError::ModelFault(_))),
            "{e:?}"
        );
        // A deadline already past is not sent at all.
        let (stack, seen) = fake_stack(false);
        let e = call_stack(stack, &Arc::new(vec![1.0]), Instant::now())
            .await
            .unwrap_err();
        assert!(
            matches!(e, RouterError::Stack(StackError::DeadlineExceeded)),
            "{e:?}"
        );
        assert!(seen.lock().unwrap().is_empty());
    }

    #[test]
    fn shadow_records_its_score_or_its_failure() {
        let shadow = || Shadow {
            request_id: "r".into(),
            model: "fraud".into(),
            version: 3,
            entities: vec![("card_id".into(), "7".into())],
        };
        let t = Thresholds {
            review_at: 0.5,
            decline_at: 0.9,
        };
        let took = Duration::from_micros(1234);
        let o = shadow().outcome(Ok(answer(3, 0.95)), Some(t), Verdict::Review, took);
        assert_eq!(
            (o.role, o.source, o.version),
            (Role::Shadow, AnswerSource::Model, Some(3))
        );
        assert_eq!((o.score, o.decision), (Some(0.95), Verdict::Decline));
        assert!(o.reasons.is_empty());
        assert_eq!(o.timings.total, 1234);
        let o = shadow().outcome(
            Err(RouterError::Internal("gone".into())),
            Some(t),
            Verdict::Review,
            took,
        );
        assert_eq!((o.score, o.decision), (None, Verdict::Review));
        assert_eq!(o.reasons, vec!["shadow v3: gone".to_string()]);
        // Scored but the spec is gone: the default decision.
        let o = shadow().outcome(Ok(answer(3, 0.95)), None, Verdict::Approve, took);
        assert_eq!(o.decision, Verdict::Approve);
    }
}
