//! Kinds `xgboost` and `lightgbm`: gradient-boosted trees read by `mesh-trees` (XGBoost
//! JSON, LightGBM text) and evaluated natively. One [`Forest`] is loaded per version
//! and shared (behind an `Arc`) by every runner instance of every replica.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_trees::Forest;

use crate::config::{ModelConfig, ModelKind, TreesConfig};
use crate::error::ModelError;
use crate::model::{Batch, Forward, Model};

/// A tree ensemble as a [`Model`]. Cloning shares the forest.
#[derive(Clone)]
pub struct Trees {
    forest: Arc<Forest>,
    input_width: usize,
    output_width: usize,
}

/// The last two parts of `path` (`<version>/<file>`): messages name the file
/// without the host's absolute path.
fn shown(path: &Path) -> String {
    let mut parts: Vec<_> = path.iter().rev().take(2).collect();
    parts.reverse();
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Reads a model file of `kind` (the size is checked before it is read).
pub fn read_forest(kind: ModelKind, path: &Path) -> Result<Forest, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", shown(path)))?
        .len();
    if len > mesh_trees::MAX_MODEL_BYTES as u64 {
        return Err(format!(
            "{} is {len} bytes; a tree model file may have at most {} MiB",
            shown(path),
            mesh_trees::MAX_MODEL_BYTES >> 20
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", shown(path)))?;
    let forest = match kind {
        // XGBoost picks the format by the file name the same way.
        ModelKind::Xgboost if path.extension().is_some_and(|e| e == "ubj") => {
            Forest::from_xgboost_ubjson(&bytes)
        }
        ModelKind::Xgboost => Forest::from_xgboost_json(&bytes),
        ModelKind::Lightgbm => {
            let text = std::str::from_utf8(&bytes).map_err(|e| {
                format!(
                    "{} is not a LightGBM text model (not UTF-8: {e})",
                    shown(path)
                )
            })?;
            Forest::from_lightgbm_text(text)
        }
        ModelKind::Mlp | ModelKind::Onnx => {
            return Err(format!("kind {} is not a tree model", kind.as_str()))
        }
    };
    forest.map_err(|e| format!("{} ({} model): {e}", shown(path), kind.as_str()))
}

/// Checks the forest against what `model.toml` declares: input width, categorical
/// columns, missing values, outputs. Messages name both sides.
pub fn check_against_config(
    forest: &Forest,
    config: &ModelConfig,
    trees: &TreesConfig,
) -> Result<(), String> {
    let width = config.input().row_width();
    if forest.num_features() != width {
        return Err(format!(
            "the model file has {} features, but model.toml declares input '{}' with dims [{width}]",
            forest.num_features(),
            config.input().name
        ));
    }
    if forest.categorical_features() != trees.categorical.as_slice() {
        return Err(format!(
            "the model file's categorical features are columns {:?}, but [trees] categorical = {:?}",
            forest.categorical_features(),
            trees.categorical
        ));
    }
    if trees.missing != crate::config::MissingColumns::None && !forest.handles_missing() {
        return Err(
            "[trees] missing declares columns where NaN is accepted, but the model file does not handle missing values"
                .into(),
        );
    }
    let outputs = config.output().row_width();
    if forest.num_outputs() != outputs {
        return Err(format!(
            "the model file ({}) gives {} value(s) per row, but model.toml declares output '{}' with dims [{outputs}]",
            forest.objective(),
            forest.num_outputs(),
            config.output().name
        ));
    }
    Ok(())
}

impl Trees {
    /// Loads the `[trees] file` of a version directory and checks it against `config`.
    pub fn load(config: &ModelConfig, version_dir: &Path) -> Result<Self, String> {
        let trees = config
            .trees
            .as_ref()
            .ok_or_else(|| format!("kind = \"{}\" needs a [trees] table", config.kind.as_str()))?;
        crate::config::check_relative_path("[trees] file", &trees.file)?;
        let path = crate::repository::weights_inside(version_dir, &trees.file)?;
        let forest = read_forest(config.kind, &path)?;
        check_against_config(&forest, config, trees)?;
        tracing::info!(
            model = %config.name,
            kind = config.kind.as_str(),
            trees = forest.num_trees(),
            features = forest.num_features(),
            objective = forest.objective(),
            "tree model read"
        );
        Ok(Self::new(Arc::new(forest)))
    }

    /// Wraps a loaded forest.
    pub fn new(forest: Arc<Forest>) -> Self {
        Self {
            input_width: forest.num_features(),
            output_width: forest.num_outputs(),
            forest,
        }
    }

    /// The shared forest.
    pub fn forest(&self) -> &Arc<Forest> {
        &self.forest
    }
}

impl Model for Trees {
    fn input_width(&self) -> usize {
        self.input_width
    }

    fn output_width(&self) -> usize {
        self.output_width
    }

    fn forward(&mut self, batch: &Batch) -> Result<Forward, ModelError> {
        batch.check_width(self.input_width)?;
        let t0 = Instant::now();
        let mut data = vec![0.0f32; batch.rows * self.output_width];
        self.forest
            .predict(&batch.data, batch.rows, &mut data)
            .map_err(|e| ModelError::Compute(e.to_string()))?;
        Ok(Forward {
            data,
            cols: self.output_width,
            input: Duration::ZERO,
            infer: t0.elapsed(),
            output: Duration::ZERO,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factory hands every runner instance the same forest (no copy per thread).
    #[test]
    fn runner_instances_share_one_forest() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models/fraud_xgb");
        let cfg = ModelConfig::load(&root).unwrap();
        let trees = Trees::load(&cfg, &root.join("1")).unwrap();
        let forest = trees.forest().clone();
        let a = trees.clone();
        let b = trees.clone();
        assert!(Arc::ptr_eq(a.forest(), b.forest()));
        assert_eq!(Arc::strong_count(&forest), 4);
        assert_eq!((a.input_width(), a.output_width()), (34, 1));
    }
}
