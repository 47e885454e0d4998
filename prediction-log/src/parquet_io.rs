//! Records <-> Arrow record batches <-> Parquet files.
//!
//! The layout is flat so any Parquet reader can use it as is: scalar columns, the stage
//! timings as `<stage>_us` int64 columns, entity keys and features as lists of structs.

use crate::error::{LogError, Result};
use crate::record::{FeatureUsed, PredictionRecord, Role, StageMicros};
use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, OnceLock};

const STAGE_COLUMNS: [&str; 7] = [
    "validate_us",
    "features_us",
    "preprocess_us",
    "queue_us",
    "compute_us",
    "postprocess_us",
    "total_us",
];

fn ts_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn key_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ])
}

fn feature_fields() -> Fields {
    Fields::from(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("value", DataType::Float64, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("event_time", ts_type(), true),
    ])
}

/// The Arrow schema of every segment.
pub fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let mut fields = vec![
                Field::new("request_id", DataType::Utf8, false),
                Field::new("ts", ts_type(), false),
                Field::new("model", DataType::Utf8, false),
                Field::new("version", DataType::Utf8, false),
                Field::new("role", DataType::Utf8, false),
                Field::new_list(
                    "entity_keys",
                    Field::new_struct("item", key_fields(), false),
                    false,
                ),
                Field::new_list(
                    "features",
                    Field::new_struct("item", feature_fields(), false),
                    true,
                ),
                Field::new("score", DataType::Float64, true),
                Field::new("decision", DataType::Utf8, true),
                Field::new("source", DataType::Utf8, false),
            ];
            fields.extend(
                STAGE_COLUMNS
                    .iter()
                    .map(|c| Field::new(*c, DataType::Int64, false)),
            );
            Arc::new(Schema::new(fields))
        })
        .clone()
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Builds one record batch from records.
pub fn to_batch(records: &[PredictionRecord]) -> Result<RecordBatch> {
    let n = records.len();
    let mut request_id = StringBuilder::with_capacity(n, n * 16);
    let mut ts = TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut model = StringBuilder::with_capacity(n, n * 8);
    let mut version = StringBuilder::with_capacity(n, n * 2);
    let mut role = StringBuilder::with_capacity(n, n * 7);
    let mut score = Float64Builder::with_capacity(n);
    let mut decision = StringBuilder::with_capacity(n, n * 7);
    let mut source = StringBuilder::with_capacity(n, n * 5);
    let mut stages: Vec<Int64Builder> = (0..7).map(|_| Int64Builder::with_capacity(n)).collect();

    let mut key_offsets = Vec::with_capacity(n + 1);
    key_offsets.push(0i32);
    let mut key_k = StringBuilder::new();
    let mut key_v = StringBuilder::new();

    let mut feat_offsets = Vec::with_capacity(n + 1);
    feat_offsets.push(0i32);
    let mut feat_valid = Vec::with_capacity(n);
    let mut f_name = StringBuilder::new();
    let mut f_value = Float64Builder::new();
    let mut f_status = StringBuilder::new();
    let mut f_time = TimestampMicrosecondBuilder::new().with_timezone("UTC");

    let mut n_keys = 0i32;
    let mut n_feats = 0i32;
    for r in records {
        request_id.append_value(&r.request_id);
        ts.append_value(r.ts_us);
        model.append_value(&r.model);
        version.append_value(&r.version);
        role.append_value(r.role.as_str());
        score.append_option(r.score);
        decision.append_option(r.decision.as_deref());
        source.append_value(&r.source);
        for (b, v) in stages.iter_mut().zip(r.stages.as_array()) {
            b.append_value(to_i64(v));
        }
        for (k, v) in &r.entity_keys {
            key_k.append_value(k);
            key_v.append_value(v);
            n_keys += 1;
        }
        key_offsets.push(n_keys);
        feat_valid.push(r.features.is_some());
        for f in r.features.iter().flatten() {
            f_name.append_value(&f.name);
            f_value.append_option(f.value);
            f_status.append_value(&f.status);
            f_time.append_option(f.event_time_us);
            n_feats += 1;
        }
        feat_offsets.push(n_feats);
    }

    let keys_struct = StructArray::try_new(
        key_fields(),
        vec![
            Arc::new(key_k.finish()) as ArrayRef,
            Arc::new(key_v.finish()),
        ],
        None,
    )?;
    let keys = ListArray::try_new(
        Arc::new(Field::new_struct("item", key_fields(), false)),
        OffsetBuffer::new(key_offsets.into()),
        Arc::new(keys_struct),
        None,
    )?;
    let feat_struct = StructArray::try_new(
        feature_fields(),
        vec![
            Arc::new(f_name.finish()) as ArrayRef,
            Arc::new(f_value.finish()),
            Arc::new(f_status.finish()),
            Arc::new(f_time.finish()),
        ],
        None,
    )?;
    let features = ListArray::try_new(
        Arc::new(Field::new_struct("item", feature_fields(), false)),
        OffsetBuffer::new(feat_offsets.into()),
        Arc::new(feat_struct),
        Some(NullBuffer::from(feat_valid)),
    )?;

    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(request_id.finish()),
        Arc::new(ts.finish()),
        Arc::new(model.finish()),
        Arc::new(version.finish()),
        Arc::new(role.finish()),
        Arc::new(keys),
        Arc::new(features),
        Arc::new(score.finish()),
        Arc::new(decision.finish()),
        Arc::new(source.finish()),
    ];
    columns.extend(stages.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// Rows per row group: large enough for good compression, small enough that readers can
/// stream a big segment.
const ROW_GROUP_ROWS: usize = 64 * 1024;

/// Writes records to `path` as one Parquet file (Snappy, which every reader supports) and
/// syncs it to disk. The caller renames it into place.
pub fn write_parquet(path: &Path, records: &[PredictionRecord]) -> Result<()> {
    let file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| LogError::io(path, e))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_created_by("inference-mesh prediction-log".to_string())
        .build();
    let mut writer = ArrowWriter::try_new(file, schema(), Some(props))
        .map_err(|e| LogError::parquet(path, e))?;
    for chunk in records.chunks(ROW_GROUP_ROWS) {
        let batch = to_batch(chunk)?;
        writer
            .write(&batch)
            .map_err(|e| LogError::parquet(path, e))?;
    }
    let file = writer
        .into_inner()
        .map_err(|e| LogError::parquet(path, e))?;
    file.sync_all().map_err(|e| LogError::io(path, e))?;
    Ok(())
}

/// Reads every record of one Parquet segment.
pub fn read_parquet(path: &Path) -> Result<Vec<PredictionRecord>> {
    let file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| LogError::parquet(path, e))?
        .with_batch_size(8192)
        .build()
        .map_err(|e| LogError::parquet(path, e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        from_batch(path, &batch, &mut out)?;
    }
    Ok(out)
}

fn column<'a>(path: &Path, batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| LogError::schema(path, format!("missing column {name}")))
}

fn strings<'a>(
    path: &Path,
    batch: &'a RecordBatch,
    name: &str,
) -> Result<&'a arrow_array::StringArray> {
    column(path, batch, name)?
        .as_string_opt::<i32>()
        .ok_or_else(|| LogError::schema(path, format!("column {name} is not utf8")))
}

fn opt_str(a: &arrow_array::StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_string())
}

/// Appends the records of `batch` to `out`.
pub fn from_batch(path: &Path, batch: &RecordBatch, out: &mut Vec<PredictionRecord>) -> Result<()> {
    let bad = |name: &str| LogError::schema(path, format!("column {name} has an unexpected type"));
    let request_id = strings(path, batch, "request_id")?;
    let ts = column(path, batch, "ts")?
        .as_primitive_opt::<TimestampMicrosecondType>()
        .ok_or_else(|| bad("ts"))?;
    let model = strings(path, batch, "model")?;
    let version = strings(path, batch, "version")?;
    let role = strings(path, batch, "role")?;
    let keys = column(path, batch, "entity_keys")?
        .as_list_opt::<i32>()
        .ok_or_else(|| bad("entity_keys"))?;
    let keys_s = keys
        .values()
        .as_struct_opt()
        .ok_or_else(|| bad("entity_keys"))?;
    let key_k = keys_s
        .column(0)
        .as_string_opt::<i32>()
        .ok_or_else(|| bad("entity_keys.key"))?;
    let key_v = keys_s
        .column(1)
        .as_string_opt::<i32>()
        .ok_or_else(|| bad("entity_keys.value"))?;
    let feats = column(path, batch, "features")?
        .as_list_opt::<i32>()
        .ok_or_else(|| bad("features"))?;
    let feats_s = feats
        .values()
        .as_struct_opt()
        .ok_or_else(|| bad("features"))?;
    let f_name = feats_s
        .column(0)
        .as_string_opt::<i32>()
        .ok_or_else(|| bad("features.name"))?;
    let f_value = feats_s
        .column(1)
        .as_primitive_opt::<Float64Type>()
        .ok_or_else(|| bad("features.value"))?;
    let f_status = feats_s
        .column(2)
        .as_string_opt::<i32>()
        .ok_or_else(|| bad("features.status"))?;
    let f_time = feats_s
        .column(3)
        .as_primitive_opt::<TimestampMicrosecondType>()
        .ok_or_else(|| bad("features.event_time"))?;
    let score = column(path, batch, "score")?
        .as_primitive_opt::<Float64Type>()
        .ok_or_else(|| bad("score"))?;
    let decision = strings(path, batch, "decision")?;
    let source = strings(path, batch, "source")?;
    let mut stage_cols = Vec::with_capacity(7);
    for c in STAGE_COLUMNS {
        stage_cols.push(
            column(path, batch, c)?
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad(c))?,
        );
    }

    let key_off = keys.value_offsets();
    let feat_off = feats.value_offsets();
    for i in 0..batch.num_rows() {
        let role_v: Role = role
            .value(i)
            .parse()
            .map_err(|e: String| LogError::schema(path, e))?;
        let entity_keys = (key_off[i] as usize..key_off[i + 1] as usize)
            .map(|j| (key_k.value(j).to_string(), key_v.value(j).to_string()))
            .collect();
        let features = feats.is_valid(i).then(|| {
            (feat_off[i] as usize..feat_off[i + 1] as usize)
                .map(|j| FeatureUsed {
                    name: f_name.value(j).to_string(),
                    value: f_value.is_valid(j).then(|| f_value.value(j)),
                    // Files written before statuses were upper case read as today's.
                    status: crate::record::status::normalize(f_status.value(j)),
                    event_time_us: f_time.is_valid(j).then(|| f_time.value(j)),
                })
                .collect()
        });
        let mut st = [0u64; 7];
        for (s, col) in st.iter_mut().zip(&stage_cols) {
            *s = u64::try_from(col.value(i)).unwrap_or(0);
        }
        out.push(PredictionRecord {
            request_id: request_id.value(i).to_string(),
            ts_us: ts.value(i),
            model: model.value(i).to_string(),
            version: version.value(i).to_string(),
            role: role_v,
            entity_keys,
            features,
            score: score.is_valid(i).then(|| score.value(i)),
            decision: opt_str(decision, i),
            source: source.value(i).to_string(),
            stages: StageMicros::from_array(st),
        });
    }
    Ok(())
}
