//! The decision path: validate -> features (one batched lookup) -> preprocess ->
//! model call through the tower stack -> postprocess -> fallback chain -> respond.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_feature_store::{
    FeatureStatus, FeatureStore, KeyColumn, KeyType, LookupRequest, LookupResponse,
};
use mesh_model_actor::{ModelConfig, ModelRepository, VersionHandle};
use mesh_proto::mesh::v1 as pb;
use mesh_stack::{model_call_stack, ModelCallStack, ReplicaId};
use metrics::{counter, histogram};
use parking_lot::Mutex;
use tower::ServiceExt;

use super::config::DecisionsConfig;
use super::features::{build_row, FeatureUsed, RequestFeatures};
use super::replica::{Fault, LocalReplica, ModelAnswer, ModelCall, RemoteReplica};
use super::spec::{DecisionSpec, Verdict};
use super::Replica;
use crate::error::RouterError;

/// Metric names of the decision path.
pub mod names {
    /// Counter: decisions by `model`, `source`, `decision`, `role`.
    pub const DECISIONS: &str = "mesh_router_decisions_total";
    /// Counter: answers that came from a fallback, by `model`, `source`.
    pub const FALLBACKS: &str = "mesh_router_fallbacks_total";
    /// Histogram: time per stage (`stage` = validate, features, preprocess, queue, compute, postprocess, total).
    pub const STAGE: &str = "mesh_router_stage_seconds";
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerSource {
    Model,
    PreviousVersion,
    BatchScore,
    Rules,
    Default,
}

impl AnswerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "MODEL",
            Self::PreviousVersion => "PREVIOUS_VERSION",
            Self::BatchScore => "BATCH_SCORE",
            Self::Rules => "RULES",
            Self::Default => "DEFAULT",
        }
    }
    fn proto(self) -> pb::AnswerSource {
        match self {
            Self::Model => pb::AnswerSource::Model,
            Self::PreviousVersion => pb::AnswerSource::PreviousVersion,
            Self::BatchScore => pb::AnswerSource::BatchScore,
            Self::Rules => pb::AnswerSource::Rules,
            Self::Default => pb::AnswerSource::Default,
        }
    }
}

/// The decision with everything the log needs.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub request_id: String,
    pub model: String,
    pub version: Option<u64>,
    pub role: &'static str,
    pub score: Option<f32>,
    pub decision: Verdict,
    pub source: AnswerSource,
    pub reasons: Vec<String>,
    pub features: Vec<FeatureUsed>,
    pub entities: Vec<(String, String)>,
    pub timings: Timings,
}

/// Microseconds per stage.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub validate: u64,
    pub features: u64,
    pub preprocess: u64,
    pub queue: u64,
    pub compute: u64,
    pub postprocess: u64,
    pub total: u64,
}

impl Outcome {
    pub fn to_proto(&self) -> pb::DecideResponse {
        let t = &self.timings;
        pb::DecideResponse {
            request_id: self.request_id.clone(),
            score: self.score,
            decision: match self.decision {
                Verdict::Approve => pb::Decision::Approve,
                Verdict::Review => pb::Decision::Review,
                Verdict::Decline => pb::Decision::Decline,
            } as i32,
            model: self.model.clone(),
            model_version: self.version.map(|v| v.to_string()).unwrap_or_default(),
            source: self.source.proto() as i32,
            timings: Some(pb::StageTimings {
                validate_us: t.validate,
                features_us: t.features,
                preprocess_us: t.preprocess,
                queue_us: t.queue,
                compute_us: t.compute,
                postprocess_us: t.postprocess,
                total_us: t.total,
            }),
            reasons: self.reasons.clone(),
            role: self.role.to_owned(),
        }
    }
}

/// Receives every outcome (primary, canary and shadow) without blocking.
pub trait OutcomeSink: Send + Sync {
    fn record(&self, outcome: &Outcome);
}

type Stack = ModelCallStack<ModelCall, ModelAnswer>;

struct CachedStack {
    /// Identity of the actor groups the stack was built over (a reload replaces them).
    handles: Vec<usize>,
    stack: Stack,
}

pub struct Engine {
    repo: Arc<ModelRepository>,
    store: Option<Arc<FeatureStore>>,
    cfg: DecisionsConfig,
    specs: Mutex<HashMap<String, (usize, Arc<DecisionSpec>)>>,
    stacks: tokio::sync::Mutex<HashMap<(String, u64), CachedStack>>,
    faults: Mutex<BTreeMap<String, Arc<Fault>>>,
    sink: Option<Arc<dyn OutcomeSink>>,
    /// Itself, for the shadow tasks that outlive a request.
    me: std::sync::Weak<Engine>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// One validated request of a batch.
struct Item<'a> {
    req: &'a pb::DecideRequest,
    pinned: Option<u64>,
}

impl Engine {
    pub fn new(
        repo: Arc<ModelRepository>,
        store: Option<Arc<FeatureStore>>,
        cfg: DecisionsConfig,
        sink: Option<Arc<dyn OutcomeSink>>,
    ) -> Result<Arc<Self>, RouterError> {
        cfg.validate().map_err(RouterError::InvalidArgument)?;
        Ok(Arc::new_cyclic(|me| Self {
            repo,
            store,
            cfg,
            specs: Mutex::new(HashMap::new()),
            stacks: tokio::sync::Mutex::new(HashMap::new()),
            faults: Mutex::new(BTreeMap::new()),
            sink,
            me: me.clone(),
        }))
    }

    /// Checks the input spec of every served model that has one, so a broken spec
    /// fails the start instead of the first decision.
    pub fn check_specs(&self) -> Result<(), RouterError> {
        for m in self.repo.models() {
            if m.config.extra.contains_key("input_spec") {
                self.spec(&m.config)?;
                // Series at zero from the start, so rates and alerts see the first fallback.
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

    fn self_ref(&self) -> Option<Arc<Self>> {
        self.me.upgrade()
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
        let key = Arc::as_ptr(config) as usize;
        if let Some((k, s)) = self.specs.lock().get(&config.name) {
            if *k == key {
                return Ok(s.clone());
            }
        }
        let spec = DecisionSpec::from_model(config)
            .map_err(|e| RouterError::Internal(format!("model '{}': {e}", config.name)))?
            .ok_or_else(|| {
                RouterError::invalid(format!(
                    "model '{}' has no [input_spec], so it cannot take decisions (use ModelInfer)",
                    config.name
                ))
            })?;
        let spec = Arc::new(spec);
        self.specs
            .lock()
            .insert(config.name.clone(), (key, spec.clone()));
        Ok(spec)
    }

    /// The stack over every replica of `model`/`version`, built on first use and
    /// rebuilt when a reload replaced the version's actor groups.
    pub async fn stack(&self, model: &str, version: u64) -> Result<Stack, RouterError> {
        let served = self.repo.model(model)?;
        let handles: Vec<Arc<VersionHandle>> = served
            .replicas
            .get(&version)
            .cloned()
            .filter(|r| r.iter().all(|h| h.is_ready()))
            .ok_or_else(|| {
                RouterError::NotFound(format!("model '{model}' has no ready version {version}"))
            })?;
        let ids: Vec<usize> = handles.iter().map(|h| Arc::as_ptr(h) as usize).collect();
        let mut stacks = self.stacks.lock().await;
        if let Some(c) = stacks.get(&(model.to_owned(), version)) {
            if c.handles == ids {
                return Ok(c.stack.clone());
            }
        }
        let mut replicas: Vec<(ReplicaId, Replica)> = Vec::new();
        for h in &handles {
            let id = format!("{model}/v{version}/local{}", h.replica);
            let fault = self.faults.lock().entry(id.clone()).or_default().clone();
            replicas.push((
                ReplicaId::from(id),
                Replica::Local(LocalReplica {
                    handle: h.clone(),
                    fault,
                }),
            ));
        }
        if let Some(d) = self.cfg.deployment(model) {
            for url in &d.remote {
                let id = format!("{model}/v{version}/{url}");
                let mut r = RemoteReplica::new(url, model, version, &served.config.input().name)
                    .map_err(RouterError::InvalidArgument)?;
                r.fault = self.faults.lock().entry(id.clone()).or_default().clone();
                replicas.push((ReplicaId::from(id), Replica::Remote(r)));
            }
        }
        let stack = model_call_stack(replicas, &self.cfg.stack)
            .map_err(|e| RouterError::Internal(e.to_string()))?;
        stacks.insert(
            (model.to_owned(), version),
            CachedStack {
                handles: ids,
                stack: stack.clone(),
            },
        );
        Ok(stack)
    }

    async fn call_model(
        &self,
        model: &str,
        version: u64,
        row: &Arc<Vec<f32>>,
        deadline: Instant,
    ) -> Result<ModelAnswer, RouterError> {
        let stack = self.stack(model, version).await?;
        let call = ModelCall {
            data: row.clone(),
            rows: 1,
            cols: row.len(),
            deadline: deadline.into(),
        };
        let answer = stack.oneshot(call).await.map_err(RouterError::Stack)?;
        Ok(answer)
    }

    fn validate<'a>(&self, reqs: &'a [pb::DecideRequest]) -> Result<Vec<Item<'a>>, RouterError> {
        if reqs.is_empty() {
            return Err(RouterError::invalid(
                "DecideBatch needs at least one request",
            ));
        }
        if reqs.len() > self.cfg.max_batch_items {
            return Err(RouterError::invalid(format!(
                "{} requests in one DecideBatch; the limit is {} (max_batch_items)",
                reqs.len(),
                self.cfg.max_batch_items
            )));
        }
        let model = &reqs[0].model;
        let mut items = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            let at = |m: String| {
                if reqs.len() > 1 {
                    RouterError::invalid(format!("requests[{i}]: {m}"))
                } else {
                    RouterError::invalid(m)
                }
            };
            if r.request_id.is_empty() {
                return Err(at("request_id is empty".into()));
            }
            if r.model.is_empty() {
                return Err(at("model is empty".into()));
            }
            if r.model != *model {
                return Err(at(format!(
                    "model '{}' differs from requests[0]'s '{model}'; a batch is for one model",
                    r.model
                )));
            }
            if let Some((k, v)) = r.features.iter().find(|(_, v)| !v.is_finite()) {
                return Err(at(format!(
                    "feature '{k}' is {v}: request features must be finite"
                )));
            }
            let pinned = crate::oip::parse_version(&r.model, &r.version)?;
            items.push(Item { req: r, pinned });
        }
        Ok(items)
    }

    /// The join keys the spec's views need, with their key types.
    fn join_keys(
        &self,
        spec: &DecisionSpec,
    ) -> Result<Vec<(String, KeyType, Vec<String>)>, RouterError> {
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        let mut out: Vec<(String, KeyType, Vec<String>)> = Vec::new();
        for v in &spec.views {
            let view = store
                .view(v)
                .map_err(|e| RouterError::Internal(format!("input spec reads view '{v}': {e}")))?;
            match out.iter_mut().find(|(k, _, _)| *k == view.join_key) {
                Some((_, _, views)) => views.push(v.clone()),
                None => out.push((view.join_key.clone(), view.key_type, vec![v.clone()])),
            }
        }
        Ok(out)
    }

    /// One batched lookup for every item; `None` when the store is absent or failed.
    async fn lookup(
        &self,
        spec: &DecisionSpec,
        items: &[Item<'_>],
    ) -> Result<Option<LookupResponse>, RouterError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        if spec.store_features.is_empty() {
            return Ok(None);
        }
        let mut req = LookupRequest::new(spec.store_features.iter().cloned());
        for (join_key, key_type, views) in self.join_keys(spec)? {
            let mut ints = Vec::new();
            let mut strs = Vec::new();
            for (i, it) in items.iter().enumerate() {
                let key = it
                    .req
                    .entities
                    .get(&join_key)
                    .and_then(|k| k.key.clone())
                    .ok_or_else(|| {
                        RouterError::invalid(format!(
                            "{}missing entity key '{join_key}' (needed by view {})",
                            if items.len() > 1 {
                                format!("requests[{i}]: ")
                            } else {
                                String::new()
                            },
                            views.join(", ")
                        ))
                    })?;
                use mesh_proto::mesh::v1::entity_key::Key;
                match (key_type, key) {
                    (KeyType::Int64, Key::Int64Key(k)) => ints.push(k),
                    (KeyType::String, Key::StringKey(k)) if !k.is_empty() => strs.push(k),
                    (t, _) => {
                        return Err(RouterError::invalid(format!(
                            "entity key '{join_key}' must be a non-empty {} key",
                            t.as_str()
                        )))
                    }
                }
            }
            let col = match key_type {
                KeyType::Int64 => KeyColumn::Int64(ints),
                KeyType::String => KeyColumn::String(strs),
            };
            req = req.with_keys(join_key, col);
        }
        match store.get_online_features(req).await {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                // A store failure degrades to defaults/refusals per the spec, not an error.
                tracing::warn!(error = %e, "feature lookup failed");
                Ok(None)
            }
        }
    }

    /// Decides every request (same model) with one feature lookup; model calls run
    /// concurrently and meet in the model's batcher.
    pub async fn decide_batch(
        &self,
        reqs: &[pb::DecideRequest],
        caller_timeout: Option<Duration>,
    ) -> Result<Vec<Outcome>, RouterError> {
        let started = Instant::now();
        let budget = Duration::from_millis(self.cfg.deadline_ms);
        let deadline = started + caller_timeout.map_or(budget, |t| t.min(budget));
        let items = self.validate(reqs)?;
        let model = reqs[0].model.clone();
        let served = self.repo.model(&model)?;
        let spec = self.spec(&served.config)?;
        let t_validate = started.elapsed();

        let t0 = Instant::now();
        let lookup = self.lookup(&spec, &items).await?;
        let t_features = t0.elapsed();

        let futs = items.iter().enumerate().map(|(i, it)| {
            let (spec, lookup, model, served) = (&spec, lookup.as_ref(), &model, &served);
            async move {
                let t_pre = Instant::now();
                let req_features = RequestFeatures {
                    numeric: &it.req.features,
                    categorical: &it.req.categorical,
                };
                let row = build_row(spec, &req_features, lookup, i);
                let preprocess = t_pre.elapsed();
                let mut o = self
                    .decide_one(it, served.config.name.as_str(), row, deadline, spec)
                    .await;
                o.model = model.clone();
                o.timings.validate = us(t_validate);
                o.timings.features = us(t_features);
                o.timings.preprocess = us(preprocess);
                o.timings.total = us(started.elapsed());
                o
            }
        });
        let outcomes = futures::future::join_all(futs).await;
        for o in &outcomes {
            self.observe(o);
        }
        Ok(outcomes)
    }

    fn observe(&self, o: &Outcome) {
        counter!(names::DECISIONS, "model" => o.model.clone(), "source" => o.source.as_str(), "decision" => o.decision.as_str(), "role" => o.role)
            .increment(1);
        if o.source != AnswerSource::Model {
            counter!(names::FALLBACKS, "model" => o.model.clone(), "source" => o.source.as_str())
                .increment(1);
        }
        let t = &o.timings;
        for (stage, v) in [
            ("validate", t.validate),
            ("features", t.features),
            ("preprocess", t.preprocess),
            ("queue", t.queue),
            ("compute", t.compute),
            ("postprocess", t.postprocess),
            ("total", t.total),
        ] {
            histogram!(names::STAGE, "stage" => stage).record(v as f64 / 1e6);
        }
        if let Some(s) = &self.sink {
            s.record(o);
        }
    }

    /// Which version answers: pinned, canary by weight, or the primary.
    fn route(
        &self,
        model: &str,
        pinned: Option<u64>,
        newest: Option<u64>,
    ) -> (Option<u64>, &'static str) {
        if let Some(v) = pinned {
            return (Some(v), "primary");
        }
        let d = self.cfg.deployment(model);
        if let Some(c) = d.and_then(|d| d.canary.as_ref()) {
            if self.repo.get(model, Some(c.version)).is_ok() && rand::random::<f64>() < c.weight {
                return (Some(c.version), "canary");
            }
        }
        (d.and_then(|d| d.primary).or(newest), "primary")
    }

    async fn decide_one(
        &self,
        it: &Item<'_>,
        model: &str,
        row: Result<(Vec<f32>, Vec<FeatureUsed>), String>,
        deadline: Instant,
        spec: &DecisionSpec,
    ) -> Outcome {
        let newest = self.repo.get(model, None).ok().map(|h| h.version);
        let (version, role) = self.route(model, it.pinned, newest);
        let mut o = Outcome {
            request_id: it.req.request_id.clone(),
            model: model.to_owned(),
            version: None,
            role,
            score: None,
            decision: self.cfg.default_decision,
            source: AnswerSource::Default,
            reasons: Vec::new(),
            features: Vec::new(),
            entities: it
                .req
                .entities
                .iter()
                .map(|(k, v)| (k.clone(), entity_str(v)))
                .collect(),
            timings: Timings::default(),
        };
        // Leave room after the model call for the cheap fallbacks.
        let reserve = Duration::from_millis(self.cfg.deadline_ms / 5).min(Duration::from_millis(5));
        let mut answered = None;
        let row = match row {
            Ok((row, used)) => {
                o.features = used;
                let row = Arc::new(row);
                if let Some(v) = version {
                    match self
                        .call_model(
                            model,
                            v,
                            &row,
                            deadline.checked_sub(reserve).unwrap_or(deadline),
                        )
                        .await
                    {
                        Ok(a) => answered = Some((a, AnswerSource::Model)),
                        Err(e) => o.reasons.push(format!("model v{v}: {e}")),
                    }
                    self.shadow(it, model, &row, role);
                } else {
                    o.reasons
                        .push(format!("model '{model}' has no ready version"));
                }
                Some(row)
            }
            Err(refusal) => {
                o.reasons.push(format!("not scored: {refusal}"));
                None
            }
        };
        // Fallback 1: the previous ready versions, newest first, while time allows.
        if answered.is_none() {
            if let (Some(row), Ok(served)) = (&row, self.repo.model(model)) {
                let below = version.unwrap_or(u64::MAX);
                for v in served
                    .versions
                    .keys()
                    .rev()
                    .filter(|v| **v < below)
                    .copied()
                {
                    if Instant::now() + Duration::from_micros(500) >= deadline {
                        break;
                    }
                    match self
                        .call_model(model, v, row, deadline - Duration::from_micros(200))
                        .await
                    {
                        Ok(a) => {
                            answered = Some((a, AnswerSource::PreviousVersion));
                            break;
                        }
                        Err(e) => o.reasons.push(format!("previous version v{v}: {e}")),
                    }
                }
            }
        }
        let t_post = Instant::now();
        if let Some((a, source)) = answered {
            let score = a.scores.first().copied().unwrap_or(f32::NAN);
            o.version = Some(a.version);
            o.score = Some(score);
            o.source = source;
            o.timings.queue = us(a.queue);
            o.timings.compute = us(a.compute);
            o.decision = spec.thresholds.verdict(f64::from(score));
            o.reasons
                .push(format!("score {score:.4} -> {}", o.decision.as_str()));
        } else if let Some(score) = self.batch_score(model, it).await {
            // Fallback 2: the precomputed batch score.
            o.score = Some(score);
            o.source = AnswerSource::BatchScore;
            o.decision = spec.thresholds.verdict(f64::from(score));
            o.reasons
                .push(format!("batch score {score:.4} -> {}", o.decision.as_str()));
        }
        // Rules: escalate model answers, decide on their own when nothing scored.
        let fired: Vec<_> = self
            .cfg
            .rules
            .iter()
            .filter(|r| r.fires(&it.req.features))
            .collect();
        for r in &fired {
            o.reasons
                .push(format!("rule {} -> {}", r.name, r.decision.as_str()));
        }
        let strictest = fired.iter().map(|r| r.decision).max();
        match (o.source, strictest) {
            (AnswerSource::Default, Some(d)) => {
                o.source = AnswerSource::Rules;
                o.decision = d;
            }
            (AnswerSource::Default, None) => o
                .reasons
                .push(format!("default -> {}", o.decision.as_str())),
            (_, Some(d)) => o.decision = o.decision.max(d),
            _ => {}
        }
        o.timings.postprocess = us(t_post.elapsed());
        if o.source == AnswerSource::Model {
            tracing::debug!(request_id = %o.request_id, version = ?o.version, score = ?o.score, decision = o.decision.as_str(), "decided");
        } else {
            tracing::debug!(request_id = %o.request_id, source = o.source.as_str(), decision = o.decision.as_str(), reasons = ?o.reasons, "answered by a fallback");
        }
        o
    }

    /// The precomputed score of the request's entity, only if fresh.
    async fn batch_score(&self, model: &str, it: &Item<'_>) -> Option<f32> {
        let bs = self.cfg.deployment(model)?.batch_score.as_ref()?;
        let store = self.store.as_ref()?;
        let view = store.view(&bs.view).ok()?;
        let key = it.req.entities.get(&view.join_key)?.key.clone()?;
        use mesh_proto::mesh::v1::entity_key::Key;
        let col = match key {
            Key::Int64Key(k) => KeyColumn::Int64(vec![k]),
            Key::StringKey(k) => KeyColumn::String(vec![k]),
        };
        let name = format!("{}:{}", bs.view, bs.feature);
        let resp = store
            .get_online_features(
                LookupRequest::new([name.clone()]).with_keys(view.join_key.clone(), col),
            )
            .await
            .ok()?;
        let c = resp.column(&name)?;
        if c.statuses.first() != Some(&FeatureStatus::Present) {
            return None;
        }
        match &c.values {
            mesh_feature_store::ColumnValues::F32(v) => v.first().copied(),
            mesh_feature_store::ColumnValues::F64(v) => v.first().map(|x| *x as f32),
            _ => None,
        }
    }

    /// Sends a copy to the shadow version; its answer is recorded, never returned,
    /// and nothing waits for it.
    fn shadow(&self, it: &Item<'_>, model: &str, row: &Arc<Vec<f32>>, role: &'static str) {
        let Some(v) = self.cfg.deployment(model).and_then(|d| d.shadow) else {
            return;
        };
        if role != "primary" || it.pinned.is_some() {
            return;
        }
        let Some(me) = self.self_ref() else { return };
        let (model, row, rid) = (model.to_owned(), row.clone(), it.req.request_id.clone());
        let entities: Vec<(String, String)> = it
            .req
            .entities
            .iter()
            .map(|(k, v)| (k.clone(), entity_str(v)))
            .collect();
        let budget = Duration::from_millis(self.cfg.deadline_ms);
        tokio::spawn(async move {
            let t = Instant::now();
            let res = me.call_model(&model, v, &row, t + budget).await;
            let (score, reasons) = match res {
                Ok(a) => (a.scores.first().copied(), vec![]),
                Err(e) => (None, vec![format!("shadow v{v}: {e}")]),
            };
            let spec = me
                .repo
                .model(&model)
                .ok()
                .and_then(|m| me.spec(&m.config).ok());
            let decision = match (score, spec) {
                (Some(s), Some(spec)) => spec.thresholds.verdict(f64::from(s)),
                _ => me.cfg.default_decision,
            };
            counter!(names::DECISIONS, "model" => model.clone(), "source" => "MODEL", "decision" => decision.as_str(), "role" => "shadow").increment(1);
            if let Some(sink) = &me.sink {
                sink.record(&Outcome {
                    request_id: rid,
                    model,
                    version: Some(v),
                    role: "shadow",
                    score,
                    decision,
                    source: AnswerSource::Model,
                    reasons,
                    features: Vec::new(),
                    entities,
                    timings: Timings {
                        total: us(t.elapsed()),
                        ..Timings::default()
                    },
                });
            }
        });
    }
}

fn entity_str(k: &mesh_proto::mesh::v1::EntityKey) -> String {
    use mesh_proto::mesh::v1::entity_key::Key;
    match &k.key {
        Some(Key::Int64Key(v)) => v.to_string(),
        Some(Key::StringKey(s)) => s.clone(),
        None => String::new(),
    }
}
