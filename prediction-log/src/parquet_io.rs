//! The log's Arrow schema, and Parquet files read back into records (through Arrow
//! record batches). The log writes its files with its own column writer
//! ([`crate::parquet_write`]); [`write_parquet_arrow`] writes the same file through the
//! Arrow writer, as the reference its tests and benchmark compare with.
//!
//! The layout is flat so any Parquet reader can use it as is: scalar columns, the stage
//! timings as `<stage>_us` int64 columns, entity keys and features as lists of structs.
//!
//! Columns added later are optional on read: a file without `protocol` (written before
//! records carried one) reads as [`Protocol::Unknown`].

use crate::error::{LogError, Result};
use crate::record::{
    FeatureUsed, LoggedFeature, PredictionRecord, Protocol, RecordRef, Role, StageMicros,
};
use arrow_array::builder::{
    ArrayBuilder, Float64Builder, Int64Builder, PrimitiveBuilder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Float64Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, ListArray, PrimitiveArray, RecordBatch, StringArray,
    StructArray, TimestampMicrosecondArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The Parquet column of each stage: `<name>_us`, in [`StageMicros::NAMES`] order.
fn stage_columns() -> &'static [String; 7] {
    static COLUMNS: OnceLock<[String; 7]> = OnceLock::new();
    COLUMNS.get_or_init(|| StageMicros::NAMES.map(|n| format!("{n}_us")))
}

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
                Field::new("protocol", DataType::Utf8, false),
            ];
            fields.extend(
                stage_columns()
                    .iter()
                    .map(|c| Field::new(c.as_str(), DataType::Int64, false)),
            );
            Arc::new(Schema::new(fields))
        })
        .clone()
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Builds one record batch from records.
#[cfg(test)]
pub(crate) fn to_batch(records: &[PredictionRecord]) -> Result<RecordBatch> {
    let mut b = BatchBuilder::with_capacity(records.len());
    for r in records {
        b.append(&r.view());
    }
    b.finish()
}

/// The Arrow builders of every column, filled one record at a time; `finish` hands over
/// the batch and leaves the builders empty for the next one.
pub(crate) struct BatchBuilder {
    request_id: StringBuilder,
    ts: TimestampMicrosecondBuilder,
    model: StringBuilder,
    version: StringBuilder,
    role: StringBuilder,
    score: Float64Builder,
    decision: StringBuilder,
    source: StringBuilder,
    protocol: StringBuilder,
    stages: [Int64Builder; 7],
    keys: KeysBuilder,
    features: FeaturesBuilder,
}

impl BatchBuilder {
    /// Builders sized for `n` records (they grow past it).
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            request_id: StringBuilder::with_capacity(n, n * 16),
            ts: TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC"),
            model: StringBuilder::with_capacity(n, n * 8),
            version: StringBuilder::with_capacity(n, n * 2),
            role: StringBuilder::with_capacity(n, n * 7),
            score: Float64Builder::with_capacity(n),
            decision: StringBuilder::with_capacity(n, n * 7),
            source: StringBuilder::with_capacity(n, n * 5),
            protocol: StringBuilder::with_capacity(n, n * 8),
            stages: std::array::from_fn(|_| Int64Builder::with_capacity(n)),
            keys: KeysBuilder::with_capacity(n),
            features: FeaturesBuilder::with_capacity(n),
        }
    }

    /// Appends one record to every column.
    pub(crate) fn append<K: AsRef<str>, F: LoggedFeature>(&mut self, r: &RecordRef<'_, K, F>) {
        self.request_id.append_value(r.request_id);
        self.ts.append_value(r.ts_us);
        self.model.append_value(r.model);
        self.version.append_value(r.version);
        self.role.append_value(r.role.as_str());
        self.score.append_option(r.score);
        self.decision.append_option(r.decision);
        self.source.append_value(r.source);
        self.protocol.append_value(r.protocol.as_str());
        for (b, v) in self.stages.iter_mut().zip(r.stages.as_array()) {
            b.append_value(to_i64(v));
        }
        self.keys.append(r);
        self.features.append(r);
    }

    /// The batch of the records appended since the last call.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(finish_strings(&mut self.request_id)),
            Arc::new(finish_primitive(&mut self.ts)),
            Arc::new(finish_strings(&mut self.model)),
            Arc::new(finish_strings(&mut self.version)),
            Arc::new(finish_strings(&mut self.role)),
            Arc::new(self.keys.finish()?),
            Arc::new(self.features.finish()?),
            Arc::new(finish_primitive(&mut self.score)),
            Arc::new(finish_strings(&mut self.decision)),
            Arc::new(finish_strings(&mut self.source)),
            Arc::new(finish_strings(&mut self.protocol)),
        ];
        columns.extend(
            self.stages
                .iter_mut()
                .map(|b| Arc::new(finish_primitive(b)) as ArrayRef),
        );
        Ok(RecordBatch::try_new(schema(), columns)?)
    }
}

/// Finishes `b` into its array and leaves it empty with the room it had filled. Arrow's
/// `finish` leaves a builder no room at all, so every slice grew each buffer again from
/// nothing, reallocating and copying as it went: `benches/encode.rs` is about 5%
/// faster this way (80.6 against 85.4 ms for 32,768 records, medians of seven
/// alternating rounds, six of the seven faster). The Parquet writer's own buffers
/// still grow per page; those are its own.
fn finish_strings(b: &mut StringBuilder) -> StringArray {
    let (items, bytes) = (b.len(), b.values_slice().len());
    let array = b.finish();
    *b = StringBuilder::with_capacity(items, bytes);
    array
}

/// [`finish_strings`] for a builder of fixed-width values (of the same data type: a
/// timestamp keeps its time zone).
fn finish_primitive<T: ArrowPrimitiveType>(b: &mut PrimitiveBuilder<T>) -> PrimitiveArray<T> {
    let items = b.len();
    let array = b.finish();
    *b = PrimitiveBuilder::<T>::with_capacity(items).with_data_type(array.data_type().clone());
    array
}

/// A list's offsets and validity as they were, leaving empty ones with the same room.
fn take_room<T: Clone>(v: &mut Vec<T>, first: &[T]) -> Vec<T> {
    let mut room = Vec::with_capacity(v.len());
    room.extend_from_slice(first);
    std::mem::replace(v, room)
}

/// Builds the `entity_keys` column: per record, a list of (key, value) structs.
struct KeysBuilder {
    offsets: Vec<i32>,
    key: StringBuilder,
    value: StringBuilder,
    count: i32,
}

impl KeysBuilder {
    /// A builder for `n` records.
    fn with_capacity(n: usize) -> Self {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0i32);
        Self {
            offsets,
            key: StringBuilder::new(),
            value: StringBuilder::new(),
            count: 0,
        }
    }

    /// Appends the entity keys of one record.
    fn append<K: AsRef<str>, F>(&mut self, r: &RecordRef<'_, K, F>) {
        for (k, v) in r.entity_keys {
            self.key.append_value(k.as_ref());
            self.value.append_value(v.as_ref());
            self.count += 1;
        }
        self.offsets.push(self.count);
    }

    /// The list column of the records appended so far; starts over empty.
    fn finish(&mut self) -> Result<ListArray> {
        let offsets = take_room(&mut self.offsets, &[0]);
        self.count = 0;
        let keys_struct = StructArray::try_new(
            key_fields(),
            vec![
                Arc::new(finish_strings(&mut self.key)) as ArrayRef,
                Arc::new(finish_strings(&mut self.value)),
            ],
            None,
        )?;
        Ok(ListArray::try_new(
            Arc::new(Field::new_struct("item", key_fields(), false)),
            OffsetBuffer::new(offsets.into()),
            Arc::new(keys_struct),
            None,
        )?)
    }
}

/// Builds the `features` column: per record, a list of feature structs, or null where
/// the record has no feature list.
struct FeaturesBuilder {
    offsets: Vec<i32>,
    valid: Vec<bool>,
    name: StringBuilder,
    value: Float64Builder,
    status: StringBuilder,
    time: TimestampMicrosecondBuilder,
    count: i32,
}

impl FeaturesBuilder {
    /// A builder for `n` records.
    fn with_capacity(n: usize) -> Self {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0i32);
        Self {
            offsets,
            valid: Vec::with_capacity(n),
            name: StringBuilder::new(),
            value: Float64Builder::new(),
            status: StringBuilder::new(),
            time: TimestampMicrosecondBuilder::new().with_timezone("UTC"),
            count: 0,
        }
    }

    /// Appends the features of one record.
    fn append<K, F: LoggedFeature>(&mut self, r: &RecordRef<'_, K, F>) {
        self.valid.push(r.features.is_some());
        for f in r.features.into_iter().flatten() {
            self.name.append_value(f.name());
            self.value.append_option(f.value());
            self.status.append_value(f.status());
            self.time.append_option(f.event_time_us());
            self.count += 1;
        }
        self.offsets.push(self.count);
    }

    /// The list column of the records appended so far; starts over empty.
    fn finish(&mut self) -> Result<ListArray> {
        let offsets = take_room(&mut self.offsets, &[0]);
        let valid = take_room(&mut self.valid, &[]);
        self.count = 0;
        let feat_struct = StructArray::try_new(
            feature_fields(),
            vec![
                Arc::new(finish_strings(&mut self.name)) as ArrayRef,
                Arc::new(finish_primitive(&mut self.value)),
                Arc::new(finish_strings(&mut self.status)),
                Arc::new(finish_primitive(&mut self.time)),
            ],
            None,
        )?;
        Ok(ListArray::try_new(
            Arc::new(Field::new_struct("item", feature_fields(), false)),
            OffsetBuffer::new(offsets.into()),
            Arc::new(feat_struct),
            Some(NullBuffer::from(valid)),
        )?)
    }
}

/// The Parquet path of one leaf of the `features` list (Arrow's list layout:
/// `features.list.item.<leaf>`).
fn feature_column(leaf: &str) -> ColumnPath {
    ColumnPath::new(
        ["features", "list", "item", leaf]
            .map(String::from)
            .to_vec(),
    )
}

/// The columns written without a dictionary (see [`OpenParquet::create`]).
fn no_dictionary() -> [ColumnPath; 4] {
    [
        ColumnPath::from("request_id"),
        ColumnPath::from("ts"),
        ColumnPath::from("score"),
        feature_column("value"),
    ]
}

/// The Arrow writer's file of `records`, with the settings the log used before it wrote
/// its columns itself ([`crate::parquet_write`]): the reference that the tests compare
/// the log's files with, and the baseline of `benches/encode.rs`. Not used by the log.
#[doc(hidden)]
pub fn write_parquet_arrow(path: &Path, records: &[PredictionRecord]) -> Result<()> {
    let file = File::create(path).map_err(|e| LogError::io(path, e))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(crate::parquet_write::ROW_GROUP_ROWS))
        .set_created_by("inference-mesh prediction-log".to_string());
    // Columns whose values are almost all distinct go without a dictionary: every
    // value would be hashed into it until it fills (1 MB) and the column falls
    // back to plain anyway, with the dictionary page and its indices on top.
    // Request ids (each is new; 100,000 records of 33 features wrote 5% smaller
    // files, 2% faster), the timestamp and the score (microseconds and full
    // doubles), and the features' values (request floats are all distinct). In
    // `benches/encode.rs` (served decisions of 30 features), dropping the last three
    // made the files 8% smaller (259 against 281 bytes a record) and the encoding
    // 13% faster (medians of five alternating runs: 177 against 204 ms for 32,768
    // records; every pair faster). The other strings repeat (names, statuses,
    // versions) and keep theirs: plain, the files grew 1.6-2.8x; so do the event
    // times (one per entity) and the stage times.
    let props = no_dictionary()
        .into_iter()
        .fold(props, |p, c| p.set_column_dictionary_enabled(c, false));
    // The feature list's columns carry no statistics. A row group's min and max of
    // every feature's name, value, status or time, all features mixed, prune
    // nothing, and computing them was a fifth of the encoding: 100,000 records of
    // 40 features took 3.0 against 3.7 µs a record to write (eight alternating
    // rounds), for files 0.1% smaller. `ts` and the other columns keep theirs.
    let props = feature_fields()
        .iter()
        .fold(props, |p, leaf| {
            p.set_column_statistics_enabled(feature_column(leaf.name()), EnabledStatistics::None)
        })
        .build();
    let mut writer = ArrowWriter::try_new(file, schema(), Some(props))
        .map_err(|e| LogError::parquet(path, e))?;
    let mut builder = BatchBuilder::with_capacity(ARROW_SLICE_ROWS);
    for chunk in records.chunks(ARROW_SLICE_ROWS) {
        for r in chunk {
            builder.append(&r.view());
        }
        writer
            .write(&builder.finish()?)
            .map_err(|e| LogError::parquet(path, e))?;
    }
    writer.close().map_err(|e| LogError::parquet(path, e))?;
    Ok(())
}

/// Rows handed to the Arrow writer at a time by [`write_parquet_arrow`] (as the log's
/// encoder did, so that the baseline is the work it did).
const ARROW_SLICE_ROWS: usize = 128;

/// Writes records to `path` as one Parquet file (Snappy, which every reader supports) and
/// syncs it to disk. The caller renames it into place.
pub fn write_parquet(path: &Path, records: &[PredictionRecord]) -> Result<()> {
    let mut out = crate::parquet_write::OpenParquet::create(path)?;
    for r in records {
        out.append(&r.view())?;
    }
    out.finish()
}

/// Wal frames made as the log makes them, for `benches/encode.rs`: each record's
/// features named by a name set (the serving threads' part), and the name-set frame
/// before the first record that uses it (the writer's part). Not used by the log.
#[doc(hidden)]
pub struct FrameMaker {
    names: crate::names::NameRegistry,
    defined: crate::names::Defined,
}

impl Default for FrameMaker {
    fn default() -> Self {
        Self {
            names: crate::names::NameRegistry::new(),
            defined: crate::names::Defined::new(),
        }
    }
}

impl FrameMaker {
    /// Appends the frames of `records` to `buf`, as the writer passes them on.
    pub fn push_frames(&mut self, records: &[PredictionRecord], buf: &mut Vec<u8>) {
        for r in records {
            let set = r.features.as_deref().map_or(0, |fs| self.names.id_of(fs));
            if set != 0 && !self.defined.contains(set) && self.names.push_frame(set, buf) {
                self.defined.insert(set);
            }
            // A record over a frame's 64 MiB is refused, as the log refuses it.
            let _ = crate::wal::push_sealed_frame(buf, set, &r.view());
        }
    }
}

/// The log's column writer fed as its encoder thread feeds it, for `benches/encode.rs`:
/// [`FrameEncoder::append_frames`] decodes a buffer of frames (from a [`FrameMaker`])
/// in place into the columns. Not used by the log.
#[doc(hidden)]
pub struct FrameEncoder {
    file: crate::parquet_write::OpenParquet,
    sets: crate::codec::NameSets,
}

impl FrameEncoder {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            file: crate::parquet_write::OpenParquet::create(path)?,
            sets: crate::codec::NameSets::default(),
        })
    }

    /// Decodes `frames` into the columns.
    pub fn append_frames(&mut self, frames: &[u8]) -> Result<()> {
        self.file.append_frames(frames, &mut self.sets, || {})
    }

    /// Writes the last row group and the footer, and syncs the file.
    pub fn finish(self) -> Result<()> {
        self.file.finish()
    }
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
    let bad = |name: &str| bad_type(path, name);
    let request_id = strings(path, batch, "request_id")?;
    let ts = column(path, batch, "ts")?
        .as_primitive_opt::<TimestampMicrosecondType>()
        .ok_or_else(|| bad("ts"))?;
    let model = strings(path, batch, "model")?;
    let version = strings(path, batch, "version")?;
    let role = strings(path, batch, "role")?;
    let keys = KeyColumns::read(path, batch)?;
    let features = FeatureColumns::read(path, batch)?;
    let score = column(path, batch, "score")?
        .as_primitive_opt::<Float64Type>()
        .ok_or_else(|| bad("score"))?;
    let decision = strings(path, batch, "decision")?;
    let source = strings(path, batch, "source")?;
    // Optional: files written before the column existed have none.
    let protocol = match batch.column_by_name("protocol") {
        None => None,
        Some(c) => Some(c.as_string_opt::<i32>().ok_or_else(|| bad("protocol"))?),
    };
    let stage_cols = read_stage_columns(path, batch)?;

    for i in 0..batch.num_rows() {
        let role_v: Role = role
            .value(i)
            .parse()
            .map_err(|e: String| LogError::schema(path, e))?;
        let protocol_v = match protocol {
            None => Protocol::Unknown,
            Some(p) => p
                .value(i)
                .parse()
                .map_err(|e: String| LogError::schema(path, e))?,
        };
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
            protocol: protocol_v,
            entity_keys: keys.row(i),
            features: features.row(i),
            score: score.is_valid(i).then(|| score.value(i)),
            decision: opt_str(decision, i),
            source: source.value(i).to_string(),
            stages: StageMicros::from_array(st),
        });
    }
    Ok(())
}

/// The error for a column whose Arrow type is not the one written.
fn bad_type(path: &Path, name: &str) -> LogError {
    LogError::schema(path, format!("column {name} has an unexpected type"))
}

/// The stage timing columns, in [`StageMicros::NAMES`] order.
fn read_stage_columns<'a>(path: &Path, batch: &'a RecordBatch) -> Result<Vec<&'a Int64Array>> {
    let mut stage_cols = Vec::with_capacity(StageMicros::NAMES.len());
    for c in stage_columns() {
        stage_cols.push(
            column(path, batch, c)?
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad_type(path, c))?,
        );
    }
    Ok(stage_cols)
}

/// The `entity_keys` column of a batch and its key and value children.
struct KeyColumns<'a> {
    list: &'a ListArray,
    key: &'a StringArray,
    value: &'a StringArray,
}

impl<'a> KeyColumns<'a> {
    /// Finds the column in `batch` and checks its type.
    fn read(path: &Path, batch: &'a RecordBatch) -> Result<Self> {
        let bad = |name: &str| bad_type(path, name);
        let list = column(path, batch, "entity_keys")?
            .as_list_opt::<i32>()
            .ok_or_else(|| bad("entity_keys"))?;
        let s = list
            .values()
            .as_struct_opt()
            .ok_or_else(|| bad("entity_keys"))?;
        let key = s
            .column(0)
            .as_string_opt::<i32>()
            .ok_or_else(|| bad("entity_keys.key"))?;
        let value = s
            .column(1)
            .as_string_opt::<i32>()
            .ok_or_else(|| bad("entity_keys.value"))?;
        Ok(Self { list, key, value })
    }

    /// The entity keys of row `i`.
    fn row(&self, i: usize) -> Vec<(String, String)> {
        let off = self.list.value_offsets();
        (off[i] as usize..off[i + 1] as usize)
            .map(|j| {
                (
                    self.key.value(j).to_string(),
                    self.value.value(j).to_string(),
                )
            })
            .collect()
    }
}

/// The `features` column of a batch and its struct children.
struct FeatureColumns<'a> {
    list: &'a ListArray,
    name: &'a StringArray,
    value: &'a Float64Array,
    status: &'a StringArray,
    time: &'a TimestampMicrosecondArray,
}

impl<'a> FeatureColumns<'a> {
    /// Finds the column in `batch` and checks its type.
    fn read(path: &Path, batch: &'a RecordBatch) -> Result<Self> {
        let bad = |name: &str| bad_type(path, name);
        let list = column(path, batch, "features")?
            .as_list_opt::<i32>()
            .ok_or_else(|| bad("features"))?;
        let s = list
            .values()
            .as_struct_opt()
            .ok_or_else(|| bad("features"))?;
        let name = s
            .column(0)
            .as_string_opt::<i32>()
            .ok_or_else(|| bad("features.name"))?;
        let value = s
            .column(1)
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(|| bad("features.value"))?;
        let status = s
            .column(2)
            .as_string_opt::<i32>()
            .ok_or_else(|| bad("features.status"))?;
        let time = s
            .column(3)
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| bad("features.event_time"))?;
        Ok(Self {
            list,
            name,
            value,
            status,
            time,
        })
    }

    /// The features of row `i` (`None` where the record had no feature list).
    fn row(&self, i: usize) -> Option<Vec<FeatureUsed>> {
        let off = self.list.value_offsets();
        self.list.is_valid(i).then(|| {
            (off[i] as usize..off[i + 1] as usize)
                .map(|j| FeatureUsed {
                    name: self.name.value(j).into(),
                    value: self.value.is_valid(j).then(|| self.value.value(j)),
                    // Files written before statuses were upper case read as today's.
                    status: crate::record::status::normalize(self.status.value(j)),
                    event_time_us: self.time.is_valid(j).then(|| self.time.value(j)),
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Vec<PredictionRecord> {
        Protocol::ALL
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = PredictionRecord::new(format!("r{i}"), "m", "1", Role::Primary);
                r.protocol = p;
                r.score = Some(0.5);
                r
            })
            .collect()
    }

    #[test]
    fn protocol_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        let recs = records();
        write_parquet(&path, &recs).unwrap();
        assert_eq!(read_parquet(&path).unwrap(), recs);
    }

    /// A segment written before the `protocol` column existed still reads, as `unknown`.
    #[test]
    fn a_file_without_the_protocol_column_reads_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.parquet");
        let recs = records();
        let mut batch = to_batch(&recs).unwrap();
        let idx = batch.schema().index_of("protocol").unwrap();
        batch.remove_column(idx);
        assert!(batch.schema().column_with_name("protocol").is_none());
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let back = read_parquet(&path).unwrap();
        assert_eq!(back.len(), recs.len());
        for (b, r) in back.iter().zip(&recs) {
            assert_eq!(b.protocol, Protocol::Unknown);
            assert_eq!(
                PredictionRecord {
                    protocol: r.protocol,
                    ..b.clone()
                },
                *r
            );
        }
    }

    /// A value this version does not know is a schema error, like an unknown role.
    #[test]
    fn an_unknown_protocol_value_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.parquet");
        let batch = to_batch(&records()[..1]).unwrap();
        let idx = batch.schema().index_of("protocol").unwrap();
        let mut cols = batch.columns().to_vec();
        cols[idx] = Arc::new(StringArray::from(vec!["carrier_pigeon"]));
        let batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
        let mut w =
            ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let e = read_parquet(&path).unwrap_err().to_string();
        assert!(e.contains("carrier_pigeon"), "{e}");
    }

    /// The columns of distinct values (request ids, the timestamp, the score, the
    /// features' values) are written without a dictionary; the others, whose values
    /// repeat (names, statuses, versions, event times, stage times), keep theirs. The
    /// file reads back whole.
    #[test]
    fn only_columns_of_distinct_values_go_without_a_dictionary() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        let recs: Vec<_> = (0..2_000)
            .map(|i| {
                let mut r =
                    PredictionRecord::new(format!("req-{i:08}"), "fraud", "1", Role::Primary);
                r.entity_keys = vec![("card_id".into(), format!("card-{}", i % 7))];
                r.features = Some(vec![FeatureUsed {
                    name: "amount".into(),
                    value: Some(f64::from(i) * 0.5),
                    status: "PRESENT".into(),
                    event_time_us: Some(1_700_000_000_000_000),
                }]);
                r.score = Some(f64::from(i) / 2_000.0);
                r
            })
            .collect();
        write_parquet(&path, &recs).unwrap();
        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let rg = file.metadata().row_group(0);
        let mut without: Vec<String> = (0..rg.num_columns())
            .map(|c| rg.column(c))
            .filter(|c| c.dictionary_page_offset().is_none())
            .map(|c| c.column_path().string())
            .collect();
        let mut expected = vec![
            "request_id".to_string(),
            "ts".into(),
            "score".into(),
            feature_column("value").string(),
        ];
        without.sort();
        expected.sort();
        assert_eq!(without, expected);
        assert_eq!(read_parquet(&path).unwrap(), recs);
    }

    /// The feature list's columns are written without statistics; `ts` and the other
    /// scalar columns keep theirs (readers prune row groups by time).
    #[test]
    fn only_the_feature_list_goes_without_statistics() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.parquet");
        let recs: Vec<_> = (0..100)
            .map(|i| {
                let mut r = PredictionRecord::new(format!("req-{i}"), "fraud", "1", Role::Primary);
                r.entity_keys = vec![("card_id".into(), format!("card-{i}"))];
                r.features = Some(vec![FeatureUsed {
                    name: "amount".into(),
                    value: Some(f64::from(i)),
                    status: "PRESENT".into(),
                    event_time_us: Some(r.ts_us),
                }]);
                r
            })
            .collect();
        write_parquet(&path, &recs).unwrap();
        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let rg = file.metadata().row_group(0);
        let mut without = Vec::new();
        for c in (0..rg.num_columns()).map(|c| rg.column(c)) {
            let name = c.column_path().string();
            if c.statistics().is_none() {
                without.push(name);
            }
        }
        let expected: Vec<String> = ["name", "value", "status", "event_time"]
            .map(|l| feature_column(l).string())
            .to_vec();
        assert_eq!(without, expected);
        assert_eq!(read_parquet(&path).unwrap(), recs);
    }

    /// The stage column names are part of the file format: they must stay as they are.
    #[test]
    fn stage_column_names_are_stable() {
        let expected = [
            "validate_us",
            "features_us",
            "preprocess_us",
            "queue_us",
            "compute_us",
            "postprocess_us",
            "total_us",
        ];
        let derived: Vec<&str> = stage_columns().iter().map(String::as_str).collect();
        assert_eq!(derived, expected);
        let schema = schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(&names[names.len() - expected.len()..], &expected);
    }
}
