//! `mesh batch-score`: reads the entity keys of a Parquet file and scores them with
//! [`mesh_router::offline::score_entities`], drawing a progress bar.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context};
use arrow_array::{Array, Int64Array, StringArray};
use clap::Args;
use mesh_feature_store::{EntityKey, KeyType};
use mesh_model_actor::{ActorSystem, ModelRepository};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use mesh_router::config::FeaturesConfig;

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

fn read_keys(path: &PathBuf, column: &str, key_type: KeyType) -> anyhow::Result<Vec<EntityKey>> {
    let err = |e: String| anyhow!("{}: {e}", path.display());
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

pub async fn run(args: BatchScoreArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let store = mesh_router::server::open_store(&FeaturesConfig {
        path: Some(args.store.clone()),
        views: Some(args.views.clone()),
        ..FeaturesConfig::default()
    })
    .await?
    .context("no feature store")?;
    let system = ActorSystem::start()?;
    let repo = Arc::new(ModelRepository::new(&args.models, system.clone())?);
    repo.load(&args.model).await?;
    let handle = repo.get(&args.model, None)?;
    let out = store.view(&args.out_view)?;
    let keys = read_keys(&args.entities, &out.join_key, out.key_type)?;
    let bar = progress_bar(keys.len() as u64);
    let progress = |done: u64, _total: u64| bar.set_position(done);
    let scored = mesh_router::offline::score_entities(
        &store,
        &handle,
        &keys,
        &args.out_view,
        args.chunk,
        &progress,
    )
    .await;
    bar.finish_and_clear();
    system.stop();
    let (scored, refused) = scored?;
    let secs = started.elapsed().as_secs_f64();
    crate::outln!(
        "batch-score: {scored} entities scored with {} v{} into view '{}' ({refused} refused by the input spec) in {secs:.1} s = {:.0} rows/s",
        args.model,
        handle.version,
        args.out_view,
        scored as f64 / secs.max(1e-9)
    )?;
    Ok(())
}

/// A progress bar of entities on stderr.
pub fn progress_bar(total: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} entities {per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}
