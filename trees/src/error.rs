//! The one error type of this crate.

/// Why a model file was refused, or why a call to `predict` was refused.
///
/// Every refusal names what was wrong (the field, the tree, the node, the value)
/// so that whoever deploys the model can act on it. Nothing in this crate panics on
/// a hostile or broken model file; it comes back as one of these.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// The bytes are not the format they claim to be (bad JSON, a missing or
    /// malformed field, a line that does not parse).
    #[error("malformed {format} model: {detail}")]
    Malformed {
        /// "XGBoost JSON" or "LightGBM text".
        format: &'static str,
        /// What did not parse, and where.
        detail: String,
    },

    /// The file is well formed but uses something this evaluator does not implement
    /// (an objective, linear trees, DART, a format version it was not tested with...).
    /// It is refused at load, never evaluated wrongly.
    #[error("unsupported {format} model: {what}")]
    Unsupported {
        /// "XGBoost JSON" or "LightGBM text".
        format: &'static str,
        /// What is not supported, by name.
        what: String,
    },

    /// A tree does not describe a valid binary tree, or a value is out of its range:
    /// child index out of range, a cycle or a shared child, a feature index at or
    /// above the number of features, a non-finite threshold or leaf value.
    #[error("invalid tree {tree} in {format} model: {detail}")]
    InvalidTree {
        /// "XGBoost JSON" or "LightGBM text".
        format: &'static str,
        /// Index of the tree in the file.
        tree: usize,
        /// What is wrong, naming the node.
        detail: String,
    },

    /// A size in the file is beyond what the loader is willing to allocate or walk
    /// (see the `MAX_*` constants of this crate).
    #[error("{format} model exceeds a limit: {what} is {value}, the limit is {limit}")]
    Limit {
        /// "XGBoost JSON" or "LightGBM text".
        format: &'static str,
        /// Which quantity.
        what: &'static str,
        /// The value found (or claimed) in the file.
        value: u64,
        /// The limit.
        limit: u64,
    },

    /// `predict` was called with buffers whose sizes do not match.
    #[error("bad input shape: {0}")]
    Shape(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, TreeError>;
