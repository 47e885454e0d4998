//! Where a decision's stored features come from: the sled store of this process
//! (`[features] path`) or a `mesh serve --role features` elsewhere (`[features]
//! remote`). The features stage, the spec checks and the batch-score fallback see
//! one interface; a lookup that fails, either way, is `Err` with the reason, and
//! the decision takes the spec's defaults for the store's features (`UNAVAILABLE`
//! in its reasons), as the spec and `max_defaulted_features` say.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mesh_feature_store::{FeatureStore, LookupRequest, LookupResponse, ViewInfo};
use metrics::counter;

use super::remote_features::RemoteFeatures;
use crate::telemetry::names;

pub enum FeatureSource {
    /// The store this process holds open.
    Local(Arc<FeatureStore>),
    /// A features role, over `mesh.v1.FeatureStore`.
    Remote(Box<RemoteFeatures>),
}

impl From<Arc<FeatureStore>> for FeatureSource {
    fn from(s: Arc<FeatureStore>) -> Self {
        Self::Local(s)
    }
}

/// When a failed lookup was last logged (ms since the process's first lookup
/// failure), so that a store that is down logs one line a second, not one per
/// decision (the counter counts every one).
static LAST_WARNING_MS: AtomicU64 = AtomicU64::new(0);

fn warn_sometimes(kind: &'static str, error: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let now = START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1_000;
    let last = LAST_WARNING_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= 1_000
        && LAST_WARNING_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            store = kind,
            error,
            "feature lookup failed; the spec's defaults stand in (logged at most once a second)"
        );
    }
}

impl FeatureSource {
    /// `local` or `remote`, the `store` label of the lookup-failure counter.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Local(_) => "local",
            Self::Remote(_) => "remote",
        }
    }

    /// The live views (a remote's as its `ListViews` answered at start).
    pub fn views(&self) -> &[ViewInfo] {
        match self {
            Self::Local(s) => s.views(),
            Self::Remote(r) => r.views(),
        }
    }

    /// One view by name.
    pub fn view(&self, name: &str) -> Result<&ViewInfo, String> {
        match self {
            Self::Local(s) => s.view(name).map_err(|e| e.to_string()),
            Self::Remote(r) => r
                .views()
                .iter()
                .find(|v| v.name == name)
                .ok_or_else(|| format!("the remote feature store has no view '{name}'")),
        }
    }

    /// One batched lookup. A remote one ends by `deadline` (its gRPC timeout is
    /// the time left); the local store answers from this process without a
    /// timer. A failure is counted (`mesh_router_feature_lookup_failures_total`),
    /// logged at most once a second, and returned.
    pub async fn lookup(
        &self,
        req: LookupRequest,
        deadline: Instant,
    ) -> Result<LookupResponse, String> {
        let r = match self {
            Self::Local(s) => s.get_online_features(req).await.map_err(|e| e.to_string()),
            Self::Remote(r) => r.lookup(req, deadline).await,
        };
        if let Err(e) = &r {
            counter!(names::FEATURE_LOOKUP_FAILURES, "store" => self.kind()).increment(1);
            warn_sometimes(self.kind(), e);
        }
        r
    }

    /// Starts the failure counter at zero, so the first failure shows in rates.
    pub fn describe(&self) {
        counter!(names::FEATURE_LOOKUP_FAILURES, "store" => self.kind()).increment(0);
    }
}
