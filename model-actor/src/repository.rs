//! The model repository: a directory of `<model>/model.toml` and numeric version
//! directories, and the set of versions being served, changed only by explicit
//! load/unload calls. A version is swapped in only after it loaded and warmed up;
//! requests that already hold a version keep it until they are answered.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::config::{parse_device, ModelConfig, ModelKind};
use crate::error::ModelError;
use crate::handle::VersionHandle;
use crate::mlp::{open_device, Mlp};
use crate::model::{Batch, Model, ModelFactory};
use crate::system::ActorSystem;
use crate::trees::Trees;

/// The served versions of one model (an immutable snapshot, replaced whole).
#[derive(Debug)]
pub struct ServedModel {
    pub config: Arc<ModelConfig>,
    /// Replica 0 of each version (what metadata and statistics describe).
    pub versions: BTreeMap<u64, Arc<VersionHandle>>,
    /// Every replica (actor group) of each version.
    pub replicas: BTreeMap<u64, Vec<Arc<VersionHandle>>>,
    next: std::sync::atomic::AtomicUsize,
}

impl ServedModel {
    fn new(config: Arc<ModelConfig>, replicas: BTreeMap<u64, Vec<Arc<VersionHandle>>>) -> Self {
        let versions = replicas
            .iter()
            .filter_map(|(v, r)| Some((*v, r.first()?.clone())))
            .collect();
        Self {
            config,
            versions,
            replicas,
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The newest ready version.
    pub fn newest(&self) -> Option<&Arc<VersionHandle>> {
        self.versions.values().rev().find(|v| v.is_ready())
    }

    /// A replica of `version` for direct calls that bypass the router's balancer
    /// (OIP): the one with the fewest requests admitted, so that admission by
    /// deadline refuses only when every replica is busy; ties go round-robin.
    pub fn pick(&self, version: u64) -> Option<&Arc<VersionHandle>> {
        let r = self.replicas.get(&version)?;
        if let [only] = r.as_slice() {
            // No choice to make: no shared counter to move (a write every core's
            // cache would pass around, per request).
            return Some(only);
        }
        let n = r.len().max(1);
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (0..n)
            .filter_map(|k| r.get((start + k) % n))
            .min_by_key(|h| h.in_flight())
    }
}

/// Checks a model's configuration before any of its versions is swapped in (the
/// router's decision engine installs one: `[input_spec]` against the feature store).
/// `Err` refuses the load with that message; what was served keeps serving.
pub type ConfigValidator = Arc<dyn Fn(&ModelConfig) -> Result<(), String> + Send + Sync>;

/// State of a version for the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub model: String,
    pub version: u64,
    pub state: &'static str,
    pub reason: String,
}

pub struct ModelRepository {
    root: PathBuf,
    system: ActorSystem,
    models: RwLock<BTreeMap<String, Arc<ServedModel>>>,
    /// Why the last load of a version failed, for the index.
    failures: Mutex<BTreeMap<(String, u64), String>>,
    /// Loads and unloads run one at a time.
    changes: tokio::sync::Mutex<()>,
    /// Called with each model's config before any of its versions is swapped in.
    validator: RwLock<Option<ConfigValidator>>,
}

impl ModelRepository {
    /// Opens the repository directory; loads nothing yet.
    pub fn new(root: impl Into<PathBuf>, system: ActorSystem) -> Result<Self, ModelError> {
        let root = root.into();
        if !root.is_dir() {
            return Err(ModelError::Config {
                path: root,
                msg: "the model repository is not a directory".into(),
            });
        }
        Ok(Self {
            root,
            system,
            models: RwLock::new(BTreeMap::new()),
            failures: Mutex::new(BTreeMap::new()),
            changes: tokio::sync::Mutex::new(()),
            validator: RwLock::new(None),
        })
    }

    /// Installs the check every later `load` runs on a model's config first.
    pub fn set_validator(&self, check: ConfigValidator) {
        *self.validator.write() = Some(check);
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Model directories (those holding a `model.toml`), sorted.
    pub fn model_names(&self) -> Result<Vec<String>, ModelError> {
        let mut names = Vec::new();
        let rd = std::fs::read_dir(&self.root).map_err(|e| ModelError::io(&self.root, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| ModelError::io(&self.root, e))?;
            if entry.path().join("model.toml").is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Loads every model of the repository; fails if any model ends with no ready version.
    pub async fn load_all(&self) -> Result<(), ModelError> {
        for name in self.model_names()? {
            self.load(&name).await?;
        }
        Ok(())
    }

    /// Loads (or reloads) a model: versions its policy selects that are not served
    /// yet are loaded and warmed up, then swapped in; versions it no longer selects
    /// are unloaded. A failed load never unloads a serving version: if any newly
    /// wanted version fails, every version that was served stays served (next to
    /// the ones that loaded) and the first error is returned. Returns the served
    /// versions.
    pub async fn load(&self, name: &str) -> Result<Vec<u64>, ModelError> {
        let _one_at_a_time = self.changes.lock().await;
        let dir = self.model_dir(name)?;
        let config = Arc::new(ModelConfig::load(&dir)?);
        for advice in config.advice() {
            tracing::warn!(model = name, "{advice}");
        }
        let wanted = config.version_policy.select(&versions_on_disk(&dir)?);
        if wanted.is_empty() {
            return Err(ModelError::Config {
                path: dir,
                msg: "no version directory matches the version policy".into(),
            });
        }
        let current = self.models.read().get(name).cloned();
        let check = self.validator.read().clone();
        if let Some(Err(msg)) = check.map(|check| check(&config)) {
            let e = ModelError::Config {
                path: PathBuf::from(name).join("model.toml"),
                msg,
            };
            tracing::error!(model = name, error = %e, "model configuration refused");
            for v in &wanted {
                if !current.as_ref().is_some_and(|m| m.replicas.contains_key(v)) {
                    self.failures
                        .lock()
                        .insert((name.to_owned(), *v), e.to_string());
                }
            }
            return Err(e);
        }
        let mut next = BTreeMap::new();
        let mut errors = Vec::new();
        for v in &wanted {
            if let Some(h) = current.as_ref().and_then(|m| m.replicas.get(v)) {
                next.insert(*v, h.clone());
                continue;
            }
            match self.load_version(config.clone(), &dir, *v).await {
                Ok(h) => {
                    self.failures.lock().remove(&(name.to_owned(), *v));
                    next.insert(*v, h);
                }
                Err(e) => {
                    tracing::error!(model = name, version = v, error = %e, "version failed to load");
                    self.failures
                        .lock()
                        .insert((name.to_owned(), *v), e.to_string());
                    errors.push(e);
                }
            }
        }
        if next.is_empty() {
            // Nothing new works: whatever was served keeps serving.
            return Err(errors.remove(0));
        }
        if !errors.is_empty() {
            // A failed load never unloads a serving version: the policy dropped
            // the older versions to make room for the ones that just failed, so
            // they keep serving (`latest = 2` with v1, v2 served and a broken v3
            // stays v1, v2) until a load in which every wanted version loads.
            if let Some(old) = &current {
                for (v, h) in old.replicas.iter() {
                    if !next.contains_key(v) {
                        tracing::warn!(
                            model = name,
                            version = v,
                            "keeps serving: a newer version failed to load"
                        );
                        next.insert(*v, h.clone());
                    }
                }
            }
        }
        let served: Vec<u64> = next.keys().copied().collect();
        if let Some(old) = &current {
            for v in old.versions.keys().filter(|v| !next.contains_key(v)) {
                tracing::info!(
                    model = name,
                    version = v,
                    "unloading version (requests in flight finish on it)"
                );
            }
        }
        self.models
            .write()
            .insert(name.to_owned(), Arc::new(ServedModel::new(config, next)));
        tracing::info!(model = name, versions = ?served, "model loaded");
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(served),
        }
    }

    /// Stops serving a model. Requests in flight finish on the versions they hold.
    pub async fn unload(&self, name: &str) -> Result<(), ModelError> {
        let _one_at_a_time = self.changes.lock().await;
        match self.models.write().remove(name) {
            Some(_) => {
                tracing::info!(model = name, "model unloaded");
                Ok(())
            }
            None => Err(ModelError::ModelNotFound(name.to_owned())),
        }
    }

    /// The served model called `name`.
    pub fn model(&self, name: &str) -> Result<Arc<ServedModel>, ModelError> {
        self.models
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::ModelNotFound(name.to_owned()))
    }

    /// All served models.
    pub fn models(&self) -> Vec<Arc<ServedModel>> {
        self.models.read().values().cloned().collect()
    }

    /// The version to call: the one asked for, or the newest ready one (a replica
    /// of it, round-robin).
    pub fn get(&self, name: &str, version: Option<u64>) -> Result<Arc<VersionHandle>, ModelError> {
        let m = self.model(name)?;
        let v = match version {
            None => m
                .newest()
                .map(|h| h.version)
                .ok_or_else(|| ModelError::NotReady(name.to_owned()))?,
            Some(v) => v,
        };
        m.pick(v)
            .filter(|h| h.is_ready())
            .cloned()
            .ok_or_else(|| ModelError::VersionNotFound {
                model: name.to_owned(),
                version: v.to_string(),
            })
    }

    /// Every model directory and version: served ones as READY, failed ones as
    /// UNAVAILABLE with the reason, the rest of the repository as UNAVAILABLE.
    pub fn index(&self) -> Vec<IndexEntry> {
        let mut out = Vec::new();
        let models = self.models.read().clone();
        let failures = self.failures.lock().clone();
        for name in self.model_names().unwrap_or_default() {
            let served = models.get(&name);
            let dir = self.root.join(&name);
            for v in versions_on_disk(&dir).unwrap_or_default() {
                let (state, reason) = match served.and_then(|m| m.versions.get(&v)) {
                    Some(h) if h.is_ready() => ("READY", String::new()),
                    Some(_) => ("LOADING", String::new()),
                    None => match failures.get(&(name.clone(), v)) {
                        Some(r) => ("UNAVAILABLE", r.clone()),
                        None => ("UNAVAILABLE", "not loaded".to_owned()),
                    },
                };
                out.push(IndexEntry {
                    model: name.clone(),
                    version: v,
                    state,
                    reason,
                });
            }
        }
        out
    }

    fn model_dir(&self, name: &str) -> Result<PathBuf, ModelError> {
        // Names are directory names: no separators, no parent references.
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(ModelError::ModelNotFound(name.to_owned()));
        }
        let dir = self.root.join(name);
        if !dir.join("model.toml").is_file() {
            return Err(ModelError::ModelNotFound(name.to_owned()));
        }
        Ok(dir)
    }

    /// Loads the weights once and starts `replicas` warmed-up actor groups on them.
    async fn load_version(
        &self,
        config: Arc<ModelConfig>,
        dir: &Path,
        version: u64,
    ) -> Result<Vec<Arc<VersionHandle>>, ModelError> {
        let vdir = dir.join(version.to_string());
        let cfg = config.clone();
        let factory = tokio::task::spawn_blocking(move || build_factory(&cfg, &vdir))
            .await
            .map_err(|e| ModelError::Load {
                model: config.name.clone(),
                version,
                msg: e.to_string(),
            })?
            .map_err(|msg| ModelError::Load {
                model: config.name.clone(),
                version,
                msg,
            })?;
        let mut out = Vec::new();
        for replica in 0..config.batching.replicas.get() {
            let handle = VersionHandle::spawn(
                &self.system,
                config.clone(),
                version,
                replica,
                factory.clone(),
            )?;
            warmup(&handle).await.map_err(|e| ModelError::Load {
                model: config.name.clone(),
                version,
                msg: format!("warmup failed: {e}"),
            })?;
            handle.mark_ready();
            out.push(Arc::new(handle));
        }
        Ok(out)
    }
}

/// Runs the configured warmup batches (zeros) through the whole batching path.
pub async fn warmup(handle: &VersionHandle) -> Result<(), ModelError> {
    let cfg = &handle.config;
    let rows = cfg
        .warmup
        .batch_size
        .clamp(1, cfg.batching.max_batch_size.get());
    let cols = cfg.input().row_width();
    for _ in 0..cfg.warmup.batches {
        let batch = Batch {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        };
        handle
            .infer(batch, Some(Instant::now() + Duration::from_secs(30)))
            .await?;
    }
    Ok(())
}

/// Loads the weights of one version and returns a factory of model instances.
pub fn build_factory(config: &ModelConfig, version_dir: &Path) -> Result<ModelFactory, String> {
    match config.kind {
        ModelKind::Mlp => {
            let mlp_cfg = config
                .mlp
                .as_ref()
                .ok_or("kind = \"mlp\" needs an [mlp] table")?;
            let device = open_device(parse_device(&config.device)?)?;
            let weights = weights_inside(version_dir, &mlp_cfg.weights)?;
            let mlp = Mlp::load(
                &weights,
                mlp_cfg,
                config.dtype,
                &device,
                config.input().row_width(),
                config.output().row_width(),
            )?;
            Ok(Arc::new(move || Box::new(mlp.clone()) as Box<dyn Model>))
        }
        ModelKind::Xgboost | ModelKind::Lightgbm => {
            // One forest per version; runner instances and replicas share it.
            let trees = Trees::load(config, version_dir)?;
            Ok(Arc::new(move || Box::new(trees.clone()) as Box<dyn Model>))
        }
        ModelKind::Onnx => {
            // The file is read once per version; each runner instance gets a session.
            let onnx = crate::onnx::OnnxModel::load(config, version_dir)?;
            Ok(Arc::new(move || {
                Box::new(onnx.instance()) as Box<dyn Model>
            }))
        }
    }
}

/// The weights file of a version: it must resolve (links followed) to a regular
/// file inside the version directory, no larger than
/// [`limits::MAX_WEIGHTS_BYTES`](crate::config::limits::MAX_WEIGHTS_BYTES).
/// Messages name the file relative to the repository, not the host's absolute path.
pub fn weights_inside(version_dir: &Path, name: &str) -> Result<std::path::PathBuf, String> {
    crate::config::check_relative_path("weights", name)?;
    let shown = || {
        let v = version_dir
            .file_name()
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{v}/{name}")
    };
    let dir = version_dir
        .canonicalize()
        .map_err(|e| format!("version directory {}: {e}", shown()))?;
    let file = dir
        .join(name)
        .canonicalize()
        .map_err(|e| format!("weights {}: {}", shown(), e.kind()))?;
    if !file.starts_with(&dir) {
        return Err(format!(
            "weights {} resolve outside the version directory (a link?); refused",
            shown()
        ));
    }
    let meta = std::fs::metadata(&file).map_err(|e| format!("weights {}: {e}", shown()))?;
    let max = crate::config::limits::MAX_WEIGHTS_BYTES;
    if !meta.is_file() || meta.len() > max {
        return Err(format!(
            "weights {} must be a regular file of at most {} GiB",
            shown(),
            max >> 30
        ));
    }
    Ok(file)
}

/// Numeric subdirectories of a model directory.
pub fn versions_on_disk(dir: &Path) -> Result<Vec<u64>, ModelError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))? {
        let entry = entry.map_err(|e| ModelError::io(dir, e))?;
        if entry.path().is_dir() {
            if let Ok(v) = entry.file_name().to_string_lossy().parse::<u64>() {
                out.push(v);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}
