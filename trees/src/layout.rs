//! The flat node layout every model is compiled into, and its validation.
//!
//! Loaders (`xgboost.rs`, `lightgbm.rs`) translate their format into [`RawTree`]s, which
//! state each split with the library's own rule already folded into a few fields
//! (`x < threshold` in f32, where NaN goes, how categories decide). [`Layout::build`]
//! checks that every tree is a proper binary tree and packs all trees into one array of
//! 12-byte [`Node`]s:
//!
//! - trees are laid out breadth first; the two children of a split are adjacent
//!   (`right = left + 1`), so a node stores one child index;
//! - a leaf is a node too: its threshold is NaN and its left child is `self - 1`, so a
//!   walk that reaches it stays on it whatever the input. That lets a group of trees be
//!   walked in lock step for a fixed number of steps (the deepest tree of the group)
//!   with no branch on "is this a leaf", which is what makes evaluation fast;
//! - leaf values live in a parallel `f64` array indexed by node slot;
//! - categorical sets are bitsets (`u32` words) in one shared array.

use crate::error::{Result, TreeError};

/// Trees are walked in lock step in groups of this many.
pub(crate) const LANES: usize = 8;

/// Feature index mask in [`Node::feat`]; the bits above are flags.
pub(crate) const FEATURE_MASK: u32 = (1 << 24) - 1;
/// NaN goes left at this node (for a leaf: never set).
pub(crate) const NAN_LEFT: u32 = 1 << 24;
/// Categorical split: `thr` holds the bits of an index into the categorical set table.
pub(crate) const CATEGORICAL: u32 = 1 << 25;
/// For a categorical split: a category in the set goes left (LightGBM); otherwise it
/// goes right (XGBoost).
pub(crate) const IN_SET_LEFT: u32 = 1 << 26;
/// LightGBM missing type "zero": an input of exactly 0.0 (after LightGBM's snapping of
/// |x| <= kZeroThreshold to 0) goes the default way, given by `NAN_LEFT`.
pub(crate) const ZERO_MISSING: u32 = 1 << 27;
/// Slot of the shared zero leaf that pads the last group of trees.
pub(crate) const ZERO_LEAF: u32 = 1;
/// Marks a leaf slot (informational; the walk does not need it).
pub(crate) const LEAF: u32 = 1 << 28;
/// LightGBM threshold +inf: every value that is not missing goes left (`x <= inf`),
/// +inf included, which no f32 `x < t` can express.
pub(crate) const ALL_LEFT: u32 = 1 << 29;
/// Nodes with any of these flags take the slow path.
pub(crate) const SLOW: u32 = CATEGORICAL | ZERO_MISSING | ALL_LEFT;

/// How a split decides, already translated to this crate's convention:
/// numeric splits go left iff `x < lt` (f32) unless the input is missing.
#[derive(Debug, Clone)]
pub(crate) enum Split {
    Numeric {
        /// Go left iff `x < lt`.
        lt: f32,
        /// Where NaN goes.
        nan_left: bool,
        /// LightGBM missing type zero: 0.0 goes the same way as NaN.
        zero_is_missing: bool,
        /// Every non-missing value goes left (LightGBM threshold +inf).
        all_left: bool,
    },
    Categorical {
        /// Bitset of the categories in the node's set.
        words: Vec<u32>,
        /// A category in the set goes left (LightGBM) or right (XGBoost).
        in_set_left: bool,
        /// Where NaN goes.
        nan_left: bool,
    },
}

#[derive(Debug, Clone)]
pub(crate) enum RawNode {
    Leaf(f64),
    Split {
        feature: usize,
        split: Split,
        left: usize,
        right: usize,
    },
}

/// One tree as a loader read it; node 0 is the root.
#[derive(Debug, Clone)]
pub(crate) struct RawTree {
    pub(crate) nodes: Vec<RawNode>,
    /// Which output (class) this tree adds to.
    pub(crate) output: usize,
}

/// One packed node (12 bytes).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Node {
    /// Numeric: go left iff `x < thr`. Categorical: `thr.to_bits()` indexes `cat_sets`.
    /// Leaf: NaN.
    pub(crate) thr: f32,
    /// Feature index (low 24 bits) and flags.
    pub(crate) feat: u32,
    /// Slot of the left child; the right child is `left + 1`.
    pub(crate) left: u32,
}

/// Limits on what a model file can make the loader build.
pub(crate) struct Limits {
    pub(crate) max_total_nodes: usize,
    pub(crate) max_depth: usize,
    pub(crate) max_cat_words: usize,
}

pub(crate) const LIMITS: Limits = Limits {
    max_total_nodes: crate::MAX_TOTAL_NODES,
    max_depth: crate::MAX_DEPTH,
    max_cat_words: crate::MAX_CATEGORICAL_WORDS,
};

/// All trees of a model, packed.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) nodes: Vec<Node>,
    /// Leaf value per slot (0.0 for splits).
    pub(crate) values: Vec<f64>,
    /// Root slot of each tree, padded to a multiple of `LANES` with a zero leaf.
    pub(crate) roots: Vec<u32>,
    /// Output index of each tree (same padding).
    pub(crate) outputs: Vec<u32>,
    /// For each group of `LANES` trees: how many steps reach every leaf of the group.
    pub(crate) group_steps: Vec<u16>,
    /// Categorical sets: (start, len) into `cat_words`.
    pub(crate) cat_sets: Vec<(u32, u32)>,
    pub(crate) cat_words: Vec<u32>,
    /// Number of outputs (classes); every tree's output is below it.
    pub(crate) num_outputs: usize,
    pub(crate) num_trees: usize,
    pub(crate) has_slow_nodes: bool,
}

impl Layout {
    /// Validates and packs `trees`. `format` names the file format in errors.
    pub(crate) fn build(
        format: &'static str,
        trees: Vec<RawTree>,
        num_features: usize,
        num_outputs: usize,
    ) -> Result<Self> {
        if num_features == 0 {
            return Err(TreeError::Malformed {
                format,
                detail: "the model has no features".into(),
            });
        }
        if num_features > FEATURE_MASK as usize {
            return Err(TreeError::Limit {
                format,
                what: "number of features",
                value: num_features as u64,
                limit: FEATURE_MASK as u64,
            });
        }
        if trees.is_empty() {
            return Err(TreeError::Malformed {
                format,
                detail: "the model has no trees".into(),
            });
        }
        let total: usize = trees.iter().map(|t| t.nodes.len()).sum();
        if total > LIMITS.max_total_nodes {
            return Err(TreeError::Limit {
                format,
                what: "total number of nodes",
                value: total as u64,
                limit: LIMITS.max_total_nodes as u64,
            });
        }
        let num_trees = trees.len();
        let padded = num_trees.div_ceil(LANES) * LANES;
        // Slot 0 is never walked to (it only serves as `self - 1` of slot 1); slot 1 is a
        // zero leaf, the root of the trees that pad the last group.
        let mut layout = Layout {
            nodes: Vec::with_capacity(total + 2),
            values: Vec::with_capacity(total + 2),
            roots: Vec::with_capacity(padded),
            outputs: Vec::with_capacity(padded),
            group_steps: Vec::with_capacity(padded / LANES),
            cat_sets: Vec::new(),
            cat_words: Vec::new(),
            num_outputs,
            num_trees,
            has_slow_nodes: false,
        };
        for _ in 0..2 {
            layout.nodes.push(Node {
                thr: f32::NAN,
                feat: LEAF,
                left: 0,
            });
            layout.values.push(0.0);
        }
        let mut depths = Vec::with_capacity(padded);
        for (t, tree) in trees.into_iter().enumerate() {
            if tree.output >= num_outputs {
                return Err(TreeError::InvalidTree {
                    format,
                    tree: t,
                    detail: format!("output index {} is not below {num_outputs}", tree.output),
                });
            }
            let (root, depth) = layout.add_tree(format, t, &tree, num_features)?;
            layout.roots.push(root);
            layout.outputs.push(tree.output as u32);
            depths.push(depth);
        }
        while layout.roots.len() < padded {
            layout.roots.push(ZERO_LEAF);
            layout.outputs.push(0);
            depths.push(0);
        }
        for group in depths.chunks(LANES) {
            let steps = group.iter().copied().max().unwrap_or(0);
            layout.group_steps.push(steps as u16);
        }
        Ok(layout)
    }

    /// Adds one tree breadth first; returns its root slot and depth.
    fn add_tree(
        &mut self,
        format: &'static str,
        t: usize,
        tree: &RawTree,
        num_features: usize,
    ) -> Result<(u32, usize)> {
        let n = tree.nodes.len();
        if n == 0 {
            return Err(TreeError::InvalidTree {
                format,
                tree: t,
                detail: "no nodes".into(),
            });
        }
        let at = TreeAt { format, tree: t };
        let mut visited = vec![false; n];
        // (raw index, slot, depth)
        let mut queue = std::collections::VecDeque::with_capacity(n.min(1 << 16));
        let root = self.push_placeholder();
        visited[0] = true;
        queue.push_back((0usize, root, 0usize));
        let mut max_depth = 0;
        while let Some((raw, slot, depth)) = queue.pop_front() {
            max_depth = max_depth.max(depth);
            match &tree.nodes[raw] {
                RawNode::Leaf(v) => self.set_leaf(at, raw, slot, *v)?,
                RawNode::Split {
                    feature,
                    split,
                    left,
                    right,
                } => {
                    check_split(at, raw, depth, *feature, num_features)?;
                    mark_children(at, raw, [*left, *right], &mut visited)?;
                    let (thr, feat) = self.encode_split(at, raw, *feature, split)?;
                    let l = self.push_placeholder();
                    let r = self.push_placeholder();
                    debug_assert_eq!(r, l + 1);
                    self.nodes[slot as usize] = Node { thr, feat, left: l };
                    queue.push_back((*left, l, depth + 1));
                    queue.push_back((*right, r, depth + 1));
                }
            }
        }
        Ok((root, max_depth))
    }

    /// Writes leaf `raw` (value `v`) into `slot`; refuses a non-finite value.
    fn set_leaf(&mut self, at: TreeAt, raw: usize, slot: u32, v: f64) -> Result<()> {
        if !v.is_finite() {
            return Err(at.invalid(format!("leaf {raw} has a non-finite value {v}")));
        }
        self.nodes[slot as usize] = Node {
            thr: f32::NAN,
            feat: LEAF,
            left: slot - 1,
        };
        self.values[slot as usize] = v;
        Ok(())
    }

    /// Packs the rule of split `raw` into its node's `(thr, feat)`, storing a
    /// categorical set in the shared table.
    fn encode_split(
        &mut self,
        at: TreeAt,
        raw: usize,
        feature: usize,
        split: &Split,
    ) -> Result<(f32, u32)> {
        let mut feat = feature as u32;
        let thr = match split {
            Split::Numeric {
                lt,
                nan_left,
                zero_is_missing,
                all_left,
            } => {
                if lt.is_nan() {
                    return Err(at.invalid(format!("node {raw} has a NaN threshold")));
                }
                if *nan_left {
                    feat |= NAN_LEFT;
                }
                if *zero_is_missing {
                    feat |= ZERO_MISSING;
                    self.has_slow_nodes = true;
                }
                if *all_left {
                    feat |= ALL_LEFT;
                    self.has_slow_nodes = true;
                }
                *lt
            }
            Split::Categorical {
                words,
                in_set_left,
                nan_left,
            } => {
                feat |= CATEGORICAL;
                if *in_set_left {
                    feat |= IN_SET_LEFT;
                }
                if *nan_left {
                    feat |= NAN_LEFT;
                }
                f32::from_bits(self.add_cat_set(at.format, words)?)
            }
        };
        Ok((thr, feat))
    }

    /// Appends one categorical bitset to the shared table; returns its index.
    fn add_cat_set(&mut self, format: &'static str, words: &[u32]) -> Result<u32> {
        if self.cat_words.len() + words.len() > LIMITS.max_cat_words {
            return Err(TreeError::Limit {
                format,
                what: "categorical bitset words",
                value: (self.cat_words.len() + words.len()) as u64,
                limit: LIMITS.max_cat_words as u64,
            });
        }
        self.has_slow_nodes = true;
        let index = self.cat_sets.len() as u32;
        self.cat_sets
            .push((self.cat_words.len() as u32, words.len() as u32));
        self.cat_words.extend_from_slice(words);
        Ok(index)
    }

    fn push_placeholder(&mut self) -> u32 {
        let slot = self.nodes.len() as u32;
        self.nodes.push(Node {
            thr: f32::NAN,
            feat: LEAF,
            left: slot.saturating_sub(1),
        });
        self.values.push(0.0);
        slot
    }
}

/// The file format and tree index that errors about one tree name.
#[derive(Clone, Copy)]
struct TreeAt {
    format: &'static str,
    tree: usize,
}

impl TreeAt {
    /// An `InvalidTree` error for this tree.
    fn invalid(self, detail: String) -> TreeError {
        TreeError::InvalidTree {
            format: self.format,
            tree: self.tree,
            detail,
        }
    }
}

/// Checks split `raw` at `depth`: the depth limit and its feature index.
fn check_split(
    at: TreeAt,
    raw: usize,
    depth: usize,
    feature: usize,
    num_features: usize,
) -> Result<()> {
    if depth >= LIMITS.max_depth {
        return Err(TreeError::Limit {
            format: at.format,
            what: "tree depth",
            value: depth as u64 + 1,
            limit: LIMITS.max_depth as u64,
        });
    }
    if feature >= num_features {
        return Err(at.invalid(format!(
            "node {raw} splits on feature {feature}, the model has {num_features}"
        )));
    }
    Ok(())
}

/// Checks that the children of split `raw` exist and were not reached before, and marks
/// them reached.
fn mark_children(at: TreeAt, raw: usize, children: [usize; 2], visited: &mut [bool]) -> Result<()> {
    let n = visited.len();
    for child in children {
        if child >= n {
            return Err(at.invalid(format!(
                "node {raw} has child {child}, the tree has {n} nodes"
            )));
        }
        if visited[child] {
            return Err(at.invalid(format!(
                "node {child} is reached twice (a cycle or a shared child, \
                 seen again from node {raw})"
            )));
        }
        visited[child] = true;
    }
    Ok(())
}

/// The largest f32 that is <= `v` (for finite or infinite `v`; not NaN).
pub(crate) fn f32_round_down(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) > v {
        next_down(f)
    } else {
        f
    }
}

pub(crate) fn next_up(f: f32) -> f32 {
    if f.is_nan() || f == f32::INFINITY {
        return f;
    }
    if f == 0.0 {
        return f32::from_bits(1);
    }
    let bits = f.to_bits();
    if f > 0.0 {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

pub(crate) fn next_down(f: f32) -> f32 {
    -next_up(-f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_helpers() {
        assert_eq!(next_up(1.0), 1.0 + f32::EPSILON);
        assert_eq!(next_up(-0.0), f32::from_bits(1));
        assert_eq!(next_down(0.0), -f32::from_bits(1));
        assert_eq!(next_up(f32::MAX), f32::INFINITY);
        assert_eq!(next_up(f32::NEG_INFINITY), f32::MIN);
        // 0.1 as f32 is above 0.1, so rounding down gives the f32 below it.
        assert!((f32_round_down(0.1) as f64) <= 0.1);
        assert!((next_up(f32_round_down(0.1)) as f64) > 0.1);
        assert_eq!(f32_round_down(0.5), 0.5);
        assert_eq!(f32_round_down(1e300), f32::MAX);
        assert_eq!(f32_round_down(-1e300), f32::NEG_INFINITY);
    }
}
