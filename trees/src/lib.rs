//! `mesh-trees`: a native evaluator of gradient-boosted tree models.
//!
//! Reads XGBoost's JSON model format and LightGBM's text format into one flat node
//! layout (see `layout.rs`) and evaluates it with each library's exact rules, in plain
//! Rust (no C++, no OpenMP, no `unsafe`).
//!
//! ```no_run
//! # fn main() -> Result<(), mesh_trees::TreeError> {
//! let bytes = std::fs::read("model.json").expect("read");
//! let forest = mesh_trees::Forest::from_xgboost_json(&bytes)?;
//! let rows = vec![0.0f32; 2 * forest.num_features()]; // row-major, NaN = missing
//! let mut out = vec![0.0f32; 2 * forest.num_outputs()];
//! forest.predict(&rows, 2, &mut out)?;
//! # Ok(()) }
//! ```
//!
//! Inputs are `f32`, row-major, in the model file's feature order; NaN means missing;
//! a categorical feature is given as its integer code (the code the model was trained
//! with) in an `f32`. The output is, per row, `num_outputs()` values: the probability
//! for binary classification, the class probabilities for multiclass, the raw value for
//! regression and `binary:logitraw`.

mod error;
mod layout;
mod lightgbm;
mod ubjson;
mod xgboost;

pub use error::{Result, TreeError};

use layout::{
    Layout, Node, ALL_LEFT, CATEGORICAL, FEATURE_MASK, IN_SET_LEFT, LANES, NAN_LEFT, SLOW,
    ZERO_MISSING,
};

/// Largest model file accepted, in bytes.
pub const MAX_MODEL_BYTES: usize = 256 << 20;
/// Most trees a model may have.
pub const MAX_TREES: usize = 1 << 20;
/// Most features a model may declare.
pub const MAX_FEATURES: usize = 1 << 20;
/// Most nodes (splits and leaves) over all trees.
pub const MAX_TOTAL_NODES: usize = 1 << 24;
/// Deepest a tree may be (edges from the root to its deepest leaf).
pub const MAX_DEPTH: usize = 512;
/// Most 32-bit words of categorical bitsets over all trees (16 MiB).
pub const MAX_CATEGORICAL_WORDS: usize = 1 << 22;
/// Largest category code a categorical split may name (XGBoost's own bound is
/// 2^24 - 1; a larger code cannot be represented exactly in an f32 input).
pub const MAX_CATEGORY: u32 = (1 << 24) - 1;
/// Most classes (outputs) of a multiclass model.
pub const MAX_CLASSES: usize = 1 << 12;

/// Which library's format a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// XGBoost JSON (`Booster.save_model("*.json")`).
    XGBoost,
    /// LightGBM text (`Booster.save_model("*.txt")`).
    LightGBM,
}

/// How the sum of leaves (the margin) becomes the output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Transform {
    /// Raw value (regression, `binary:logitraw`).
    Identity,
    /// XGBoost's f32 sigmoid: `1 / (1 + expf(min(-x, 88.7)))`.
    SigmoidF32,
    /// LightGBM's f64 sigmoid: `1 / (1 + exp(-scale * x))`.
    SigmoidF64 { scale: f64 },
    /// XGBoost's softmax (f32 values, f64 sum).
    SoftmaxF32,
    /// LightGBM's softmax (f64).
    SoftmaxF64,
}

/// A loaded tree ensemble, ready to evaluate. Immutable, `Send + Sync`; share it
/// behind an `Arc` between threads.
#[derive(Debug, Clone)]
pub struct Forest {
    layout: Layout,
    format: ModelFormat,
    objective: String,
    num_features: usize,
    feature_names: Vec<String>,
    categorical: Vec<usize>,
    /// Starting margin per output (XGBoost: the base score in margin space, an f32).
    base_margin: Vec<f64>,
    transform: Transform,
    /// Categorical inputs below this are not in any set (XGBoost: x < 0;
    /// LightGBM: x <= -1, because it truncates toward zero before testing `< 0`).
    cat_floor: f32,
    /// LightGBM: inputs with |x| <= kZeroThreshold are read as 0.0 (its predictor drops
    /// them from the row as zeros).
    snap_zero: bool,
}

/// LightGBM's `kZeroThreshold` (`1e-35f` widened to double).
const K_ZERO_THRESHOLD: f32 = 1e-35;

impl Forest {
    /// Loads an XGBoost JSON model (as written by `Booster.save_model` with a `.json`
    /// name). See the crate README for what is supported and what is refused.
    pub fn from_xgboost_json(bytes: &[u8]) -> Result<Forest> {
        xgboost::load(bytes)
    }

    /// Loads an XGBoost UBJSON model (`Booster.save_model` with a `.ubj` name, XGBoost's
    /// default binary format): the same document and the same checks as the JSON format.
    pub fn from_xgboost_ubjson(bytes: &[u8]) -> Result<Forest> {
        xgboost::load_ubjson(bytes)
    }

    /// Loads a LightGBM text model (as written by `Booster.save_model`).
    pub fn from_lightgbm_text(text: &str) -> Result<Forest> {
        lightgbm::load(text)
    }

    /// Number of input features (columns) a row must have.
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// Feature names from the model file, in input order (may be generated names
    /// such as `f0..` when the file has none).
    pub fn feature_names(&self) -> &[String] {
        &self.feature_names
    }

    /// Indices of the categorical features, ascending: declared categorical in the
    /// file, or used by a categorical split.
    pub fn categorical_features(&self) -> &[usize] {
        &self.categorical
    }

    /// Whether NaN inputs are accepted as "missing". Always true for the formats
    /// supported: every split of an XGBoost tree has a learned default direction, and
    /// LightGBM defines where NaN goes at every split (its default direction for
    /// missing type NaN or zero; for missing type none, NaN is read as 0.0, exactly as
    /// LightGBM does). The evaluator reproduces the library in each case.
    pub fn handles_missing(&self) -> bool {
        true
    }

    /// Values per row in the output: 1, or the number of classes.
    pub fn num_outputs(&self) -> usize {
        self.layout.num_outputs
    }

    /// Number of trees in the model.
    pub fn num_trees(&self) -> usize {
        self.layout.num_trees
    }

    /// The model's objective as named in the file (e.g. `binary:logistic`, `binary`).
    pub fn objective(&self) -> &str {
        &self.objective
    }

    /// Which format the model was read from.
    pub fn format(&self) -> ModelFormat {
        self.format
    }

    /// Evaluates `n_rows` rows. `rows` is row-major, `n_rows * num_features()` values
    /// (NaN = missing, categorical codes as integers in f32); `out` receives
    /// `n_rows * num_outputs()` values. Errors only on mismatched sizes.
    pub fn predict(&self, rows: &[f32], n_rows: usize, out: &mut [f32]) -> Result<()> {
        let f = self.num_features;
        let k = self.num_outputs();
        let want_in = n_rows.checked_mul(f);
        let want_out = n_rows.checked_mul(k);
        if want_in != Some(rows.len()) {
            return Err(TreeError::Shape(format!(
                "{n_rows} rows of {f} features need {} input values, got {}",
                n_rows.saturating_mul(f),
                rows.len()
            )));
        }
        if want_out != Some(out.len()) {
            return Err(TreeError::Shape(format!(
                "{n_rows} rows of {k} outputs need {} output values, got {}",
                n_rows.saturating_mul(k),
                out.len()
            )));
        }
        if n_rows == 0 {
            return Ok(());
        }
        match (self.format, self.layout.has_slow_nodes) {
            (ModelFormat::XGBoost, true) => self.predict_rows::<f32, true>(rows, out),
            (ModelFormat::XGBoost, false) => self.predict_rows::<f32, false>(rows, out),
            (ModelFormat::LightGBM, true) => self.predict_rows::<f64, true>(rows, out),
            (ModelFormat::LightGBM, false) => self.predict_rows::<f64, false>(rows, out),
        }
        Ok(())
    }

    fn predict_rows<A: Accum, const SLOW_NODES: bool>(&self, rows: &[f32], out: &mut [f32]) {
        let f = self.num_features;
        let k = self.num_outputs();
        let mut scratch = if self.snap_zero {
            vec![0.0f32; f]
        } else {
            Vec::new()
        };
        let mut margins = vec![A::ZERO; k];
        for (row, out_row) in rows.chunks_exact(f).zip(out.chunks_exact_mut(k)) {
            let row = if self.snap_zero {
                for (s, &x) in scratch.iter_mut().zip(row) {
                    *s = if x.abs() <= K_ZERO_THRESHOLD { 0.0 } else { x };
                }
                &scratch[..]
            } else {
                row
            };
            for (m, &b) in margins.iter_mut().zip(&self.base_margin) {
                *m = A::from_f64(b);
            }
            if k == 1 {
                margins[0] = self.sum_single::<A, SLOW_NODES>(row, margins[0]);
            } else {
                self.sum_multi::<A, SLOW_NODES>(row, &mut margins);
            }
            self.finish(&margins, out_row);
        }
    }

    /// Sum of leaves of a single-output model, in tree order.
    #[inline]
    fn sum_single<A: Accum, const SLOW_NODES: bool>(&self, row: &[f32], mut acc: A) -> A {
        let values = &self.layout.values[..];
        for g in 0..self.layout.group_steps.len() {
            let leaves = self.walk_group::<SLOW_NODES>(row, g);
            for leaf in leaves {
                acc = acc.add(values[leaf as usize]);
            }
        }
        acc
    }

    fn sum_multi<A: Accum, const SLOW_NODES: bool>(&self, row: &[f32], margins: &mut [A]) {
        let values = &self.layout.values[..];
        let outputs = &self.layout.outputs[..];
        for g in 0..self.layout.group_steps.len() {
            let leaves = self.walk_group::<SLOW_NODES>(row, g);
            for (lane, leaf) in leaves.into_iter().enumerate() {
                let o = outputs[g * LANES + lane] as usize;
                margins[o] = margins[o].add(values[leaf as usize]);
            }
        }
    }

    /// Walks the `LANES` trees of group `g` in lock step; returns their leaf slots.
    #[inline(always)]
    fn walk_group<const SLOW_NODES: bool>(&self, row: &[f32], g: usize) -> [u32; LANES] {
        let nodes = &self.layout.nodes[..];
        let mut idx = [0u32; LANES];
        idx.copy_from_slice(&self.layout.roots[g * LANES..(g + 1) * LANES]);
        for _ in 0..self.layout.group_steps[g] {
            for i in idx.iter_mut() {
                let n = nodes[*i as usize];
                let x = row[(n.feat & FEATURE_MASK) as usize];
                let go_left = if SLOW_NODES && n.feat & SLOW != 0 {
                    self.slow_go_left(n, x)
                } else {
                    // NaN fails `<`, so it goes right unless the node sends it left.
                    (x < n.thr) | (x.is_nan() & (n.feat & NAN_LEFT != 0))
                };
                *i = n.left + u32::from(!go_left);
            }
        }
        idx
    }

    /// Categorical splits and LightGBM "missing type zero" splits.
    #[inline(never)]
    fn slow_go_left(&self, n: Node, x: f32) -> bool {
        let nan_left = n.feat & NAN_LEFT != 0;
        if x.is_nan() {
            return nan_left;
        }
        if n.feat & CATEGORICAL != 0 {
            let in_set = if x >= self.cat_floor {
                // Truncates toward zero and saturates, like the libraries' int cast for
                // every value that can reach here (-1 < x < 2^24 matter).
                let code = x as u32;
                let (start, len) = self.layout.cat_sets[n.thr.to_bits() as usize];
                let word = (code / 32) as usize;
                word < len as usize
                    && (self.layout.cat_words[start as usize + word] >> (code % 32)) & 1 == 1
            } else {
                false
            };
            in_set == (n.feat & IN_SET_LEFT != 0)
        } else if n.feat & ZERO_MISSING != 0 && x == 0.0 {
            nan_left
        } else if n.feat & ALL_LEFT != 0 {
            true
        } else {
            x < n.thr
        }
    }

    fn finish<A: Accum>(&self, margins: &[A], out: &mut [f32]) {
        match self.transform {
            Transform::Identity => {
                for (o, m) in out.iter_mut().zip(margins) {
                    *o = m.to_f64() as f32;
                }
            }
            Transform::SigmoidF32 => {
                for (o, m) in out.iter_mut().zip(margins) {
                    *o = sigmoid_f32(m.to_f64() as f32);
                }
            }
            Transform::SigmoidF64 { scale } => {
                for (o, m) in out.iter_mut().zip(margins) {
                    *o = (1.0 / (1.0 + (-scale * m.to_f64()).exp())) as f32;
                }
            }
            Transform::SoftmaxF32 => {
                // XGBoost's common::Softmax: f32 values, f64 sum, f32 division.
                let wmax = margins
                    .iter()
                    .map(|m| m.to_f64() as f32)
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut wsum = 0.0f64;
                for (o, m) in out.iter_mut().zip(margins) {
                    *o = (m.to_f64() as f32 - wmax).exp();
                    wsum += f64::from(*o);
                }
                for o in out.iter_mut() {
                    *o /= wsum as f32;
                }
            }
            Transform::SoftmaxF64 => {
                // LightGBM's Common::Softmax, in f64.
                let wmax = margins
                    .iter()
                    .map(|m| m.to_f64())
                    .fold(f64::NEG_INFINITY, f64::max);
                let mut wsum = 0.0f64;
                for m in margins {
                    wsum += (m.to_f64() - wmax).exp();
                }
                for (o, m) in out.iter_mut().zip(margins) {
                    *o = ((m.to_f64() - wmax).exp() / wsum) as f32;
                }
            }
        }
    }
}

/// XGBoost's `common::Sigmoid(float)`.
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    let x = (-x).min(88.7);
    1.0 / (x.exp() + 1.0)
}

/// The accumulator of leaf values: f32 for XGBoost (it sums in float, tree by tree),
/// f64 for LightGBM (it sums in double).
trait Accum: Copy {
    const ZERO: Self;
    fn from_f64(v: f64) -> Self;
    fn add(self, v: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Accum for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn add(self, v: f64) -> Self {
        self + v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Accum for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn add(self, v: f64) -> Self {
        self + v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

/// Refuses a model larger than [`MAX_MODEL_BYTES`].
pub(crate) fn check_size(format: &'static str, len: usize) -> Result<()> {
    if len > MAX_MODEL_BYTES {
        return Err(TreeError::Limit {
            format,
            what: "model size in bytes",
            value: len as u64,
            limit: MAX_MODEL_BYTES as u64,
        });
    }
    Ok(())
}

/// Collects categorical features: declared ones plus any used by a categorical split.
pub(crate) fn categorical_features(declared: &[usize], trees: &[layout::RawTree]) -> Vec<usize> {
    let mut out: Vec<usize> = declared.to_vec();
    for t in trees {
        for n in &t.nodes {
            if let layout::RawNode::Split {
                feature,
                split: layout::Split::Categorical { .. },
                ..
            } = n
            {
                out.push(*feature);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
