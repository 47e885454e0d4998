//! XGBoost JSON model loader (`Booster.save_model("*.json")`).
//!
//! Rules, as in XGBoost's `predict_fn.h` and `common/categorical.h`:
//! - numeric split: left iff `x < split_condition` (f32); NaN goes to the default child
//!   (`default_left`);
//! - categorical split (`split_type` 1): NaN goes to the default child; a category in
//!   the node's set goes right; anything else (unseen, negative, >= 2^24) goes left;
//!   the code is the input truncated toward zero;
//! - a node is a leaf iff its left child is -1; its value is `split_conditions[i]`;
//! - the prediction is `base_margin + sum of leaves`, summed in f32 tree by tree, then
//!   the objective's transform. `base_score` is stored in probability space; the
//!   logistic objectives turn it into a margin with `logit` (after clamping to
//!   [1e-6, 1 - 1e-6]); `binary:logitraw`, `reg:squarederror` and `multi:softprob` use
//!   it as is (checked against XGBoost 2.0 to 3.2 sources and against 3.2 itself).
//!
//! XGBoost's own predictor takes the right child as `left + 1`; a file where that does
//! not hold is refused rather than evaluated differently from XGBoost.

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Result, TreeError};
use crate::layout::{Layout, RawNode, RawTree, Split};
use crate::{
    Forest, ModelFormat, Transform, MAX_CATEGORICAL_WORDS, MAX_CATEGORY, MAX_CLASSES, MAX_FEATURES,
    MAX_TREES,
};

const FORMAT: &str = "XGBoost JSON";

/// XGBoost versions (major, minor) whose JSON this loader was tested against.
pub(crate) const TESTED_VERSIONS: &[(u64, u64)] = &[(3, 2)];

#[derive(Deserialize)]
struct Document {
    version: Vec<u64>,
    learner: Learner,
}

#[derive(Deserialize)]
struct Learner {
    #[serde(default)]
    feature_names: Vec<String>,
    #[serde(default)]
    feature_types: Vec<String>,
    gradient_booster: GradientBooster,
    learner_model_param: LearnerModelParam,
    objective: Objective,
}

#[derive(Deserialize)]
struct LearnerModelParam {
    base_score: String,
    num_class: String,
    num_feature: String,
    #[serde(default)]
    num_target: Option<String>,
}

#[derive(Deserialize)]
struct Objective {
    name: String,
}

#[derive(Deserialize)]
struct GradientBooster {
    name: String,
    #[serde(default)]
    model: Option<Value>,
}

#[derive(Deserialize)]
struct GbTree {
    gbtree_model_param: GbTreeParam,
    tree_info: Vec<i64>,
    trees: Vec<Tree>,
    #[serde(default)]
    cats: Option<Cats>,
}

#[derive(Deserialize)]
struct GbTreeParam {
    num_trees: String,
    #[serde(default)]
    num_parallel_tree: Option<String>,
}

#[derive(Deserialize)]
struct Cats {
    #[serde(default)]
    enc: Vec<Value>,
}

#[derive(Deserialize)]
struct Tree {
    tree_param: TreeParam,
    left_children: Vec<i64>,
    right_children: Vec<i64>,
    split_indices: Vec<i64>,
    split_conditions: Vec<f64>,
    default_left: Vec<i64>,
    #[serde(default)]
    split_type: Option<Vec<i64>>,
    #[serde(default)]
    categories: Vec<i64>,
    #[serde(default)]
    categories_nodes: Vec<i64>,
    #[serde(default)]
    categories_segments: Vec<i64>,
    #[serde(default)]
    categories_sizes: Vec<i64>,
}

#[derive(Deserialize)]
struct TreeParam {
    num_nodes: String,
    #[serde(default)]
    size_leaf_vector: Option<String>,
}

fn malformed(detail: impl Into<String>) -> TreeError {
    TreeError::Malformed {
        format: FORMAT,
        detail: detail.into(),
    }
}

fn unsupported(what: impl Into<String>) -> TreeError {
    TreeError::Unsupported {
        format: FORMAT,
        what: what.into(),
    }
}

fn parse_count(field: &str, s: &str) -> Result<u64> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| malformed(format!("{field} is not a count: {s:?}")))
}

/// Parses `base_score`: "[2.016875E-2]" (3.x, one value per output) or "5E-1" (2.x).
fn parse_base_score(s: &str) -> Result<Vec<f32>> {
    let t = s.trim();
    let inner = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(t);
    let mut out = Vec::new();
    for part in inner.split(',') {
        let part = part.trim();
        let v: f32 = part
            .parse()
            .map_err(|_| malformed(format!("base_score is not a number list: {s:?}")))?;
        if !v.is_finite() {
            return Err(malformed(format!("base_score is not finite: {s:?}")));
        }
        out.push(v);
        if out.len() > MAX_CLASSES {
            return Err(malformed(
                "base_score has more values than any supported output",
            ));
        }
    }
    Ok(out)
}

/// XGBoost's `LogisticProbToMargin` in f32.
fn logit_f32(p: f32) -> f32 {
    let p = p.clamp(1e-6, 1.0 - 1e-6);
    -(1.0f32 / p - 1.0f32).ln()
}

/// Loads an XGBoost JSON model.
pub(crate) fn load(bytes: &[u8]) -> Result<Forest> {
    crate::check_size(FORMAT, bytes.len())?;
    let doc: Document = serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
    load_document(doc)
}

/// Loads an XGBoost UBJSON model (`save_model("*.ubj")`): the same document as the JSON
/// format in a binary encoding, decoded with bounds and then checked as JSON is.
pub(crate) fn load_ubjson(bytes: &[u8]) -> Result<Forest> {
    const UBJ: &str = "XGBoost UBJSON";
    crate::check_size(UBJ, bytes.len())?;
    let value = crate::ubjson::decode(bytes).map_err(|detail| TreeError::Malformed {
        format: UBJ,
        detail,
    })?;
    let doc: Document = serde_json::from_value(value).map_err(|e| TreeError::Malformed {
        format: UBJ,
        detail: e.to_string(),
    })?;
    load_document(doc)
}

/// Checks and lays out a parsed model: version, booster, shape, objective, then the trees.
fn load_document(doc: Document) -> Result<Forest> {
    check_version(&doc.version)?;
    let learner = doc.learner;
    let model = gbtree_model(learner.gradient_booster)?;
    let p = &learner.learner_model_param;
    let (num_feature, num_class) = read_shape(p, &learner.feature_names, &learner.feature_types)?;
    let objective = learner.objective.name;
    let (num_outputs, transform, logit_base) = read_objective(&objective, num_class)?;
    let base_margin = read_base_margin(&p.base_score, num_outputs, logit_base)?;
    check_tree_counts(&model, &learner.feature_names)?;
    let trees = read_trees(&model, num_outputs)?;

    let declared: Vec<usize> = learner
        .feature_types
        .iter()
        .enumerate()
        .filter(|(_, ty)| ty.as_str() == "c")
        .map(|(i, _)| i)
        .collect();
    let categorical = crate::categorical_features(&declared, &trees);
    let feature_names = if learner.feature_names.is_empty() {
        (0..num_feature).map(|i| format!("f{i}")).collect()
    } else {
        learner.feature_names
    };
    let layout = Layout::build(FORMAT, trees, num_feature, num_outputs)?;
    Ok(Forest {
        layout,
        format: ModelFormat::XGBoost,
        objective,
        num_features: num_feature,
        feature_names,
        categorical,
        base_margin,
        transform,
        cat_floor: 0.0,
        snap_zero: false,
    })
}

/// Refuses a `version` that is not `[major, minor, ...]` of a tested release.
fn check_version(version: &[u64]) -> Result<()> {
    if version.len() < 2 {
        return Err(malformed(format!(
            "version {version:?} is not [major, minor, patch]"
        )));
    }
    let (major, minor) = (version[0], version[1]);
    if !TESTED_VERSIONS.contains(&(major, minor)) {
        return Err(unsupported(format!(
            "XGBoost version {major}.{minor} (tested: {})",
            TESTED_VERSIONS
                .iter()
                .map(|(a, b)| format!("{a}.{b}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

/// Refuses any booster but `gbtree` and parses its model.
fn gbtree_model(booster: GradientBooster) -> Result<GbTree> {
    match booster.name.as_str() {
        "gbtree" => {}
        "dart" => return Err(unsupported("DART booster (per-tree weight_drop weights)")),
        other => return Err(unsupported(format!("booster {other:?}"))),
    }
    let model = booster
        .model
        .ok_or_else(|| malformed("gradient_booster has no model"))?;
    serde_json::from_value(model).map_err(|e| malformed(format!("gbtree model: {e}")))
}

/// Reads and bounds `num_feature`, `num_class` and `num_target`, and checks the feature
/// name and type lists against `num_feature`; returns `(num_feature, num_class)`.
fn read_shape(
    p: &LearnerModelParam,
    feature_names: &[String],
    feature_types: &[String],
) -> Result<(usize, usize)> {
    let num_feature = parse_count("num_feature", &p.num_feature)? as usize;
    if num_feature > MAX_FEATURES {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "num_feature",
            value: num_feature as u64,
            limit: MAX_FEATURES as u64,
        });
    }
    let num_class = parse_count("num_class", &p.num_class)? as usize;
    let num_target = match &p.num_target {
        Some(s) => parse_count("num_target", s)? as usize,
        None => 1,
    };
    if num_target > 1 {
        return Err(unsupported(format!(
            "multi-target model (num_target = {num_target})"
        )));
    }
    if num_class > MAX_CLASSES {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "num_class",
            value: num_class as u64,
            limit: MAX_CLASSES as u64,
        });
    }
    if !feature_names.is_empty() && feature_names.len() != num_feature {
        return Err(malformed(format!(
            "{} feature_names for num_feature {num_feature}",
            feature_names.len()
        )));
    }
    if !feature_types.is_empty() && feature_types.len() != num_feature {
        return Err(malformed(format!(
            "{} feature_types for num_feature {num_feature}",
            feature_types.len()
        )));
    }
    Ok((num_feature, num_class))
}

/// Maps the objective to `(num_outputs, transform, whether base_score is a probability)`.
fn read_objective(objective: &str, num_class: usize) -> Result<(usize, Transform, bool)> {
    let (num_outputs, transform, logit_base) = match objective {
        "binary:logistic" | "reg:logistic" => (1, Transform::SigmoidF32, true),
        "binary:logitraw" => (1, Transform::Identity, false),
        "reg:squarederror" => (1, Transform::Identity, false),
        "multi:softprob" => {
            if num_class < 2 {
                return Err(malformed(format!(
                    "multi:softprob with num_class {num_class}"
                )));
            }
            (num_class, Transform::SoftmaxF32, false)
        }
        other => return Err(unsupported(format!("objective {other:?}"))),
    };
    if num_outputs == 1 && num_class > 1 {
        return Err(malformed(format!(
            "objective {objective} with num_class {num_class}"
        )));
    }
    Ok((num_outputs, transform, logit_base))
}

/// Turns `base_score` into one margin per output (through `logit` for the logistic
/// objectives).
fn read_base_margin(base_score: &str, num_outputs: usize, logit_base: bool) -> Result<Vec<f64>> {
    let base = parse_base_score(base_score)?;
    let base: Vec<f32> = if base.len() == 1 {
        vec![base[0]; num_outputs]
    } else if base.len() == num_outputs {
        base
    } else {
        return Err(malformed(format!(
            "base_score has {} values for {num_outputs} outputs",
            base.len()
        )));
    };
    base.iter()
        .map(|&b| {
            if logit_base {
                if !(0.0..=1.0).contains(&b) {
                    return Err(malformed(format!("base_score {b} is not a probability")));
                }
                Ok(f64::from(logit_f32(b)))
            } else {
                Ok(f64::from(b))
            }
        })
        .collect()
}

/// Checks `num_trees` (limit, random forest, the array lengths) and the category
/// encoding table.
fn check_tree_counts(model: &GbTree, feature_names: &[String]) -> Result<()> {
    let num_trees = parse_count("num_trees", &model.gbtree_model_param.num_trees)? as usize;
    if num_trees > MAX_TREES {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "num_trees",
            value: num_trees as u64,
            limit: MAX_TREES as u64,
        });
    }
    if let Some(npt) = &model.gbtree_model_param.num_parallel_tree {
        let npt = parse_count("num_parallel_tree", npt)?;
        if npt != 1 {
            return Err(unsupported(format!(
                "num_parallel_tree = {npt} (random forest)"
            )));
        }
    }
    if model.trees.len() != num_trees || model.tree_info.len() != num_trees {
        return Err(malformed(format!(
            "num_trees is {num_trees} but there are {} trees and {} tree_info entries",
            model.trees.len(),
            model.tree_info.len()
        )));
    }
    if let Some(cats) = &model.cats {
        check_identity_encoding(&cats.enc, feature_names)?;
    }
    Ok(())
}

/// Reads every tree, checking its `tree_info` output index.
fn read_trees(model: &GbTree, num_outputs: usize) -> Result<Vec<RawTree>> {
    let mut cat_words_budget = MAX_CATEGORICAL_WORDS;
    let mut trees = Vec::with_capacity(model.trees.len());
    for (t, (tree, &info)) in model.trees.iter().zip(&model.tree_info).enumerate() {
        if info < 0 || info as usize >= num_outputs {
            return Err(TreeError::InvalidTree {
                format: FORMAT,
                tree: t,
                detail: format!("tree_info {info} is not an output below {num_outputs}"),
            });
        }
        trees.push(read_tree(t, tree, info as usize, &mut cat_words_budget)?);
    }
    Ok(trees)
}

/// XGBoost 3.1+ stores the training categories of each categorical feature (`cats.enc`)
/// and re-codes DataFrame inputs with them. This evaluator takes codes, so it accepts the
/// table only where the recoding is the identity (values `0..n` in order); anything else
/// (string categories, other integer values) is refused rather than silently mis-coded.
fn check_identity_encoding(enc: &[Value], names: &[String]) -> Result<()> {
    for (i, e) in enc.iter().enumerate() {
        let values = match e.get("values") {
            Some(Value::Array(v)) => v,
            _ => return Err(malformed(format!("cats.enc[{i}] has no values array"))),
        };
        let identity = values
            .iter()
            .enumerate()
            .all(|(j, v)| v.as_u64() == Some(j as u64));
        if !identity {
            let name = names.get(i).map(String::as_str).unwrap_or("?");
            return Err(unsupported(format!(
                "category encoding of feature {i} ({name}) is not the codes 0..n in order \
                 (string or re-coded categories need a recoding this evaluator does not do)"
            )));
        }
    }
    Ok(())
}

/// Reads tree `t` into a [`RawTree`] adding to `output`; categorical sets are taken from
/// `cat_budget` words.
fn read_tree(t: usize, tree: &Tree, output: usize, cat_budget: &mut usize) -> Result<RawTree> {
    let invalid = |detail: String| invalid_tree(t, detail);
    let n = check_tree_shape(t, tree)?;
    let cat_of_node = categories_by_node(t, tree, n)?;
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let left = tree.left_children[i];
        if left == -1 {
            let v = tree.split_conditions[i] as f32;
            nodes.push(RawNode::Leaf(f64::from(v)));
            continue;
        }
        let right = tree.right_children[i];
        if left < 0 || left as usize >= n {
            return Err(invalid(format!(
                "node {i} has left child {left}, the tree has {n} nodes"
            )));
        }
        if right != left + 1 {
            return Err(invalid(format!(
                "node {i} has children {left} and {right}; XGBoost's predictor takes the right \
                 child as left + 1, so this file would not evaluate as written"
            )));
        }
        let feature = tree.split_indices[i];
        if feature < 0 {
            return Err(invalid(format!("node {i} splits on feature {feature}")));
        }
        let nan_left = match tree.default_left[i] {
            0 => false,
            1 => true,
            other => return Err(invalid(format!("node {i} has default_left {other}"))),
        };
        let split_type = tree.split_type.as_ref().map_or(0, |s| s[i]);
        let split = match split_type {
            0 => numeric_split(t, tree, i, nan_left)?,
            1 => categorical_split(t, tree, i, cat_of_node[i], nan_left, cat_budget)?,
            other => return Err(invalid(format!("node {i} has split_type {other}"))),
        };
        nodes.push(RawNode::Split {
            feature: feature as usize,
            split,
            left: left as usize,
            right: right as usize,
        });
    }
    Ok(RawTree { nodes, output })
}

/// An `InvalidTree` error for tree `t`.
fn invalid_tree(t: usize, detail: String) -> TreeError {
    TreeError::InvalidTree {
        format: FORMAT,
        tree: t,
        detail,
    }
}

/// Refuses vector leaves, and checks every array against `num_nodes`; returns it.
fn check_tree_shape(t: usize, tree: &Tree) -> Result<usize> {
    if let Some(s) = &tree.tree_param.size_leaf_vector {
        let v = parse_count("size_leaf_vector", s)?;
        if v > 1 {
            return Err(unsupported(format!(
                "vector leaves (size_leaf_vector = {v}) in tree {t}"
            )));
        }
    }
    let n = parse_count("num_nodes", &tree.tree_param.num_nodes)? as usize;
    let lens = [
        ("left_children", tree.left_children.len()),
        ("right_children", tree.right_children.len()),
        ("split_indices", tree.split_indices.len()),
        ("split_conditions", tree.split_conditions.len()),
        ("default_left", tree.default_left.len()),
        ("split_type", tree.split_type.as_ref().map_or(n, Vec::len)),
    ];
    for (name, len) in lens {
        if len != n {
            return Err(invalid_tree(
                t,
                format!("{name} has {len} entries, num_nodes is {n}"),
            ));
        }
    }
    if n == 0 {
        return Err(invalid_tree(t, "num_nodes is 0".into()));
    }
    Ok(n)
}

/// Maps each of the `n` nodes to its position in `categories_nodes`, if any.
fn categories_by_node(t: usize, tree: &Tree, n: usize) -> Result<Vec<Option<usize>>> {
    let c = &tree.categories_nodes;
    if tree.categories_segments.len() != c.len() || tree.categories_sizes.len() != c.len() {
        return Err(invalid_tree(
            t,
            "categories_nodes, categories_segments and categories_sizes differ in length".into(),
        ));
    }
    let mut cat_of_node: Vec<Option<usize>> = vec![None; n];
    for (k, &node) in c.iter().enumerate() {
        if node < 0 || node as usize >= n {
            return Err(invalid_tree(
                t,
                format!("categories_nodes names node {node}, the tree has {n}"),
            ));
        }
        if cat_of_node[node as usize].replace(k).is_some() {
            return Err(invalid_tree(
                t,
                format!("categories_nodes names node {node} twice"),
            ));
        }
    }
    Ok(cat_of_node)
}

/// The numeric split of node `i`: `x < split_condition` in f32.
fn numeric_split(t: usize, tree: &Tree, i: usize, nan_left: bool) -> Result<Split> {
    let thr = tree.split_conditions[i] as f32;
    if !thr.is_finite() {
        return Err(invalid_tree(
            t,
            format!(
                "node {i} has a non-finite threshold {}",
                tree.split_conditions[i]
            ),
        ));
    }
    Ok(Split::Numeric {
        lt: thr,
        nan_left,
        zero_is_missing: false,
        all_left: false,
    })
}

/// The categorical split of node `i` (set `k` of `categories_nodes`) as a bitset, taken
/// from `cat_budget` words.
fn categorical_split(
    t: usize,
    tree: &Tree,
    i: usize,
    k: Option<usize>,
    nan_left: bool,
    cat_budget: &mut usize,
) -> Result<Split> {
    let invalid = |detail: String| invalid_tree(t, detail);
    let k = k.ok_or_else(|| invalid(format!("categorical node {i} has no categories")))?;
    let (seg, size) = (tree.categories_segments[k], tree.categories_sizes[k]);
    if seg < 0
        || size <= 0
        || (seg as u64).saturating_add(size as u64) > tree.categories.len() as u64
    {
        return Err(invalid(format!(
            "categorical node {i}: segment {seg}+{size} is outside the {} categories",
            tree.categories.len()
        )));
    }
    let cats = &tree.categories[seg as usize..(seg + size) as usize];
    let mut max = 0u32;
    for &cat in cats {
        if cat < 0 || cat > i64::from(MAX_CATEGORY) {
            return Err(invalid(format!(
                "categorical node {i} names category {cat}"
            )));
        }
        max = max.max(cat as u32);
    }
    let words_len = (max / 32 + 1) as usize;
    if words_len > *cat_budget {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "categorical bitset words",
            value: (MAX_CATEGORICAL_WORDS - *cat_budget + words_len) as u64,
            limit: MAX_CATEGORICAL_WORDS as u64,
        });
    }
    *cat_budget -= words_len;
    let mut words = vec![0u32; words_len];
    for &cat in cats {
        words[(cat / 32) as usize] |= 1 << (cat % 32);
    }
    Ok(Split::Categorical {
        words,
        in_set_left: false,
        nan_left,
    })
}
