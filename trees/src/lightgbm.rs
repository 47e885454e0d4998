//! LightGBM text model loader (`Booster.save_model`, format `version=v4`).
//!
//! Rules, as in LightGBM's `include/LightGBM/tree.h` (`NumericalDecision`,
//! `CategoricalDecision`) and its C API's row reader:
//! - inputs with |x| <= kZeroThreshold (1e-35f) are read as 0.0 (the predictor drops
//!   them from the row as zeros);
//! - `decision_type`: bit 1 categorical, bit 2 default left, `(dt >> 2) & 3` the missing
//!   type (0 none, 1 zero, 2 NaN);
//! - numeric split: NaN becomes 0.0 unless the missing type is NaN; then if (type zero
//!   and x is 0.0) or (type NaN and x is NaN) it goes the default way; otherwise left iff
//!   `x <= threshold` in f64. For an f32 input that is `x < next_up(round_down_f32(t))`,
//!   which is how it is stored;
//! - categorical split: NaN goes right; the code is the input truncated toward zero, a
//!   negative code goes right; a code whose bit is set in the node's slice of
//!   `cat_threshold` (`cat_boundaries[k]..cat_boundaries[k+1]`, `k` the threshold) goes
//!   left, anything else right;
//! - `leaf_value` already includes the shrinkage; a tree's output is its leaf, summed in
//!   f64 by iteration; `binary sigmoid:S` gives `1 / (1 + exp(-S * sum))`, `multiclass`
//!   a softmax, `regression` the sum.

use crate::error::{Result, TreeError};
use crate::layout::{f32_round_down, next_up, Layout, RawNode, RawTree, Split};
use crate::{
    Forest, ModelFormat, Transform, MAX_CATEGORICAL_WORDS, MAX_CLASSES, MAX_FEATURES,
    MAX_TOTAL_NODES, MAX_TREES,
};

const FORMAT: &str = "LightGBM text";

/// `version=` values of the text format this loader was tested against (LightGBM 4.x).
pub(crate) const TESTED_VERSIONS: &[&str] = &["v4"];

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

fn parse_int(field: &str, s: &str) -> Result<i64> {
    s.trim()
        .parse::<i64>()
        .map_err(|_| malformed(format!("{field} is not an integer: {:?}", clip(s))))
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Parses a space-separated array of exactly `n` values.
fn parse_array<T: std::str::FromStr>(
    tree: usize,
    field: &str,
    s: Option<&str>,
    n: usize,
) -> Result<Vec<T>> {
    let s = s.ok_or_else(|| TreeError::InvalidTree {
        format: FORMAT,
        tree,
        detail: format!("no {field} line"),
    })?;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for part in s.split_ascii_whitespace() {
        if out.len() == n {
            return Err(TreeError::InvalidTree {
                format: FORMAT,
                tree,
                detail: format!("{field} has more than {n} values"),
            });
        }
        out.push(part.parse::<T>().map_err(|_| TreeError::InvalidTree {
            format: FORMAT,
            tree,
            detail: format!("{field} has a value that does not parse: {:?}", clip(part)),
        })?);
    }
    if out.len() != n {
        return Err(TreeError::InvalidTree {
            format: FORMAT,
            tree,
            detail: format!("{field} has {} values, expected {n}", out.len()),
        });
    }
    Ok(out)
}

/// Key/value lines of one section.
#[derive(Default)]
struct Section<'a> {
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Section<'a> {
    fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }
}

/// Loads a LightGBM text model: header, objective, trees, then the trailing parameters.
pub(crate) fn load(text: &str) -> Result<Forest> {
    crate::check_size(FORMAT, text.len())?;
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r')).peekable();
    let header = read_header(&mut lines)?;
    check_version(&header)?;
    let shape = read_shape(&header)?;
    let objective = read_objective(&header, shape.num_class, shape.per_iter)?;
    let num_outputs = objective.num_outputs;
    let trees = read_trees(&mut lines, shape.num_features, num_outputs)?;
    check_trailer(lines)?;

    let categorical = crate::categorical_features(&shape.declared_cat, &trees);
    let layout = Layout::build(FORMAT, trees, shape.num_features, num_outputs)?;
    Ok(Forest {
        layout,
        format: ModelFormat::LightGBM,
        objective: objective.line.to_owned(),
        num_features: shape.num_features,
        feature_names: shape.feature_names,
        categorical,
        base_margin: vec![0.0; num_outputs],
        transform: objective.transform,
        // LightGBM casts to int (toward zero) and tests `< 0`: x <= -1 is negative.
        cat_floor: next_up(-1.0),
        snap_zero: true,
    })
}

/// Reads the `tree` line and the header's key=value lines, up to the first `Tree=` line.
fn read_header<'a, I: Iterator<Item = &'a str>>(
    lines: &mut std::iter::Peekable<I>,
) -> Result<Section<'a>> {
    match lines.next() {
        Some("tree") => {}
        other => {
            return Err(malformed(format!(
                "the first line is {:?}, expected \"tree\"",
                other.map(clip)
            )))
        }
    }
    let mut header = Section::default();
    while let Some(line) = lines.peek() {
        if line.starts_with("Tree=") || *line == "end of trees" {
            break;
        }
        let line = lines.next().unwrap_or_default();
        if line.is_empty() {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) => header.pairs.push((k, v)),
            None => header.pairs.push((line, "")),
        }
    }
    Ok(header)
}

/// Refuses a format version this loader was not tested with, and random forest mode.
fn check_version(header: &Section<'_>) -> Result<()> {
    let version = header
        .get("version")
        .ok_or_else(|| malformed("no version line"))?;
    if !TESTED_VERSIONS.contains(&version) {
        return Err(unsupported(format!(
            "text format version {version:?} (tested: {})",
            TESTED_VERSIONS.join(", ")
        )));
    }
    if header.get("average_output").is_some() {
        return Err(unsupported("average_output (random forest mode)"));
    }
    Ok(())
}

/// The model's shape as the header states it.
struct Shape {
    num_class: i64,
    per_iter: i64,
    num_features: usize,
    feature_names: Vec<String>,
    /// Features that `feature_infos` declares categorical.
    declared_cat: Vec<usize>,
}

/// Reads and bounds `num_class`, `num_tree_per_iteration`, `max_feature_idx`,
/// `feature_names` and `feature_infos`.
fn read_shape(header: &Section<'_>) -> Result<Shape> {
    let num_class = parse_int(
        "num_class",
        header
            .get("num_class")
            .ok_or_else(|| malformed("no num_class line"))?,
    )?;
    let per_iter = match header.get("num_tree_per_iteration") {
        Some(s) => parse_int("num_tree_per_iteration", s)?,
        None => num_class,
    };
    if !(1..=MAX_CLASSES as i64).contains(&num_class)
        || !(1..=MAX_CLASSES as i64).contains(&per_iter)
    {
        return Err(malformed(format!(
            "num_class {num_class} / num_tree_per_iteration {per_iter} out of range"
        )));
    }
    let max_feature_idx = parse_int(
        "max_feature_idx",
        header
            .get("max_feature_idx")
            .ok_or_else(|| malformed("no max_feature_idx line"))?,
    )?;
    if max_feature_idx < 0 || max_feature_idx >= MAX_FEATURES as i64 {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "max_feature_idx + 1",
            value: (max_feature_idx + 1).max(0) as u64,
            limit: MAX_FEATURES as u64,
        });
    }
    let num_features = (max_feature_idx + 1) as usize;
    let feature_names: Vec<String> = match header.get("feature_names") {
        Some(s) => s.split(' ').map(str::to_owned).collect(),
        None => return Err(malformed("no feature_names line")),
    };
    if feature_names.len() != num_features {
        return Err(malformed(format!(
            "{} feature_names for max_feature_idx {max_feature_idx}",
            feature_names.len()
        )));
    }
    let declared_cat = declared_categorical(header, num_features)?;
    Ok(Shape {
        num_class,
        per_iter,
        num_features,
        feature_names,
        declared_cat,
    })
}

/// The features `feature_infos` declares categorical: "[min:max]" is numeric, "none"
/// unused, "a:b:c" categorical values.
fn declared_categorical(header: &Section<'_>, num_features: usize) -> Result<Vec<usize>> {
    let mut declared_cat = Vec::new();
    if let Some(infos) = header.get("feature_infos") {
        let infos: Vec<&str> = infos.split(' ').collect();
        if infos.len() != num_features {
            return Err(malformed(format!(
                "{} feature_infos for {num_features} features",
                infos.len()
            )));
        }
        for (i, info) in infos.iter().enumerate() {
            if !info.starts_with('[') && *info != "none" {
                declared_cat.push(i);
            }
        }
    }
    Ok(declared_cat)
}

/// The objective line and what it means for the outputs.
struct ObjectiveSpec<'a> {
    line: &'a str,
    num_outputs: usize,
    transform: Transform,
}

/// Reads the `objective` line into the number of outputs and their transform, and checks
/// it against `num_class` and `num_tree_per_iteration`.
fn read_objective<'a>(
    header: &Section<'a>,
    num_class: i64,
    per_iter: i64,
) -> Result<ObjectiveSpec<'a>> {
    let objective_line = header
        .get("objective")
        .ok_or_else(|| unsupported("a model with no objective line (custom objective)"))?;
    let mut tokens = objective_line.split_ascii_whitespace();
    let objective = tokens.next().unwrap_or("").to_owned();
    let params: Vec<(&str, &str)> = tokens
        .map(|t| t.split_once(':').unwrap_or((t, "")))
        .collect();
    let param = |k: &str| params.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    let (num_outputs, transform) = match objective.as_str() {
        "binary" => {
            let s: f64 = param("sigmoid")
                .ok_or_else(|| malformed("binary objective without sigmoid:"))?
                .parse()
                .map_err(|_| malformed(format!("objective {objective_line:?}: bad sigmoid")))?;
            if !(s.is_finite() && s > 0.0) {
                return Err(malformed(format!(
                    "objective {objective_line:?}: sigmoid must be positive"
                )));
            }
            (1usize, Transform::SigmoidF64 { scale: s })
        }
        "regression" => {
            if params.iter().any(|(k, _)| *k == "sqrt") {
                return Err(unsupported(
                    "objective \"regression sqrt\" (sqrt-transformed label)",
                ));
            }
            (1, Transform::Identity)
        }
        "multiclass" => {
            let k = param("num_class")
                .map(|v| parse_int("objective num_class", v))
                .transpose()?;
            if k != Some(num_class) || num_class < 2 {
                return Err(malformed(format!(
                    "objective {objective_line:?} with num_class {num_class}"
                )));
            }
            (num_class as usize, Transform::SoftmaxF64)
        }
        _ => return Err(unsupported(format!("objective {objective_line:?}"))),
    };
    if per_iter as usize != num_outputs || (num_outputs == 1 && num_class != 1) {
        return Err(malformed(format!(
            "objective {objective} with num_class {num_class} and num_tree_per_iteration {per_iter}"
        )));
    }
    Ok(ObjectiveSpec {
        line: objective_line,
        num_outputs,
        transform,
    })
}

/// Reads the `Tree=` sections up to `end of trees`; checks their labels and count.
fn read_trees<'a, I: Iterator<Item = &'a str>>(
    lines: &mut std::iter::Peekable<I>,
    num_features: usize,
    num_outputs: usize,
) -> Result<Vec<RawTree>> {
    let mut trees = Vec::new();
    let mut total_nodes = 0usize;
    let mut cat_words = 0usize;
    loop {
        let Some(line) = lines.next() else {
            return Err(malformed("no \"end of trees\" line"));
        };
        if line.is_empty() {
            continue;
        }
        if line == "end of trees" {
            break;
        }
        let Some(index) = line.strip_prefix("Tree=") else {
            return Err(malformed(format!("expected Tree=, found {:?}", clip(line))));
        };
        let t = trees.len();
        if parse_int("Tree=", index)? != t as i64 {
            return Err(malformed(format!("tree {t} is labelled {line:?}")));
        }
        if t >= MAX_TREES {
            return Err(TreeError::Limit {
                format: FORMAT,
                what: "number of trees",
                value: t as u64 + 1,
                limit: MAX_TREES as u64,
            });
        }
        let section = read_tree_section(lines, t)?;
        let tree = read_tree(
            t,
            &section,
            num_features,
            t % num_outputs,
            &mut total_nodes,
            &mut cat_words,
        )?;
        trees.push(tree);
    }
    if trees.is_empty() || trees.len() % num_outputs != 0 {
        return Err(malformed(format!(
            "{} trees is not a positive multiple of {num_outputs} trees per iteration",
            trees.len()
        )));
    }
    Ok(trees)
}

/// Reads the key=value lines of tree `t`, up to a blank line or the next tree.
fn read_tree_section<'a, I: Iterator<Item = &'a str>>(
    lines: &mut std::iter::Peekable<I>,
    t: usize,
) -> Result<Section<'a>> {
    let mut section = Section::default();
    while let Some(l) = lines.peek() {
        if l.is_empty() || l.starts_with("Tree=") || *l == "end of trees" {
            break;
        }
        let l = lines.next().unwrap_or_default();
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| malformed(format!("tree {t}: line {:?} is not key=value", clip(l))))?;
        section.pairs.push((k, v));
    }
    Ok(section)
}

/// Checks what follows the trees: the parameters (linear_tree) and pandas_categorical.
fn check_trailer<'a>(lines: impl Iterator<Item = &'a str>) -> Result<()> {
    for line in lines {
        if line.starts_with("[linear_tree: ") && line != "[linear_tree: 0]" {
            return Err(unsupported("linear trees (linear_tree)"));
        }
        if let Some(json) = line.strip_prefix("pandas_categorical:") {
            check_identity_categories(json)?;
        }
    }
    Ok(())
}

/// `pandas_categorical` lists the categories of each categorical column as seen in
/// training; LightGBM's Python package re-codes DataFrame inputs with it. This evaluator
/// takes codes, so it accepts the list only where the recoding is the identity.
fn check_identity_categories(json: &str) -> Result<()> {
    let v: serde_json::Value = serde_json::from_str(json.trim())
        .map_err(|e| malformed(format!("pandas_categorical: {e}")))?;
    match v {
        serde_json::Value::Null => Ok(()),
        serde_json::Value::Array(cols) => {
            for (i, col) in cols.iter().enumerate() {
                let ok = col.as_array().is_some_and(|vals| {
                    vals.iter()
                        .enumerate()
                        .all(|(j, x)| x.as_u64() == Some(j as u64))
                });
                if !ok {
                    return Err(unsupported(format!(
                        "pandas_categorical column {i} is not the codes 0..n in order (string or \
                         re-coded categories need a recoding this evaluator does not do)"
                    )));
                }
            }
            Ok(())
        }
        _ => Err(malformed("pandas_categorical is not a list")),
    }
}

/// Reads tree `t` from its section into a [`RawTree`] adding to `output`; counts its
/// nodes and categorical words against the model's limits.
fn read_tree(
    t: usize,
    s: &Section<'_>,
    num_features: usize,
    output: usize,
    total_nodes: &mut usize,
    cat_words: &mut usize,
) -> Result<RawTree> {
    let (leaves, num_cat) = read_counts(t, s, total_nodes)?;
    let leaf_value: Vec<f64> = parse_array(t, "leaf_value", s.get("leaf_value"), leaves)?;
    if leaves == 1 {
        return Ok(RawTree {
            nodes: vec![RawNode::Leaf(leaf_value[0])],
            output,
        });
    }
    let arrays = read_arrays(t, s, leaves - 1, num_cat, cat_words)?;
    let nodes = build_nodes(t, &arrays, leaf_value, num_features)?;
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

/// Reads and bounds `num_leaves` and `num_cat` (before anything is allocated from them),
/// adds the tree's nodes to `total_nodes`, and refuses a linear tree.
fn read_counts(t: usize, s: &Section<'_>, total_nodes: &mut usize) -> Result<(usize, usize)> {
    let invalid = |detail: String| invalid_tree(t, detail);
    let num_leaves = parse_int(
        "num_leaves",
        s.get("num_leaves")
            .ok_or_else(|| invalid("no num_leaves line".into()))?,
    )?;
    let num_cat = parse_int(
        "num_cat",
        s.get("num_cat")
            .ok_or_else(|| invalid("no num_cat line".into()))?,
    )?;
    if num_leaves < 1 || num_cat < 0 {
        return Err(invalid(format!(
            "num_leaves {num_leaves}, num_cat {num_cat}"
        )));
    }
    // Bound before anything is allocated from these counts.
    let nodes_here = (num_leaves as u64).saturating_mul(2);
    if (*total_nodes as u64).saturating_add(nodes_here) > MAX_TOTAL_NODES as u64 {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "total number of nodes",
            value: (*total_nodes as u64).saturating_add(nodes_here),
            limit: MAX_TOTAL_NODES as u64,
        });
    }
    if num_cat >= num_leaves {
        return Err(invalid(format!(
            "num_cat {num_cat} with {num_leaves} leaves"
        )));
    }
    let leaves = num_leaves as usize;
    *total_nodes += 2 * leaves - 1;
    if let Some(v) = s.get("is_linear") {
        if parse_int("is_linear", v)? != 0 {
            return Err(unsupported(format!(
                "linear trees (is_linear=1 in tree {t})"
            )));
        }
    }
    Ok((leaves, num_cat as usize))
}

/// The per-split arrays of one tree (`inner` entries each) and its categorical sets.
struct TreeArrays {
    leaves: usize,
    inner: usize,
    num_cat: usize,
    split_feature: Vec<i64>,
    threshold: Vec<f64>,
    decision_type: Vec<i64>,
    left_child: Vec<i64>,
    right_child: Vec<i64>,
    cat_boundaries: Vec<i64>,
    cat_threshold: Vec<u32>,
}

/// Parses the split arrays of a tree with `inner` splits, and its categorical sets.
fn read_arrays(
    t: usize,
    s: &Section<'_>,
    inner: usize,
    num_cat: usize,
    cat_words: &mut usize,
) -> Result<TreeArrays> {
    let get = |k: &str| s.get(k);
    let split_feature: Vec<i64> = parse_array(t, "split_feature", get("split_feature"), inner)?;
    let threshold: Vec<f64> = parse_array(t, "threshold", get("threshold"), inner)?;
    let decision_type: Vec<i64> = match get("decision_type") {
        Some(v) => parse_array(t, "decision_type", Some(v), inner)?,
        None => vec![0; inner],
    };
    let left_child: Vec<i64> = parse_array(t, "left_child", get("left_child"), inner)?;
    let right_child: Vec<i64> = parse_array(t, "right_child", get("right_child"), inner)?;
    let (cat_boundaries, cat_threshold) = if num_cat > 0 {
        read_cat_sets(t, s, num_cat, cat_words)?
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(TreeArrays {
        leaves: inner + 1,
        inner,
        num_cat,
        split_feature,
        threshold,
        decision_type,
        left_child,
        right_child,
        cat_boundaries,
        cat_threshold,
    })
}

/// Parses `cat_boundaries` and `cat_threshold`, counting the words against the limit.
fn read_cat_sets(
    t: usize,
    s: &Section<'_>,
    num_cat: usize,
    cat_words: &mut usize,
) -> Result<(Vec<i64>, Vec<u32>)> {
    let b: Vec<i64> = parse_array(t, "cat_boundaries", s.get("cat_boundaries"), num_cat + 1)?;
    if b[0] != 0 || b.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid_tree(
            t,
            "cat_boundaries do not start at 0 and ascend".into(),
        ));
    }
    let words = b[num_cat];
    if words < 0 || (*cat_words as u64).saturating_add(words as u64) > MAX_CATEGORICAL_WORDS as u64
    {
        return Err(TreeError::Limit {
            format: FORMAT,
            what: "categorical bitset words",
            value: (*cat_words as u64).saturating_add(words.max(0) as u64),
            limit: MAX_CATEGORICAL_WORDS as u64,
        });
    }
    *cat_words += words as usize;
    let th: Vec<u32> = parse_array(t, "cat_threshold", s.get("cat_threshold"), words as usize)?;
    Ok((b, th))
}

/// Builds the nodes: internal nodes keep their index; leaf j becomes node inner + j.
fn build_nodes(
    t: usize,
    a: &TreeArrays,
    leaf_value: Vec<f64>,
    num_features: usize,
) -> Result<Vec<RawNode>> {
    let mut nodes = Vec::with_capacity(a.inner + a.leaves);
    for i in 0..a.inner {
        let (feature, split) = read_split(t, a, i, num_features)?;
        nodes.push(RawNode::Split {
            feature,
            split,
            left: child_index(t, a, i, a.left_child[i])?,
            right: child_index(t, a, i, a.right_child[i])?,
        });
    }
    for v in leaf_value {
        nodes.push(RawNode::Leaf(v));
    }
    Ok(nodes)
}

/// Maps child `c` of node `node` (a split index, or `!leaf`) to its node index.
fn child_index(t: usize, a: &TreeArrays, node: usize, c: i64) -> Result<usize> {
    let (inner, leaves) = (a.inner, a.leaves);
    if c >= 0 {
        if c as usize >= inner {
            return Err(invalid_tree(
                t,
                format!("node {node} has child {c}, there are {inner} splits"),
            ));
        }
        Ok(c as usize)
    } else {
        let leaf = !c;
        if leaf as usize >= leaves {
            return Err(invalid_tree(
                t,
                format!("node {node} has leaf child {c}, there are {leaves} leaves"),
            ));
        }
        Ok(inner + leaf as usize)
    }
}

/// Decodes split `i`: its `decision_type`, feature and threshold, into a [`Split`].
fn read_split(t: usize, a: &TreeArrays, i: usize, num_features: usize) -> Result<(usize, Split)> {
    let invalid = |detail: String| invalid_tree(t, detail);
    let dt = a.decision_type[i];
    if !(0..16).contains(&dt) {
        return Err(invalid(format!("node {i} has decision_type {dt}")));
    }
    let categorical = dt & 1 != 0;
    let default_left = dt & 2 != 0;
    let missing = (dt >> 2) & 3;
    if missing == 3 {
        return Err(invalid(format!(
            "node {i} has missing type 3 (decision_type {dt})"
        )));
    }
    let feature = a.split_feature[i];
    if feature < 0 || feature as usize >= num_features {
        return Err(invalid(format!(
            "node {i} splits on feature {feature}, the model has {num_features}"
        )));
    }
    let thr = a.threshold[i];
    let split = if categorical {
        categorical_split(t, a, i, thr)?
    } else {
        numeric_split(t, i, thr, missing, default_left)?
    };
    Ok((feature as usize, split))
}

/// A categorical split of node `i` whose threshold `k` indexes the tree's sets.
fn categorical_split(t: usize, a: &TreeArrays, i: usize, k: f64) -> Result<Split> {
    let num_cat = a.num_cat;
    if !(k >= 0.0 && k < num_cat as f64 && k.fract() == 0.0) {
        return Err(invalid_tree(
            t,
            format!("categorical node {i} has set index {k}, there are {num_cat} sets"),
        ));
    }
    let k = k as usize;
    let words =
        a.cat_threshold[a.cat_boundaries[k] as usize..a.cat_boundaries[k + 1] as usize].to_vec();
    Ok(Split::Categorical {
        words,
        in_set_left: true,
        nan_left: false,
    })
}

/// A numeric split of node `i`: `x <= thr` in f64, with LightGBM's missing type.
fn numeric_split(t: usize, i: usize, thr: f64, missing: i64, default_left: bool) -> Result<Split> {
    if thr.is_nan() {
        return Err(invalid_tree(t, format!("node {i} has a NaN threshold")));
    }
    // x <= thr (f64) for an f32 x  <=>  x < next_up(largest f32 <= thr); for
    // thr = +inf (LightGBM writes it for "missing or not" splits) every
    // non-missing value goes left, which takes a flag.
    let all_left = thr == f64::INFINITY;
    let lt = next_up(f32_round_down(thr));
    let nan_left = match missing {
        // None: NaN is read as 0.0, which goes where 0.0 <= thr says.
        0 => 0.0 <= thr,
        // Zero: NaN becomes 0.0, and 0.0 goes the default way.
        // NaN: NaN goes the default way.
        _ => default_left,
    };
    Ok(Split::Numeric {
        lt,
        nan_left,
        zero_is_missing: missing == 1,
        all_left,
    })
}
