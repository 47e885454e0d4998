//! The binary encoding of one record in a wal frame (files that start `MESHWAL2`).
//!
//! A frame's payload is one tag byte, [`RECORD_V1`], then the record's fields in
//! declaration order, little endian:
//!
//! ```text
//! str  request_id        str = varint byte length + UTF-8 bytes
//! i64  ts_us             8 bytes
//! str  model, version
//! u8   role              0 primary, 1 canary, 2 shadow
//! u8   protocol          0 decide, 1 oip_grpc, 2 oip_http, 3 unknown
//! var  entity key count, then (str key, str value) each
//! u8   0 = no feature list, 1 = a list: var count, then per feature:
//!        str name, u8 flags (1 value, 2 event time), [f64 value],
//!        u8 status (index in status::ALL, or 255 then str), [i64 event time]
//! u8   0/1 score, [f64]
//! u8   0/1 decision, [str]
//! str  source
//! var  ×7 stage microseconds (StageMicros::NAMES order)
//! ```
//!
//! About a quarter of the bytes of the JSON it replaces and an order of magnitude
//! cheaper to write and read. A tag this build does not know (a newer layout) is an
//! error that names it, never taken for a torn frame: recovery must not discard it.

use crate::record::{
    status, LoggedFeature, PredictionRecord, Protocol, RecordRef, Role, StageMicros,
};

/// Tag of the layout above.
pub(crate) const RECORD_V1: u8 = 1;

const HAS_VALUE: u8 = 1;
const HAS_TIME: u8 = 2;
const OTHER_STATUS: u8 = 255;

/// Appends the payload of `rec` (tag included) to `out`.
pub(crate) fn encode<K: AsRef<str>, F: LoggedFeature>(
    rec: &RecordRef<'_, K, F>,
    out: &mut Vec<u8>,
) {
    out.push(RECORD_V1);
    put_str(out, rec.request_id);
    out.extend_from_slice(&rec.ts_us.to_le_bytes());
    put_str(out, rec.model);
    put_str(out, rec.version);
    out.push(role_code(rec.role));
    out.push(protocol_code(rec.protocol));
    put_var(out, rec.entity_keys.len() as u64);
    for (k, v) in rec.entity_keys {
        put_str(out, k.as_ref());
        put_str(out, v.as_ref());
    }
    match rec.features {
        None => out.push(0),
        Some(fs) => {
            out.push(1);
            put_var(out, fs.len() as u64);
            for f in fs {
                put_feature(out, f);
            }
        }
    }
    put_opt_f64(out, rec.score);
    match rec.decision {
        None => out.push(0),
        Some(d) => {
            out.push(1);
            put_str(out, d);
        }
    }
    put_str(out, rec.source);
    for v in rec.stages.as_array() {
        put_var(out, v);
    }
}

/// The timestamp of a payload [`encode`] wrote, read without decoding the rest.
pub(crate) fn ts_of(payload: &[u8]) -> Option<i64> {
    let mut r = Reader { buf: payload };
    if r.u8().ok()? != RECORD_V1 {
        return None;
    }
    r.str().ok()?;
    r.i64().ok()
}

fn put_feature(out: &mut Vec<u8>, f: &impl LoggedFeature) {
    put_str(out, f.name());
    let (value, time) = (f.value(), f.event_time_us());
    let flags =
        if value.is_some() { HAS_VALUE } else { 0 } | if time.is_some() { HAS_TIME } else { 0 };
    out.push(flags);
    if let Some(v) = value {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let st = f.status();
    match status::ALL.iter().position(|s| *s == st) {
        Some(i) => out.push(i as u8),
        None => {
            out.push(OTHER_STATUS);
            put_str(out, st);
        }
    }
    if let Some(t) = time {
        out.extend_from_slice(&t.to_le_bytes());
    }
}

fn put_opt_f64(out: &mut Vec<u8>, v: Option<f64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// An unsigned LEB128 varint, 7 bits per byte, high bit set on all but the last (the
/// wal's lengths and counts; the run headers of the Parquet writer's levels).
pub(crate) fn put_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_var(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn role_code(r: Role) -> u8 {
    match r {
        Role::Primary => 0,
        Role::Canary => 1,
        Role::Shadow => 2,
    }
}

fn protocol_code(p: Protocol) -> u8 {
    match p {
        Protocol::Decide => 0,
        Protocol::OipGrpc => 1,
        Protocol::OipHttp => 2,
        Protocol::Unknown => 3,
    }
}

/// Why a payload did not decode.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// A layout this build does not know (written by a newer one).
    UnknownTag(u8),
    /// The bytes do not form a record of the known layout.
    Malformed(&'static str),
}

/// A feature of a decoded payload, borrowed from its bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FeatureRef<'a> {
    pub name: &'a str,
    pub value: Option<f64>,
    pub status: &'a str,
    pub event_time_us: Option<i64>,
}

impl LoggedFeature for FeatureRef<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn value(&self) -> Option<f64> {
        self.value
    }
    fn status(&self) -> &str {
        self.status
    }
    fn event_time_us(&self) -> Option<i64> {
        self.event_time_us
    }
}

/// Where [`decode_ref`] puts a payload's lists; kept and reused across the payloads of
/// one buffer, so decoding allocates nothing per record.
#[derive(Default)]
pub(crate) struct Lists<'a> {
    keys: Vec<(&'a str, &'a str)>,
    features: Vec<FeatureRef<'a>>,
}

/// A decoded payload, borrowed from its bytes.
pub(crate) type DecodedRef<'s, 'a> = RecordRef<'s, &'a str, FeatureRef<'a>>;

/// Decodes one payload written by [`encode`] without copying its text.
pub(crate) fn decode_ref<'s, 'a: 's>(
    payload: &'a [u8],
    lists: &'s mut Lists<'a>,
) -> Result<DecodedRef<'s, 'a>, DecodeError> {
    let mut r = Reader { buf: payload };
    match r.u8()? {
        RECORD_V1 => {}
        t => return Err(DecodeError::UnknownTag(t)),
    }
    let request_id = r.str()?;
    let ts_us = r.i64()?;
    let model = r.str()?;
    let version = r.str()?;
    let role = match r.u8()? {
        0 => Role::Primary,
        1 => Role::Canary,
        2 => Role::Shadow,
        _ => return Err(DecodeError::Malformed("role")),
    };
    let protocol = match r.u8()? {
        0 => Protocol::Decide,
        1 => Protocol::OipGrpc,
        2 => Protocol::OipHttp,
        3 => Protocol::Unknown,
        _ => return Err(DecodeError::Malformed("protocol")),
    };
    // Each entity key takes at least 2 bytes, each feature at least 3: a count larger
    // than the bytes left could hold is corruption, and never sizes an allocation.
    let n = r.count(2)?;
    lists.keys.clear();
    lists.keys.reserve(n);
    for _ in 0..n {
        lists.keys.push((r.str()?, r.str()?));
    }
    lists.features.clear();
    let has_features = match r.u8()? {
        0 => false,
        1 => {
            let n = r.count(3)?;
            lists.features.reserve(n);
            for _ in 0..n {
                lists.features.push(r.feature()?);
            }
            true
        }
        _ => return Err(DecodeError::Malformed("features flag")),
    };
    let score = r.opt_f64()?;
    let decision = match r.u8()? {
        0 => None,
        1 => Some(r.str()?),
        _ => return Err(DecodeError::Malformed("decision flag")),
    };
    let source = r.str()?;
    let mut st = [0u64; 7];
    for s in &mut st {
        *s = r.var()?;
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok(RecordRef {
        request_id,
        ts_us,
        model,
        version,
        role,
        protocol,
        entity_keys: &lists.keys,
        features: has_features.then_some(&lists.features[..]),
        score,
        decision,
        source,
        stages: StageMicros::from_array(st),
    })
}

/// Decodes one payload written by [`encode`] into an owned record.
pub(crate) fn decode(payload: &[u8]) -> Result<PredictionRecord, DecodeError> {
    let mut lists = Lists::default();
    decode_ref(payload, &mut lists).map(|r| r.to_record())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Malformed("short payload"));
        }
        let buf: &'a [u8] = self.buf;
        let (head, rest) = buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn eight(&mut self) -> Result<[u8; 8], DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(b)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.eight()?))
    }

    fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_le_bytes(self.eight()?))
    }

    fn opt_f64(&mut self) -> Result<Option<f64>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.f64()?)),
            _ => Err(DecodeError::Malformed("option flag")),
        }
    }

    fn var(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Malformed("varint"))
    }

    /// A count of items that take at least `min_bytes` each.
    fn count(&mut self, min_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.var()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(min_bytes) <= self.buf.len() => Ok(n),
            _ => Err(DecodeError::Malformed("count")),
        }
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = usize::try_from(self.var()?).map_err(|_| DecodeError::Malformed("length"))?;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::Malformed("utf-8"))
    }

    fn feature(&mut self) -> Result<FeatureRef<'a>, DecodeError> {
        let name = self.str()?;
        let flags = self.u8()?;
        if flags & !(HAS_VALUE | HAS_TIME) != 0 {
            return Err(DecodeError::Malformed("feature flags"));
        }
        let value = if flags & HAS_VALUE != 0 {
            Some(self.f64()?)
        } else {
            None
        };
        let status = match self.u8()? {
            OTHER_STATUS => self.str()?,
            i => status::ALL
                .get(usize::from(i))
                .ok_or(DecodeError::Malformed("status"))?,
        };
        let event_time_us = if flags & HAS_TIME != 0 {
            Some(self.i64()?)
        } else {
            None
        };
        Ok(FeatureRef {
            name,
            value,
            status,
            event_time_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{source, FeatureUsed};

    fn full() -> PredictionRecord {
        let mut r = PredictionRecord::new("req-ü-1", "fraud", "12", Role::Shadow);
        r.ts_us = -5;
        r.protocol = Protocol::OipHttp;
        r.entity_keys = vec![("card_id".into(), "17".into()), ("m".into(), String::new())];
        r.features = Some(vec![
            FeatureUsed {
                name: "card:txn_count_1h".into(),
                value: Some(-0.0),
                status: status::PRESENT.into(),
                event_time_us: Some(1_700_000_000_000_000),
            },
            FeatureUsed {
                name: "request:amount".into(),
                value: None,
                status: status::MISSING.into(),
                event_time_us: None,
            },
            FeatureUsed {
                name: "x".into(),
                value: Some(f64::MAX),
                status: "something_else".into(),
                event_time_us: Some(i64::MIN),
            },
        ]);
        r.score = Some(0.25);
        r.decision = Some("decline".into());
        r.source = source::BATCH_SCORE.into();
        r.stages = StageMicros::from_array([0, 1, 127, 128, 16_383, 16_384, u64::MAX]);
        r
    }

    #[test]
    fn every_field_round_trips() {
        for rec in [full(), PredictionRecord::new("", "", "", Role::Primary)] {
            let mut buf = Vec::new();
            encode(&rec.view(), &mut buf);
            assert_eq!(decode(&buf), Ok(rec));
        }
        let mut none = full();
        none.features = None;
        none.score = None;
        none.decision = None;
        let mut buf = Vec::new();
        encode(&none.view(), &mut buf);
        assert_eq!(decode(&buf), Ok(none));
    }

    #[test]
    fn damaged_payloads_are_refused_not_misread() {
        let mut buf = Vec::new();
        encode(&full().view(), &mut buf);
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert_eq!(
            decode(&longer),
            Err(DecodeError::Malformed("trailing bytes"))
        );
        let mut newer = buf.clone();
        newer[0] = 9;
        assert_eq!(decode(&newer), Err(DecodeError::UnknownTag(9)));
        // A huge count never sizes an allocation.
        let mut r = PredictionRecord::new("r", "m", "1", Role::Primary);
        r.entity_keys.clear();
        let mut b = Vec::new();
        encode(&r.view(), &mut b);
        // tag, "r", ts, "m", "1", role, protocol: the key count follows.
        let at = 1 + 2 + 8 + 2 + 2 + 2;
        assert_eq!(b[at], 0);
        let mut huge = b[..at].to_vec();
        put_var(&mut huge, u64::MAX / 2);
        huge.extend_from_slice(&b[at + 1..]);
        assert_eq!(decode(&huge), Err(DecodeError::Malformed("count")));
    }

    /// `ts_of` reads the timestamp without decoding; `decode_ref` borrows the text and
    /// reuses its lists from one payload to the next.
    #[test]
    fn the_timestamp_and_a_borrowed_record_read_from_the_bytes() {
        let a = full();
        let mut b = PredictionRecord::new("other", "m", "", Role::Primary);
        b.ts_us = 1_700_000_000_123_456;
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        encode(&a.view(), &mut pa);
        encode(&b.view(), &mut pb);
        assert_eq!(ts_of(&pa), Some(-5));
        assert_eq!(ts_of(&pb), Some(b.ts_us));
        assert_eq!(ts_of(&pa[..3]), None);
        let mut lists = Lists::default();
        let ra = decode_ref(&pa, &mut lists).unwrap();
        assert_eq!(ra.features.map(<[_]>::len), Some(3));
        assert_eq!(ra.features.unwrap()[2].status, "something_else");
        assert_eq!(ra.to_record(), a);
        let rb = decode_ref(&pb, &mut lists).unwrap();
        assert_eq!(rb.to_record(), b);
        assert!(rb.features.is_none() && rb.entity_keys.is_empty());
    }
}
