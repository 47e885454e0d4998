//! On-disk layout: keys and the versioned value encoding.
//!
//! Keys (tree `rows`): `view_id: u32 BE | key tag: u8 | key bytes`.
//! - view ids are assigned once, when a view is first recorded, so renaming the
//!   view file's order never moves data; big-endian makes one view a contiguous
//!   range (`scan_prefix(view_id)`).
//! - int64 keys: tag 1, then the value with its sign bit flipped, big-endian, so byte
//!   order equals numeric order; string keys: tag 2, then the UTF-8 bytes.
//!
//! Values, encoding version 1 (all integers little-endian):
//! `version: u8 = 1 | event_time_micros: i64 | n_fields: u16 | n_fields x field`,
//! field = `feature_id: u16 | type tag: u8 | payload`. Null features are not stored:
//! a feature absent from the value is NULL. Because fields are named by a stable id
//! (recorded in the registry), adding a feature to a view needs no rewrite: old
//! values simply lack the new id and read as NULL.
use crate::types::{EntityKey, FeatureType, Micros, Value};

pub const ENCODING_VERSION: u8 = 1;
const HEADER_LEN: usize = 1 + 8 + 2;

const KEY_TAG_INT64: u8 = 1;
const KEY_TAG_STRING: u8 = 2;

const TAG_F32: u8 = 1;
const TAG_F64: u8 = 2;
const TAG_I64: u8 = 3;
const TAG_BOOL: u8 = 4;
const TAG_STRING: u8 = 5;
const TAG_F32_VECTOR: u8 = 6;

pub fn view_prefix(view_id: u32) -> [u8; 4] {
    view_id.to_be_bytes()
}

pub fn encode_key(view_id: u32, key: &EntityKey, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&view_id.to_be_bytes());
    match key {
        EntityKey::Int64(v) => {
            out.push(KEY_TAG_INT64);
            out.extend_from_slice(&((*v as u64) ^ (1 << 63)).to_be_bytes());
        }
        EntityKey::String(s) => encode_string_key(view_id, s, out),
    }
}

/// [`encode_key`] for a borrowed string key.
pub fn encode_string_key(view_id: u32, key: &str, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&view_id.to_be_bytes());
    out.push(KEY_TAG_STRING);
    out.extend_from_slice(key.as_bytes());
}

/// Inverse of [`encode_key`], for scans. `None` for bytes this build did not write.
pub fn decode_key(bytes: &[u8]) -> Option<(u32, EntityKey)> {
    let view = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?);
    let tag = *bytes.get(4)?;
    let rest = bytes.get(5..)?;
    let key = match tag {
        KEY_TAG_INT64 => {
            let raw = u64::from_be_bytes(rest.try_into().ok()?);
            EntityKey::Int64((raw ^ (1 << 63)) as i64)
        }
        KEY_TAG_STRING => EntityKey::String(std::str::from_utf8(rest).ok()?.to_owned()),
        _ => return None,
    };
    Some((view, key))
}

fn tag_of(t: FeatureType) -> u8 {
    match t {
        FeatureType::F32 => TAG_F32,
        FeatureType::F64 => TAG_F64,
        FeatureType::I64 => TAG_I64,
        FeatureType::Bool => TAG_BOOL,
        FeatureType::String => TAG_STRING,
        FeatureType::F32Vector => TAG_F32_VECTOR,
    }
}

/// Encodes one row. `fields` pairs each non-null value with its feature id.
pub fn encode_value<'a>(
    event_time: Micros,
    fields: impl ExactSizeIterator<Item = (u16, &'a Value)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + fields.len() * 8);
    out.push(ENCODING_VERSION);
    out.extend_from_slice(&event_time.to_le_bytes());
    // Views are limited to 10,000 features at config time, so this cannot truncate.
    out.extend_from_slice(&(fields.len() as u16).to_le_bytes());
    for (id, v) in fields {
        out.extend_from_slice(&id.to_le_bytes());
        out.push(tag_of(v.feature_type()));
        match v {
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            Value::F32Vector(xs) => {
                out.extend_from_slice(&(xs.len() as u32).to_le_bytes());
                for x in xs {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    out
}

/// Reads only the event time: the write path's "is the stored row newer?" check.
pub fn decode_event_time(bytes: &[u8]) -> Result<Micros, String> {
    check_version(bytes)?;
    let raw = bytes.get(1..9).ok_or("value shorter than its header")?;
    Ok(i64::from_le_bytes(
        raw.try_into().map_err(|_| "bad header")?,
    ))
}

fn check_version(bytes: &[u8]) -> Result<(), String> {
    match bytes.first() {
        Some(&ENCODING_VERSION) => Ok(()),
        Some(v) => Err(format!(
            "encoding version {v}, this build reads version {ENCODING_VERSION}"
        )),
        None => Err("empty value".into()),
    }
}

/// A decoded field, borrowing from the stored bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldRef<'a> {
    F32(f32),
    F64(f64),
    I64(i64),
    Bool(bool),
    String(&'a str),
    /// Little-endian f32s.
    F32Vector(&'a [u8]),
}

impl FieldRef<'_> {
    pub fn feature_type(&self) -> FeatureType {
        match self {
            FieldRef::F32(_) => FeatureType::F32,
            FieldRef::F64(_) => FeatureType::F64,
            FieldRef::I64(_) => FeatureType::I64,
            FieldRef::Bool(_) => FeatureType::Bool,
            FieldRef::String(_) => FeatureType::String,
            FieldRef::F32Vector(_) => FeatureType::F32Vector,
        }
    }

    pub fn to_value(self) -> Value {
        match self {
            FieldRef::F32(x) => Value::F32(x),
            FieldRef::F64(x) => Value::F64(x),
            FieldRef::I64(x) => Value::I64(x),
            FieldRef::Bool(x) => Value::Bool(x),
            FieldRef::String(s) => Value::String(s.to_owned()),
            FieldRef::F32Vector(b) => Value::F32Vector(f32s(b)),
        }
    }
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Decodes a stored value: returns its event time and calls `each` per stored field.
pub fn decode_value<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(u16, FieldRef<'a>),
) -> Result<Micros, String> {
    let event_time = decode_event_time(bytes)?;
    let n = u16::from_le_bytes(take::<2>(bytes, 9)?);
    let mut pos = HEADER_LEN;
    for _ in 0..n {
        let id = u16::from_le_bytes(take::<2>(bytes, pos)?);
        let tag = *bytes.get(pos + 2).ok_or("truncated field")?;
        pos += 3;
        let field = match tag {
            TAG_F32 => {
                let f = FieldRef::F32(f32::from_le_bytes(take::<4>(bytes, pos)?));
                pos += 4;
                f
            }
            TAG_F64 => {
                let f = FieldRef::F64(f64::from_le_bytes(take::<8>(bytes, pos)?));
                pos += 8;
                f
            }
            TAG_I64 => {
                let f = FieldRef::I64(i64::from_le_bytes(take::<8>(bytes, pos)?));
                pos += 8;
                f
            }
            TAG_BOOL => {
                let f = FieldRef::Bool(take::<1>(bytes, pos)?[0] != 0);
                pos += 1;
                f
            }
            TAG_STRING => {
                let len = u32::from_le_bytes(take::<4>(bytes, pos)?) as usize;
                pos += 4;
                let raw = bytes.get(pos..pos + len).ok_or("truncated string")?;
                pos += len;
                FieldRef::String(std::str::from_utf8(raw).map_err(|_| "string is not UTF-8")?)
            }
            TAG_F32_VECTOR => {
                let len = u32::from_le_bytes(take::<4>(bytes, pos)?) as usize;
                pos += 4;
                let raw = bytes.get(pos..pos + 4 * len).ok_or("truncated vector")?;
                pos += 4 * len;
                FieldRef::F32Vector(raw)
            }
            other => return Err(format!("unknown field type tag {other}")),
        };
        each(id, field);
    }
    Ok(event_time)
}

fn take<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], String> {
    bytes
        .get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| "truncated value".to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn int_keys_sort_numerically() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        for v in [i64::MIN, -5, -1, 0, 1, 7, i64::MAX] {
            encode_key(3, &EntityKey::Int64(v), &mut a);
            if let Some(prev) = &last {
                assert!(prev < &a, "{v}");
            }
            assert_eq!(decode_key(&a), Some((3, EntityKey::Int64(v))));
            last = Some(a.clone());
        }
        encode_key(3, &EntityKey::String("x".into()), &mut b);
        assert_eq!(decode_key(&b), Some((3, EntityKey::String("x".into()))));
        assert!(b.starts_with(&view_prefix(3)));
    }

    #[test]
    fn value_roundtrip_and_version() {
        let vals = [
            Value::F32(1.5),
            Value::F64(-2.25),
            Value::I64(-7),
            Value::Bool(true),
            Value::String("héllo".into()),
            Value::F32Vector(vec![1.0, 2.0, 3.5]),
        ];
        let bytes = encode_value(123, vals.iter().enumerate().map(|(i, v)| (i as u16 * 3, v)));
        let mut got = Vec::new();
        let t = decode_value(&bytes, |id, f| got.push((id, f.to_value()))).unwrap();
        assert_eq!(t, 123);
        let want: Vec<_> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u16 * 3, v.clone()))
            .collect();
        assert_eq!(got, want);

        let mut newer = bytes.clone();
        newer[0] = 2;
        assert!(decode_value(&newer, |_, _| {})
            .unwrap_err()
            .contains("version 2"));
        assert!(decode_value(&bytes[..bytes.len() - 2], |_, _| {}).is_err());
    }
}
