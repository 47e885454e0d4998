//! `model.toml`: what a model is, how it is batched and which versions are served.
//!
//! ```toml
//! kind = "mlp"                 # mlp | xgboost | lightgbm (trees: see below)
//! dtype = "f32"                # f32 | f16 | bf16 (weights and compute; mlp only)
//! device = "cpu"               # cpu | cuda:N (needs the `cuda` feature; trees: cpu)
//! platform = "candle_mlp"      # reported in metadata (default by kind: candle_mlp,
//!                              # xgboost_json, lightgbm_text)
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
//! runner_instances = 2         # SyncArbiter threads that own a copy of the model (default 2 on the CPU, 1 on a GPU)
//! idle_spin_us = 50            # a runner out of work spins (yielding) this long before it sleeps, while requests come that close; 0: never
//! inline_below_us = 0          # a request that finds the queue empty is computed on the caller's thread when a batch of its rows takes at most this long (cpu only); 0: never
//! replicas = 1                 # independent actor groups (batcher + runners) per version (on a GPU they take turns: one answers the most)
//! default_timeout_ms = 1000    # deadline for requests that bring none
//!
//! [version_policy]
//! latest = 1                   # or: all = true, or: specific = [1, 3]
//!
//! [warmup]
//! batches = 2                  # forward passes run before a version is READY
//! batch_size = 8
//! ```
//!
//! Kinds `xgboost` and `lightgbm` (gradient-boosted trees, evaluated natively by
//! `mesh-trees`) take a `[trees]` table instead of `[mlp]`; one FP32 input of dims
//! `[features]` in the model file's feature order, one output of dims `[1]` (or
//! `[classes]`):
//!
//! ```toml
//! kind = "xgboost"
//!
//! [[inputs]]
//! name = "input"
//! datatype = "FP32"
//! dims = [34]                  # must equal the model file's number of features
//!
//! [[outputs]]
//! name = "probability"         # probability; raw value for regression / logitraw
//! datatype = "FP32"
//! dims = [1]                   # must equal the model's outputs (classes for multiclass)
//!
//! [trees]
//! file = "model.json"          # inside each version directory (default: model.json for
//!                              # xgboost, model.txt for lightgbm); an xgboost file
//!                              # named *.ubj is read as UBJSON
//! categorical = [32, 33]       # columns holding integer category codes; must equal the
//!                              # model file's categorical features
//! missing = [4, 9, 20]         # columns where NaN (missing) is accepted; or "any" | "none"
//! ```
//!
//! Kind `onnx` runs an ONNX model with ONNX Runtime (the `ort` crate, the library
//! loaded at run time: `[onnx] runtime_library`, else `ORT_DYLIB_PATH`, else the
//! system's library search path). One FP32 input of dims `[features]` whose name and
//! width must match the model's input, one FP32 output of dims `[1]`:
//!
//! ```toml
//! kind = "onnx"
//!
//! [[inputs]]
//! name = "input"               # the session's input name
//! datatype = "FP32"
//! dims = [32]
//!
//! [[outputs]]
//! name = "probability"
//! datatype = "FP32"
//! dims = [1]
//!
//! [onnx]
//! file = "model.onnx"          # inside each version directory (the default)
//! output = "probabilities"     # which output of the model to serve
//! output_column = 1            # for an output of [N, C] (scikit-learn's probabilities
//!                              # [N, 2]): the column served; leave out for [N] or [N, 1]
//! threads = 1                  # ONNX Runtime intra-op threads per runner instance
//! # runtime_library = "/opt/onnxruntime/lib/libonnxruntime.so"  # else ORT_DYLIB_PATH
//! ```
//!
//! Every request is checked against these: infinity is refused everywhere, NaN outside
//! the `missing` columns (the MLP refuses NaN in every column), and a categorical value
//! that is not an integer code from 0 to 2^24 - 1; the refusal (`INVALID_ARGUMENT`)
//! names the row and column. The width, categorical columns and outputs are checked
//! against the model file when a version loads.
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ModelError;

/// The largest category code a categorical column takes (codes are 0 to this).
pub use mesh_trees::MAX_CATEGORY;

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
    /// `[batching] max_queue_delay_us` (1 s).
    pub const MAX_QUEUE_DELAY_US: u64 = 1_000_000;
    /// `[batching] idle_spin_us` (1 ms).
    pub const MAX_IDLE_SPIN_US: u64 = 1_000;
    /// `[batching] inline_below_us` (1 ms: longer would hold a serving thread
    /// against every other request on it).
    pub const MAX_INLINE_BELOW_US: u64 = 1_000;
    /// `[batching] default_timeout_ms` (1 hour).
    pub const MAX_DEFAULT_TIMEOUT_MS: u64 = 3_600_000;
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
    /// Dense layers from safetensors, run with candle (`[mlp]`).
    Mlp,
    /// Gradient-boosted trees from XGBoost's JSON model format (`[trees]`), evaluated
    /// by `mesh-trees`.
    Xgboost,
    /// Gradient-boosted trees from LightGBM's text model format (`[trees]`), evaluated
    /// by `mesh-trees`.
    Lightgbm,
    /// An ONNX model run by ONNX Runtime (`[onnx]`).
    Onnx,
}

impl ModelKind {
    /// The name used in `model.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mlp => "mlp",
            Self::Xgboost => "xgboost",
            Self::Lightgbm => "lightgbm",
            Self::Onnx => "onnx",
        }
    }

    /// `platform` reported in metadata when `model.toml` names none.
    pub fn default_platform(self) -> &'static str {
        match self {
            Self::Mlp => "candle_mlp",
            Self::Xgboost => "xgboost_json",
            Self::Lightgbm => "lightgbm_text",
            Self::Onnx => "onnxruntime_onnx",
        }
    }

    /// What runs the model, reported as Triton's ModelConfig `backend`.
    pub fn backend(self) -> &'static str {
        match self {
            Self::Mlp => "candle",
            Self::Xgboost | Self::Lightgbm => "mesh_trees",
            Self::Onnx => "onnxruntime",
        }
    }

    /// Whether the kind is a tree ensemble read by `mesh-trees` (`[trees]`).
    pub fn is_trees(self) -> bool {
        matches!(self, Self::Xgboost | Self::Lightgbm)
    }
}

/// `[trees]` of kinds `xgboost` and `lightgbm`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTreesConfig {
    file: Option<String>,
    #[serde(default)]
    categorical: Vec<usize>,
    missing: Option<RawMissing>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "\"any\", \"none\" or a list of column indices")]
enum RawMissing {
    Word(String),
    Columns(Vec<usize>),
}

/// Which input columns may be NaN (missing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MissingColumns {
    /// None: NaN is refused everywhere (the default).
    #[default]
    None,
    /// Every column.
    Any,
    /// These columns (ascending, distinct).
    Columns(Vec<usize>),
}

/// `[trees]`: the model file and what each input column may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreesConfig {
    /// The model file inside each version directory (default `model.json` for
    /// `xgboost`, `model.txt` for `lightgbm`). An `xgboost` file named `*.ubj` is read
    /// as XGBoost's UBJSON, any other as JSON.
    pub file: String,
    /// Input columns holding category codes (ascending, distinct); must equal the
    /// categorical features of the model file.
    pub categorical: Vec<usize>,
    /// Input columns where NaN (missing) is accepted.
    pub missing: MissingColumns,
}

/// What the values of each input column may be, from `model.toml`: checked on every
/// request before it is queued ([`ModelConfig::check_values`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColumnRules {
    /// One entry per input column (bits [`ColumnRules::MISSING`],
    /// [`ColumnRules::CATEGORICAL`]); empty when every column only takes finite
    /// values (the MLP).
    flags: Vec<u8>,
    /// `[trees]` may declare missing columns (refusals say how).
    trees: bool,
}

impl ColumnRules {
    /// NaN is accepted (missing).
    pub const MISSING: u8 = 1;
    /// The value is a category code: an integer from 0 to [`mesh_trees::MAX_CATEGORY`].
    pub const CATEGORICAL: u8 = 2;

    fn new(width: usize, trees: &TreesConfig) -> Self {
        let mut flags = vec![0u8; width];
        match &trees.missing {
            MissingColumns::None => {}
            MissingColumns::Any => flags.iter_mut().for_each(|f| *f |= Self::MISSING),
            MissingColumns::Columns(c) => c.iter().for_each(|&i| flags[i] |= Self::MISSING),
        }
        for &i in &trees.categorical {
            flags[i] |= Self::CATEGORICAL;
        }
        if flags.iter().all(|&f| f == 0) {
            flags.clear();
        }
        Self { flags, trees: true }
    }

    /// The flags of column `c`.
    pub fn column(&self, c: usize) -> u8 {
        self.flags.get(c).copied().unwrap_or(0)
    }

    /// Checks row-major `data` of `cols` values per row: infinity is refused
    /// everywhere, NaN outside the missing columns, and anything but an integer code
    /// from 0 to 2^24 - 1 in a categorical column (NaN there too, unless it is also
    /// a missing column). The refusal names the row and the column.
    pub fn check(&self, data: &[f32], cols: usize) -> Result<(), String> {
        // The common case first: all finite, no categorical column.
        if self.flags.is_empty() {
            return match data.iter().position(|x| !x.is_finite()) {
                None => Ok(()),
                Some(i) => Err(self.refusal(i, cols, data[i], 0)),
            };
        }
        if cols != self.flags.len() {
            return Err(format!(
                "rows of {cols} values, but the model's input has {} columns",
                self.flags.len()
            ));
        }
        for (r, row) in data.chunks_exact(cols).enumerate() {
            for (c, (&x, &f)) in row.iter().zip(&self.flags).enumerate() {
                if !Self::accepts_flags(f, x) {
                    return Err(self.refusal(r * cols + c, cols, x, f));
                }
            }
        }
        Ok(())
    }

    /// Whether column `c` accepts `x` (the rule [`ColumnRules::check`] applies to
    /// every value).
    pub fn accepts(&self, c: usize, x: f32) -> bool {
        Self::accepts_flags(self.column(c), x)
    }

    fn accepts_flags(f: u8, x: f32) -> bool {
        if x.is_nan() {
            f & Self::MISSING != 0
        } else if f & Self::CATEGORICAL != 0 {
            x >= 0.0 && x.fract() == 0.0 && x <= mesh_trees::MAX_CATEGORY as f32
        } else {
            x.is_finite()
        }
    }

    fn refusal(&self, i: usize, cols: usize, x: f32, flags: u8) -> String {
        let (r, c) = (i / cols.max(1), i % cols.max(1));
        if x.is_nan() && !self.trees {
            format!("row {r} column {c} is NaN; this model takes finite values only (NaN or infinite values are refused)")
        } else if x.is_nan() {
            format!(
                "row {r} column {c} is NaN, and column {c} is not declared missing \
                 (NaN is accepted only in the columns [trees] missing names)"
            )
        } else if x.is_infinite() {
            format!("row {r} column {c} is infinite ({x}); NaN or infinite values are refused")
        } else if flags & Self::CATEGORICAL != 0 {
            format!(
                "row {r} column {c} is categorical and must be an integer code from 0 to {}, not {x}",
                mesh_trees::MAX_CATEGORY
            )
        } else {
            format!("row {r} column {c} is {x}; refused")
        }
    }
}

/// `[onnx]` of kind `onnx`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxConfig {
    /// The model file inside each version directory.
    #[serde(default = "default_onnx_file")]
    pub file: String,
    /// The model output served (scikit-learn exports: `label`, `probabilities`).
    pub output: String,
    /// For an output of `[N, C]`: the column served (the fraud column of `[N, 2]`
    /// probabilities). Absent: the output must be `[N]` or `[N, 1]`.
    pub output_column: Option<usize>,
    /// ONNX Runtime intra-op threads per runner instance.
    #[serde(default = "default_onnx_threads")]
    pub threads: NonZeroUsize,
    /// Path of `libonnxruntime.so`; absent: `ORT_DYLIB_PATH`, else the system's
    /// library search path. One library per process: the first one loaded stays.
    pub runtime_library: Option<String>,
}

fn default_onnx_file() -> String {
    "model.onnx".to_owned()
}

fn default_onnx_threads() -> NonZeroUsize {
    NonZeroUsize::MIN
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
    /// How long a runner with nothing to do spins (yielding the CPU between looks)
    /// before it sleeps. Under load the next request usually arrives within it and
    /// is taken without a sleep and a wake-up. A runner spins only while its
    /// smoothed wait for the next request is within this (see `batcher`), so an
    /// idle or lightly loaded model spends nothing on it. 0: never spin.
    pub idle_spin_us: u64,
    /// A request that finds its group's queue empty is computed on the caller's
    /// (async) thread, with an instance of the model kept for it, when the learned
    /// time of a batch of its rows is at most this: no hand-off to a runner thread
    /// and back, which costs a small model more than its forward pass. When the
    /// queue holds anything, or the kept instance is busy, the request queues as
    /// always, so batching under load is untouched (a request computed inline does
    /// not wait `max_queue_delay_us` for company). 0 (the default): never; CPU
    /// models only.
    pub inline_below_us: u64,
}

/// `[batching] idle_spin_us` when model.toml does not set it.
pub const DEFAULT_IDLE_SPIN_US: u64 = 50;

impl Default for BatchingConfig {
    fn default() -> Self {
        Self {
            max_batch_size: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            max_queue_delay_us: 0,
            queue_capacity: NonZeroUsize::new(2048).unwrap_or(NonZeroUsize::MIN),
            runner_instances: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
            replicas: NonZeroUsize::MIN,
            default_timeout_ms: 1000,
            idle_spin_us: DEFAULT_IDLE_SPIN_US,
            inline_below_us: 0,
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
    pub fn idle_spin(&self) -> Duration {
        Duration::from_micros(self.idle_spin_us)
    }
    /// `inline_below_us`, or `None` when it is 0 (off).
    pub fn inline_below(&self) -> Option<Duration> {
        (self.inline_below_us > 0).then(|| Duration::from_micros(self.inline_below_us))
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
    trees: Option<RawTreesConfig>,
    onnx: Option<OnnxConfig>,
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

/// Resolves `[trees]`: the default file name, sorted distinct column lists.
fn trees_config(kind: ModelKind, raw: RawTreesConfig) -> Result<TreesConfig, String> {
    let file = raw.file.unwrap_or_else(|| {
        match kind {
            ModelKind::Lightgbm => "model.txt",
            _ => "model.json",
        }
        .to_owned()
    });
    let distinct = |what: &str, mut v: Vec<usize>| {
        let n = v.len();
        v.sort_unstable();
        v.dedup();
        if v.len() != n {
            return Err(format!("[trees] {what} names a column twice"));
        }
        Ok(v)
    };
    let missing = match raw.missing {
        None => MissingColumns::None,
        Some(RawMissing::Word(w)) if w == "any" => MissingColumns::Any,
        Some(RawMissing::Word(w)) if w == "none" => MissingColumns::None,
        Some(RawMissing::Word(w)) => {
            return Err(format!(
                "[trees] missing = {:?}: expected \"any\", \"none\" or a list of column indices",
                w.chars().take(100).collect::<String>()
            ))
        }
        Some(RawMissing::Columns(c)) => MissingColumns::Columns(distinct("missing", c)?),
    };
    Ok(TreesConfig {
        file,
        categorical: distinct("categorical", raw.categorical)?,
        missing,
    })
}

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
    /// `[trees]` of kinds `xgboost` and `lightgbm`.
    pub trees: Option<TreesConfig>,
    /// `[onnx]` of kind `onnx`.
    pub onnx: Option<OnnxConfig>,
    /// What each input column may hold (from `[trees]`; finite values for the MLP).
    pub columns: ColumnRules,
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
        let mut raw: RawModelConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        // A GPU computes one pass at a time (`crate::device`): a second runner of the
        // group only waits for the first, and holds a second copy of the weights there.
        if raw.device != "cpu" && !sets(text, "batching", "runner_instances") {
            raw.batching.runner_instances = NonZeroUsize::MIN;
        }
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
        let trees = raw.trees.map(|t| trees_config(raw.kind, t)).transpose()?;
        let mut cfg = Self {
            name: raw.name.unwrap_or_else(|| default_name.to_owned()),
            kind: raw.kind,
            dtype: raw.dtype,
            device: raw.device,
            platform: raw
                .platform
                .unwrap_or_else(|| raw.kind.default_platform().to_owned()),
            inputs: raw.inputs,
            outputs: raw.outputs,
            mlp: raw.mlp,
            trees,
            onnx: raw.onnx,
            columns: ColumnRules::default(),
            batching: raw.batching,
            version_policy,
            warmup: raw.warmup,
            extra: raw.extra,
        };
        cfg.validate()?;
        if let Some(t) = &cfg.trees {
            cfg.columns = ColumnRules::new(cfg.input().row_width(), t);
        }
        Ok(cfg)
    }

    /// What in a valid configuration is likely to cost the model: one sentence each,
    /// logged as a warning when the model loads. Now one: more than one runner of a
    /// version on one GPU (several replicas, or several runners of one), whose passes
    /// take turns there (`crate::device`), so each forms smaller batches for no more
    /// compute.
    pub fn advice(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (replicas, runners) = (
            self.batching.replicas.get(),
            self.batching.runner_instances.get(),
        );
        if replicas * runners > 1 && self.device != "cpu" {
            out.push(format!(
                "[batching] replicas = {replicas} and runner_instances = {runners} on {}: \
                 their {} runners take turns at one GPU, so each forms smaller batches for \
                 no more compute (on an H200, four replicas of the example MLP answered \
                 0.56-0.66 of one runner's requests a second, two runners of one replica \
                 0.88-0.97); one replica with one runner answers the most (README, GPUs)",
                self.device,
                replicas * runners
            ));
        }
        out
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("model name is empty".into());
        }
        if self.onnx.is_some() && self.kind != ModelKind::Onnx {
            return Err(format!(
                "[onnx] is for kind onnx, not {}",
                self.kind.as_str()
            ));
        }
        match self.kind {
            ModelKind::Onnx => check_onnx(self)?,
            ModelKind::Mlp => {
                if self.mlp.is_none() {
                    return Err("kind = \"mlp\" needs an [mlp] table".into());
                }
                if self.trees.is_some() {
                    return Err("[trees] is for kinds xgboost and lightgbm, not mlp".into());
                }
                if self.inputs.len() != 1 || self.outputs.len() != 1 {
                    return Err("an mlp model has exactly one input and one output".into());
                }
            }
            ModelKind::Xgboost | ModelKind::Lightgbm => {
                let kind = self.kind.as_str();
                if self.mlp.is_some() {
                    return Err(format!("[mlp] is for kind mlp, not {kind}"));
                }
                if self.trees.is_none() {
                    return Err(format!("kind = \"{kind}\" needs a [trees] table"));
                }
                if self.inputs.len() != 1 || self.outputs.len() != 1 {
                    return Err(format!(
                        "a {kind} model has exactly one input and one output"
                    ));
                }
                if self.inputs[0].dims.len() != 1 || self.outputs[0].dims.len() != 1 {
                    return Err(format!(
                        "a {kind} model's input dims are [features] and its output dims \
                         [1] or [classes] (one dimension each)"
                    ));
                }
                if self.dtype != Precision::F32 {
                    return Err(format!(
                        "dtype applies to kind mlp; a {kind} model computes in its own precision (leave dtype out or f32)"
                    ));
                }
                if self.device != "cpu" {
                    return Err(format!(
                        "a {kind} model runs on the cpu, not '{}'",
                        self.device
                    ));
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
        if self.batching.inline_below_us > 0 && self.device != "cpu" {
            return Err(format!(
                "[batching] inline_below_us computes on the serving threads, so it is for \
                 models on the cpu, not '{}'",
                self.device
            ));
        }
        self.check_sizes()?;
        if let Some(mlp) = &self.mlp {
            check_relative_path("[mlp] weights", &mlp.weights)?;
        }
        if let Some(o) = &self.onnx {
            check_relative_path("[onnx] file", &o.file)?;
        }
        if let Some(t) = &self.trees {
            check_relative_path("[trees] file", &t.file)?;
            let width = self.input().row_width();
            let cols = match &t.missing {
                MissingColumns::Columns(c) => c.as_slice(),
                _ => &[],
            };
            for (what, list) in [("categorical", &t.categorical[..]), ("missing", cols)] {
                if let Some(c) = list.iter().find(|&&c| c >= width) {
                    return Err(format!(
                        "[trees] {what} names column {c}, but the input has {width} columns (0 to {})",
                        width - 1
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks request rows against [`ModelConfig::columns`] (see [`ColumnRules::check`]).
    pub fn check_values(&self, data: &[f32], cols: usize) -> Result<(), String> {
        self.columns.check(data, cols)
    }

    /// Every size within [`limits`].
    fn check_sizes(&self) -> Result<(), String> {
        use limits::*;
        let b = &self.batching;
        fn over<T: PartialOrd + std::fmt::Display>(what: &str, got: T, max: T) -> Option<String> {
            (got > max).then(|| format!("{what} = {got} is over the limit of {max}"))
        }
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
            over(
                "[batching] max_queue_delay_us",
                b.max_queue_delay_us,
                MAX_QUEUE_DELAY_US,
            ),
            over("[batching] idle_spin_us", b.idle_spin_us, MAX_IDLE_SPIN_US),
            over(
                "[batching] inline_below_us",
                b.inline_below_us,
                MAX_INLINE_BELOW_US,
            ),
            over(
                "[batching] default_timeout_ms",
                b.default_timeout_ms,
                MAX_DEFAULT_TIMEOUT_MS,
            ),
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

/// The rules of kind `onnx` (the `[onnx]` table itself is checked against the model
/// file when a version loads).
fn check_onnx(c: &ModelConfig) -> Result<(), String> {
    let Some(o) = &c.onnx else {
        return Err("kind = \"onnx\" needs an [onnx] table (file, output)".into());
    };
    if c.mlp.is_some() || c.trees.is_some() {
        return Err("[mlp] and [trees] are for other kinds, not onnx".into());
    }
    if c.inputs.len() != 1 || c.outputs.len() != 1 {
        return Err("an onnx model has exactly one input and one output".into());
    }
    if c.inputs[0].dims.len() != 1 {
        return Err("an onnx model's input dims are [features] (one dimension)".into());
    }
    if c.outputs[0].dims != [1] {
        return Err(format!(
            "an onnx model's output has dims [1] (one value per row: [onnx] output, \
             and output_column for an output of [N, C]), not {:?}",
            c.outputs[0].dims
        ));
    }
    if c.dtype != Precision::F32 {
        return Err(
            "dtype applies to kind mlp; an onnx model computes in its own precision (leave dtype out or f32)"
                .into(),
        );
    }
    if c.device != "cpu" {
        return Err(format!("an onnx model runs on the cpu, not '{}'", c.device));
    }
    if o.output.is_empty() {
        return Err("[onnx] output is empty".into());
    }
    if o.threads.get() > limits::MAX_RUNNER_INSTANCES {
        return Err(format!(
            "[onnx] threads = {} is over the limit of {}",
            o.threads,
            limits::MAX_RUNNER_INSTANCES
        ));
    }
    Ok(())
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

/// Whether a model.toml sets `key` in `[table]` (rather than leaving the default);
/// only asked of a text that has parsed.
fn sets(text: &str, table: &str, key: &str) -> bool {
    text.parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get(table)?.get(key).map(|_| ()))
        .is_some()
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
            // Typos by orders of magnitude: a lone request would wait for company
            // until its deadline; a request without one would be held for ages.
            (
                "[batching]\nmax_queue_delay_us = 18446744073709551615",
                "max_queue_delay_us",
            ),
            ("[batching]\nidle_spin_us = 1001", "idle_spin_us"),
            ("[batching]\ninline_below_us = 1001", "inline_below_us"),
            (
                "[batching]\ndefault_timeout_ms = 18446744073709551615",
                "default_timeout_ms",
            ),
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

    /// `MIN` on `device` with the `[batching]` lines given.
    fn on_device(device: &str, batching: &str) -> ModelConfig {
        let text = format!("{MIN}\n[batching]\n{batching}\n").replace(
            "kind = \"mlp\"",
            &format!("kind = \"mlp\"\ndevice = \"{device}\""),
        );
        ModelConfig::parse(&text, "m").unwrap()
    }

    #[test]
    fn several_runners_on_one_gpu_are_advised_against() {
        let on = |device: &str, batching: &str| on_device(device, batching).advice();
        let advice = on("cuda:1", "replicas = 2");
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(
            advice[0].contains("replicas = 2 and runner_instances = 1 on cuda:1: their 2 runners"),
            "{advice:?}"
        );
        let advice = on("cuda:1", "runner_instances = 2\nreplicas = 2");
        assert!(advice[0].contains("their 4 runners"), "{advice:?}");
        let advice = on("cuda:0", "runner_instances = 2");
        assert!(
            advice[0].contains("runner_instances = 2 on cuda:0"),
            "{advice:?}"
        );
        assert!(on("cuda:1", "replicas = 1").is_empty());
        assert!(on("cpu", "replicas = 2").is_empty());
        assert!(on("cpu", "").is_empty(), "the CPU's default of 2 runners");
    }

    #[test]
    fn a_gpu_model_has_one_runner_unless_it_asks_for_more() {
        let runners = |device: &str, batching: &str| {
            on_device(device, batching).batching.runner_instances.get()
        };
        assert_eq!(runners("cpu", ""), 2);
        assert_eq!(runners("cuda:0", ""), 1);
        assert_eq!(runners("cuda:0", "max_batch_size = 32"), 1);
        assert_eq!(runners("cuda:0", "runner_instances = 3"), 3);
        assert_eq!(runners("cpu", "runner_instances = 1"), 1);
    }

    #[test]
    fn inline_is_off_by_default_and_cpu_only() {
        let c = ModelConfig::parse(MIN, "m").unwrap();
        assert_eq!(c.batching.inline_below(), None);
        let on = format!("{MIN}\n[batching]\ninline_below_us = 40\n");
        let c = ModelConfig::parse(&on, "m").unwrap();
        assert_eq!(c.batching.inline_below(), Some(Duration::from_micros(40)));
        let gpu = on.replace("kind = \"mlp\"", "kind = \"mlp\"\ndevice = \"cuda:0\"");
        let err = ModelConfig::parse(&gpu, "m").unwrap_err();
        assert!(
            err.contains("inline_below_us") && err.contains("cuda:0"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = ModelConfig::parse(&format!("{MIN}\n[batchign]\nx = 1\n"), "m").unwrap_err();
        assert!(err.contains("batchign"), "{err}");
    }

    const TREES: &str = r#"
        kind = "xgboost"
        [[inputs]]
        name = "input"
        datatype = "FP32"
        dims = [4]
        [[outputs]]
        name = "p"
        datatype = "FP32"
        dims = [1]
        [trees]
        categorical = [3]
        missing = [2, 0]
    "#;

    #[test]
    fn trees_kinds_parse_with_defaults_by_kind() {
        let c = ModelConfig::parse(TREES, "t").unwrap();
        assert_eq!(c.kind, ModelKind::Xgboost);
        assert_eq!(c.platform, "xgboost_json");
        assert_eq!(c.kind.backend(), "mesh_trees");
        let t = c.trees.as_ref().unwrap();
        assert_eq!(t.file, "model.json");
        assert_eq!(t.categorical, vec![3]);
        assert_eq!(t.missing, MissingColumns::Columns(vec![0, 2]));
        assert_eq!(c.columns.column(0), ColumnRules::MISSING);
        assert_eq!(c.columns.column(1), 0);
        assert_eq!(c.columns.column(3), ColumnRules::CATEGORICAL);
        let l = ModelConfig::parse(&TREES.replace("xgboost", "lightgbm"), "t").unwrap();
        assert_eq!(l.trees.unwrap().file, "model.txt");
        assert_eq!(l.platform, "lightgbm_text");
        let any = ModelConfig::parse(&TREES.replace("missing = [2, 0]", "missing = \"any\""), "t")
            .unwrap();
        assert_eq!(any.trees.unwrap().missing, MissingColumns::Any);
        let none = ModelConfig::parse(&TREES.replace("missing = [2, 0]", ""), "t").unwrap();
        assert_eq!(none.trees.unwrap().missing, MissingColumns::None);
        // The MLP keeps its platform and backend.
        let m = ModelConfig::parse(MIN, "m").unwrap();
        assert_eq!(
            (m.platform.as_str(), m.kind.backend()),
            ("candle_mlp", "candle")
        );
    }

    #[test]
    fn trees_config_refusals_are_named() {
        let cases = [
            ("missing = [2, 0]", "missing = [9]", "names column 9"),
            ("categorical = [3]", "categorical = [4]", "names column 4"),
            ("categorical = [3]", "categorical = [3, 3]", "twice"),
            ("missing = [2, 0]", "missing = \"some\"", "\"any\""),
            ("missing = [2, 0]", "missing = [-1]", "\"any\""),
            ("[trees]", "[trees]\nfile = \"../x.json\"", "relative path"),
            ("[trees]", "[trees]\nfiel = \"x.json\"", "fiel"),
            (
                "[trees]",
                "[mlp]\nactivations = []\noutput_activation = \"none\"\n[trees]",
                "[mlp] is for kind mlp",
            ),
            ("dims = [4]", "dims = [2, 2]", "one dimension"),
            (
                "kind = \"xgboost\"",
                "kind = \"xgboost\"\ndtype = \"f16\"",
                "dtype",
            ),
            (
                "kind = \"xgboost\"",
                "kind = \"xgboost\"\ndevice = \"cuda:0\"",
                "cpu",
            ),
        ];
        for (from, to, named) in cases {
            let err = ModelConfig::parse(&TREES.replace(from, to), "t").unwrap_err();
            assert!(err.contains(named), "{to}: {err}");
        }
        let no_table = TREES.split("[trees]").next().unwrap();
        let err = ModelConfig::parse(no_table, "t").unwrap_err();
        assert!(err.contains("needs a [trees] table"), "{err}");
        let err = ModelConfig::parse(&format!("{MIN}\n[trees]\n"), "m").unwrap_err();
        assert!(err.contains("[trees] is for kinds"), "{err}");
    }

    #[test]
    fn column_rules_check_every_value() {
        let c = ModelConfig::parse(TREES, "t").unwrap();
        let nan = f32::NAN;
        c.check_values(&[nan, 1.0, nan, 7.0, 0.5, -3.0, 1.0, 0.0], 4)
            .unwrap();
        let err = |v: &[f32]| c.check_values(v, 4).unwrap_err();
        assert!(err(&[0.0, 0.0, 0.0, 0.0, 0.0, nan, 0.0, 0.0]).contains("row 1 column 1 is NaN"));
        assert!(err(&[f32::INFINITY, 0.0, 0.0, 0.0]).contains("row 0 column 0 is infinite"));
        for bad in [-1.0, 0.5, 1e8, nan] {
            let e = err(&[0.0, 0.0, 0.0, bad]);
            assert!(e.contains("row 0 column 3"), "{bad}: {e}");
        }
        // The MLP: finite values only.
        let m = ModelConfig::parse(MIN, "m").unwrap();
        m.check_values(&[1.0, -2.0, 0.5, 1e30], 4).unwrap();
        let e = m
            .check_values(&[1.0, 2.0, 3.0, 4.0, 0.0, nan, 0.0, 0.0], 4)
            .unwrap_err();
        assert!(e.contains("row 1 column 1 is NaN"), "{e}");
        let e = m
            .check_values(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0], 4)
            .unwrap_err();
        assert!(e.contains("infinite"), "{e}");
    }

    #[test]
    fn unknown_datatype_rejected() {
        let err = ModelConfig::parse(&MIN.replacen("FP32", "FP8", 1), "m").unwrap_err();
        assert!(err.contains("FP8"), "{err}");
    }
}
