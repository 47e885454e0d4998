//! Synthetic features for the demo and benchmarks, for the `card` and `merchant`
//! views of `examples/views.toml` (any features they declare, by type).
//!
//! Cards are keyed `1..=n_cards`, merchants `"m000001"..`. About 2% of rows are
//! written with an event time beyond their view's max_age and about 1% of values
//! are null, so a demo shows every lookup status.
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::Result;
use crate::registry::ViewInfo;
use crate::store::FeatureStore;
use crate::types::{now_micros, Durability, EntityKey, FeatureType, Row, Value};

/// Merchant key of demo merchant `i` (1-based).
pub fn demo_merchant_key(i: u64) -> String {
    format!("m{i:06}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoReport {
    pub cards: u64,
    pub merchants: u64,
}

/// Writes `n_cards` rows to view `card` and `n_merchants` rows to view `merchant`
/// (a view that is not declared is skipped), deterministically from `seed` except
/// for event times, which are relative to now. Blocking; flushes at the end.
pub fn generate_demo_features(
    store: &FeatureStore,
    n_cards: u64,
    n_merchants: u64,
    seed: u64,
) -> Result<DemoReport> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut report = DemoReport {
        cards: 0,
        merchants: 0,
    };
    if let Ok(v) = store.view("card") {
        let v = v.clone();
        report.cards = fill(store, &v, n_cards, &mut rng, |i| EntityKey::Int64(i as i64))?;
    }
    if let Ok(v) = store.view("merchant") {
        let v = v.clone();
        report.merchants = fill(store, &v, n_merchants, &mut rng, |i| {
            EntityKey::String(demo_merchant_key(i))
        })?;
    }
    store.flush()?;
    Ok(report)
}

fn fill(
    store: &FeatureStore,
    v: &ViewInfo,
    n: u64,
    rng: &mut StdRng,
    key: impl Fn(u64) -> EntityKey,
) -> Result<u64> {
    const BATCH: usize = 10_000;
    let now = now_micros();
    let max_age = v.max_age_micros();
    let mut batch = Vec::with_capacity(BATCH);
    for i in 1..=n {
        let stale = rng.random_bool(0.02);
        // Fresh rows are up to half of max_age old; stale ones 1.5-3x max_age.
        let age = if stale {
            rng.random_range(max_age + max_age / 2..=max_age.saturating_mul(3))
        } else {
            rng.random_range(0..=max_age / 2)
        };
        let values = v
            .features
            .iter()
            .map(|f| {
                if rng.random_bool(0.01) {
                    None
                } else {
                    Some(random_value(rng, f.dtype, &f.name))
                }
            })
            .collect();
        batch.push(Row {
            key: key(i),
            event_time: now - age,
            values,
        });
        if batch.len() == BATCH {
            store.write_rows(&v.name, &batch, Durability::Buffered)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        store.write_rows(&v.name, &batch, Durability::Buffered)?;
    }
    Ok(n)
}

// Plausible ranges by naming convention, so the demo's numbers read sensibly.
fn random_value(rng: &mut StdRng, t: FeatureType, name: &str) -> Value {
    match t {
        FeatureType::F32 if name.contains("rate") => Value::F32(rng.random_range(0.0..0.08)),
        FeatureType::F32 => Value::F32((rng.random_range(1.0f32..9.0)).exp()),
        FeatureType::F64 => Value::F64(rng.random_range(0.0..1000.0)),
        FeatureType::I64 if name.contains("tier") => Value::I64(rng.random_range(0..4)),
        FeatureType::I64 => Value::I64(rng.random_range(0..60)),
        FeatureType::Bool => Value::Bool(rng.random_bool(0.1)),
        FeatureType::String => {
            Value::String(["US", "GB", "DE", "FR", "BR"][rng.random_range(0..5)].to_owned())
        }
        FeatureType::F32Vector => {
            Value::F32Vector((0..8).map(|_| rng.random_range(-1.0..1.0)).collect())
        }
    }
}
