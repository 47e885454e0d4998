//! CSV ingest: a header row names the columns; an empty cell is a null feature.
//! Booleans are `true`/`false`/`1`/`0` (also `TRUE`/`True`...); f32 vectors are
//! `[1.0, 2.0]` or `1.0;2.0`; timestamps as in [`super::parse_timestamp_in`].
use std::path::Path;

use super::{parse_timestamp_in, ColumnMap, IngestOptions, Sink, TimestampUnit};
use crate::error::{FeatureStoreError, Result};
use crate::registry::ViewInfo;
use crate::types::{EntityKey, FeatureType, KeyType, Row, Value};

pub(crate) fn read(path: &Path, v: &ViewInfo, opts: &IngestOptions, sink: &mut Sink) -> Result<()> {
    let err = |what: String| FeatureStoreError::Ingest {
        path: path.to_path_buf(),
        what,
    };
    let file = std::fs::File::open(path).map_err(|e| FeatureStoreError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(std::io::BufReader::new(file));
    let names: Vec<String> = reader
        .headers()
        .map_err(|e| err(format!("cannot read the header row: {e}")))?
        .iter()
        .map(str::to_owned)
        .collect();
    let map = ColumnMap::new(v, &names, opts, path)?;
    sink.start(total, super::ProgressUnit::Bytes, &map);

    let mut batch = Vec::with_capacity(opts.batch_rows);
    let mut record = csv::StringRecord::new();
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(err(format!("{e}"))),
        }
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        let row = parse_row(v, &map, &record, opts.timestamp_unit)
            .map_err(|what| err(format!("line {line}: {what}")))?;
        batch.push(row);
        if batch.len() >= opts.batch_rows {
            let pos = reader.position().byte();
            sink.write(
                std::mem::replace(&mut batch, Vec::with_capacity(opts.batch_rows)),
                pos,
            )?;
        }
    }
    let pos = reader.position().byte();
    sink.write(batch, pos)
}

fn parse_row(
    v: &ViewInfo,
    map: &ColumnMap,
    rec: &csv::StringRecord,
    unit: TimestampUnit,
) -> std::result::Result<Row, String> {
    let cell = |i: usize| rec.get(i).unwrap_or("");
    let raw_key = cell(map.key);
    let key = match v.key_type {
        KeyType::Int64 => EntityKey::Int64(
            raw_key
                .trim()
                .parse()
                .map_err(|_| format!("{}: {raw_key:?} is not an int64 key", v.join_key))?,
        ),
        KeyType::String if raw_key.is_empty() => return Err(format!("{}: empty key", v.join_key)),
        KeyType::String => EntityKey::String(raw_key.to_owned()),
    };
    let event_time = parse_timestamp_in(cell(map.timestamp), unit)
        .map_err(|e| format!("{}: {e}", v.timestamp_field))?;
    let mut values = Vec::with_capacity(v.features.len());
    for (f, col) in v.features.iter().zip(&map.features) {
        let value = match col {
            None => None,
            Some(i) => parse_value(f.dtype, cell(*i)).map_err(|e| format!("{}: {e}", f.name))?,
        };
        values.push(value);
    }
    Ok(Row {
        key,
        event_time,
        values,
    })
}

/// Parses one CSV cell as a feature of type `t`; an empty cell is a null.
pub fn parse_value(t: FeatureType, s: &str) -> std::result::Result<Option<Value>, String> {
    // Strings keep their spaces; everything else is read trimmed.
    if t == FeatureType::String {
        return Ok(if s.is_empty() {
            None
        } else {
            Some(Value::String(s.to_owned()))
        });
    }
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let bad = || format!("{s:?} is not a valid {t}");
    let v = match t {
        FeatureType::F32 => Value::F32(s.parse().map_err(|_| bad())?),
        FeatureType::F64 => Value::F64(s.parse().map_err(|_| bad())?),
        FeatureType::I64 => Value::I64(s.parse().map_err(|_| bad())?),
        FeatureType::Bool => Value::Bool(match s {
            "true" | "TRUE" | "True" | "1" => true,
            "false" | "FALSE" | "False" | "0" => false,
            _ => return Err(bad()),
        }),
        FeatureType::F32Vector => {
            let inner = s
                .strip_prefix('[')
                .and_then(|x| x.strip_suffix(']'))
                .unwrap_or(s);
            let parts = inner
                .split([',', ';'])
                .map(str::trim)
                .filter(|p| !p.is_empty());
            Value::F32Vector(
                parts
                    .map(|p| p.parse::<f32>().map_err(|_| bad()))
                    .collect::<std::result::Result<_, _>>()?,
            )
        }
        FeatureType::String => Value::String(s.to_owned()),
    };
    Ok(Some(v))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cells() {
        assert_eq!(
            parse_value(FeatureType::F32, " 1.5 "),
            Ok(Some(Value::F32(1.5)))
        );
        assert_eq!(parse_value(FeatureType::I64, ""), Ok(None));
        assert_eq!(
            parse_value(FeatureType::Bool, "0"),
            Ok(Some(Value::Bool(false)))
        );
        assert_eq!(
            parse_value(FeatureType::F32Vector, "[1, 2.5]"),
            Ok(Some(Value::F32Vector(vec![1.0, 2.5])))
        );
        assert_eq!(
            parse_value(FeatureType::String, " a "),
            Ok(Some(Value::String(" a ".into())))
        );
        assert!(parse_value(FeatureType::I64, "1.5").is_err());
        assert!(parse_value(FeatureType::Bool, "yes").is_err());
    }
}
