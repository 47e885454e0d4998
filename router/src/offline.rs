//! Offline scoring, the batch half of the hybrid: scores entities in large batches
//! (features from the store, request-time features at their spec defaults) and
//! writes each score into a feature view, which the decision path's fallback chain
//! reads when the model cannot answer in time. `mesh batch-score` and the demo call
//! [`score_entities`].
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_feature_store::{
    Durability, EntityKey, FeatureStore, KeyColumn, KeyType, LookupRequest, LookupResponse, Row,
    Value, ViewInfo,
};
use mesh_model_actor::config::ColumnRules;
use mesh_model_actor::{Batch, VersionHandle};

use crate::decide::features::{build_row, RequestFeatures};
use crate::decide::spec::{DecisionSpec, OnMissing, Source};
use crate::error::RouterError;

/// How long one offline batch may take in the model: offline work has no caller
/// waiting, so this only stops a wedged actor from hanging the job.
const OFFLINE_BATCH_DEADLINE: Duration = Duration::from_secs(60);

/// Progress of [`score_entities`]: called with the number of entities done so far
/// and the total, after each chunk.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// Scores `keys` with `handle` (features from `store`, request-time features at
/// their spec defaults) and writes each score into `out_view`'s first f32
/// feature. Returns (scored, refused by the input spec).
pub async fn score_entities(
    store: &Arc<FeatureStore>,
    handle: &VersionHandle,
    keys: &[EntityKey],
    out_view: &str,
    chunk: usize,
    progress: Progress<'_>,
) -> Result<(u64, u64), RouterError> {
    let spec = offline_spec(handle)?;
    let out = store
        .view(out_view)
        .map_err(|e| RouterError::NotFound(e.to_string()))?
        .clone();
    let score_idx = out
        .features
        .iter()
        .position(|f| f.dtype == mesh_feature_store::FeatureType::F32)
        .ok_or_else(|| {
            RouterError::invalid(format!(
                "view '{out_view}' has no f32 feature to hold the score"
            ))
        })?;
    let (keyed_views, keyed_features) = keyed_like(store, &spec, &out)?;
    // One lookup reads rows x views keys; stay within the store's limit.
    let chunk_size = chunk.clamp(
        1,
        (store.options().limits.max_keys_per_lookup / keyed_views.max(1)).max(1),
    );
    let (mut scored, mut refused, mut done) = (0u64, 0u64, 0u64);
    for chunk in keys.chunks(chunk_size) {
        // Only the views keyed like the output view can be read offline (there is no
        // merchant key, say, when scoring cards); the spec's defaults or refusals
        // cover the rest, as they would for a missing value online.
        let lookup = if keyed_features.is_empty() {
            None
        } else {
            let lr = LookupRequest::new(keyed_features.iter().cloned())
                .with_keys(out.join_key.clone(), key_column(out.key_type, chunk));
            Some(
                store
                    .get_online_features(lr)
                    .await
                    .map_err(|e| RouterError::Internal(e.to_string()))?,
            )
        };
        let (rows, r) = build_rows(&spec, chunk, lookup.as_ref());
        refused += r;
        let writes = score_rows(handle, rows, &out, score_idx).await?;
        scored += writes.len() as u64;
        if !writes.is_empty() {
            store
                .push(out_view, writes, Durability::Buffered)
                .await
                .map_err(|e| RouterError::Internal(e.to_string()))?;
        }
        done += chunk.len() as u64;
        progress(done, keys.len() as u64);
    }
    store
        .flush()
        .map_err(|e| RouterError::Internal(e.to_string()))?;
    Ok((scored, refused))
}

/// The model's input spec with no refusal of request-time features: offline there
/// are none, so an entry that would refuse to score without one takes NaN where the
/// model accepts missing values there (a tree model's `[trees] missing` column),
/// else its default.
fn offline_spec(handle: &VersionHandle) -> Result<DecisionSpec, RouterError> {
    let mut spec = DecisionSpec::from_model(&handle.config)
        .map_err(RouterError::InvalidArgument)?
        .ok_or_else(|| {
            RouterError::invalid(format!(
                "model '{}' has no [input_spec]",
                handle.config.name
            ))
        })?;
    let mut col = 0;
    for e in &mut spec.entries {
        if matches!(e.source, Source::Request(_)) && e.on_missing == OnMissing::Refuse {
            let missing = e.width() == 1 && spec.columns.column(col) & ColumnRules::MISSING != 0;
            e.on_missing = if missing {
                OnMissing::Nan
            } else {
                OnMissing::Default
            };
        }
        col += e.width();
    }
    Ok(spec)
}

/// The spec's views keyed like `out` (their count) and their features.
fn keyed_like(
    store: &FeatureStore,
    spec: &DecisionSpec,
    out: &ViewInfo,
) -> Result<(usize, Vec<String>), RouterError> {
    let mut views = 0;
    let mut features = Vec::new();
    for v in &spec.views {
        let info = store
            .view(v)
            .map_err(|e| RouterError::Internal(e.to_string()))?;
        if info.join_key == out.join_key {
            views += 1;
            let prefix = format!("{v}:");
            features.extend(
                spec.store_features
                    .iter()
                    .filter(|f| f.starts_with(&prefix))
                    .cloned(),
            );
        }
    }
    Ok((views, features))
}

/// The keys of `chunk` of the given type as a lookup column.
fn key_column(key_type: KeyType, chunk: &[EntityKey]) -> KeyColumn {
    match key_type {
        KeyType::Int64 => KeyColumn::Int64(
            chunk
                .iter()
                .filter_map(|k| match k {
                    EntityKey::Int64(v) => Some(*v),
                    EntityKey::String(_) => None,
                })
                .collect(),
        ),
        KeyType::String => KeyColumn::String(
            chunk
                .iter()
                .filter_map(|k| match k {
                    EntityKey::String(v) => Some(v.clone()),
                    EntityKey::Int64(_) => None,
                })
                .collect(),
        ),
    }
}

/// One model row per key the spec accepts; returns them and the count refused.
fn build_rows(
    spec: &DecisionSpec,
    chunk: &[EntityKey],
    lookup: Option<&LookupResponse>,
) -> (Vec<(EntityKey, Vec<f32>)>, u64) {
    let empty_num = Default::default();
    let empty_cat = Default::default();
    let req = RequestFeatures {
        numeric: &empty_num,
        categorical: &empty_cat,
    };
    let mut rows = Vec::with_capacity(chunk.len());
    let mut refused = 0;
    for (i, k) in chunk.iter().enumerate() {
        match build_row(spec, &req, lookup, i) {
            Ok((r, _)) => rows.push((k.clone(), r)),
            Err(_) => refused += 1,
        }
    }
    (rows, refused)
}

/// Scores `rows` in batches of the model's largest size; one store row per score.
async fn score_rows(
    handle: &VersionHandle,
    rows: Vec<(EntityKey, Vec<f32>)>,
    out: &ViewInfo,
    score_idx: usize,
) -> Result<Vec<Row>, RouterError> {
    let max_rows = handle.config.batching.max_batch_size.get();
    let cols = handle.config.input().row_width();
    let now = mesh_feature_store::now_micros();
    let mut writes = Vec::with_capacity(rows.len());
    for part in rows.chunks(max_rows) {
        let data: Vec<f32> = part.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        let batch = Batch {
            rows: part.len(),
            cols,
            data,
        };
        let o = handle
            .infer(batch, Some(Instant::now() + OFFLINE_BATCH_DEADLINE))
            .await?;
        for ((k, _), s) in part.iter().zip(o.data.chunks(o.cols.max(1))) {
            let mut values = vec![None; out.features.len()];
            values[score_idx] = Some(Value::F32(s[0]));
            writes.push(Row {
                key: k.clone(),
                event_time: now,
                values,
            });
        }
    }
    Ok(writes)
}
