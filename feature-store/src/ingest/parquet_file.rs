//! Parquet ingest through the Arrow reader, reading only the view's columns.
//!
//! Accepted column types: keys Int8-64/UInt8-32 or Utf8/LargeUtf8/Utf8View;
//! timestamps Timestamp(any unit), or any integer or Float32/Float64 column of Unix
//! seconds, milliseconds or microseconds (`IngestOptions::timestamp_unit`); features: f32
//! and f64 from Float32/Float64, i64 from any integer up to 64 bits (UInt64 only if
//! it fits), bool from Boolean, string from the Utf8 types, f32 vectors from
//! List/LargeList/FixedSizeList of Float32.
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use super::{ColumnMap, IngestOptions, Sink, TimestampUnit};
use crate::error::{FeatureStoreError, Result};
use crate::registry::ViewInfo;
use crate::types::{EntityKey, FeatureType, KeyType, Micros, Row, Value};

type Cells<T> = std::result::Result<Vec<Option<T>>, String>;

pub(crate) fn read(path: &Path, v: &ViewInfo, opts: &IngestOptions, sink: &mut Sink) -> Result<()> {
    let err = |what: String| FeatureStoreError::Ingest {
        path: path.to_path_buf(),
        what,
    };
    let file = std::fs::File::open(path).map_err(|e| FeatureStoreError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| err(format!("not a readable Parquet file: {e}")))?;
    let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let names: Vec<String> = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let map = ColumnMap::new(v, &names, opts, path)?;
    let mut wanted: Vec<usize> = vec![map.key, map.timestamp];
    wanted.extend(map.features.iter().flatten().copied());
    wanted.sort_unstable();
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(opts.batch_rows)
        .build()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    sink.start(total, super::ProgressUnit::Rows, &map);

    let mut row_base = 0usize;
    for batch in reader {
        let batch = batch.map_err(|e| err(format!("cannot read a record batch: {e}")))?;
        let col = |name: &str| batch.column_by_name(name).cloned();
        let at = |what: String| {
            err(format!(
                "rows {}..{}: {what}",
                row_base,
                row_base + batch.num_rows()
            ))
        };
        let keys = keys(col(&v.join_key).as_ref(), v.key_type)
            .map_err(|e| at(format!("{}: {e}", v.join_key)))?;
        let times = times(col(&v.timestamp_field).as_ref(), opts.timestamp_unit)
            .map_err(|e| at(format!("{}: {e}", v.timestamp_field)))?;
        let mut features: Vec<Option<Vec<Option<Value>>>> = Vec::with_capacity(v.features.len());
        for (f, present) in v.features.iter().zip(&map.features) {
            features.push(match present {
                Some(_) => Some(
                    values(col(&f.name).as_ref(), f.dtype)
                        .map_err(|e| at(format!("{}: {e}", f.name)))?,
                ),
                None => None,
            });
        }
        let mut rows = Vec::with_capacity(batch.num_rows());
        for (i, (key, time)) in keys.into_iter().zip(times).enumerate() {
            let key =
                key.ok_or_else(|| err(format!("row {}: null {}", row_base + i, v.join_key)))?;
            let event_time = time
                .ok_or_else(|| err(format!("row {}: null {}", row_base + i, v.timestamp_field)))?;
            let values = features
                .iter_mut()
                .map(|c| c.as_mut().and_then(|c| c[i].take()))
                .collect();
            rows.push(Row {
                key,
                event_time,
                values,
            });
        }
        row_base += batch.num_rows();
        sink.write(rows, row_base as u64)?;
    }
    Ok(())
}

fn prim<T: ArrowPrimitiveType>(a: &ArrayRef, f: impl Fn(T::Native) -> Option<i64>) -> Cells<i64> {
    let a = a.as_primitive_opt::<T>().ok_or("unexpected array type")?;
    a.iter()
        .map(|x| {
            x.map(|x| f(x).ok_or_else(|| "value out of int64 range".to_owned()))
                .transpose()
        })
        .collect()
}

fn ints(a: &ArrayRef) -> Option<Cells<i64>> {
    Some(match a.data_type() {
        DataType::Int8 => prim::<Int8Type>(a, |x| Some(x.into())),
        DataType::Int16 => prim::<Int16Type>(a, |x| Some(x.into())),
        DataType::Int32 => prim::<Int32Type>(a, |x| Some(x.into())),
        DataType::Int64 => prim::<Int64Type>(a, Some),
        DataType::UInt8 => prim::<UInt8Type>(a, |x| Some(x.into())),
        DataType::UInt16 => prim::<UInt16Type>(a, |x| Some(x.into())),
        DataType::UInt32 => prim::<UInt32Type>(a, |x| Some(x.into())),
        DataType::UInt64 => prim::<UInt64Type>(a, |x| i64::try_from(x).ok()),
        _ => return None,
    })
}

fn strings(a: &ArrayRef) -> Option<Vec<Option<String>>> {
    let own = |x: Option<&str>| x.map(str::to_owned);
    if let Some(s) = a.as_string_opt::<i32>() {
        Some(s.iter().map(own).collect())
    } else if let Some(s) = a.as_string_opt::<i64>() {
        Some(s.iter().map(own).collect())
    } else {
        a.as_string_view_opt().map(|s| s.iter().map(own).collect())
    }
}

fn missing() -> String {
    "column missing from a record batch".into()
}

fn keys(a: Option<&ArrayRef>, kt: KeyType) -> Cells<EntityKey> {
    let a = a.ok_or_else(missing)?;
    match kt {
        KeyType::Int64 => {
            let v = ints(a).ok_or_else(|| {
                format!("int64 keys need an integer column, found {}", a.data_type())
            })??;
            Ok(v.into_iter().map(|x| x.map(EntityKey::Int64)).collect())
        }
        KeyType::String => {
            let v = strings(a).ok_or_else(|| {
                format!("string keys need a string column, found {}", a.data_type())
            })?;
            v.into_iter()
                .map(|x| match x {
                    Some(s) if s.is_empty() => Err("empty key".to_owned()),
                    other => Ok(other.map(EntityKey::String)),
                })
                .collect()
        }
    }
}

fn times(a: Option<&ArrayRef>, unit: TimestampUnit) -> Cells<Micros> {
    let a = a.ok_or_else(missing)?;
    let scale = |mul: i64, div: i64| move |x: i64| x.checked_mul(mul).map(|m| m / div);
    let per_unit = unit.micros_per_unit();
    let decimal = |x: Option<f64>| {
        x.filter(|x| x.is_finite())
            .map(|x| (x * per_unit as f64).round())
            .filter(|x| x.abs() < 9.2e18)
            .map(|x| x as i64)
    };
    match a.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            prim::<TimestampSecondType>(a, scale(1_000_000, 1))
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            prim::<TimestampMillisecondType>(a, scale(1_000, 1))
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => prim::<TimestampMicrosecondType>(a, Some),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            prim::<TimestampNanosecondType>(a, scale(1, 1_000))
        }
        DataType::Float64 | DataType::Float32 => Ok(floats(a)
            .ok_or("unexpected array type")?
            .into_iter()
            .map(decimal)
            .collect()),
        other => match ints(a) {
            Some(cells) => cells?
                .into_iter()
                .map(|x| {
                    x.map(|x| {
                        x.checked_mul(per_unit).ok_or_else(|| {
                            format!("{x} {unit} is out of range of Unix microseconds")
                        })
                    })
                    .transpose()
                })
                .collect(),
            None => Err(format!(
                "timestamps need a Timestamp, integer or float (Unix {unit}) column, found {other}"
            )),
        },
    }
}

fn floats(a: &ArrayRef) -> Option<Vec<Option<f64>>> {
    if let Some(f) = a.as_primitive_opt::<Float64Type>() {
        Some(f.iter().collect())
    } else {
        a.as_primitive_opt::<Float32Type>()
            .map(|f| f.iter().map(|x| x.map(f64::from)).collect())
    }
}

fn f32_list(a: &ArrayRef) -> Option<Vec<f32>> {
    a.as_primitive_opt::<Float32Type>()
        .map(|f| f.values().to_vec())
}

fn values(a: Option<&ArrayRef>, t: FeatureType) -> Cells<Value> {
    let a = a.ok_or_else(missing)?;
    let wrong = || {
        format!(
            "a {t} feature cannot be read from a {} column",
            a.data_type()
        )
    };
    Ok(match t {
        FeatureType::F32 => {
            // f32 from a Float32 column directly; from Float64 by rounding, as any
            // f64 -> f32 conversion would.
            if let Some(f) = a.as_primitive_opt::<Float32Type>() {
                f.iter().map(|x| x.map(Value::F32)).collect()
            } else {
                floats(a)
                    .ok_or_else(wrong)?
                    .into_iter()
                    .map(|x| x.map(|x| Value::F32(x as f32)))
                    .collect()
            }
        }
        FeatureType::F64 => floats(a)
            .ok_or_else(wrong)?
            .into_iter()
            .map(|x| x.map(Value::F64))
            .collect(),
        FeatureType::I64 => ints(a)
            .ok_or_else(wrong)??
            .into_iter()
            .map(|x| x.map(Value::I64))
            .collect(),
        FeatureType::Bool => a
            .as_boolean_opt()
            .ok_or_else(wrong)?
            .iter()
            .map(|x| x.map(Value::Bool))
            .collect(),
        FeatureType::String => strings(a)
            .ok_or_else(wrong)?
            .into_iter()
            .map(|x| x.map(Value::String))
            .collect(),
        FeatureType::F32Vector => {
            let lists: Vec<Option<ArrayRef>> = if let Some(l) = a.as_list_opt::<i32>() {
                l.iter().collect()
            } else if let Some(l) = a.as_list_opt::<i64>() {
                l.iter().collect()
            } else if let Some(l) = a.as_fixed_size_list_opt() {
                l.iter().collect()
            } else {
                return Err(wrong());
            };
            lists
                .into_iter()
                .map(|x| {
                    x.map(|l| f32_list(&l).map(Value::F32Vector).ok_or_else(wrong))
                        .transpose()
                })
                .collect::<std::result::Result<_, _>>()?
        }
    })
}
