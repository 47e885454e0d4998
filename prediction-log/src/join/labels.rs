//! Loading labels (CSV with a header row, or Parquet) into a key -> label map.

use crate::error::{LogError, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::HashMap;
use std::path::Path;

/// Labels by key, with what was odd about the file.
#[derive(Debug, Default)]
pub(crate) struct Labels {
    /// key -> (label, matched by at least one prediction)
    pub map: HashMap<String, (bool, bool)>,
    pub rows: u64,
    /// Rows whose key was already seen (the first one wins).
    pub duplicate_rows: u64,
    /// Duplicate rows whose label differs from the first one.
    pub conflicting_duplicates: u64,
    /// Rows with an empty key or a label that is not 0/1/true/false/yes/no.
    pub invalid_rows: u64,
}

impl Labels {
    fn add(&mut self, key: Option<String>, label: Option<bool>) {
        self.rows += 1;
        let (Some(key), Some(label)) = (key, label) else {
            self.invalid_rows += 1;
            return;
        };
        if key.is_empty() {
            self.invalid_rows += 1;
            return;
        }
        match self.map.get(&key) {
            Some((first, _)) => {
                self.duplicate_rows += 1;
                if *first != label {
                    self.conflicting_duplicates += 1;
                }
            }
            None => {
                self.map.insert(key, (label, false));
            }
        }
    }
}

/// Parses a label cell: 1/0, true/false, yes/no, or a number (positive when > 0.5).
pub(crate) fn parse_label(s: &str) -> Option<bool> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Some(true),
        "0" | "false" | "f" | "no" | "n" => Some(false),
        _ => t
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(|v| v > 0.5),
    }
}

pub(crate) fn load(path: &Path, key_col: &str, label_col: &str) -> Result<Labels> {
    let is_parquet = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
    if is_parquet {
        load_parquet(path, key_col, label_col)
    } else {
        load_csv(path, key_col, label_col)
    }
}

fn load_csv(path: &Path, key_col: &str, label_col: &str) -> Result<Labels> {
    let csv_err = |source| LogError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .from_path(path)
        .map_err(csv_err)?;
    let headers = rdr.headers().map_err(csv_err)?.clone();
    let find = |name: &str| {
        headers
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| LogError::Labels {
                path: path.to_path_buf(),
                reason: format!(
                    "no column {name:?} (columns: {})",
                    headers.iter().collect::<Vec<_>>().join(", ")
                ),
            })
    };
    let (ki, li) = (find(key_col)?, find(label_col)?);
    let mut labels = Labels::default();
    for row in rdr.records() {
        let row = row.map_err(csv_err)?;
        let key = row.get(ki).map(|k| k.trim().to_string());
        let label = row.get(li).and_then(parse_label);
        labels.add(key, label);
    }
    Ok(labels)
}

fn load_parquet(path: &Path, key_col: &str, label_col: &str) -> Result<Labels> {
    let file = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| LogError::parquet(path, e))?;
    let reader = builder.build().map_err(|e| LogError::parquet(path, e))?;
    let mut labels = Labels::default();
    for batch in reader {
        let batch = batch?;
        let get = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| LogError::Labels {
                    path: path.to_path_buf(),
                    reason: format!("no column {name:?}"),
                })
        };
        let (k, l) = (get(key_col)?, get(label_col)?);
        for i in 0..batch.num_rows() {
            let key = cell_string(path, &k, i)?;
            let label = match l.data_type() {
                DataType::Boolean => l.is_valid(i).then(|| l.as_boolean().value(i)),
                _ => cell_string(path, &l, i)?.as_deref().and_then(parse_label),
            };
            labels.add(key, label);
        }
    }
    Ok(labels)
}

/// A cell of a key or label column as text; `None` when null.
fn cell_string(path: &Path, a: &ArrayRef, i: usize) -> Result<Option<String>> {
    if a.is_null(i) {
        return Ok(None);
    }
    let s = match a.data_type() {
        DataType::Utf8 => a.as_string::<i32>().value(i).to_string(),
        DataType::LargeUtf8 => a.as_string::<i64>().value(i).to_string(),
        DataType::Utf8View => a.as_string_view().value(i).to_string(),
        DataType::Boolean => a.as_boolean().value(i).to_string(),
        DataType::Int8 => a.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 => a.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::UInt32 => a.as_primitive::<UInt32Type>().value(i).to_string(),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i).to_string(),
        DataType::Float32 => a.as_primitive::<Float32Type>().value(i).to_string(),
        DataType::Float64 => a.as_primitive::<Float64Type>().value(i).to_string(),
        other => {
            return Err(LogError::Labels {
                path: path.to_path_buf(),
                reason: format!("unsupported column type {other}"),
            })
        }
    };
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_cells() {
        assert_eq!(parse_label("1"), Some(true));
        assert_eq!(parse_label(" TRUE "), Some(true));
        assert_eq!(parse_label("0.0"), Some(false));
        assert_eq!(parse_label("no"), Some(false));
        assert_eq!(parse_label(""), None);
        assert_eq!(parse_label("fraud"), None);
        assert_eq!(parse_label("NaN"), None);
    }
}
