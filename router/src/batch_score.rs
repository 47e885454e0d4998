//! `mesh batch-score`: the offline half of the hybrid. Scores every entity of a
//! Parquet file in large batches (features from the store, request-time features at
//! their spec defaults) and writes the scores into a feature view, which the
//! decision path's fallback chain reads when the model cannot answer in time.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Array, Int64Array, StringArray};
use clap::Args;
use mesh_feature_store::{
    Durability, EntityKey, FeatureStore, KeyColumn, KeyType, LookupRequest, Row, Value,
};
use mesh_model_actor::{ActorSystem, Batch, ModelRepository, VersionHandle};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::config::FeaturesConfig;
use crate::decide::features::{build_row, RequestFeatures};
use crate::decide::spec::DecisionSpec;
use crate::error::RouterError;

#[derive(Debug, Args)]
pub struct BatchScoreArgs {
    /// Model to score with (newest ready version).
    #[arg(long)]
    pub model: String,
    /// Parquet file with the entity keys, in a column named after the view's join key.
    #[arg(long)]
    pub entities: PathBuf,
    /// Feature view that receives the scores (its first f32 feature).
    #[arg(long)]
    pub out_view: String,
    /// Model repository.
    #[arg(long, default_value = "examples/models")]
    pub models: PathBuf,
    /// Feature store directory.
    #[arg(long)]
    pub store: PathBuf,
    /// Views file.
    #[arg(long)]
    pub views: PathBuf,
    /// Entities per lookup and write.
    #[arg(long, default_value_t = 4096)]
    pub chunk: usize,
}

fn read_keys(
    path: &PathBuf,
    column: &str,
    key_type: KeyType,
) -> Result<Vec<EntityKey>, RouterError> {
    let err = |e: String| RouterError::InvalidArgument(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| err(e.to_string()))?
        .build()
        .map_err(|e| err(e.to_string()))?;
    let mut keys = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| err(e.to_string()))?;
        let col = batch
            .column_by_name(column)
            .ok_or_else(|| err(format!("no column '{column}'")))?;
        match key_type {
            KeyType::Int64 => {
                let a = col
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .ok_or_else(|| err(format!("column '{column}' is not int64")))?;
                keys.extend(a.iter().flatten().map(EntityKey::Int64));
            }
            KeyType::String => {
                let a = col
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| err(format!("column '{column}' is not a string column")))?;
                keys.extend(a.iter().flatten().map(|s| EntityKey::String(s.to_owned())));
            }
        }
    }
    Ok(keys)
}

pub async fn run(args: BatchScoreArgs) -> Result<(), RouterError> {
    let started = Instant::now();
    let store = crate::server::open_store(&FeaturesConfig {
        path: Some(args.store.clone()),
        views: Some(args.views.clone()),
        max_keys_per_lookup: None,
    })
    .await?
    .ok_or_else(|| RouterError::Internal("no store".into()))?;
    let system = ActorSystem::start().map_err(|e| RouterError::Internal(e.to_string()))?;
    let repo = Arc::new(ModelRepository::new(&args.models, system.clone())?);
    repo.load(&args.model).await?;
    let handle = repo.get(&args.model, None)?;
    let out = store
        .view(&args.out_view)
        .map_err(|e| RouterError::NotFound(e.to_string()))?;
    let keys = read_keys(&args.entities, &out.join_key, out.key_type)?;
    let scored = score_entities(&store, &handle, &keys, &args.out_view, args.chunk, true).await;
    system.stop();
    let (scored, refused) = scored?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "batch-score: {scored} entities scored with {} v{} into view '{}' ({refused} refused by the input spec) in {secs:.1} s = {:.0} rows/s",
        args.model,
        handle.version,
        args.out_view,
        scored as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Scores `keys` with `handle` (features from `store`, request-time features at
/// their spec defaults) and writes each score into `out_view`'s first f32
/// feature. Returns (scored, refused by the input spec).
pub async fn score_entities(
    store: &Arc<FeatureStore>,
    handle: &VersionHandle,
    keys: &[EntityKey],
    out_view: &str,
    chunk: usize,
    progress: bool,
) -> Result<(u64, u64), RouterError> {
    let spec = DecisionSpec::from_model(&handle.config)
        .map_err(RouterError::InvalidArgument)?
        .ok_or_else(|| {
            RouterError::invalid(format!(
                "model '{}' has no [input_spec]",
                handle.config.name
            ))
        })?;
    // Offline there are no request-time features: they take their defaults here even
    // where the online path would refuse to score without them.
    let mut spec = spec;
    for e in &mut spec.entries {
        if matches!(e.source, crate::decide::spec::Source::Request(_)) {
            e.on_missing = crate::decide::spec::OnMissing::Default;
        }
    }
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
                "view '{}' has no f32 feature to hold the score",
                out_view
            ))
        })?;
    let mut keyed_views = 0;
    let mut keyed_features = Vec::new();
    for v in &spec.views {
        if store
            .view(v)
            .map_err(|e| RouterError::Internal(e.to_string()))?
            .join_key
            == out.join_key
        {
            keyed_views += 1;
            keyed_features.extend(
                spec.store_features
                    .iter()
                    .filter(|f| f.starts_with(&format!("{v}:")))
                    .cloned(),
            );
        }
    }
    // One lookup reads rows x views keys; stay within the store's limit.
    let chunk_size = chunk.clamp(
        1,
        store.options().limits.max_keys_per_lookup / keyed_views.max(1),
    );
    let bar = if progress {
        indicatif::ProgressBar::new(keys.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} entities {per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let empty_num = Default::default();
    let empty_cat = Default::default();
    let req = RequestFeatures {
        numeric: &empty_num,
        categorical: &empty_cat,
    };
    let max_rows = handle.config.batching.max_batch_size.get();
    let cols = handle.config.input().row_width();
    let (mut scored, mut refused) = (0u64, 0u64);
    for chunk in keys.chunks(chunk_size.max(1)) {
        let col = match out.key_type {
            KeyType::Int64 => KeyColumn::Int64(
                chunk
                    .iter()
                    .filter_map(|k| {
                        if let EntityKey::Int64(v) = k {
                            Some(*v)
                        } else {
                            None
                        }
                    })
                    .collect(),
            ),
            KeyType::String => KeyColumn::String(
                chunk
                    .iter()
                    .filter_map(|k| {
                        if let EntityKey::String(v) = k {
                            Some(v.clone())
                        } else {
                            None
                        }
                    })
                    .collect(),
            ),
        };
        // Only the views keyed like the output view can be read offline (there is no
        // merchant key, say, when scoring cards); the spec's defaults or refusals
        // cover the rest, as they would for a missing value online.
        let lookup = if keyed_features.is_empty() {
            None
        } else {
            let lr = LookupRequest::new(keyed_features.iter().cloned())
                .with_keys(out.join_key.clone(), col);
            Some(
                store
                    .get_online_features(lr)
                    .await
                    .map_err(|e| RouterError::Internal(e.to_string()))?,
            )
        };
        let mut rows: Vec<(EntityKey, Vec<f32>)> = Vec::with_capacity(chunk.len());
        for (i, k) in chunk.iter().enumerate() {
            match build_row(&spec, &req, lookup.as_ref(), i) {
                Ok((r, _)) => rows.push((k.clone(), r)),
                Err(_) => refused += 1,
            }
        }
        let now = mesh_feature_store::now_micros();
        let mut writes = Vec::with_capacity(rows.len());
        for part in rows.chunks(max_rows) {
            let data: Vec<f32> = part.iter().flat_map(|(_, r)| r.iter().copied()).collect();
            let o = handle
                .infer(
                    Batch {
                        rows: part.len(),
                        cols,
                        data,
                    },
                    Some(Instant::now() + Duration::from_secs(60)),
                )
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
        scored += writes.len() as u64;
        if writes.is_empty() {
            bar.inc(chunk.len() as u64);
            continue;
        }
        store
            .push(out_view, writes, Durability::Buffered)
            .await
            .map_err(|e| RouterError::Internal(e.to_string()))?;
        bar.inc(chunk.len() as u64);
    }
    store
        .flush()
        .map_err(|e| RouterError::Internal(e.to_string()))?;
    bar.finish_and_clear();
    Ok((scored, refused))
}
