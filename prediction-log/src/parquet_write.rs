//! Segments' Parquet files written column by column, straight from the records.
//!
//! The log's schema is fixed, so its files need none of a general writer's machinery:
//! no Arrow arrays built and then taken apart again, no dictionary that hashes every
//! feature name of every record. Each of the 22 leaf columns keeps its page's levels and
//! values as they arrive; a column's page is encoded (RLE and bit-packed levels and
//! dictionary indices, plain values), compressed with Snappy and set aside once it holds
//! [`PAGE_BYTES`], and a row group's column chunks go to the file through the
//! `parquet` crate's own file writer, which writes the page headers, the footer and the
//! Arrow schema. The file reads exactly as the Arrow writer's did (the tests read both
//! back and compare their metadata; DuckDB reads the log's files in the end-to-end
//! tests), for about 60% of its CPU (`cargo bench -p mesh-prediction-log --bench encode`
//! runs both).
//!
//! Dictionaries: a repeated string (a feature's name, its status, the model, an entity
//! key's name) is looked up first where the previous record had it, by comparing bytes
//! (the feature at position 7 of this record is almost always the one at position 7 of
//! the last), and hashed only when that misses. An event time equal to the one before
//! it in the record (each feature of one entity's row) takes the index just pushed, and
//! integers under [`SMALL_INTS`] (stage times) are found by indexing a table. A record
//! decoded from a wal frame (the encoder thread's) goes faster still: feature names
//! given by a name set take the indices that set's last record took in this row group
//! (one copy, no compare), and a status known by its position in [`status::ALL`] takes
//! that status's index. Strings from requests (entity key
//! values) use the standard library's keyed hash, so a caller cannot choose colliding
//! keys; the integers (event and stage times, measured here) a multiplicative one. A
//! column whose dictionary passes [`DICT_BYTES`] in a row group goes on in plain encoding
//! for the rest of it, so memory stays bounded whatever the values.

use crate::codec::put_var;
use crate::error::{LogError, Result};
use crate::record::{status, LoggedFeature, RecordRef};
use crate::wal::PacedWrite;
use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result as PqResult};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::{ColumnDescPtr, SchemaDescriptor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Rows per row group: large enough for good compression, small enough that readers can
/// stream a big segment, and that the open segment's writer holds (and writes out) one
/// row group of a few MB at a time rather than the whole segment when it closes.
pub(crate) const ROW_GROUP_ROWS: usize = 16 * 1024;

/// A column's page is encoded and compressed once its values, dictionary indices and
/// levels take this much (a column of nulls has levels only): Snappy's own block size, so each page is one short spell of work
/// (tens of µs) rather than one per row group.
const PAGE_BYTES: usize = 64 * 1024;

/// Past this many bytes of dictionary (plain encoded) in one row group, a column goes on
/// without it: the `parquet` crate's default limit.
const DICT_BYTES: usize = 1024 * 1024;

/// A string's min or max statistic is cut to this many bytes (the max then raised to
/// stay an upper bound), as the `parquet` crate does.
const STATS_MAX_LEN: usize = 64;

/// The min statistic of a string column: `v`, or its first [`STATS_MAX_LEN`] bytes (at a
/// character's boundary); whether it was cut.
fn truncate_min(v: Vec<u8>) -> (Vec<u8>, bool) {
    if v.len() <= STATS_MAX_LEN {
        return (v, false);
    }
    let cut = match std::str::from_utf8(&v) {
        Ok(s) => (1..=STATS_MAX_LEN).rfind(|&x| s.is_char_boundary(x)),
        Err(_) => Some(STATS_MAX_LEN),
    };
    match cut {
        Some(n) => (v[..n].to_vec(), true),
        None => (v, false),
    }
}

/// The max statistic of a string column: `v`, or a prefix of at most [`STATS_MAX_LEN`]
/// bytes whose last character is raised by one, so that it still bounds `v` (as a
/// string: a character never grows in bytes); `v` itself where no such prefix exists.
fn truncate_max(v: Vec<u8>) -> (Vec<u8>, bool) {
    if v.len() <= STATS_MAX_LEN {
        return (v, false);
    }
    let raised = match std::str::from_utf8(&v) {
        Ok(s) => (STATS_MAX_LEN.saturating_sub(3)..=STATS_MAX_LEN)
            .rfind(|&x| s.is_char_boundary(x))
            .and_then(|n| {
                let prefix = &s[..n];
                prefix.char_indices().rev().find_map(|(at, c)| {
                    let next =
                        char::from_u32(c as u32 + 1).filter(|n| n.len_utf8() == c.len_utf8())?;
                    let mut out = prefix.as_bytes()[..at].to_vec();
                    out.extend_from_slice(next.encode_utf8(&mut [0; 4]).as_bytes());
                    Some(out)
                })
            }),
        Err(_) => {
            let mut b = v[..STATS_MAX_LEN].to_vec();
            // Raise the last byte that can be, dropping the ones that overflow.
            while let Some(last) = b.pop() {
                if last < u8::MAX {
                    b.push(last + 1);
                    break;
                }
            }
            (!b.is_empty()).then_some(b)
        }
    };
    match raised {
        Some(r) => (r, true),
        None => (v, false),
    }
}

/// The leaf columns in file order.
mod leaf {
    pub const REQUEST_ID: usize = 0;
    pub const TS: usize = 1;
    pub const MODEL: usize = 2;
    pub const VERSION: usize = 3;
    pub const ROLE: usize = 4;
    pub const KEY: usize = 5;
    pub const KEY_VALUE: usize = 6;
    pub const F_NAME: usize = 7;
    pub const F_VALUE: usize = 8;
    pub const F_STATUS: usize = 9;
    pub const F_TIME: usize = 10;
    pub const SCORE: usize = 11;
    pub const DECISION: usize = 12;
    pub const SOURCE: usize = 13;
    pub const PROTOCOL: usize = 14;
    pub const STAGES: usize = 15;
    pub const COUNT: usize = 22;
}

/// How a leaf's values are encoded, and its levels: (path, kind, max definition level,
/// max repetition level, statistics). Checked against the schema's descriptors when a
/// file is created, so a change to the Arrow schema that this table does not follow is
/// an error at once, never a file that reads wrong.
const LEAVES: [(&str, Kind, i16, i16, bool); leaf::COUNT] = [
    ("request_id", Kind::PlainBytes, 0, 0, true),
    ("ts", Kind::PlainI64, 0, 0, true),
    ("model", Kind::DictBytes, 0, 0, true),
    ("version", Kind::DictBytes, 0, 0, true),
    ("role", Kind::DictBytes, 0, 0, true),
    ("entity_keys.list.item.key", Kind::DictBytes, 1, 1, true),
    ("entity_keys.list.item.value", Kind::DictBytes, 1, 1, true),
    ("features.list.item.name", Kind::DictBytes, 2, 1, false),
    ("features.list.item.value", Kind::PlainF64, 3, 1, false),
    ("features.list.item.status", Kind::DictBytes, 2, 1, false),
    ("features.list.item.event_time", Kind::DictI64, 3, 1, false),
    ("score", Kind::PlainF64, 1, 0, true),
    ("decision", Kind::DictBytes, 1, 0, true),
    ("source", Kind::DictBytes, 0, 0, true),
    ("protocol", Kind::DictBytes, 0, 0, true),
    ("validate_us", Kind::DictI64, 0, 0, true),
    ("features_us", Kind::DictI64, 0, 0, true),
    ("preprocess_us", Kind::DictI64, 0, 0, true),
    ("queue_us", Kind::DictI64, 0, 0, true),
    ("compute_us", Kind::DictI64, 0, 0, true),
    ("postprocess_us", Kind::DictI64, 0, 0, true),
    ("total_us", Kind::DictI64, 0, 0, true),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Strings, plain (`request_id`: every one is new).
    PlainBytes,
    /// Strings through a dictionary.
    DictBytes,
    /// Integers, plain (`ts`: microseconds, almost all distinct).
    PlainI64,
    /// Integers through a dictionary (event times repeat per entity, stage times are
    /// small).
    DictI64,
    /// Doubles, plain (scores and feature values are almost all distinct).
    PlainF64,
}

/// The Parquet schema of [`crate::schema`] (the Arrow writer's mapping of it).
fn descriptor() -> Result<Arc<SchemaDescriptor>> {
    static DESCR: OnceLock<std::result::Result<Arc<SchemaDescriptor>, String>> = OnceLock::new();
    DESCR
        .get_or_init(|| {
            let d = parquet::arrow::ArrowSchemaConverter::new()
                .convert(&crate::parquet_io::schema())
                .map_err(|e| e.to_string())?;
            check_leaves(&d)?;
            Ok(Arc::new(d))
        })
        .clone()
        .map_err(LogError::Config)
}

/// Every leaf of `d` is the one [`LEAVES`] describes, in its order.
fn check_leaves(d: &SchemaDescriptor) -> std::result::Result<(), String> {
    if d.num_columns() != leaf::COUNT {
        return Err(format!(
            "the log's Parquet schema has {} leaf columns, its writer knows {}",
            d.num_columns(),
            leaf::COUNT
        ));
    }
    for (i, (path, _, def, rep, _)) in LEAVES.iter().enumerate() {
        let c = d.column(i);
        let (got_path, got_def, got_rep) =
            (c.path().string(), c.max_def_level(), c.max_rep_level());
        if got_path != *path || got_def != *def || got_rep != *rep {
            return Err(format!(
                "the log's Parquet leaf {i} is {got_path} (levels {got_def}/{got_rep}); its writer expects {path} ({def}/{rep})"
            ));
        }
    }
    Ok(())
}

/// A multiplicative hash for the integer dictionaries (values the mesh measures, not
/// ones a caller sends).
#[derive(Default)]
struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_i64(&mut self, v: i64) {
        // Fibonacci hashing: the high bits, which hashbrown uses, mix every input bit.
        self.0 = (v as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(32);
    }
}

/// A column's dictionary for one row group: the distinct values in the order first
/// seen, their index, and per position in a record's list the index last used there.
enum Dict {
    /// `plain` is the dictionary page's body as it grows (each value's length, then
    /// its bytes), and `spans` where each value's bytes are in it: the hint of a
    /// feature's name is checked against bytes kept together, not one allocation each.
    Bytes {
        map: HashMap<Box<[u8]>, u32>,
        plain: Vec<u8>,
        spans: Vec<(u32, u32)>,
    },
    /// `small`: the index of each value under [`SMALL_INTS`] (`u32::MAX`: none yet),
    /// looked up by the value itself (stage times in µs, mostly), the rest in `map`.
    Int {
        map: HashMap<i64, u32, BuildHasherDefault<IntHasher>>,
        small: Vec<u32>,
        values: Vec<i64>,
    },
}

/// Name sets whose names' dictionary indices a row group keeps (a server has a name
/// set a model version; the rest go in name by name).
const SETS_KEPT: usize = 16;

/// Integers from 0 up to this (exclusive) are found in a dictionary by indexing a table
/// rather than hashing: the stage times of a fast decision, in µs. At most 16 KiB a
/// column, grown to the largest such value seen.
const SMALL_INTS: i64 = 4096;

impl Dict {
    fn len(&self) -> usize {
        match self {
            Dict::Bytes { spans, .. } => spans.len(),
            Dict::Int { values, .. } => values.len(),
        }
    }

    fn clear(&mut self) {
        match self {
            Dict::Bytes { map, plain, spans } => {
                map.clear();
                plain.clear();
                spans.clear();
            }
            Dict::Int { map, small, values } => {
                map.clear();
                small.clear();
                values.clear();
            }
        }
    }

    /// The dictionary page's body: its values, plain.
    fn plain(&self) -> Cow<'_, [u8]> {
        match self {
            Dict::Bytes { plain, .. } => Cow::Borrowed(plain),
            Dict::Int { values, .. } => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// Bytes of the dictionary page's body (what [`DICT_BYTES`] bounds).
    fn plain_len(&self) -> usize {
        match self {
            Dict::Bytes { plain, .. } => plain.len(),
            Dict::Int { values, .. } => 8 * values.len(),
        }
    }
}

/// Min, max and nulls of a column chunk, for its statistics.
#[derive(Default)]
struct Stats {
    nulls: u64,
    bytes: Option<(Vec<u8>, Vec<u8>)>,
    int: Option<(i64, i64)>,
    float: Option<(f64, f64)>,
}

impl Stats {
    fn bytes(&mut self, v: &[u8]) {
        match &mut self.bytes {
            None => self.bytes = Some((v.to_vec(), v.to_vec())),
            Some((min, max)) => {
                if v < min.as_slice() {
                    min.clear();
                    min.extend_from_slice(v);
                } else if v > max.as_slice() {
                    max.clear();
                    max.extend_from_slice(v);
                }
            }
        }
    }

    fn int(&mut self, v: i64) {
        self.int = Some(match self.int {
            None => (v, v),
            Some((min, max)) => (min.min(v), max.max(v)),
        });
    }

    /// NaN takes no part (the Parquet spec's order for floats); a zero min is -0.0 and
    /// a zero max +0.0, as the spec asks.
    fn float(&mut self, v: f64) {
        if v.is_nan() {
            return;
        }
        self.float = Some(match self.float {
            None => (v, v),
            Some((min, max)) => (min.min(v), max.max(v)),
        });
    }

    fn take(&mut self, kind: Kind) -> Statistics {
        let nulls = Some(std::mem::take(&mut self.nulls));
        match kind {
            Kind::PlainBytes | Kind::DictBytes => match self.bytes.take() {
                None => Statistics::byte_array(None, None, None, nulls, false),
                Some((min, max)) => {
                    let (min, min_cut) = truncate_min(min);
                    let (max, max_cut) = truncate_max(max);
                    Statistics::ByteArray(
                        ValueStatistics::new(
                            Some(min.into()),
                            Some(max.into()),
                            None,
                            nulls,
                            false,
                        )
                        .with_min_is_exact(!min_cut)
                        .with_max_is_exact(!max_cut),
                    )
                }
            },
            Kind::PlainI64 | Kind::DictI64 => {
                let (min, max) = self.int.take().unzip();
                Statistics::int64(min, max, None, nulls, true)
            }
            Kind::PlainF64 => {
                let (min, max) = self.float.take().unzip();
                let min = min.map(|m: f64| if m == 0.0 { -0.0 } else { m });
                let max = max.map(|m: f64| if m == 0.0 { 0.0 } else { m });
                Statistics::double(min, max, None, nulls, true)
            }
        }
    }
}

fn put_plain_bytes(out: &mut Vec<u8>, v: &[u8]) {
    // A string's length is bounded far below 4 GiB by the frame that carried it.
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    out.extend_from_slice(v);
}

/// A page's levels (definition or repetition), RLE-encoded as they arrive: a run of
/// equal levels grows a count, a change writes the run out. The levels of a record's
/// list repeat (a repetition level of 0, then 1 for each further item; one definition
/// level for all), so the runs are long and this is a compare and an add per entry.
#[derive(Default)]
struct Levels {
    runs: Vec<u8>,
    level: u8,
    count: u64,
}

impl Levels {
    #[inline]
    fn push(&mut self, level: u8) {
        if level == self.level && self.count > 0 {
            self.count += 1;
        } else {
            self.end_run();
            self.level = level;
            self.count = 1;
        }
    }

    /// `n` entries at `level`: one add where the run goes on.
    #[inline]
    fn push_n(&mut self, level: u8, n: usize) {
        if n == 0 {
            return;
        }
        if level != self.level || self.count == 0 {
            self.end_run();
            self.level = level;
        }
        self.count += n as u64;
    }

    fn end_run(&mut self) {
        if self.count > 0 {
            put_var(&mut self.runs, self.count << 1);
            // Every max level here is under 256: the run's value is one byte.
            self.runs.push(self.level);
            self.count = 0;
        }
    }

    /// Writes the page's levels as a version 1 data page holds them (their byte length,
    /// 4 bytes little endian, then the runs) and starts over.
    fn write_to(&mut self, out: &mut Vec<u8>) {
        self.end_run();
        out.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.runs);
        self.runs.clear();
    }
}

/// Snappy's compressor; one for all the columns (its table is 2 KB, and a column's hot
/// fields are best kept close together).
type Snappy = snap::raw::Encoder;

/// One leaf column: its current page's levels and values, and its chunk's pages so far.
struct Column {
    descr: ColumnDescPtr,
    kind: Kind,
    max_def: i16,
    max_rep: i16,
    with_stats: bool,
    /// The page's levels.
    def: Levels,
    rep: Levels,
    /// Entries in the page (levels, or values of a required flat column).
    entries: usize,
    /// The page's plain values.
    plain: Vec<u8>,
    /// The page's dictionary indices.
    idx: Vec<u32>,
    dict: Option<Dict>,
    /// Per position in a record's list, the dictionary index used there last.
    hints: Vec<u32>,
    /// Feature names: the dictionary indices of a name set's names in this row group,
    /// for the records of that set (the Arc kept, so its identity stays its own), at
    /// most [`SETS_KEPT`].
    by_set: Vec<(crate::codec::Names, Vec<u32>)>,
    /// Statuses: the dictionary index of each of [`status::ALL`] in this row group
    /// (`u32::MAX`: not in it yet), for features that give their status's position.
    by_status: [u32; status::ALL.len()],
    /// The dictionary filled up in this row group: plain from here on.
    fell_back: bool,
    stats: Stats,
    /// The chunk's data pages, headers included, as written.
    pages: TrackedWrite<Vec<u8>>,
    /// The last chunk's buffer, back from the file writer, for the next.
    spare: Vec<u8>,
    chunk_entries: i64,
    chunk_uncompressed: i64,
    chunk_compressed: i64,
    had_dict_page: bool,
    had_plain_page: bool,
    /// Scratch buffer for a page's body.
    body: Vec<u8>,
}

impl Column {
    fn new(
        descr: ColumnDescPtr,
        (kind, max_def, max_rep, with_stats): (Kind, i16, i16, bool),
    ) -> Self {
        let dict = match kind {
            Kind::DictBytes => Some(Dict::Bytes {
                map: HashMap::new(),
                plain: Vec::new(),
                spans: Vec::new(),
            }),
            Kind::DictI64 => Some(Dict::Int {
                map: HashMap::default(),
                small: Vec::new(),
                values: Vec::new(),
            }),
            _ => None,
        };
        Self {
            descr,
            kind,
            max_def,
            max_rep,
            with_stats,
            def: Levels::default(),
            rep: Levels::default(),
            entries: 0,
            plain: Vec::new(),
            idx: Vec::new(),
            dict,
            hints: Vec::new(),
            by_set: Vec::new(),
            by_status: [u32::MAX; status::ALL.len()],
            fell_back: false,
            stats: Stats::default(),
            pages: TrackedWrite::new(Vec::new()),
            spare: Vec::new(),
            chunk_entries: 0,
            chunk_uncompressed: 0,
            chunk_compressed: 0,
            had_dict_page: false,
            had_plain_page: false,
            body: Vec::new(),
        }
    }

    /// The levels of one entry (nothing for a flat required column).
    #[inline(always)]
    fn levels(&mut self, def: i16, rep: i16) {
        if self.max_def > 0 {
            self.def.push(def as u8);
        }
        if self.max_rep > 0 {
            self.rep.push(rep as u8);
        }
        self.entries += 1;
    }

    /// The repetition levels of a list of `n` (at least 1) items, a 0 then a 1 for
    /// each further item, and, where `def` is given, their definition levels, all at
    /// `def`: a record's list in a few adds rather than two pushes an item.
    #[inline]
    fn list_levels(&mut self, n: usize, def: Option<u8>) {
        self.rep.push(0);
        self.rep.push_n(1, n - 1);
        if let Some(d) = def {
            self.def.push_n(d, n);
        }
        self.entries += n;
    }

    /// An entry without a value: a null at `def`, or an empty or null list.
    #[inline]
    fn absent(&mut self, def: i16) {
        self.levels(def, 0);
        if def == self.max_def - 1 || self.max_rep == 0 {
            self.stats.nulls += 1;
        }
    }

    /// A string at position `slot` of its record's list (0 for a flat column).
    #[inline]
    fn bytes(&mut self, slot: usize, v: &[u8], rep: i16) {
        self.levels(self.max_def, rep);
        self.put_bytes(slot, v);
    }

    /// The value of a string entry whose levels are in (see [`Column::bytes`]).
    #[inline]
    fn put_bytes(&mut self, slot: usize, v: &[u8]) {
        if let (false, Some(Dict::Bytes { map, plain, spans })) = (self.fell_back, &mut self.dict) {
            if let Some(&h) = self.hints.get(slot) {
                if let Some(&(at, len)) = spans.get(h as usize) {
                    if plain
                        .get(at as usize..(at + len) as usize)
                        .is_some_and(|s| same(s, v))
                    {
                        self.idx.push(h);
                        return;
                    }
                }
            }
            let i = match map.get(v) {
                Some(&i) => i,
                None => {
                    let i = spans.len() as u32;
                    map.insert(v.into(), i);
                    put_plain_bytes(plain, v);
                    // Under DICT_BYTES plus one value: far below 4 GiB.
                    spans.push(((plain.len() - v.len()) as u32, v.len() as u32));
                    if self.with_stats {
                        self.stats.bytes(v);
                    }
                    i
                }
            };
            remember(&mut self.hints, slot, i);
            self.idx.push(i);
            return;
        }
        put_plain_bytes(&mut self.plain, v);
        if self.with_stats {
            self.stats.bytes(v);
        }
    }

    /// The values of a record's feature names when they are those of name set `set`
    /// and the set's indices in this row group's dictionary are known: pushed in one
    /// copy. False when the caller is to put the names one by one.
    #[inline]
    fn put_set(&mut self, set: Option<&crate::codec::Names>) -> bool {
        let Some(set) = set else { return false };
        if self.fell_back || self.with_stats {
            return false;
        }
        match self.by_set.iter().find(|(s, _)| Arc::ptr_eq(s, set)) {
            Some((_, ix)) => {
                self.idx.extend_from_slice(ix);
                true
            }
            None => false,
        }
    }

    /// After a record's feature names of name set `set` went in one by one, from index
    /// entry `from` on: keeps their dictionary indices for the set's next records.
    fn keep_set(&mut self, set: Option<&crate::codec::Names>, from: usize) {
        let Some(set) = set else { return };
        let ix = self.idx.get(from..).unwrap_or_default();
        // All of them through the dictionary (not fallen back to plain values).
        if !self.fell_back
            && !self.with_stats
            && ix.len() == set.len()
            && self.by_set.len() < SETS_KEPT
        {
            let ix = ix.to_vec();
            self.by_set.push((set.clone(), ix));
        }
    }

    /// The status of a feature at position `slot` of its record's list: by its
    /// position in [`status::ALL`] when the feature gives it and this row group's
    /// dictionary has it, else as [`Column::put_bytes`].
    #[inline]
    fn put_status(&mut self, slot: usize, f: &impl LoggedFeature) {
        let known = f
            .status_index()
            .map(usize::from)
            .filter(|&k| k < self.by_status.len() && !self.fell_back && !self.with_stats);
        let Some(k) = known else {
            return self.put_bytes(slot, f.status().as_bytes());
        };
        match self.by_status[k] {
            u32::MAX => {
                let at = self.idx.len();
                self.put_bytes(slot, f.status().as_bytes());
                if let Some(&i) = self.idx.get(at) {
                    self.by_status[k] = i;
                }
            }
            i => self.idx.push(i),
        }
    }

    #[inline]
    fn int(&mut self, slot: usize, v: i64, rep: i16) {
        self.levels(self.max_def, rep);
        self.put_int(slot, v);
    }

    /// The value of an integer entry whose levels are in (see [`Column::int`]).
    #[inline]
    fn put_int(&mut self, slot: usize, v: i64) {
        if self.with_stats {
            self.stats.int(v);
        }
        if let (false, Some(Dict::Int { map, small, values })) = (self.fell_back, &mut self.dict) {
            if let Some(&h) = self.hints.get(slot) {
                if values.get(h as usize) == Some(&v) {
                    self.idx.push(h);
                    return;
                }
            }
            let i = if (0..SMALL_INTS).contains(&v) {
                let at = v as usize;
                if at >= small.len() {
                    small.resize(at + 1, u32::MAX);
                }
                if small[at] == u32::MAX {
                    values.push(v);
                    small[at] = (values.len() - 1) as u32;
                }
                small[at]
            } else {
                *map.entry(v).or_insert_with(|| {
                    values.push(v);
                    (values.len() - 1) as u32
                })
            };
            remember(&mut self.hints, slot, i);
            self.idx.push(i);
            return;
        }
        self.plain.extend_from_slice(&v.to_le_bytes());
    }

    /// [`Column::put_int`] for a value that often repeats the one before it in the
    /// record (`last`, None at the record's start): the features of one entity's row
    /// share its event time. A repeat takes the index just pushed, with no lookup.
    #[inline]
    fn put_int_again(&mut self, slot: usize, v: i64, last: &mut Option<i64>) {
        if *last == Some(v) && !self.fell_back && !self.with_stats {
            if let Some(&i) = self.idx.last() {
                self.idx.push(i);
                return;
            }
        }
        self.put_int(slot, v);
        *last = Some(v);
    }

    #[inline]
    fn float(&mut self, v: f64, rep: i16) {
        self.levels(self.max_def, rep);
        self.put_float(v);
    }

    /// The value of a float entry whose levels are in (see [`Column::float`]).
    #[inline]
    fn put_float(&mut self, v: f64) {
        if self.with_stats {
            self.stats.float(v);
        }
        self.plain.extend_from_slice(&v.to_le_bytes());
    }

    /// The dictionary outgrew [`DICT_BYTES`]: the column falls back to plain values.
    fn dict_full(&self) -> bool {
        !self.fell_back
            && self
                .dict
                .as_ref()
                .is_some_and(|d| d.plain_len() > DICT_BYTES)
    }

    /// After a record: the page is full, or the dictionary is, and is to be cut before
    /// the next record goes in ([`Column::cut_due_page`]).
    fn page_due(&self) -> bool {
        self.dict_full()
            || self.plain.len() + self.idx.len() + self.def.runs.len() + self.rep.runs.len()
                >= PAGE_BYTES
    }

    /// Cuts the page that [`Column::page_due`] says is due (and falls back to plain
    /// values if the dictionary is why).
    fn cut_due_page(&mut self, snappy: &mut Snappy) -> PqResult<()> {
        let fall_back = self.dict_full();
        self.cut_page(snappy)?;
        if fall_back {
            self.fell_back = true;
        }
        Ok(())
    }

    /// Encodes, compresses and sets aside the page (a version 1 data page: repetition
    /// levels, definition levels, then the values; all of it compressed).
    fn cut_page(&mut self, snappy: &mut Snappy) -> PqResult<()> {
        if self.entries == 0 {
            return Ok(());
        }
        let body = &mut self.body;
        body.clear();
        if self.max_rep > 0 {
            self.rep.write_to(body);
        }
        if self.max_def > 0 {
            self.def.write_to(body);
        }
        // A page of nulls only, in a column with a dictionary, is a dictionary page of
        // no index (and a chunk of nulls only has an empty dictionary), as the Arrow
        // writer writes them.
        let dictionary = !self.idx.is_empty()
            || (self.dict.is_some() && !self.fell_back && self.plain.is_empty());
        let encoding = if dictionary {
            let entries = self.dict.as_ref().map_or(0, Dict::len);
            let bw = bit_width(entries.saturating_sub(1) as u64);
            body.push(bw);
            hybrid(&self.idx, bw, body);
            self.had_dict_page = true;
            Encoding::RLE_DICTIONARY
        } else {
            body.extend_from_slice(&self.plain);
            self.had_plain_page = true;
            Encoding::PLAIN
        };
        let compressed = snappy
            .compress_vec(body)
            .map_err(|e| ParquetError::General(format!("Snappy failed on a log page: {e}")))?;
        let page = Page::DataPage {
            buf: Bytes::from(compressed),
            num_values: self.entries as u32,
            encoding,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        };
        let spec = SerializedPageWriter::new(&mut self.pages)
            .write_page(CompressedPage::new(page, body.len()))?;
        self.chunk_entries += self.entries as i64;
        self.chunk_uncompressed += spec.uncompressed_size as i64;
        self.chunk_compressed += spec.compressed_size as i64;
        self.plain.clear();
        self.idx.clear();
        self.entries = 0;
        Ok(())
    }

    /// The column chunk of the row group (dictionary page first), and its metadata;
    /// leaves the column empty for the next row group.
    fn finish_chunk(
        &mut self,
        rows: usize,
        snappy: &mut Snappy,
    ) -> PqResult<(Bytes, ColumnCloseResult)> {
        self.cut_page(snappy)?;
        let mut head = TrackedWrite::new(Vec::new());
        let mut dictionary_offset = None;
        let (mut uncompressed, mut compressed) = (self.chunk_uncompressed, self.chunk_compressed);
        if let Some(dict) = self.dict.as_ref().filter(|_| self.had_dict_page) {
            let plain = dict.plain();
            let buf = snappy.compress_vec(&plain).map_err(|e| {
                ParquetError::General(format!("Snappy failed on a log dictionary: {e}"))
            })?;
            let page = Page::DictionaryPage {
                buf: Bytes::from(buf),
                num_values: dict.len() as u32,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            };
            let spec = SerializedPageWriter::new(&mut head)
                .write_page(CompressedPage::new(page, plain.len()))?;
            uncompressed += spec.uncompressed_size as i64;
            compressed += spec.compressed_size as i64;
            dictionary_offset = Some(0);
        }
        let data_offset = head.bytes_written() as i64;
        // The chunk is built in the buffer the last one came back in, and the pages'
        // buffer keeps its room: fresh memory for each row group was a tenth of the
        // encoding (the kernel zeroing pages, and copies as buffers grew).
        let mut chunk = std::mem::take(&mut self.spare);
        chunk.clear();
        chunk.extend_from_slice(&head.into_inner()?);
        // A `TrackedWrite` buffers: what it holds goes to its vector first.
        std::io::Write::flush(&mut self.pages)?;
        chunk.extend_from_slice(self.pages.inner());
        self.pages = TrackedWrite::new(std::mem::take(self.pages.inner_mut()));
        self.pages.inner_mut().clear();

        let mut encodings = vec![Encoding::RLE];
        if self.had_plain_page || self.had_dict_page {
            encodings.push(Encoding::PLAIN);
        }
        if self.had_dict_page {
            encodings.push(Encoding::RLE_DICTIONARY);
        }
        let mut meta = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(Compression::SNAPPY)
            .set_encodings(encodings)
            .set_num_values(self.chunk_entries)
            .set_total_compressed_size(compressed)
            .set_total_uncompressed_size(uncompressed)
            .set_data_page_offset(data_offset)
            .set_dictionary_page_offset(dictionary_offset);
        if self.with_stats {
            meta = meta.set_statistics(self.stats.take(self.kind));
        }
        let metadata = meta.build()?;

        // Ready for the next row group.
        if let Some(d) = self.dict.as_mut() {
            d.clear();
        }
        self.hints.clear();
        self.by_set.clear();
        self.by_status = [u32::MAX; status::ALL.len()];
        self.fell_back = false;
        self.stats = Stats::default();
        self.chunk_entries = 0;
        self.chunk_uncompressed = 0;
        self.chunk_compressed = 0;
        self.had_dict_page = false;
        self.had_plain_page = false;

        let close = ColumnCloseResult {
            bytes_written: chunk.len() as u64,
            rows_written: rows as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        Ok((Bytes::from(chunk), close))
    }
}

/// Notes that the value at position `slot` of a record's list was dictionary entry `i`.
fn remember(hints: &mut Vec<u32>, slot: usize, i: u32) {
    if slot >= hints.len() {
        hints.resize(slot + 1, u32::MAX);
    }
    hints[slot] = i;
}

/// `a == b`, inline for the short strings of a dictionary's hints (a call to `memcmp`
/// for every feature's name and status was a tenth of the encoding).
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    if n > 32 {
        return a == b;
    }
    if n < 8 {
        if n < 4 {
            return a.iter().zip(b).all(|(x, y)| x == y);
        }
        let half =
            |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
        return half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4);
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let mut at = 0;
    while at + 8 <= n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}

/// Bits for values up to `max`.
fn bit_width(max: u64) -> u8 {
    (64 - max.leading_zeros()) as u8
}

/// Length of the run of equal values at the start of `v`, counting at most `cap`.
#[inline]
fn run<T: PartialEq + Copy>(v: &[T], cap: usize) -> usize {
    let first = v[0];
    v.iter().take(cap).take_while(|&&x| x == first).count()
}

/// Parquet's RLE / bit-packing hybrid of `v`, every value under `1 << bw`: runs of eight
/// or more equal values as one run, the rest bit-packed in groups of eight (the last
/// group padded with zeros; the page header gives the count).
fn hybrid<T: PartialEq + Copy + Into<u64>>(v: &[T], bw: u8, out: &mut Vec<u8>) {
    let width = usize::from(bw).div_ceil(8);
    let mut i = 0;
    while i < v.len() {
        let r = run(&v[i..], usize::MAX);
        if r >= 8 {
            put_var(out, (r as u64) << 1);
            out.extend_from_slice(&v[i].into().to_le_bytes()[..width]);
            i += r;
            continue;
        }
        // Groups of eight until a run of eight starts at a group's boundary (at most 63
        // groups, so the run's header is one byte).
        let start = i;
        let mut groups = 0usize;
        loop {
            groups += 1;
            i += 8;
            if i >= v.len() || groups == 63 || run(&v[i..], 8) >= 8 {
                break;
            }
        }
        out.push(((groups << 1) | 1) as u8);
        let values = &v[start..i.min(v.len())];
        let mut acc = 0u64;
        let mut bits = 0u32;
        for k in 0..groups * 8 {
            let x = values.get(k).map_or(0, |&x| x.into());
            acc |= x << bits;
            bits += u32::from(bw);
            while bits >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                bits -= 8;
            }
        }
    }
}

/// A Parquet file written while its segment is open: each record goes into the column
/// buffers as it arrives, each column's page is encoded as it fills, and each row group
/// goes to the file once it has [`ROW_GROUP_ROWS`], so that closing it only has the last
/// pages, the last row group and the footer left to write.
pub(crate) struct OpenParquet {
    path: PathBuf,
    writer: SerializedFileWriter<BufWriter<PacedWrite<File>>>,
    columns: Vec<Column>,
    rows: usize,
    snappy: Snappy,
}

impl OpenParquet {
    /// Creates (or truncates) the file at `path`.
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let descr = descriptor()?;
        let file = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| LogError::io(path, e))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by("inference-mesh prediction-log".to_string())
            .build();
        // The Arrow schema, as the Arrow writer stores it: readers get back the
        // timestamps' "UTC" zone and the list fields as written.
        parquet::arrow::add_encoded_arrow_schema_to_metadata(
            &crate::parquet_io::schema(),
            &mut props,
        );
        let writer = SerializedFileWriter::new(
            BufWriter::with_capacity(256 * 1024, PacedWrite(file)),
            descr.root_schema_ptr(),
            Arc::new(props),
        )
        .map_err(|e| LogError::parquet(path, e))?;
        let columns = LEAVES
            .iter()
            .enumerate()
            .map(|(i, &(_, kind, def, rep, stats))| {
                Column::new(descr.column(i), (kind, def, rep, stats))
            })
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            columns,
            rows: 0,
            snappy: Snappy::new(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record; a full row group goes to the file.
    pub(crate) fn append<K: AsRef<str>, F: LoggedFeature>(
        &mut self,
        r: &RecordRef<'_, K, F>,
    ) -> Result<()> {
        self.push(r, None)?;
        self.cut_due_pages()?;
        if self.row_group_full() {
            self.write_row_group()?;
        }
        Ok(())
    }

    /// The column buffers hold a whole row group: the next record waits for
    /// [`OpenParquet::write_row_group`].
    pub(crate) fn row_group_full(&self) -> bool {
        self.rows >= ROW_GROUP_ROWS
    }

    /// Puts one record into the column buffers; a page it fills is cut after it
    /// ([`OpenParquet::cut_due_pages`], or step by step in `append_frames_from`), and the
    /// row group goes to the file apart.
    /// `names`: the name set that names the record's features, in order, when it has
    /// one (a record from a wal frame).
    fn push<K: AsRef<str>, F: LoggedFeature>(
        &mut self,
        r: &RecordRef<'_, K, F>,
        names: Option<&crate::codec::Names>,
    ) -> Result<()> {
        let c = &mut self.columns;
        c[leaf::REQUEST_ID].bytes(0, r.request_id.as_bytes(), 0);
        c[leaf::TS].int(0, r.ts_us, 0);
        c[leaf::MODEL].bytes(0, r.model.as_bytes(), 0);
        c[leaf::VERSION].bytes(0, r.version.as_bytes(), 0);
        c[leaf::ROLE].bytes(0, r.role.as_str().as_bytes(), 0);
        if r.entity_keys.is_empty() {
            // A required list, empty.
            c[leaf::KEY].absent(0);
            c[leaf::KEY_VALUE].absent(0);
        }
        for (j, (k, v)) in r.entity_keys.iter().enumerate() {
            let rep = i16::from(j > 0);
            c[leaf::KEY].bytes(j, k.as_ref().as_bytes(), rep);
            c[leaf::KEY_VALUE].bytes(j, v.as_ref().as_bytes(), rep);
        }
        match r.features {
            // A null list (def 0) or an empty one (def 1).
            None | Some([]) => {
                let def = i16::from(r.features.is_some());
                for l in [leaf::F_NAME, leaf::F_VALUE, leaf::F_STATUS, leaf::F_TIME] {
                    c[l].absent(def);
                }
            }
            // Column by column, each column's levels for the whole list at once.
            Some(fs) => {
                let n = fs.len();
                let col = &mut c[leaf::F_NAME];
                col.list_levels(n, Some(col.max_def as u8));
                if !col.put_set(names) {
                    let from = col.idx.len();
                    for (j, f) in fs.iter().enumerate() {
                        col.put_bytes(j, f.name().as_bytes());
                    }
                    col.keep_set(names, from);
                }
                let col = &mut c[leaf::F_STATUS];
                col.list_levels(n, Some(col.max_def as u8));
                for (j, f) in fs.iter().enumerate() {
                    col.put_status(j, f);
                }
                // A value or an event time may be null (one definition level less).
                let col = &mut c[leaf::F_VALUE];
                col.list_levels(n, None);
                let top = col.max_def as u8;
                for f in fs {
                    match f.value() {
                        Some(v) => {
                            col.def.push(top);
                            col.put_float(v);
                        }
                        None => col.def.push(top - 1),
                    }
                }
                let col = &mut c[leaf::F_TIME];
                col.list_levels(n, None);
                let top = col.max_def as u8;
                let mut last = None;
                for (j, f) in fs.iter().enumerate() {
                    match f.event_time_us() {
                        Some(t) => {
                            col.def.push(top);
                            col.put_int_again(j, t, &mut last);
                        }
                        None => col.def.push(top - 1),
                    }
                }
            }
        }
        match r.score {
            Some(s) => c[leaf::SCORE].float(s, 0),
            None => c[leaf::SCORE].absent(0),
        }
        match r.decision {
            Some(d) => c[leaf::DECISION].bytes(0, d.as_bytes(), 0),
            None => c[leaf::DECISION].absent(0),
        }
        c[leaf::SOURCE].bytes(0, r.source.as_bytes(), 0);
        c[leaf::PROTOCOL].bytes(0, r.protocol.as_str().as_bytes(), 0);
        for (k, v) in r.stages.as_array().into_iter().enumerate() {
            c[leaf::STAGES + k].int(0, i64::try_from(v).unwrap_or(i64::MAX), 0);
        }
        self.rows += 1;
        Ok(())
    }

    /// Cuts the pages that the records so far made due ([`Column::page_due`]).
    fn cut_due_pages(&mut self) -> Result<()> {
        while self.cut_a_due_page()? {}
        Ok(())
    }

    /// Cuts the page of the first column that has one due; whether there was one.
    fn cut_a_due_page(&mut self) -> Result<bool> {
        let Some(col) = self.columns.iter_mut().find(|c| c.page_due()) else {
            return Ok(false);
        };
        col.cut_due_page(&mut self.snappy)
            .map_err(|e| LogError::parquet(&self.path, e))?;
        Ok(true)
    }

    /// Some column has a page due ([`Column::page_due`]).
    fn page_due(&self) -> bool {
        self.columns.iter().any(Column::page_due)
    }

    /// Appends the records of `frames` (sealed wal frames, as the writer passes them to
    /// the encoder thread), decoding each in place, all of them, and calls `between`
    /// between two steps (a caller's pacing). Stops at the first record that does not
    /// decode or append.
    pub(crate) fn append_frames(
        &mut self,
        frames: &[u8],
        sets: &mut crate::codec::NameSets,
        mut between: impl FnMut(),
    ) -> Result<()> {
        let go_on = || {
            between();
            true
        };
        self.append_frames_from(frames, 0, sets, go_on, true)?;
        if self.row_group_full() {
            self.write_row_group()?;
        }
        Ok(())
    }

    /// Appends the records of `frames` from the frame at offset `at` on, decoding each
    /// in place, in steps: a record, or the cut of a page that the record before filled
    /// (encoding and compressing up to 64 KiB). `go_on` is asked
    /// before each step but the first. `row_groups`: the encoder thread, which also
    /// writes a full row group to the file; a worker's turn (false) stops before that,
    /// and takes a page's cut only as its first step, so that a turn is either about
    /// as long as `go_on` allows or one page's cut. Returns the offset of the first
    /// frame not appended (`frames.len()` when all were) and how many records it
    /// appended. Stops with an error at the first record that does not decode or
    /// append. A page left due is cut before the next record, or with the row group.
    /// `sets`: the name sets of the frames' records, kept from one buffer to the next;
    /// a buffer's own name-set frames are taken in when it is first seen (`at` 0: taking
    /// them in again is a no-op) and passed over after.
    pub(crate) fn append_frames_from(
        &mut self,
        frames: &[u8],
        mut at: usize,
        sets: &mut crate::codec::NameSets,
        mut go_on: impl FnMut() -> bool,
        row_groups: bool,
    ) -> Result<(usize, usize)> {
        if at == 0 {
            sets.define_all(frames, 0).map_err(|e| {
                LogError::Config(format!("a queued name-set frame did not decode ({e:?})"))
            })?;
        }
        let sets = &*sets;
        let mut lists = crate::codec::Lists::default();
        let (mut steps, mut n) = (0usize, 0usize);
        while let Some((payload, next)) = crate::wal::frame_at(frames, at) {
            while self.page_due() {
                if steps > 0 && (!row_groups || !go_on()) {
                    return Ok((at, n));
                }
                steps += 1;
                self.cut_a_due_page()?;
            }
            if self.row_group_full() {
                if !row_groups {
                    break;
                }
                self.write_row_group()?;
            }
            if crate::codec::is_name_set(payload) {
                at = next;
                continue;
            }
            if steps > 0 && !go_on() {
                break;
            }
            steps += 1;
            let r = crate::codec::decode_ref(payload, &mut lists, sets).map_err(|e| {
                LogError::Config(format!("a queued wal frame did not decode ({e:?})"))
            })?;
            self.push(&r, sets.names_of(payload))?;
            at = next;
            n += 1;
        }
        Ok((at, n))
    }

    /// Writes the buffered row group to the file (1-3 ms of copying and writes for a full
    /// one, handed to the OS [`crate::wal::WRITE_BYTES`] at a time).
    pub(crate) fn write_row_group(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        self.cut_due_pages()?;
        let rows = std::mem::take(&mut self.rows);
        let path = self.path.clone();
        let mut group = self
            .writer
            .next_row_group()
            .map_err(|e| LogError::parquet(&path, e))?;
        for col in &mut self.columns {
            let (bytes, close) = col
                .finish_chunk(rows, &mut self.snappy)
                .map_err(|e| LogError::parquet(&path, e))?;
            group
                .append_column(&bytes, close)
                .map_err(|e| LogError::parquet(&path, e))?;
            col.spare = bytes.try_into_mut().map(Vec::from).unwrap_or_default();
        }
        group.close().map_err(|e| LogError::parquet(&path, e))?;
        Ok(())
    }

    /// Gives the file up: closes it without a footer and removes it (its rows are read
    /// again from the wal).
    pub(crate) fn discard(self) {
        let Self { path, writer, .. } = self;
        drop(writer);
        let _ = std::fs::remove_file(path);
    }

    /// Writes what is left and the footer, and syncs the file to disk. The caller renames
    /// it into place.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.write_row_group()?;
        let buffered = self
            .writer
            .into_inner()
            .map_err(|e| LogError::parquet(&self.path, e))?;
        let file = buffered
            .into_inner()
            .map_err(|e| LogError::io(&self.path, e.into_error()))?;
        file.0.sync_all().map_err(|e| LogError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hybrid encoding reads back with the `parquet` crate's own decoder, for runs,
    /// mixed groups, a padded last group and every bit width used here.
    #[test]
    fn the_hybrid_encoding_reads_back() {
        let cases: Vec<Vec<u32>> = vec![
            vec![0; 100],
            (0..30).cycle().take(30 * 20).collect(),
            [
                vec![3; 9],
                (0..13).collect(),
                vec![1; 8],
                vec![2; 7],
                vec![5],
            ]
            .concat(),
            (0..1000).map(|i| (i * 7919) % 4096).collect(),
            (0..600).map(|i| u32::from(i % 40 != 0)).collect(),
            vec![7],
        ];
        for v in cases {
            let max = u64::from(*v.iter().max().unwrap_or(&0));
            for bw in [bit_width(max), 16, 20] {
                let mut out = Vec::new();
                hybrid(&v, bw, &mut out);
                assert_eq!(decode(&out, bw, v.len()), v, "bw {bw}");
            }
        }
    }

    /// The hybrid encoding read back as the Parquet spec describes it.
    fn decode(mut b: &[u8], bw: u8, n: usize) -> Vec<u32> {
        let width = usize::from(bw).div_ceil(8);
        let mut out = Vec::new();
        while out.len() < n {
            let mut header = 0u64;
            let mut shift = 0;
            loop {
                let byte = b[0];
                b = &b[1..];
                header |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    break;
                }
            }
            if header & 1 == 0 {
                let mut v = [0u8; 4];
                v[..width].copy_from_slice(&b[..width]);
                b = &b[width..];
                out.extend(std::iter::repeat_n(
                    u32::from_le_bytes(v),
                    (header >> 1) as usize,
                ));
            } else {
                let count = (header >> 1) as usize * 8;
                let bytes = count * usize::from(bw) / 8;
                let (packed, rest) = b.split_at(bytes);
                b = rest;
                for k in 0..count {
                    let mut x = 0u32;
                    for bit in 0..usize::from(bw) {
                        let at = k * usize::from(bw) + bit;
                        x |= u32::from((packed[at / 8] >> (at % 8)) & 1) << bit;
                    }
                    out.push(x);
                }
            }
        }
        out.truncate(n);
        out
    }

    /// The writer's table of leaves matches the schema it writes.
    #[test]
    fn the_leaves_match_the_schema() {
        descriptor().unwrap();
    }

    /// Records of every shape the log writes: no feature list, an empty one, features
    /// without a value or an event time, statuses outside `status::ALL`, no entity keys,
    /// no score or decision, strings past the statistics' length, entity values that
    /// overflow a row group's dictionary, more rows than one row group.
    fn assorted(n: usize) -> Vec<crate::PredictionRecord> {
        use crate::{FeatureUsed, PredictionRecord, Protocol, Role};
        let names: Vec<Arc<str>> = (0..30)
            .map(|i| Arc::from(format!("view:feature_{i}")))
            .collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        (0..n)
            .map(|i| {
                let role = [Role::Primary, Role::Canary, Role::Shadow][i % 3];
                let mut r = PredictionRecord::new(format!("req-{:x}", next()), "fraud", "3", role);
                r.ts_us = 1_796_170_000_000_000 + (next() % 10_000_000) as i64;
                r.protocol = Protocol::ALL[i % Protocol::ALL.len()];
                let shape = next() % 16;
                r.entity_keys = match shape {
                    0 => vec![],
                    // Long values: a row group's dictionary of them passes 1 MB.
                    1..=4 => vec![("card_id".into(), format!("{:0>120}", next()))],
                    _ => vec![
                        ("card_id".into(), (next() % 5_000).to_string()),
                        ("merchant_id".into(), format!("m{}", next() % 300)),
                    ],
                };
                r.features = match shape {
                    5 => None,
                    6 => Some(vec![]),
                    _ => Some(
                        names
                            .iter()
                            .take(1 + (next() % 30) as usize)
                            .map(|n| FeatureUsed {
                                name: n.clone(),
                                value: (next() % 10 != 0)
                                    .then(|| (next() % 1_000_000) as f64 / 7.0),
                                status: match next() % 20 {
                                    0 => "SOMETHING_NEW".into(),
                                    1 => crate::status::MISSING.into(),
                                    _ => crate::status::PRESENT.into(),
                                },
                                event_time_us: (next() % 4 != 0)
                                    .then(|| 1_796_000_000_000_000 + (next() % 50) as i64),
                            })
                            .collect(),
                    ),
                };
                r.score = (shape != 7).then(|| (next() % 1000) as f64 / 1000.0);
                r.decision = match shape {
                    8 => None,
                    9 => Some("x".repeat(100)),
                    _ => Some(["APPROVE", "DECLINE", "REVIEW"][i % 3].into()),
                };
                r.source = ["model", "fallback:rules"][i % 2].into();
                r.stages =
                    crate::StageMicros::from_array(std::array::from_fn(|k| next() % (100 << k)));
                r
            })
            .collect()
    }

    /// The log's file holds every record as written, reads as the Arrow writer's file of
    /// the same records, has its row groups and statistics, and leaves dictionaries
    /// where the Arrow writer left them.
    #[test]
    fn a_file_reads_back_as_the_arrow_writers_file() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let recs = assorted(ROW_GROUP_ROWS * 2 + 1_234);
        let ours = dir.path().join("ours.parquet");
        let theirs = dir.path().join("arrow.parquet");
        crate::write_parquet(&ours, &recs).unwrap();
        crate::write_parquet_arrow(&theirs, &recs).unwrap();
        let back = crate::read_parquet(&ours).unwrap();
        assert_eq!(back.len(), recs.len());
        for (i, (b, r)) in back.iter().zip(&recs).enumerate() {
            assert_eq!(b, r, "record {i}");
        }
        assert_eq!(back, crate::read_parquet(&theirs).unwrap());

        let open = |p: &Path| SerializedFileReader::new(File::open(p).unwrap()).unwrap();
        let (a, b) = (open(&ours), open(&theirs));
        let (a, b) = (a.metadata(), b.metadata());
        assert_eq!(a.num_row_groups(), 3);
        assert_eq!(
            a.file_metadata().schema_descr().root_schema(),
            b.file_metadata().schema_descr().root_schema()
        );
        for g in 0..3 {
            let (ga, gb) = (a.row_group(g), b.row_group(g));
            assert_eq!(ga.num_rows(), gb.num_rows());
            for c in 0..ga.num_columns() {
                let (ca, cb) = (ga.column(c), gb.column(c));
                let name = ca.column_path().string();
                assert_eq!(ca.num_values(), cb.num_values(), "{name}");
                // The same min and max where both have them (the feature list has none).
                match (ca.statistics(), cb.statistics()) {
                    (Some(Statistics::Double(sa)), Some(Statistics::Double(sb))) => {
                        // Equal as numbers: a zero min is -0.0 here, as the Parquet
                        // spec asks; the Arrow writer writes +0.0.
                        assert_eq!(sa.min_opt(), sb.min_opt(), "{name} min, row group {g}");
                        assert_eq!(sa.max_opt(), sb.max_opt(), "{name} max, row group {g}");
                        assert_eq!(sa.null_count_opt(), sb.null_count_opt(), "{name}");
                    }
                    (Some(sa), Some(sb)) => {
                        assert_eq!(
                            sa.min_bytes_opt(),
                            sb.min_bytes_opt(),
                            "{name} min, row group {g}"
                        );
                        assert_eq!(
                            sa.max_bytes_opt(),
                            sb.max_bytes_opt(),
                            "{name} max, row group {g}"
                        );
                        assert_eq!(
                            sa.null_count_opt(),
                            sb.null_count_opt(),
                            "{name} nulls, row group {g}"
                        );
                    }
                    (None, None) => assert!(name.starts_with("features."), "{name}"),
                    _ => panic!("{name}: statistics in one file only"),
                }
                assert_eq!(
                    ca.dictionary_page_offset().is_some(),
                    cb.dictionary_page_offset().is_some(),
                    "{name}"
                );
            }
        }
        // The long entity values overflowed the dictionary: that column went plain.
        let keys = a.row_group(0).column(leaf::KEY_VALUE);
        assert!(
            keys.encodings().any(|e| e == Encoding::PLAIN),
            "{:?}",
            keys.encodings().collect::<Vec<_>>()
        );
    }

    /// Pages are cut on levels too (a column of few values and many nulls holds
    /// mostly levels), and hold a value larger than a page; both read back.
    #[test]
    fn pages_of_nulls_only_and_of_one_large_value_read_back() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nulls.parquet");
        let recs: Vec<_> = (0..300)
            .map(|i| {
                let mut r = crate::PredictionRecord::new(
                    if i == 7 {
                        "r".repeat(200_000)
                    } else {
                        format!("r{i}")
                    },
                    "m",
                    "1",
                    crate::Role::Primary,
                );
                // Alternating present and null values: one run of levels each.
                r.features = Some(
                    (0..400)
                        .map(|j| crate::FeatureUsed {
                            name: "f".into(),
                            value: (j % 2 == 0 && i % 3 == 0).then_some(1.0),
                            status: crate::status::NULL.into(),
                            // One level run for each entry, a one-value dictionary.
                            event_time_us: (j % 2 == 0).then_some(5),
                        })
                        .collect(),
                );
                r
            })
            .collect();
        crate::write_parquet(&path, &recs).unwrap();
        assert_eq!(crate::read_parquet(&path).unwrap(), recs);
        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let time = file.get_row_group(0).unwrap();
        let mut pages = time.get_column_page_reader(leaf::F_TIME).unwrap();
        let mut count = 0;
        while let Some(page) = pages.get_next_page().unwrap() {
            count += usize::from(page.page_type() == parquet::basic::PageType::DATA_PAGE);
        }
        // 300 records of 400 entries: 240 KB of levels, 60,000 one-byte indices.
        assert!(count >= 3, "the event times took {count} data pages");
    }

    /// A file of no records reads as none.
    #[test]
    fn an_empty_file_reads_back_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.parquet");
        crate::write_parquet(&path, &[]).unwrap();
        assert!(crate::read_parquet(&path).unwrap().is_empty());
    }

    /// Writes `recs` into `dir` twice, from the records and from wal frames in runs of
    /// `run` records (as the encoder thread gets them), asserts that the two files are
    /// the same byte for byte, and returns the frames' file and the runs it took.
    fn framed_as_direct(
        dir: &Path,
        recs: &[crate::PredictionRecord],
        run: usize,
    ) -> (PathBuf, usize) {
        let direct = dir.join("direct.parquet");
        crate::write_parquet(&direct, recs).unwrap();
        let framed = dir.join("framed.parquet");
        let mut enc = crate::FrameEncoder::create(&framed).unwrap();
        let mut maker = crate::FrameMaker::default();
        let mut frames = Vec::new();
        let mut runs = 0;
        for part in recs.chunks(run) {
            frames.clear();
            maker.push_frames(part, &mut frames);
            enc.append_frames(&frames).unwrap();
            runs += 1;
        }
        enc.finish().unwrap();
        assert_eq!(
            std::fs::read(&framed).unwrap(),
            std::fs::read(&direct).unwrap()
        );
        (framed, runs)
    }

    /// The encoder thread's path (wal frames decoded in place, in runs) writes the file
    /// that the records themselves make, byte for byte; a frame that does not decode
    /// stops it with an error.
    #[test]
    fn frames_make_the_same_file_as_records() {
        let dir = tempfile::tempdir().unwrap();
        let recs = assorted(20_000);
        let (_, runs) = framed_as_direct(dir.path(), &recs, 97);
        assert!(runs > 100);

        let mut open = OpenParquet::create(&dir.path().join("bad.parquet")).unwrap();
        let mut frames = Vec::new();
        let bare: Vec<_> = recs[..2]
            .iter()
            .map(|r| crate::PredictionRecord {
                features: None,
                ..r.clone()
            })
            .collect();
        crate::FrameMaker::default().push_frames(&bare, &mut frames);
        // The first payload's tag byte: a layout no build knows.
        frames[crate::wal::FRAME_HEADER] = 0xee;
        let mut between = 0;
        let mut sets = crate::codec::NameSets::default();
        let e = open
            .append_frames(&frames, &mut sets, || between += 1)
            .unwrap_err();
        assert!(e.to_string().contains("did not decode"), "{e}");
        assert_eq!(between, 0);
    }

    /// The shortcuts of the frames' path (a name set's dictionary indices kept per row
    /// group, statuses by their position, an event time repeated within a record) make
    /// the file that the records make name by name, also when the feature names'
    /// dictionary fills up in the middle of a row group and the names go on plain
    /// between records of a kept set.
    #[test]
    fn kept_name_sets_make_the_same_file_when_the_names_fall_back_to_plain() {
        use crate::{FeatureUsed, PredictionRecord, Role};
        let dir = tempfile::tempdir().unwrap();
        let feature = |name: String, i: usize| FeatureUsed {
            name: name.into(),
            value: Some(i as f64),
            status: [crate::status::PRESENT, crate::status::MISSING, "ELSEWHERE"][i % 3].into(),
            event_time_us: (i % 4 != 3).then_some(1_796_000_000_000_000 + (i / 4) as i64),
        };
        let kept: Vec<String> = (0..12).map(|i| format!("card:f{i}")).collect();
        let recs: Vec<PredictionRecord> = (0..600)
            .map(|i| {
                let mut r = PredictionRecord::new(format!("r{i}"), "fraud", "3", Role::Primary);
                r.ts_us = 1_796_170_000_000_000 + i as i64;
                // Every other record the kept set; the others name 30 features of 200
                // bytes each of their own: 3 MB of names, past the dictionary's 1 MB.
                r.features = Some(if i % 2 == 0 {
                    kept.iter()
                        .enumerate()
                        .map(|(j, n)| feature(n.clone(), i + j))
                        .collect()
                } else {
                    (0..30)
                        .map(|j| feature(format!("{i:>100}:{j:>99}"), i + j))
                        .collect()
                });
                r.stages = crate::StageMicros::from_array(std::array::from_fn(|k| {
                    (i * 7 + k * 1_000) as u64
                }));
                r
            })
            .collect();
        let (framed, _) = framed_as_direct(dir.path(), &recs, 50);
        let back = crate::read_parquet(&framed).unwrap();
        assert_eq!(back.len(), recs.len());
        for (a, b) in back.iter().zip(&recs) {
            assert_eq!(a.features, b.features);
            assert_eq!(a.stages, b.stages);
        }
        // The names' dictionary did fill up: the file has plain pages of names.
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let reader = SerializedFileReader::new(std::fs::File::open(&framed).unwrap()).unwrap();
        let names = reader.metadata().row_group(0).column(leaf::F_NAME);
        let encodings: Vec<Encoding> = names.encodings().collect();
        assert!(
            encodings.contains(&Encoding::RLE_DICTIONARY),
            "{encodings:?}"
        );
        assert!(encodings.contains(&Encoding::PLAIN), "{encodings:?}");
    }

    /// A worker's turns (`row_groups` false, `go_on` always yes) append records until
    /// one fills a page, then stop; the next turn cuts one due page as its first step,
    /// never a second one after it, and no turn writes a row group. Driven so, with the
    /// thread's row groups between, the file is the records' own, byte for byte.
    #[test]
    fn a_workers_turn_cuts_a_page_only_as_its_first_step() {
        let dir = tempfile::tempdir().unwrap();
        let recs = assorted(ROW_GROUP_ROWS + 3_000);
        let direct = dir.path().join("direct.parquet");
        crate::write_parquet(&direct, &recs).unwrap();
        let mut frames = Vec::new();
        crate::FrameMaker::default().push_frames(&recs, &mut frames);
        // Taken in by the first turn (at offset 0), kept for the rest.
        let mut sets = crate::codec::NameSets::default();
        let turned = dir.path().join("turned.parquet");
        let mut open = OpenParquet::create(&turned).unwrap();
        let due = |o: &OpenParquet| o.columns.iter().filter(|c| c.page_due()).count();
        let (mut at, mut appended, mut turns, mut cuts, mut groups) = (0, 0, 0, 0, 0);
        while at < frames.len() {
            turns += 1;
            let before = due(&open);
            let (next, n) = open
                .append_frames_from(&frames, at, &mut sets, || true, false)
                .unwrap();
            let after = due(&open);
            if before > 1 {
                assert_eq!(
                    (n, after),
                    (0, before - 1),
                    "turn {turns}: one cut, then stop"
                );
            }
            if before > 0 {
                cuts += 1;
                assert!(after < before || n > 0, "turn {turns} cut nothing");
            }
            if next < frames.len() {
                assert!(
                    after > 0 || open.row_group_full(),
                    "turn {turns} stopped with nothing due"
                );
            }
            if open.row_group_full() && after == 0 {
                // The encoder thread's step.
                open.write_row_group().unwrap();
                groups += 1;
            }
            (at, appended) = (next, appended + n);
        }
        open.finish().unwrap();
        assert_eq!(appended, recs.len());
        assert_eq!(groups, 1);
        assert!(cuts > 20, "{cuts} turns began with a cut");
        assert_eq!(
            std::fs::read(&turned).unwrap(),
            std::fs::read(&direct).unwrap()
        );
    }

    /// A row group's column chunks run to megabytes; the file gets them in pieces of at
    /// most [`crate::wal::WRITE_BYTES`] (as many writes as that takes, at least), and
    /// reads back whole.
    #[test]
    fn a_row_group_goes_to_the_file_in_pieces() {
        use crate::wal::{thread_writes, WRITE_BYTES};
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paced.parquet");
        let recs = assorted(ROW_GROUP_ROWS + 500);
        let before = thread_writes();
        crate::write_parquet(&path, &recs).unwrap();
        let after = thread_writes();
        let size = std::fs::metadata(&path).unwrap().len();
        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let largest = (0..file.metadata().num_row_groups())
            .flat_map(|g| {
                let rg = file.metadata().row_group(g).clone();
                (0..rg.num_columns()).map(move |c| rg.column(c).compressed_size())
            })
            .max()
            .unwrap();
        // One write a chunk (or a 256 KiB buffer's worth) would have been larger.
        assert!(
            largest as usize > 3 * WRITE_BYTES,
            "largest chunk {largest} bytes"
        );
        assert_eq!(crate::read_parquet(&path).unwrap(), recs);
        if let (Some((calls0, bytes0)), Some((calls1, bytes1))) = (before, after) {
            let (calls, bytes) = (calls1 - calls0, bytes1 - bytes0);
            assert_eq!(bytes, size);
            assert!(
                calls >= size.div_ceil(WRITE_BYTES as u64),
                "{bytes} bytes in {calls} writes, pieces of {WRITE_BYTES}"
            );
        }
    }
}
