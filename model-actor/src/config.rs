//! `model.toml`: what a model is, how it is batched and which versions are served.
//!
//! ```toml
//! kind = "mlp"                 # the only kind so far
//! dtype = "f32"                # f32 | f16 | bf16 (weights and compute)
//! device = "cpu"               # cpu | cuda:N (needs the `cuda` feature)
//! platform = "candle_mlp"      # reported in metadata
//!
//! [[inputs]]
//! name = "input"
//! datatype = "FP32"            # what requests must send: FP32 | FP64 | INT32 | INT64
//! dims = [32]                  # without the batch dimension
//!
//! [[outputs]]
//! name = "probability"
//! datatype = "FP32"
//! dims = [1]
//!
//! [mlp]
//! weights = "model.safetensors"      # inside each numeric version directory
//! activations = ["relu", "relu"]     # one per hidden layer: relu | gelu | tanh | none
//! output_activation = "sigmoid"      # sigmoid | softmax | none
//!
//! [batching]
//! max_batch_size = 64          # rows per forward pass; also the most rows one request may send
//! max_queue_delay_us = 200     # wait at most this long (from the oldest request) to fill a batch
//! queue_capacity = 2048        # requests admitted (waiting or running) before RESOURCE_EXHAUSTED
//! runner_instances = 2         # SyncArbiter threads that own a copy of the model
//! replicas = 1                 # independent actor groups (batcher + runners) per version
//! default_timeout_ms = 1000    # deadline for requests that bring none
//!
//! [version_policy]
//! latest = 1                   # or: all = true, or: specific = [1, 3]
//!
//! [warmup]
//! batches = 2                  # forward passes run before a version is READY
//! batch_size = 8
//! ```
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ModelError;

/// Upper bounds on the sizes a `model.toml` may ask for, checked when it is parsed,
/// so that a bad file (a typo, or a hostile one) is refused with a message instead
/// of making a load allocate without limit. Each is far above what a fraud model
/// needs.
pub mod limits {
    /// `[batching] max_batch_size` (and `[warmup] batch_size`, which may not exceed it).
    pub const MAX_BATCH_SIZE: usize = 4096;
    /// `[batching] queue_capacity`.
    pub const MAX_QUEUE_CAPACITY: usize = 1 << 16;
    /// `[batching] runner_instances`.
    pub const MAX_RUNNER_INSTANCES: usize = 64;
    /// `[batching] replicas`.
    pub const MAX_REPLICAS: usize = 16;
    /// `[warmup] batches`.
    pub const MAX_WARMUP_BATCHES: usize = 100;
    /// Elements in one row of any input or output (product of `dims`).
    pub const MAX_ROW_ELEMENTS: usize = 1 << 20;
    /// Bytes of one full batch of input (`max_batch_size` x row x 8 bytes).
    pub const MAX_BATCH_BYTES: usize = 256 << 20;
    /// Versions a `specific` policy or `latest = N` may name.
    pub const MAX_VERSIONS: usize = 64;
    /// Size of one weights file.
    pub const MAX_WEIGHTS_BYTES: u64 = 4 << 30;
}

/// Element types a request may carry and a model may declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum DataType {
    #[serde(rename = "FP32")]
    Fp32,
    #[serde(rename = "FP64")]
    Fp64,
    #[serde(rename = "INT32")]
    Int32,
    #[serde(rename = "INT64")]
    Int64,
}

impl DataType {
    /// The Open Inference Protocol name (`"FP32"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp32 => "FP32",
            Self::Fp64 => "FP64",
            Self::Int32 => "INT32",
            Self::Int64 => "INT64",
        }
    }

    /// Parses an Open Inference Protocol datatype name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "FP32" => Self::Fp32,
            "FP64" => Self::Fp64,
            "INT32" => Self::Int32,
            "INT64" => Self::Int64,
            _ => return None,
        })
    }

    /// Bytes per element in `raw_input_contents`.
    pub fn size(self) -> usize {
        match self {
            Self::Fp32 | Self::Int32 => 4,
            Self::Fp64 | Self::Int64 => 8,
        }
    }
}

/// Storage and compute precision of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    F16,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Gelu,
    Tanh,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputActivation {
    Sigmoid,
    Softmax,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Mlp,
}

/// One input or output tensor of a model; `dims` excludes the batch dimension.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    pub dims: Vec<usize>,
}

impl TensorSpec {
    /// Elements per row (product of `dims`).
    pub fn row_width(&self) -> usize {
        self.dims.iter().product()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpConfig {
    #[serde(default = "default_weights")]
    pub weights: String,
    pub activations: Vec<Activation>,
    pub output_activation: OutputActivation,
}

fn default_weights() -> String {
    "model.safetensors".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchingConfig {
    pub max_batch_size: NonZeroUsize,
    pub max_queue_delay_us: u64,
    pub queue_capacity: NonZeroUsize,
    pub runner_instances: NonZeroUsize,
    /// Independent actor groups (batcher + runners) per version; the router
    /// balances over them and trips a breaker per group.
    pub replicas: NonZeroUsize,
    pub default_timeout_ms: u64,
}

impl Default for BatchingConfig {
    fn default() -> Self {
        Self {
            max_batch_size: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            max_queue_delay_us: 0,
            queue_capacity: NonZeroUsize::new(2048).unwrap_or(NonZeroUsize::MIN),
            runner_instances: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
            replicas: NonZeroUsize::MIN,
            default_timeout_ms: 1000,
        }
    }
}

impl BatchingConfig {
    pub fn max_queue_delay(&self) -> Duration {
        Duration::from_micros(self.max_queue_delay_us)
    }
    pub fn default_timeout(&self) -> Duration {
        Duration::from_millis(self.default_timeout_ms)
    }
}

/// Which version directories are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The newest N numeric version directories.
    Latest(NonZeroUsize),
    All,
    Specific(Vec<u64>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        Self::Latest(NonZeroUsize::MIN)
    }
}

impl VersionPolicy {
    /// The versions to serve out of those present on disk (any order in, ascending out).
    pub fn select(&self, on_disk: &[u64]) -> Vec<u64> {
        let mut v: Vec<u64> = on_disk.to_vec();
        v.sort_unstable();
        v.dedup();
        match self {
            Self::Latest(n) => v.split_off(v.len().saturating_sub(n.get())),
            Self::All => v,
            Self::Specific(wanted) => v.into_iter().filter(|x| wanted.contains(x)).collect(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawVersionPolicy {
    latest: Option<usize>,
    all: Option<bool>,
    specific: Option<Vec<u64>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WarmupConfig {
    pub batches: usize,
    pub batch_size: usize,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        Self {
            batches: 1,
            batch_size: 1,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct RawModelConfig {
    name: Option<String>,
    kind: ModelKind,
    #[serde(default)]
    dtype: Precision,
    #[serde(default = "default_device")]
    device: String,
    platform: Option<String>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    mlp: Option<MlpConfig>,
    #[serde(default)]
    batching: BatchingConfig,
    #[serde(default)]
    version_policy: RawVersionPolicy,
    #[serde(default)]
    warmup: WarmupConfig,
    /// Tables other layers read (see [`EXTRA_TABLES`]).
    #[serde(flatten)]
    extra: toml::Table,
}

/// Top-level tables of `model.toml` that belong to other layers: the router's input
/// spec (feature order, defaults, transforms) and its decision thresholds.
pub const EXTRA_TABLES: &[&str] = &["input_spec", "decision"];

fn default_device() -> String {
    "cpu".to_owned()
}

/// A validated `model.toml`.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub kind: ModelKind,
    pub dtype: Precision,
    pub device: String,
    pub platform: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub mlp: Option<MlpConfig>,
    pub batching: BatchingConfig,
    pub version_policy: VersionPolicy,
    pub warmup: WarmupConfig,
    /// Tables of `model.toml` this crate does not interpret, for other layers.
    pub extra: toml::Table,
}

impl ModelConfig {
    /// Reads and validates `<dir>/model.toml`; the model is named after `dir`
    /// unless the file says otherwise.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("model.toml");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let default_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self::parse(&text, &default_name).map_err(|msg| ModelError::Config { path, msg })
    }

    /// Parses `model.toml` text; errors are messages that name the offending field.
    pub fn parse(text: &str, default_name: &str) -> Result<Self, String> {
        let raw: RawModelConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        if let Some(k) = raw
            .extra
            .keys()
            .find(|k| !EXTRA_TABLES.contains(&k.as_str()))
        {
            return Err(format!(
                "unknown key '{k}' (known tables besides the model's own: {EXTRA_TABLES:?})"
            ));
        }
        let version_policy = match (
            raw.version_policy.latest,
            raw.version_policy.all,
            raw.version_policy.specific,
        ) {
            (None, None | Some(false), None) => VersionPolicy::default(),
            (Some(n), None, None) => VersionPolicy::Latest(
                NonZeroUsize::new(n).ok_or("version_policy.latest must be at least 1")?,
            ),
            (None, Some(true), None) => VersionPolicy::All,
            (None, None, Some(v)) if !v.is_empty() => VersionPolicy::Specific(v),
            (None, None, Some(_)) => {
                return Err("version_policy.specific must list at least one version".into())
            }
            _ => return Err("version_policy takes exactly one of latest, all, specific".into()),
        };
        let cfg = Self {
            name: raw.name.unwrap_or_else(|| default_name.to_owned()),
            kind: raw.kind,
            dtype: raw.dtype,
            device: raw.device,
            platform: raw.platform.unwrap_or_else(|| "candle_mlp".to_owned()),
            inputs: raw.inputs,
            outputs: raw.outputs,
            mlp: raw.mlp,
            batching: raw.batching,
            version_policy,
            warmup: raw.warmup,
            extra: raw.extra,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("model name is empty".into());
        }
        match self.kind {
            ModelKind::Mlp => {
                if self.mlp.is_none() {
                    return Err("kind = \"mlp\" needs an [mlp] table".into());
                }
                if self.inputs.len() != 1 || self.outputs.len() != 1 {
                    return Err("an mlp model has exactly one input and one output".into());
                }
            }
        }
        for t in self.inputs.iter().chain(&self.outputs) {
            if t.dims.is_empty() || t.dims.contains(&0) {
                return Err(format!(
                    "tensor '{}': dims must be non-empty and positive",
                    t.name
                ));
            }
        }
        if self.outputs.iter().any(|o| o.datatype != DataType::Fp32) {
            return Err("outputs are FP32".into());
        }
        parse_device(&self.device)?;
        self.check_sizes()?;
        if let Some(mlp) = &self.mlp {
            check_relative_path("[mlp] weights", &mlp.weights)?;
        }
        Ok(())
    }

    /// Every size within [`limits`].
    fn check_sizes(&self) -> Result<(), String> {
        use limits::*;
        let b = &self.batching;
        let over = |what: &str, got: usize, max: usize| {
            (got > max).then(|| format!("{what} = {got} is over the limit of {max}"))
        };
        let checks = [
            over(
                "[batching] max_batch_size",
                b.max_batch_size.get(),
                MAX_BATCH_SIZE,
            ),
            over(
                "[batching] queue_capacity",
                b.queue_capacity.get(),
                MAX_QUEUE_CAPACITY,
            ),
            over(
                "[batching] runner_instances",
                b.runner_instances.get(),
                MAX_RUNNER_INSTANCES,
            ),
            over("[batching] replicas", b.replicas.get(), MAX_REPLICAS),
            over("[warmup] batches", self.warmup.batches, MAX_WARMUP_BATCHES),
            over(
                "[warmup] batch_size",
                self.warmup.batch_size,
                b.max_batch_size.get(),
            ),
        ];
        if let Some(e) = checks.into_iter().flatten().next() {
            return Err(e);
        }
        match &self.version_policy {
            VersionPolicy::Latest(n) if n.get() > MAX_VERSIONS => {
                return Err(format!(
                    "version_policy.latest = {n} is over the limit of {MAX_VERSIONS}"
                ))
            }
            VersionPolicy::Specific(v) if v.len() > MAX_VERSIONS => {
                return Err(format!(
                    "version_policy.specific names {} versions; the limit is {MAX_VERSIONS}",
                    v.len()
                ))
            }
            _ => {}
        }
        for t in self.inputs.iter().chain(&self.outputs) {
            let row = t
                .dims
                .iter()
                .try_fold(1usize, |a, d| a.checked_mul(*d))
                .filter(|r| *r <= MAX_ROW_ELEMENTS)
                .ok_or_else(|| {
                    format!(
                        "tensor '{}': dims {:?} make more than {MAX_ROW_ELEMENTS} elements per row",
                        t.name, t.dims
                    )
                })?;
            if row.saturating_mul(b.max_batch_size.get()).saturating_mul(8) > MAX_BATCH_BYTES {
                return Err(format!(
                    "tensor '{}': a batch of max_batch_size = {} rows of {row} elements is over {} MiB",
                    t.name,
                    b.max_batch_size,
                    MAX_BATCH_BYTES >> 20
                ));
            }
        }
        Ok(())
    }

    /// The one input of single-input kinds (all kinds so far).
    pub fn input(&self) -> &TensorSpec {
        &self.inputs[0]
    }

    /// The one output of single-output kinds.
    pub fn output(&self) -> &TensorSpec {
        &self.outputs[0]
    }
}

/// A path in model.toml that must stay inside the version directory: relative,
/// without `..`, not empty.
pub fn check_relative_path(what: &str, p: &str) -> Result<(), String> {
    use std::path::Component;
    let path = Path::new(p);
    if p.is_empty()
        || !path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{what} = {:?} must be a relative path inside the version directory (no '..', not absolute)",
            p.chars().take(200).collect::<String>()
        ));
    }
    Ok(())
}

/// Where a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

/// Parses `cpu` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    match s {
        "cpu" => Ok(DeviceSpec::Cpu),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(DeviceSpec::Cuda(n)),
            _ => Err(format!("device '{s}' is neither 'cpu' nor 'cuda:N'")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
        kind = "mlp"
        [[inputs]]
        name = "input"
        datatype = "FP32"
        dims = [4]
        [[outputs]]
        name = "p"
        datatype = "FP32"
        dims = [1]
        [mlp]
        activations = ["relu"]
        output_activation = "sigmoid"
    "#;

    #[test]
    fn defaults_apply() {
        let c = ModelConfig::parse(MIN, "m").unwrap();
        assert_eq!(c.name, "m");
        assert_eq!(c.version_policy, VersionPolicy::Latest(NonZeroUsize::MIN));
        assert_eq!(c.device, "cpu");
        assert_eq!(c.input().row_width(), 4);
    }

    #[test]
    fn version_policy_selects() {
        let on_disk = [3, 1, 2, 10];
        assert_eq!(
            VersionPolicy::Latest(NonZeroUsize::new(2).unwrap()).select(&on_disk),
            vec![3, 10]
        );
        assert_eq!(VersionPolicy::All.select(&on_disk), vec![1, 2, 3, 10]);
        assert_eq!(
            VersionPolicy::Specific(vec![2, 7]).select(&on_disk),
            vec![2]
        );
    }

    #[test]
    fn policy_conflict_is_named() {
        let text = format!("{MIN}\n[version_policy]\nlatest = 1\nall = true\n");
        let err = ModelConfig::parse(&text, "m").unwrap_err();
        assert!(err.contains("exactly one"), "{err}");
    }

    #[test]
    fn every_size_has_an_upper_bound_named_in_the_refusal() {
        let cases = [
            (
                "[batching]\nmax_batch_size = 1000000000000",
                "max_batch_size",
            ),
            ("[batching]\nqueue_capacity = 10000000", "queue_capacity"),
            ("[batching]\nrunner_instances = 1000", "runner_instances"),
            ("[batching]\nreplicas = 1000", "replicas"),
            ("[warmup]\nbatches = 1000000", "[warmup] batches"),
            // The issue's case: warmup of 10^12 rows used to allocate terabytes.
            (
                "[batching]\nmax_batch_size = 64\n[warmup]\nbatch_size = 1000000000000",
                "[warmup] batch_size",
            ),
            ("[version_policy]\nlatest = 100000", "latest"),
        ];
        for (extra, named) in cases {
            let err = ModelConfig::parse(&format!("{MIN}\n{extra}\n"), "m").unwrap_err();
            assert!(err.contains(named), "{extra}: {err}");
        }
        // Huge dims: overflow of the row width and a batch over the byte bound.
        let wide = MIN.replace("dims = [4]", "dims = [4294967296, 4294967296, 4294967296]");
        let err = ModelConfig::parse(&wide, "m").unwrap_err();
        assert!(err.contains("elements per row"), "{err}");
        let big = MIN.replace("dims = [4]", "dims = [1000000]");
        let err = ModelConfig::parse(&format!("{big}\n[batching]\nmax_batch_size = 4096\n"), "m")
            .unwrap_err();
        assert!(err.contains("MiB"), "{err}");
        // At the limits, fine.
        let ok = format!(
            "{MIN}\n[batching]\nmax_batch_size = {}\n[warmup]\nbatch_size = {}\n",
            limits::MAX_BATCH_SIZE,
            limits::MAX_BATCH_SIZE
        );
        ModelConfig::parse(&ok, "m").unwrap();
    }

    #[test]
    fn weights_must_stay_in_the_version_directory() {
        for bad in ["../../etc/passwd", "/etc/passwd", "", "a/../../b"] {
            let text = MIN.replace("[mlp]", &format!("[mlp]\nweights = {bad:?}"));
            let err = ModelConfig::parse(&text, "m").unwrap_err();
            assert!(
                err.contains("relative path inside the version directory"),
                "{bad}: {err}"
            );
        }
        let text = MIN.replace("[mlp]", "[mlp]\nweights = \"sub/model.safetensors\"");
        ModelConfig::parse(&text, "m").unwrap();
    }

    #[test]
    fn bad_device_is_named() {
        let text = MIN.replace("kind = \"mlp\"", "kind = \"mlp\"\ndevice = \"tpu\"");
        let err = ModelConfig::parse(&text, "m").unwrap_err();
        assert!(err.contains("tpu"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = ModelConfig::parse(&format!("{MIN}\n[batchign]\nx = 1\n"), "m").unwrap_err();
        assert!(err.contains("batchign"), "{err}");
    }

    #[test]
    fn unknown_datatype_rejected() {
        let err = ModelConfig::parse(&MIN.replacen("FP32", "FP8", 1), "m").unwrap_err();
        assert!(err.contains("FP8"), "{err}");
    }
}
