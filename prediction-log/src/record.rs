//! The record written for every prediction. Plain data, no heavy dependencies, so the
//! router can build one cheaply on every request.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Where the answer came from (`PredictionRecord::source`). Free-form on purpose (the router
/// owns the fallback chain); these are the values the mesh writes.
pub mod source {
    pub const MODEL: &str = "MODEL";
    pub const PREVIOUS_VERSION: &str = "PREVIOUS_VERSION";
    pub const BATCH_SCORE: &str = "BATCH_SCORE";
    pub const RULES: &str = "RULES";
    pub const DEFAULT: &str = "DEFAULT";
}

/// The status of a feature value (`FeatureUsed::status`): the feature store's four, as
/// `mesh.v1.FeatureStatus` spells them, plus two the decision path adds. One spelling
/// in the API, the Parquet files and the docs.
pub mod status {
    /// The value was read and used.
    pub const PRESENT: &str = "PRESENT";
    /// The store has no row for the entity (an unknown card): the spec's default was used.
    pub const NOT_FOUND: &str = "NOT_FOUND";
    /// The row exists but this feature is null: the default was used.
    pub const NULL: &str = "NULL";
    /// The stored value is older than the view's `max_age`: the default was used.
    pub const OUTSIDE_MAX_AGE: &str = "OUTSIDE_MAX_AGE";
    /// A request feature the input spec reads was not in the request: the default was used.
    pub const MISSING: &str = "MISSING";
    /// The feature store could not be read (no store, or the lookup failed): the default was used.
    pub const UNAVAILABLE: &str = "UNAVAILABLE";
    /// A categorical value that is not one of the input spec entry's categories:
    /// treated as missing (the entry's `on_missing`: its default, NaN, or no score).
    pub const UNSEEN: &str = "UNSEEN";
    /// Every status the mesh writes.
    pub const ALL: [&str; 7] = [
        PRESENT,
        NOT_FOUND,
        NULL,
        OUTSIDE_MAX_AGE,
        MISSING,
        UNAVAILABLE,
        UNSEEN,
    ];

    /// The status of [`ALL`] that `same` matches with `s`, borrowed; else `s`, owned.
    fn spelled(s: &str, same: fn(&str, &str) -> bool) -> std::borrow::Cow<'static, str> {
        match ALL.iter().find(|a| same(a, s)) {
            Some(a) => std::borrow::Cow::Borrowed(a),
            None => std::borrow::Cow::Owned(s.to_owned()),
        }
    }

    /// A status as a record keeps it: one of [`ALL`] borrowed, anything else owned as given.
    pub(crate) fn normalize_owned(s: &str) -> std::borrow::Cow<'static, str> {
        spelled(s, |a, s| a == s)
    }

    /// The one spelling of a status: logs written before statuses were upper case
    /// (`not_found`) read as `NOT_FOUND`.
    pub fn normalize(s: &str) -> std::borrow::Cow<'static, str> {
        spelled(s, str::eq_ignore_ascii_case)
    }
}

/// Deployment role of the model version that produced the prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Canary,
    Shadow,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Canary => "canary",
            Role::Shadow => "shadow",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "primary" => Ok(Role::Primary),
            "canary" => Ok(Role::Canary),
            "shadow" => Ok(Role::Shadow),
            other => Err(format!("unknown role {other:?} (primary, canary, shadow)")),
        }
    }
}

/// The front door a prediction came through (`PredictionRecord::protocol`), so a join can
/// keep OIP traffic (a `mesh bench --target infer` run, say) apart from decisions.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Decide / DecideBatch (primary, canary and shadow records alike).
    Decide,
    /// OIP ModelInfer over gRPC.
    OipGrpc,
    /// OIP infer over HTTP/REST.
    OipHttp,
    /// Written before records carried a protocol: decisions and OIP rows cannot be told
    /// apart there, so old wal frames and Parquet files read as `unknown`.
    #[default]
    Unknown,
}

impl Protocol {
    /// Every value, in the order joins sort them.
    pub const ALL: [Protocol; 4] = [
        Protocol::Decide,
        Protocol::OipGrpc,
        Protocol::OipHttp,
        Protocol::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Decide => "decide",
            Protocol::OipGrpc => "oip_grpc",
            Protocol::OipHttp => "oip_http",
            Protocol::Unknown => "unknown",
        }
    }

    /// The protocol of an OIP call by its transport (`"grpc"` or `"http"`, the
    /// request metrics' `protocol` label); anything else is `Unknown`.
    pub fn oip(transport: &str) -> Self {
        match transport {
            "grpc" => Protocol::OipGrpc,
            "http" => Protocol::OipHttp,
            _ => Protocol::Unknown,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown protocol {s:?} (decide, oip_grpc, oip_http, unknown)"))
    }
}

/// One feature value the prediction used, as the feature store returned it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureUsed {
    /// Shared, not copied: the serving path hands the log the name its input spec holds.
    pub name: Arc<str>,
    /// `None` when the store had no usable value (the model then used its default).
    pub value: Option<f64>,
    /// One of [`status`]: PRESENT | NOT_FOUND | NULL | OUTSIDE_MAX_AGE (the feature
    /// store's) | MISSING (a request feature) | UNAVAILABLE (the store could not be read).
    /// Borrowed for those (no allocation per feature on the request path).
    pub status: Cow<'static, str>,
    /// Event time of the value, microseconds since the Unix epoch.
    pub event_time_us: Option<i64>,
}

/// Microseconds spent in each stage of the request. `total` is measured end to end, so the
/// stages add up to no more than it (the remainder is routing, logging, serialization).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageMicros {
    pub validate: u64,
    pub features: u64,
    pub preprocess: u64,
    pub queue: u64,
    pub compute: u64,
    pub postprocess: u64,
    pub total: u64,
}

impl StageMicros {
    /// Stage names in column order (`<name>_us` in Parquet).
    pub const NAMES: [&'static str; 7] = [
        "validate",
        "features",
        "preprocess",
        "queue",
        "compute",
        "postprocess",
        "total",
    ];

    pub fn as_array(&self) -> [u64; 7] {
        [
            self.validate,
            self.features,
            self.preprocess,
            self.queue,
            self.compute,
            self.postprocess,
            self.total,
        ]
    }

    pub fn from_array(a: [u64; 7]) -> Self {
        Self {
            validate: a[0],
            features: a[1],
            preprocess: a[2],
            queue: a[3],
            compute: a[4],
            postprocess: a[5],
            total: a[6],
        }
    }

    /// Sum of the stages other than `total`.
    pub fn sum_of_stages(&self) -> u64 {
        self.as_array()[..6].iter().sum()
    }
}

/// One prediction, from any path (Decide, DecideBatch, OIP ModelInfer, shadow, canary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictionRecord {
    pub request_id: String,
    /// Time of the prediction, microseconds since the Unix epoch (UTC).
    pub ts_us: i64,
    pub model: String,
    pub version: String,
    pub role: Role,
    /// The front door: `decide`, `oip_grpc` or `oip_http`. Records written before the
    /// field existed read as `unknown` (serde default; a Parquet file without the column).
    #[serde(default)]
    pub protocol: Protocol,
    /// Entity keys of the request, e.g. `("card_id", "c-123")`, in request order.
    pub entity_keys: Vec<(String, String)>,
    /// Features used. `None` when feature logging is off or the record was not sampled
    /// (the handle applies `FeatureLogging`); `Some(vec![])` when the path used none (OIP).
    pub features: Option<Vec<FeatureUsed>>,
    pub score: Option<f64>,
    /// approve / review / decline; `None` on paths without a decision (OIP).
    pub decision: Option<String>,
    /// Which source answered, see [`source`].
    pub source: String,
    pub stages: StageMicros,
}

impl PredictionRecord {
    /// A record with the given identity, stamped now, everything else empty. The protocol
    /// is `Decide`; OIP paths set theirs.
    pub fn new(
        request_id: impl Into<String>,
        model: impl Into<String>,
        version: impl Into<String>,
        role: Role,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            ts_us: now_us(),
            model: model.into(),
            version: version.into(),
            role,
            protocol: Protocol::Decide,
            entity_keys: Vec::new(),
            features: None,
            score: None,
            decision: None,
            source: source::MODEL.to_string(),
            stages: StageMicros::default(),
        }
    }

    /// The record borrowed, as the log encodes it.
    pub fn view(&self) -> RecordRef<'_> {
        RecordRef {
            request_id: &self.request_id,
            ts_us: self.ts_us,
            model: &self.model,
            version: &self.version,
            role: self.role,
            protocol: self.protocol,
            entity_keys: &self.entity_keys,
            features: self.features.as_deref(),
            score: self.score,
            decision: self.decision.as_deref(),
            source: &self.source,
            stages: self.stages,
        }
    }
}

/// A feature as the log reads it. [`FeatureUsed`] is one; a caller that keeps its own
/// type (the router's decision outcome) implements this and logs through
/// [`RecordRef`] without building a [`PredictionRecord`].
pub trait LoggedFeature {
    fn name(&self) -> &str;
    fn value(&self) -> Option<f64>;
    /// One of [`status`] (any other text is kept as it is).
    fn status(&self) -> &str;
    fn event_time_us(&self) -> Option<i64>;
    /// The status's position in [`status::ALL`], or None for any other text. The
    /// default compares [`LoggedFeature::status`] with each; a type that holds the
    /// position (a feature decoded from a wal frame) gives it without comparing, and
    /// must give the one of the text `status` returns.
    fn status_index(&self) -> Option<u8> {
        let s = self.status();
        status::ALL.iter().position(|a| *a == s).map(|i| i as u8)
    }
}

impl LoggedFeature for FeatureUsed {
    fn name(&self) -> &str {
        &self.name
    }
    fn value(&self) -> Option<f64> {
        self.value
    }
    fn status(&self) -> &str {
        &self.status
    }
    fn event_time_us(&self) -> Option<i64> {
        self.event_time_us
    }
}

/// One prediction, borrowed: the fields of a [`PredictionRecord`] as references into
/// what the caller already holds. [`PredictionLogHandle::record_ref`](crate::PredictionLogHandle::record_ref)
/// encodes it straight into the log's queue, so logging a decision copies its bytes
/// once and allocates nothing per feature. `K` is the text of the entity keys, `F` the
/// features' type.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a, K = String, F = FeatureUsed> {
    pub request_id: &'a str,
    /// Microseconds since the Unix epoch (UTC); [`now_us`] for a prediction made now.
    pub ts_us: i64,
    pub model: &'a str,
    pub version: &'a str,
    pub role: Role,
    pub protocol: Protocol,
    pub entity_keys: &'a [(K, K)],
    pub features: Option<&'a [F]>,
    pub score: Option<f64>,
    pub decision: Option<&'a str>,
    pub source: &'a str,
    pub stages: StageMicros,
}

impl<K: AsRef<str>, F: LoggedFeature> RecordRef<'_, K, F> {
    /// The owned record (for tests and tools; the log never needs one).
    pub fn to_record(&self) -> PredictionRecord {
        PredictionRecord {
            request_id: self.request_id.to_owned(),
            ts_us: self.ts_us,
            model: self.model.to_owned(),
            version: self.version.to_owned(),
            role: self.role,
            protocol: self.protocol,
            entity_keys: self
                .entity_keys
                .iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
                .collect(),
            features: self.features.map(|fs| {
                fs.iter()
                    .map(|f| FeatureUsed {
                        name: f.name().into(),
                        value: f.value(),
                        status: status::normalize_owned(f.status()),
                        event_time_us: f.event_time_us(),
                    })
                    .collect()
            }),
            score: self.score,
            decision: self.decision.map(str::to_owned),
            source: self.source.to_owned(),
            stages: self.stages,
        }
    }
}

/// The decimal text of a version number without allocating: `VersionText::new(Some(12))`
/// reads `"12"`, `None` reads `""` (as an unversioned record is written).
pub struct VersionText {
    buf: [u8; 20],
    start: usize,
}

impl VersionText {
    pub fn new(v: Option<u64>) -> Self {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        if let Some(mut v) = v {
            loop {
                start -= 1;
                buf[start] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
        }
        Self { buf, start }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII digits are ever written.
        std::str::from_utf8(&self.buf[self.start..]).unwrap_or_default()
    }
}

/// Which features go into the log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FeatureLogging {
    All,
    None,
    /// Keep the features of this fraction (0..=1) of records, chosen by a hash of the
    /// request id so the choice is reproducible and a request's shadow/canary records agree.
    Sample(f64),
}

impl FeatureLogging {
    /// Whether the features of a record with this request id are kept.
    pub fn keeps(&self, request_id: &str) -> bool {
        match *self {
            FeatureLogging::All => true,
            FeatureLogging::None => false,
            FeatureLogging::Sample(rate) => {
                if rate >= 1.0 {
                    return true;
                }
                if rate <= 0.0 || rate.is_nan() {
                    return false;
                }
                // FNV-1a, then the splitmix64 finalizer (FNV alone mixes the last bytes of
                // ids like "req-00000042" poorly), mapped onto [0, 1).
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in request_id.as_bytes() {
                    h ^= u64::from(*b);
                    h = h.wrapping_mul(0x0000_0100_0000_01b3);
                }
                h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                h ^= h >> 31;
                ((h >> 11) as f64 / (1u64 << 53) as f64) < rate
            }
        }
    }
}

impl FromStr for FeatureLogging {
    type Err = String;
    /// `all`, `none`, or a sample rate such as `0.05`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "all" => Ok(Self::All),
            "none" => Ok(Self::None),
            other => match other.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(Self::Sample(r)),
                _ => Err(format!(
                    "feature logging must be all, none or a rate in [0, 1], got {other:?}"
                )),
            },
        }
    }
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// `n` records `r0`, `r1`, ... of model `m` version 1 in `role` (for tests).
#[cfg(test)]
pub(crate) fn numbered(n: usize, role: Role) -> Vec<PredictionRecord> {
    (0..n)
        .map(|i| PredictionRecord::new(format!("r{i}"), "m", "1", role))
        .collect()
}

/// UTC calendar date (`YYYY-MM-DD`) of a timestamp in microseconds since the epoch.
pub fn date_of_us(ts_us: i64) -> String {
    let days = ts_us.div_euclid(86_400_000_000);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {

    #[test]
    fn statuses_have_one_spelling() {
        assert_eq!(status::normalize("not_found"), "NOT_FOUND");
        assert_eq!(status::normalize("outside_max_age"), "OUTSIDE_MAX_AGE");
        assert_eq!(status::normalize("PRESENT"), "PRESENT");
        assert_eq!(status::normalize("missing"), "MISSING");
        assert_eq!(status::normalize("other"), "other");
    }

    use super::*;

    #[test]
    fn protocols_round_trip_and_old_records_read_as_unknown() {
        for p in Protocol::ALL {
            assert_eq!(p.as_str().parse::<Protocol>(), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert!("grpc".parse::<Protocol>().is_err());
        assert_eq!(Protocol::oip("grpc"), Protocol::OipGrpc);
        assert_eq!(Protocol::oip("http"), Protocol::OipHttp);
        let mut r = PredictionRecord::new("r", "m", "1", Role::Primary);
        assert_eq!(r.protocol, Protocol::Decide);
        r.protocol = Protocol::OipHttp;
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["protocol"], "oip_http");
        let back: PredictionRecord = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, r);
        // A wal frame written before the field existed.
        let mut old = json;
        old.as_object_mut().unwrap().remove("protocol");
        let back: PredictionRecord = serde_json::from_value(old).unwrap();
        assert_eq!(back.protocol, Protocol::Unknown);
    }

    #[test]
    fn dates() {
        assert_eq!(date_of_us(0), "1970-01-01");
        assert_eq!(date_of_us(-1), "1969-12-31");
        // 2024-02-29T12:00:00Z
        assert_eq!(date_of_us(1_709_208_000_000_000), "2024-02-29");
        // 2000-03-01T00:00:00Z
        assert_eq!(date_of_us(951_868_800_000_000), "2000-03-01");
    }

    #[test]
    fn sampling_rate_is_roughly_right_and_stable() {
        let s = FeatureLogging::Sample(0.25);
        for fmt in [
            |i: u32| format!("req-{i}"),
            |i: u32| format!("req-{i:08}"),
            |i: u32| format!("{i:x}"),
        ] {
            let kept = (0..20_000).filter(|i| s.keeps(&fmt(*i))).count();
            assert!((4_500..5_500).contains(&kept), "kept {kept}");
        }
        assert_eq!(s.keeps("abc"), s.keeps("abc"));
        assert!(!FeatureLogging::None.keeps("x"));
        assert!(FeatureLogging::All.keeps("x"));
        assert_eq!(
            "0.5".parse::<FeatureLogging>(),
            Ok(FeatureLogging::Sample(0.5))
        );
        assert!("1.5".parse::<FeatureLogging>().is_err());
    }
}
