//! Metric names of the stack, in one place.
//!
//! All go through the `metrics` facade; the router installs the Prometheus
//! exporter. Labels are low-cardinality: `replica` is the configured replica
//! id (a handful per model version), `to` and `reason` are fixed sets.

/// Counter: retries issued (not counting first attempts), label `reason`
/// (the error that caused the retry, see [`crate::StackError::label`]).
pub const RETRIES_TOTAL: &str = "mesh_router_retries_total";
/// Counter: retries refused because the retry budget was spent.
pub const RETRY_BUDGET_EXHAUSTED_TOTAL: &str = "mesh_router_retry_budget_exhausted_total";
/// Gauge: breaker state per replica, label `replica`; 0 closed, 1 open, 2 half-open.
pub const BREAKER_STATE: &str = "mesh_router_breaker_state";
/// Counter: breaker transitions, labels `replica` and `to` (`closed`, `open`, `half_open`).
pub const BREAKER_TRANSITIONS_TOTAL: &str = "mesh_router_breaker_transitions_total";
/// Counter: model calls shed with `Overloaded` at the entry of the stack.
pub const SHED_TOTAL: &str = "mesh_router_shed_total";
/// Counter: requests failed fast because no replica could take them.
pub const NO_REPLICA_TOTAL: &str = "mesh_router_no_replica_total";

/// Registers descriptions with the installed recorder (call once at start-up,
/// after installing it).
pub fn describe() {
    metrics::describe_counter!(RETRIES_TOTAL, "Model-call retries issued, by reason");
    metrics::describe_counter!(
        RETRY_BUDGET_EXHAUSTED_TOTAL,
        "Model-call retries refused because the retry budget was spent"
    );
    metrics::describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state per replica: 0 closed, 1 open, 2 half-open"
    );
    metrics::describe_counter!(
        BREAKER_TRANSITIONS_TOTAL,
        "Circuit breaker state changes per replica, by target state"
    );
    metrics::describe_counter!(
        SHED_TOTAL,
        "Model calls shed because the stack was saturated"
    );
    metrics::describe_counter!(
        NO_REPLICA_TOTAL,
        "Model calls failed fast because every replica's breaker was open"
    );
}
