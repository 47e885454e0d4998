//! `GetOnlineFeaturesResponse` encoded by hand, byte for byte as prost encodes it.
//!
//! At 100 keys of 16 features a lookup's answer is 1,600 statuses and, unless the
//! caller asks for `event_times_per_view`, 1,600 event times: packed varints that
//! prost encodes one call at a time after summing their lengths three times over (for
//! the buffer check, the column's length prefix and the field's own), about a sixth of
//! the feature server's CPU. Here each column's lengths are summed once, statuses below
//! 128 (all of them) are one byte each, and a column whose event times are the ones of
//! the column before (every column of a view: the times are the view's rows') copies
//! their encoding instead of encoding them again. The wire is unchanged: the tests
//! compare these bytes with prost's for every field, and clients decode as before.
//! Columns of strings or vectors are rare in fraud lookups; a response with any goes
//! through prost whole ([`covers`]).

use crate::mesh::v1::{FeatureColumn, GetOnlineFeaturesResponse};
use prost::bytes::BufMut;
use prost::encoding::{encode_varint, encoded_len_varint};

const VARINT: u64 = 0;
const LEN: u64 = 2;

/// Whether [`encode`] covers `r`: no column of strings or vectors.
pub fn covers(r: &GetOnlineFeaturesResponse) -> bool {
    r.columns
        .iter()
        .all(|c| c.string_values.is_empty() && c.f32_vector_values.is_empty())
}

/// Encodes `r` (which [`covers`]) into `buf`, as `r.encode(buf)` would.
pub fn encode(r: &GetOnlineFeaturesResponse, buf: &mut impl BufMut) {
    let mut s = Scratch::default();
    for c in &r.columns {
        column(c, buf, &mut s);
    }
    if !r.degraded_reason.is_empty() {
        string(2, &r.degraded_reason, buf);
    }
    for v in &r.view_event_times {
        s.varints(&v.event_time_unix_micros);
        let len = string_len(1, &v.view) + packed_len(2, s.times.len());
        key(3, LEN, buf);
        encode_varint(len as u64, buf);
        if !v.view.is_empty() {
            string(1, &v.view, buf);
        }
        packed(2, &s.times, buf);
    }
}

/// Buffers kept across the columns of one response.
#[derive(Default)]
struct Scratch {
    statuses: Vec<u8>,
    /// The event times last encoded, and their encoding.
    last_times: Vec<i64>,
    times: Vec<u8>,
    ints: Vec<u8>,
}

impl Scratch {
    /// Encodes `times` into `self.times`, unless they are the ones encoded last.
    fn varints(&mut self, times: &[i64]) {
        if self.last_times.as_slice() == times {
            return;
        }
        self.last_times.clear();
        self.last_times.extend_from_slice(times);
        self.times.clear();
        for &t in times {
            encode_varint(t as u64, &mut self.times);
        }
    }
}

fn key(tag: u32, wire: u64, buf: &mut impl BufMut) {
    encode_varint((u64::from(tag) << 3) | wire, buf);
}

fn key_len(tag: u32) -> usize {
    encoded_len_varint(u64::from(tag) << 3)
}

/// A length-delimited field of `n` bytes, or nothing where `n` is 0 (an empty packed
/// field is left out).
fn packed_len(tag: u32, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(n as u64) + n
    }
}

fn packed(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if !bytes.is_empty() {
        key(tag, LEN, buf);
        encode_varint(bytes.len() as u64, buf);
        buf.put_slice(bytes);
    }
}

fn string_len(tag: u32, s: &str) -> usize {
    packed_len(tag, s.len())
}

fn string(tag: u32, s: &str, buf: &mut impl BufMut) {
    packed(tag, s.as_bytes(), buf);
}

fn column(c: &FeatureColumn, buf: &mut impl BufMut, s: &mut Scratch) {
    s.statuses.clear();
    for &st in &c.statuses {
        if (0..128).contains(&st) {
            s.statuses.push(st as u8);
        } else {
            // An enum is an int32: a negative one takes ten bytes, as prost writes it.
            encode_varint(i64::from(st) as u64, &mut s.statuses);
        }
    }
    s.varints(&c.event_time_unix_micros);
    s.ints.clear();
    for &v in &c.i64_values {
        encode_varint(v as u64, &mut s.ints);
    }
    let len = string_len(1, &c.name)
        + if c.r#type != 0 {
            key_len(2) + encoded_len_varint(i64::from(c.r#type) as u64)
        } else {
            0
        }
        + packed_len(3, s.statuses.len())
        + packed_len(4, s.times.len())
        + packed_len(5, 4 * c.f32_values.len())
        + packed_len(6, 8 * c.f64_values.len())
        + packed_len(7, s.ints.len())
        + packed_len(8, c.bool_values.len());
    key(1, LEN, buf);
    encode_varint(len as u64, buf);
    if !c.name.is_empty() {
        string(1, &c.name, buf);
    }
    if c.r#type != 0 {
        key(2, VARINT, buf);
        encode_varint(i64::from(c.r#type) as u64, buf);
    }
    packed(3, &s.statuses, buf);
    packed(4, &s.times, buf);
    if !c.f32_values.is_empty() {
        key(5, LEN, buf);
        encode_varint(4 * c.f32_values.len() as u64, buf);
        for v in &c.f32_values {
            buf.put_f32_le(*v);
        }
    }
    if !c.f64_values.is_empty() {
        key(6, LEN, buf);
        encode_varint(8 * c.f64_values.len() as u64, buf);
        for v in &c.f64_values {
            buf.put_f64_le(*v);
        }
    }
    packed(7, &s.ints, buf);
    if !c.bool_values.is_empty() {
        key(8, LEN, buf);
        encode_varint(c.bool_values.len() as u64, buf);
        for b in &c.bool_values {
            buf.put_u8(u8::from(*b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::v1::{FloatVector, ViewEventTimes};
    use prost::Message;

    fn column(name: &str, n: usize, seed: u64) -> FeatureColumn {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let kind = (next() % 4) as usize;
        let mut c = FeatureColumn {
            name: name.into(),
            r#type: (next() % 5) as i32,
            statuses: (0..n).map(|_| (next() % 6) as i32).collect(),
            event_time_unix_micros: (0..n)
                .map(|i| {
                    if i % 5 == 0 {
                        0
                    } else {
                        1_796_000_000_000_000 + (next() % 1000) as i64
                    }
                })
                .collect(),
            ..Default::default()
        };
        match kind {
            0 => c.f32_values = (0..n).map(|_| next() as f32 / 3.0).collect(),
            1 => c.f64_values = (0..n).map(|_| next() as f64 / 7.0).collect(),
            2 => c.i64_values = (0..n).map(|_| next() as i64).collect(),
            _ => c.bool_values = (0..n).map(|_| next() % 2 == 0).collect(),
        }
        c
    }

    fn same_as_prost(r: &GetOnlineFeaturesResponse) {
        assert!(covers(r));
        let mut ours = Vec::new();
        encode(r, &mut ours);
        assert_eq!(ours, r.encode_to_vec());
        assert_eq!(
            &GetOnlineFeaturesResponse::decode(ours.as_slice()).unwrap(),
            r
        );
    }

    /// Every field, present and absent, encodes to prost's bytes.
    #[test]
    fn the_bytes_are_prosts() {
        same_as_prost(&GetOnlineFeaturesResponse::default());
        let mut r = GetOnlineFeaturesResponse {
            columns: (0..16)
                .map(|i| column(&format!("card:f{i}"), 100, i))
                .collect(),
            ..Default::default()
        };
        same_as_prost(&r);
        // A view's columns share their event times (the encoding is copied).
        let times = r.columns[0].event_time_unix_micros.clone();
        for c in &mut r.columns {
            c.event_time_unix_micros = times.clone();
        }
        same_as_prost(&r);
        // Times per view instead, a degraded answer, odd values.
        for c in &mut r.columns {
            c.event_time_unix_micros.clear();
        }
        r.view_event_times = vec![
            ViewEventTimes {
                view: "card".into(),
                event_time_unix_micros: times.clone(),
            },
            ViewEventTimes {
                view: String::new(),
                event_time_unix_micros: vec![],
            },
            ViewEventTimes {
                view: "merchant".into(),
                event_time_unix_micros: vec![-1, 0, i64::MAX],
            },
        ];
        r.degraded_reason = "redis: timed out".into();
        r.columns[3].statuses = vec![-1, 0, 200, i32::MAX, i32::MIN];
        r.columns[4].name.clear();
        r.columns[4].r#type = -3;
        r.columns[5].i64_values = vec![i64::MIN, -1, 0, 1, i64::MAX];
        r.columns[6] = FeatureColumn {
            name: "empty".into(),
            ..Default::default()
        };
        same_as_prost(&r);
        // Columns of no entity, and 1 to 300 entities.
        for n in [0, 1, 127, 128, 300] {
            same_as_prost(&GetOnlineFeaturesResponse {
                columns: (0..3).map(|i| column("v:f", n, 100 + i)).collect(),
                ..Default::default()
            });
        }
    }

    /// Strings and vectors are left to prost.
    #[test]
    fn string_and_vector_columns_are_not_covered() {
        let mut r = GetOnlineFeaturesResponse {
            columns: vec![column("a", 3, 1)],
            ..Default::default()
        };
        r.columns[0].string_values = vec!["x".into()];
        assert!(!covers(&r));
        r.columns[0].string_values.clear();
        r.columns[0].f32_vector_values = vec![FloatVector::default()];
        assert!(!covers(&r));
    }
}
