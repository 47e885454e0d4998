//! The binary encoding of one record in a wal frame (files that start `MESHWAL2`).
//!
//! A frame's payload is one tag byte, [`RECORD_V2`] (written now) or [`RECORD_V1`]
//! (written before, still read), then the record's fields in declaration order, little
//! endian:
//!
//! ```text
//! var  name set          V2 only: 0, or the id of a name-set frame (below) earlier
//!                        in the same wal that names the features, in order
//! str  request_id        str = varint byte length + UTF-8 bytes
//! i64  ts_us             8 bytes
//! str  model, version
//! u8   role              0 primary, 1 canary, 2 shadow
//! u8   protocol          0 decide, 1 oip_grpc, 2 oip_http, 3 unknown
//! var  entity key count, then (str key, str value) each
//! u8   0 = no feature list, 1 = a list: var count, then per feature:
//!        [str name] (not with a name set), u8 flags, [value], u8 status (index in
//!        status::ALL, or 255 then str), [i64 event time]
//!      flags: 1 value, 2 event time; in V2 also 4 (the value is an f32 that widens
//!        to it bit for bit: 4 bytes, else an f64, 8 bytes) and 8 (the event time is
//!        the one of the last feature before it that had one: no bytes)
//! u8   0/1 score, [f64]
//! u8   0/1 decision, [str]
//! str  source
//! var  ×7 stage microseconds (StageMicros::NAMES order)
//! ```
//!
//! A name-set frame ([`NAMES`]) holds the feature names that records of one model
//! share: `var id, var count, str × count`. The log gives each list of names it meets
//! an id ([`MAX_NAME_SETS`] at most) and writes its frame into a segment's wal before
//! the first record that uses it, so every wal reads on its own.
//!
//! About a quarter of the bytes of the JSON it replaces and an order of magnitude
//! cheaper to write and read. V2 spends less on what the records of a model share: the
//! names of its features (by name set), values a feature store keeps as f32, and the
//! event time of an entity's row, which each of that row's features repeats (the
//! example fraud model's 29 features: 1,003 bytes a record in V1, 359 in V2). A tag this build does not know (a newer layout) is an
//! error that names it, never taken for a torn frame: recovery must not discard it.

use crate::record::{
    status, LoggedFeature, PredictionRecord, Protocol, RecordRef, Role, StageMicros,
};
use std::sync::Arc;

/// Tag of the layout above as written before V2: values always as f64, every event
/// time in full.
pub(crate) const RECORD_V1: u8 = 1;
/// Tag of the layout above as written now.
pub(crate) const RECORD_V2: u8 = 2;

const HAS_VALUE: u8 = 1;
const HAS_TIME: u8 = 2;
/// V2: the value is stored as an f32 (it widens back to the f64, bit for bit).
const VALUE_F32: u8 = 4;
/// V2: the event time is that of the last feature before this one that had one.
const TIME_SAME: u8 = 8;
const OTHER_STATUS: u8 = 255;
/// Tag of a name-set frame: an id and the feature names records of that set carry.
pub(crate) const NAMES: u8 = 16;
/// Most name sets one log gives ids to, and one wal may define: past it, records name
/// their features themselves.
pub(crate) const MAX_NAME_SETS: u32 = 1024;

/// The feature names of a name set, in order.
pub(crate) type Names = Arc<[Box<str>]>;

/// Appends the payload of `rec` (tag included) to `out`, its features named inline.
#[cfg(test)]
pub(crate) fn encode<K: AsRef<str>, F: LoggedFeature>(
    rec: &RecordRef<'_, K, F>,
    out: &mut Vec<u8>,
) {
    encode_as(RECORD_V2, 0, rec, out);
}

/// [`encode`] for a record whose features are named, in order, by the name set `set`
/// (not 0),
/// as the caller checked: the names are left out.
pub(crate) fn encode_by_names<K: AsRef<str>, F: LoggedFeature>(
    set: u32,
    rec: &RecordRef<'_, K, F>,
    out: &mut Vec<u8>,
) {
    encode_as(RECORD_V2, set, rec, out);
}

/// The payload of a name-set frame.
pub(crate) fn encode_name_set(id: u32, names: &[Box<str>], out: &mut Vec<u8>) {
    out.push(NAMES);
    put_var(out, u64::from(id));
    put_var(out, names.len() as u64);
    for n in names {
        put_str(out, n);
    }
}

/// The name set a payload's record names its features by (None: named inline, or not a
/// V2 record).
pub(crate) fn name_set_of(payload: &[u8]) -> Option<u32> {
    let mut r = Reader { buf: payload };
    if r.u8().ok()? != RECORD_V2 {
        return None;
    }
    match r.var().ok()? {
        0 => None,
        id => u32::try_from(id).ok(),
    }
}

/// Whether a payload is a name-set frame's (no record).
pub(crate) fn is_name_set(payload: &[u8]) -> bool {
    payload.first() == Some(&NAMES)
}

/// [`encode`] in the layout of `tag` (V1 for the tests that read what older builds
/// wrote), the features named by the name set `set` when it is not 0 (V2).
fn encode_as<K: AsRef<str>, F: LoggedFeature>(
    tag: u8,
    set: u32,
    rec: &RecordRef<'_, K, F>,
    out: &mut Vec<u8>,
) {
    out.push(tag);
    let set = if rec.features.is_some() { set } else { 0 };
    if tag == RECORD_V2 {
        put_var(out, u64::from(set));
    }
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
            let mut last_time = None;
            for f in fs {
                put_feature(tag, set == 0, out, f, &mut last_time);
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
    match r.u8().ok()? {
        RECORD_V1 => {}
        RECORD_V2 => {
            r.var().ok()?;
        }
        _ => return None,
    }
    r.str().ok()?;
    r.i64().ok()
}

/// One feature, with its name when `named`; `last_time` is the event time of the last
/// feature before it that had one (V2 writes a repeat of it as a flag).
fn put_feature(
    tag: u8,
    named: bool,
    out: &mut Vec<u8>,
    f: &impl LoggedFeature,
    last_time: &mut Option<i64>,
) {
    if named {
        put_str(out, f.name());
    }
    let (value, time) = (f.value(), f.event_time_us());
    let v2 = tag == RECORD_V2;
    // An f32 that widens to the value bit for bit (a NaN's payload may not: it stays
    // an f64).
    let narrow = match value {
        Some(v) if v2 && f64::from(v as f32).to_bits() == v.to_bits() => Some(v as f32),
        _ => None,
    };
    let same_time = v2 && time.is_some() && time == *last_time;
    let flags = if value.is_some() { HAS_VALUE } else { 0 }
        | if time.is_some() { HAS_TIME } else { 0 }
        | if narrow.is_some() { VALUE_F32 } else { 0 }
        | if same_time { TIME_SAME } else { 0 };
    out.push(flags);
    match (narrow, value) {
        (Some(n), _) => out.extend_from_slice(&n.to_le_bytes()),
        (None, Some(v)) => out.extend_from_slice(&v.to_le_bytes()),
        (None, None) => {}
    }
    match f.status_index() {
        Some(i) => out.push(i),
        None => {
            out.push(OTHER_STATUS);
            put_str(out, f.status());
        }
    }
    if let Some(t) = time {
        if !same_time {
            out.extend_from_slice(&t.to_le_bytes());
        }
        *last_time = Some(t);
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
    /// `status`'s position in [`status::ALL`] (None: another text).
    pub status_index: Option<u8>,
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
    fn status_index(&self) -> Option<u8> {
        self.status_index
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

/// The name sets a reader of one wal (or of the frames the writer passes on) has met,
/// by id.
#[derive(Default)]
pub(crate) struct NameSets {
    by_id: std::collections::HashMap<u32, Names>,
}

impl NameSets {
    /// Takes in the name-set frame `payload`. The same id again must name the same
    /// features.
    pub(crate) fn define(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        let mut r = Reader { buf: payload };
        if r.u8()? != NAMES {
            return Err(DecodeError::Malformed("not a name set"));
        }
        let id = match u32::try_from(r.var()?) {
            Ok(id) if id != 0 && id <= MAX_NAME_SETS => id,
            _ => return Err(DecodeError::Malformed("name set id")),
        };
        let n = r.count(1)?;
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            names.push(Box::<str>::from(r.str()?));
        }
        if !r.buf.is_empty() {
            return Err(DecodeError::Malformed("trailing bytes"));
        }
        match self.by_id.get(&id) {
            Some(known) if known[..] != names[..] => {
                Err(DecodeError::Malformed("name set redefined"))
            }
            Some(_) => Ok(()),
            None => {
                self.by_id.insert(id, names.into());
                Ok(())
            }
        }
    }

    /// The names of the name set that a record's payload names its features by (None:
    /// named inline, not a V2 record, or a set not met).
    pub(crate) fn names_of(&self, payload: &[u8]) -> Option<&Names> {
        self.by_id.get(&name_set_of(payload)?)
    }

    /// Takes in every name-set frame of `frames` (whole wal frames) from offset `at` on.
    pub(crate) fn define_all(&mut self, frames: &[u8], mut at: usize) -> Result<(), DecodeError> {
        while let Some((payload, next)) = crate::wal::frame_at(frames, at) {
            if is_name_set(payload) {
                self.define(payload)?;
            }
            at = next;
        }
        Ok(())
    }
}

/// Decodes one payload written by [`encode`] without copying its text; the names of
/// a record by a name set are borrowed from `sets`.
pub(crate) fn decode_ref<'s, 'a: 's>(
    payload: &'a [u8],
    lists: &'s mut Lists<'a>,
    sets: &'a NameSets,
) -> Result<DecodedRef<'s, 'a>, DecodeError> {
    let mut r = Reader { buf: payload };
    let tag = match r.u8()? {
        t @ (RECORD_V1 | RECORD_V2) => t,
        t => return Err(DecodeError::UnknownTag(t)),
    };
    let names = match tag {
        RECORD_V2 => match r.var()? {
            0 => None,
            id => Some(
                u32::try_from(id)
                    .ok()
                    .and_then(|id| sets.by_id.get(&id))
                    .ok_or(DecodeError::Malformed("name set not defined"))?,
            ),
        },
        _ => None,
    };
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
            // Without names a feature takes at least 2 bytes.
            let n = r.count(if names.is_some() { 2 } else { 3 })?;
            lists.features.reserve(n);
            let mut last_time = None;
            match names {
                None => {
                    for _ in 0..n {
                        let name = r.str()?;
                        lists.features.push(r.feature(name, tag, &mut last_time)?);
                    }
                }
                Some(names) if names.len() == n => {
                    for name in names.iter() {
                        lists.features.push(r.feature(name, tag, &mut last_time)?);
                    }
                }
                Some(_) => return Err(DecodeError::Malformed("features of the name set")),
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
pub(crate) fn decode(payload: &[u8], sets: &NameSets) -> Result<PredictionRecord, DecodeError> {
    let mut lists = Lists::default();
    decode_ref(payload, &mut lists, sets).map(|r| r.to_record())
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

    /// The rest of a feature named `name` of a payload of layout `tag`; `last_time` as
    /// [`put_feature`] has it.
    #[inline(always)]
    fn feature(
        &mut self,
        name: &'a str,
        tag: u8,
        last_time: &mut Option<i64>,
    ) -> Result<FeatureRef<'a>, DecodeError> {
        let flags = self.u8()?;
        let known = match tag {
            RECORD_V1 => HAS_VALUE | HAS_TIME,
            _ => HAS_VALUE | HAS_TIME | VALUE_F32 | TIME_SAME,
        };
        // A narrow value needs a value, a repeated time a time, and a repeat something
        // to repeat.
        if flags & !known != 0
            || (flags & VALUE_F32 != 0 && flags & HAS_VALUE == 0)
            || (flags & TIME_SAME != 0 && (flags & HAS_TIME == 0 || last_time.is_none()))
        {
            return Err(DecodeError::Malformed("feature flags"));
        }
        let value = if flags & VALUE_F32 != 0 {
            let mut b = [0u8; 4];
            b.copy_from_slice(self.take(4)?);
            Some(f64::from(f32::from_le_bytes(b)))
        } else if flags & HAS_VALUE != 0 {
            Some(self.f64()?)
        } else {
            None
        };
        let (status, status_index) = match self.u8()? {
            OTHER_STATUS => (self.str()?, None),
            i => (
                *status::ALL
                    .get(usize::from(i))
                    .ok_or(DecodeError::Malformed("status"))?,
                Some(i),
            ),
        };
        let event_time_us = if flags & TIME_SAME != 0 {
            *last_time
        } else if flags & HAS_TIME != 0 {
            Some(self.i64()?)
        } else {
            None
        };
        if event_time_us.is_some() {
            *last_time = event_time_us;
        }
        Ok(FeatureRef {
            name,
            value,
            status,
            status_index,
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
            assert_eq!(decode(&buf, &NameSets::default()), Ok(rec));
        }
        let mut none = full();
        none.features = None;
        none.score = None;
        none.decision = None;
        let mut buf = Vec::new();
        encode(&none.view(), &mut buf);
        assert_eq!(decode(&buf, &NameSets::default()), Ok(none));
    }

    #[test]
    fn damaged_payloads_are_refused_not_misread() {
        let mut buf = Vec::new();
        encode(&full().view(), &mut buf);
        for cut in 0..buf.len() {
            assert!(
                decode(&buf[..cut], &NameSets::default()).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert_eq!(
            decode(&longer, &NameSets::default()),
            Err(DecodeError::Malformed("trailing bytes"))
        );
        let mut newer = buf.clone();
        newer[0] = 9;
        assert_eq!(
            decode(&newer, &NameSets::default()),
            Err(DecodeError::UnknownTag(9))
        );
        // A huge count never sizes an allocation.
        let mut r = PredictionRecord::new("r", "m", "1", Role::Primary);
        r.entity_keys.clear();
        let mut b = Vec::new();
        encode(&r.view(), &mut b);
        // tag, name set, "r", ts, "m", "1", role, protocol: the key count follows.
        let at = 1 + 1 + 2 + 8 + 2 + 2 + 2;
        assert_eq!(b[at], 0);
        let mut huge = b[..at].to_vec();
        put_var(&mut huge, u64::MAX / 2);
        huge.extend_from_slice(&b[at + 1..]);
        assert_eq!(
            decode(&huge, &NameSets::default()),
            Err(DecodeError::Malformed("count"))
        );
    }

    /// V2 keeps an f32 value in 4 bytes and a repeated event time in none, and reads
    /// back every value bit for bit; what V1 wrote still reads.
    #[test]
    fn v2_narrows_values_and_repeated_times_and_v1_still_reads() {
        let t0 = 1_700_000_000_000_000;
        let values = [
            Some(16.0),
            Some(f64::from(8.892_908_f32)),
            Some(414.432_678_646_908_24),
            Some(-0.0),
            Some(f64::INFINITY),
            Some(f64::NAN),
            Some(f64::from_bits(0x7ff8_0000_0000_0001)), // a NaN no f32 holds
            None,
            Some(1e300),
        ];
        let times = [
            Some(t0),
            Some(t0),
            None,
            Some(t0),
            Some(t0 + 1),
            Some(t0 + 1),
            None,
            Some(t0),
            Some(t0),
        ];
        let mut rec = PredictionRecord::new("r", "m", "1", Role::Primary);
        rec.features = Some(
            values
                .iter()
                .zip(times)
                .enumerate()
                .map(|(i, (v, t))| FeatureUsed {
                    name: format!("f{i}").into(),
                    value: *v,
                    status: status::PRESENT.into(),
                    event_time_us: t,
                })
                .collect(),
        );
        let (mut v1, mut v2) = (Vec::new(), Vec::new());
        encode_as(RECORD_V1, 0, &rec.view(), &mut v1);
        encode(&rec.view(), &mut v2);
        assert_eq!((v1[0], v2[0]), (RECORD_V1, RECORD_V2));
        // Five values narrow (16, the f32, -0, inf, the f32 NaN) and four times repeat.
        // V2 also spends a byte on the name set (0: named inline).
        assert_eq!(v1.len() + 1 - v2.len(), 5 * 4 + 4 * 8);
        for payload in [&v1, &v2] {
            let got = decode(payload, &NameSets::default()).unwrap();
            let fs = got.features.as_ref().unwrap();
            for (f, (v, t)) in fs.iter().zip(values.iter().zip(times)) {
                assert_eq!(f.value.map(f64::to_bits), v.map(f64::to_bits), "{}", f.name);
                assert_eq!(f.event_time_us, t, "{}", f.name);
            }
        }
        // A flag V1 does not have, and a repeat with nothing before it, are refused.
        let mut one = PredictionRecord::new("r", "m", "1", Role::Primary);
        one.features = Some(vec![FeatureUsed {
            name: "a".into(),
            value: Some(1.0),
            status: status::PRESENT.into(),
            event_time_us: Some(t0),
        }]);
        let mut b = Vec::new();
        encode(&one.view(), &mut b);
        // tag, name set, "r", ts, "m", "1", role, protocol, no keys, a list of one, "a":
        // the flags.
        let at = 1 + 1 + 2 + 8 + 2 + 2 + 2 + 1 + 1 + 1 + 2;
        assert_eq!(b[at], HAS_VALUE | HAS_TIME | VALUE_F32);
        let mut v1_flag = b.clone();
        v1_flag.remove(1); // V1 has no name set
        v1_flag[0] = RECORD_V1;
        assert_eq!(
            decode(&v1_flag, &NameSets::default()),
            Err(DecodeError::Malformed("feature flags"))
        );
        let mut no_repeat = b.clone();
        no_repeat[at] |= TIME_SAME;
        assert_eq!(
            decode(&no_repeat, &NameSets::default()),
            Err(DecodeError::Malformed("feature flags"))
        );
    }

    /// A record by a name set leaves its names to the set's frame, and reads back only
    /// where that frame was read first, and only with as many features as it names.
    #[test]
    fn records_by_a_name_set_read_their_names_from_its_frame() {
        let rec = full();
        let names: Names = rec
            .features
            .as_ref()
            .unwrap()
            .iter()
            .map(|f| Box::from(&*f.name))
            .collect();
        let (mut inline, mut by_set, mut set_frame) = (Vec::new(), Vec::new(), Vec::new());
        encode(&rec.view(), &mut inline);
        encode_by_names(7, &rec.view(), &mut by_set);
        encode_name_set(7, &names, &mut set_frame);
        let name_bytes: usize = names.iter().map(|n| 1 + n.len()).sum();
        assert_eq!(inline.len() - by_set.len(), name_bytes);
        assert_eq!(
            (name_set_of(&inline), name_set_of(&by_set)),
            (None, Some(7))
        );
        assert!(is_name_set(&set_frame) && !is_name_set(&by_set));
        assert_eq!(ts_of(&by_set), Some(rec.ts_us));
        assert_eq!(
            decode(&by_set, &NameSets::default()),
            Err(DecodeError::Malformed("name set not defined"))
        );
        let mut sets = NameSets::default();
        sets.define(&set_frame).unwrap();
        sets.define(&set_frame).unwrap(); // the same again: fine
        assert_eq!(decode(&by_set, &sets), Ok(rec.clone()));
        assert_eq!(decode(&inline, &sets), Ok(rec.clone()));
        // The same id naming other features is damage, as is a set of another length.
        let mut other = Vec::new();
        encode_name_set(7, &names[..2], &mut other);
        assert_eq!(
            sets.define(&other),
            Err(DecodeError::Malformed("name set redefined"))
        );
        let mut short = NameSets::default();
        short.define(&other).unwrap();
        assert_eq!(
            decode(&by_set, &short),
            Err(DecodeError::Malformed("features of the name set"))
        );
        // Ids are bounded, and a record without features names no set.
        let mut big = Vec::new();
        encode_name_set(MAX_NAME_SETS + 1, &names, &mut big);
        assert_eq!(
            NameSets::default().define(&big),
            Err(DecodeError::Malformed("name set id"))
        );
        let mut bare = rec.clone();
        bare.features = None;
        let mut b = Vec::new();
        encode_by_names(7, &bare.view(), &mut b);
        assert_eq!(name_set_of(&b), None);
        assert_eq!(decode(&b, &NameSets::default()), Ok(bare));
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
        let sets = NameSets::default();
        let mut lists = Lists::default();
        let ra = decode_ref(&pa, &mut lists, &sets).unwrap();
        assert_eq!(ra.features.map(<[_]>::len), Some(3));
        assert_eq!(ra.features.unwrap()[2].status, "something_else");
        assert_eq!(ra.to_record(), a);
        let rb = decode_ref(&pb, &mut lists, &sets).unwrap();
        assert_eq!(rb.to_record(), b);
        assert!(rb.features.is_none() && rb.entity_keys.is_empty());
    }
}
