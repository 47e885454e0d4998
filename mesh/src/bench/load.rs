//! Sending the load: the requests, the connection, one call and what it counts,
//! the closed and open loops, and the server's own statistics (Infer).
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mesh_proto::inference as oip;
use mesh_proto::mesh::v1 as pb;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use super::args::{BenchArgs, GrpcClient, Target};
use super::tally::Tally;
use super::unary;

/// The methods the bench calls.
const DECIDE: &str = "/mesh.v1.Decisions/Decide";
const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const LOOKUP: &str = "/mesh.v1.FeatureStore/GetOnlineFeatures";

/// A Decide request of the load, as a message: what [`decide_body`] writes as bytes
/// (the test holds the two to the same request).
#[cfg(test)]
fn decide_request(rng: &mut impl Rng, i: u64, args: &BenchArgs) -> pb::DecideRequest {
    let card = rng.random_range(1..=args.cards.max(1));
    let merchant = format!("m{:06}", rng.random_range(1..=args.merchants.max(1)));
    let mut features: std::collections::HashMap<String, f64> = (0..32)
        .map(|j| (format!("f{j}"), rng.random::<f64>() * 2.0 - 1.0))
        .collect();
    features.insert("amount".into(), rng.random::<f64>() * 500.0);
    pb::DecideRequest {
        request_id: if args.warming_up {
            format!("bench-warmup-{i}")
        } else {
            format!("bench-{i}")
        },
        model: args.model.clone(),
        entities: [
            (
                "card_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::Int64Key(card)),
                },
            ),
            (
                "merchant_id".to_string(),
                pb::EntityKey {
                    key: Some(pb::entity_key::Key::StringKey(merchant)),
                },
            ),
        ]
        .into(),
        features,
        categorical: [(
            "merchant_category".to_string(),
            ["grocery", "travel", "electronics", "gaming"][(i % 4) as usize].to_string(),
        )]
        .into(),
        ..Default::default()
    }
}

/// A message whose protobuf bytes are already written: sent as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Encoded(bytes::Bytes);

impl prost::Message for Encoded {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only ever sent: nothing is decoded into it.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = bytes::Bytes::new();
    }
}

/// The Decide request of the load (request `i`: a random card and merchant, 32 random
/// request features and an amount, a merchant category), written straight into its
/// protobuf bytes. Built as a `DecideRequest` (33 strings formatted, a hashed map
/// built, encoded and freed) it was 14% of the load generator's samples in `perf`;
/// written here, the bench's CPU at 15,000 Decide/s for 6 s fell from 3.31-3.37 s to
/// 3.13-3.25 s (two rounds each), CPU the server on the same cores gets back.
fn decide_body(rng: &mut impl Rng, i: u64, args: &BenchArgs) -> Encoded {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| (0..32).map(|j| format!("f{j}")).collect());
    fn string(tag: u32, s: &[u8], b: &mut bytes::BytesMut) {
        encode_key(tag, WireType::LengthDelimited, b);
        encode_varint(s.len() as u64, b);
        b.extend_from_slice(s);
    }
    fn string_len(s: &[u8]) -> usize {
        1 + encoded_len_varint(s.len() as u64) + s.len()
    }
    // One map entry of field `tag`: its key (1), then, written by the caller, its
    // value (2) of `value_len` bytes including the value's own key.
    fn entry(tag: u32, key: &[u8], value_len: usize, b: &mut bytes::BytesMut) {
        encode_key(tag, WireType::LengthDelimited, b);
        encode_varint((string_len(key) + value_len) as u64, b);
        string(1, key, b);
    }
    // A map entry whose value is a message of `len` bytes: the entry and the value's
    // key and length; the caller writes the message's fields.
    fn message_entry(tag: u32, key: &[u8], len: usize, b: &mut bytes::BytesMut) {
        entry(tag, key, 1 + encoded_len_varint(len as u64) + len, b);
        encode_key(2, WireType::LengthDelimited, b);
        encode_varint(len as u64, b);
    }
    fn double(tag: u32, name: &[u8], v: f64, b: &mut bytes::BytesMut) {
        entry(tag, name, 9, b);
        encode_key(2, WireType::SixtyFourBit, b);
        b.extend_from_slice(&v.to_le_bytes());
    }
    let card = rng.random_range(1..=args.cards.max(1));
    // "m" and at least six digits: at most 21 bytes for a u64.
    let mut merchant = [0u8; 24];
    let merchant = {
        use std::io::Write as _;
        let m = rng.random_range(1..=args.merchants.max(1));
        let mut w = &mut merchant[..];
        let _ = write!(w, "m{m:06}");
        let len = 24 - w.len();
        &merchant[..len]
    };
    let mut b = bytes::BytesMut::with_capacity(640);
    {
        use std::fmt::Write as _;
        let mut id = String::with_capacity(32);
        let _ = if args.warming_up {
            write!(id, "bench-warmup-{i}")
        } else {
            write!(id, "bench-{i}")
        };
        string(1, id.as_bytes(), &mut b);
    }
    string(2, args.model.as_bytes(), &mut b);
    // entities: card_id -> EntityKey { int64_key (1) }, merchant_id -> { string_key (2) }.
    message_entry(4, b"card_id", 1 + encoded_len_varint(card as u64), &mut b);
    encode_key(1, WireType::Varint, &mut b);
    encode_varint(card as u64, &mut b);
    message_entry(4, b"merchant_id", string_len(merchant), &mut b);
    string(2, merchant, &mut b);
    for name in names {
        double(5, name.as_bytes(), rng.random::<f64>() * 2.0 - 1.0, &mut b);
    }
    double(5, b"amount", rng.random::<f64>() * 500.0, &mut b);
    let category = ["grocery", "travel", "electronics", "gaming"][(i % 4) as usize].as_bytes();
    entry(6, b"merchant_category", string_len(category), &mut b);
    string(2, category, &mut b);
    Encoded(b.freeze())
}

/// What one ModelInfer row of the model is, from its ModelMetadata (the input's
/// name, datatype and width) and ModelConfig (`categorical_columns`, which take
/// integer codes): the bench sends rows the model accepts whatever its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct InferShape {
    pub input: String,
    pub datatype: String,
    /// Values per row (the input's dims without the batch dimension, multiplied).
    pub width: usize,
    /// Columns that take integer category codes.
    pub categorical: Vec<usize>,
}

/// Category codes the bench sends: small non-negative integers, valid for any
/// categorical column (a code the model never saw is evaluated as the library does).
const BENCH_CODES: u32 = 16;

impl Default for InferShape {
    fn default() -> Self {
        Self {
            input: "input".into(),
            datatype: "FP32".into(),
            width: 32,
            categorical: Vec::new(),
        }
    }
}

impl InferShape {
    /// Reads the model's metadata and config from the mesh.
    pub async fn fetch(c: &Clients, model: &str) -> anyhow::Result<Self> {
        let mut infer = c.infer.clone();
        let meta = infer
            .model_metadata(oip::ModelMetadataRequest {
                name: model.to_owned(),
                version: String::new(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("ModelMetadata of '{model}': {}", s.message()))?
            .into_inner();
        let input = meta
            .inputs
            .first()
            .ok_or_else(|| anyhow::anyhow!("model '{model}' declares no input"))?;
        let dims: Vec<i64> = input.shape.iter().skip(1).copied().collect();
        if dims.iter().any(|d| *d <= 0) {
            anyhow::bail!(
                "model '{model}': input '{}' has shape {:?}; the bench needs fixed dims after the batch dimension",
                input.name,
                input.shape
            );
        }
        let width = dims.iter().product::<i64>() as usize;
        // Older meshes report no parameters: no categorical column then.
        let categorical = match infer
            .model_config(oip::ModelConfigRequest {
                name: model.to_owned(),
                version: String::new(),
            })
            .await
        {
            Ok(r) => r
                .into_inner()
                .config
                .and_then(|c| c.parameters.get("categorical_columns").cloned())
                .map(|p| parse_columns(&p.string_value, width))
                .transpose()?
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        Ok(Self {
            input: input.name.clone(),
            datatype: input.datatype.clone(),
            width,
            categorical,
        })
    }
}

/// `"32,33"` -> [32, 33], each below `width`.
fn parse_columns(text: &str, width: usize) -> anyhow::Result<Vec<usize>> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| match t.parse::<usize>() {
            Ok(c) if c < width => Ok(c),
            _ => anyhow::bail!("categorical_columns {text:?}: '{t}' is not a column below {width}"),
        })
        .collect()
}

/// One random row as `shape` says: values in [-1, 1), integer codes in the
/// categorical columns, in the input's datatype (raw little-endian bytes).
fn infer_request(rng: &mut impl Rng, model: &str, shape: &InferShape) -> oip::ModelInferRequest {
    let values = (0..shape.width).map(|c| {
        if shape.categorical.contains(&c) {
            f64::from(rng.random_range(0..BENCH_CODES))
        } else {
            rng.random::<f64>() * 2.0 - 1.0
        }
    });
    let raw: Vec<u8> = match shape.datatype.as_str() {
        "FP64" => values.flat_map(f64::to_le_bytes).collect(),
        "INT32" => values
            .flat_map(|v| (v.round() as i32).to_le_bytes())
            .collect(),
        "INT64" => values
            .flat_map(|v| (v.round() as i64).to_le_bytes())
            .collect(),
        _ => values.flat_map(|v| (v as f32).to_le_bytes()).collect(),
    };
    oip::ModelInferRequest {
        model_name: model.to_owned(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: shape.input.clone(),
            datatype: shape.datatype.clone(),
            shape: vec![1, shape.width as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![raw],
        ..Default::default()
    }
}

/// What a Lookup call asks for, from the view as the store declares it (ListViews).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LookupShape {
    pub join_key: String,
    /// Int64 keys (otherwise string keys).
    pub int64: bool,
    /// Every feature of the view, as `view:feature`.
    pub features: Vec<String>,
}

impl LookupShape {
    /// Reads the view's spec from the mesh.
    pub async fn fetch(c: &Clients, view: &str) -> anyhow::Result<Self> {
        let views = c
            .features
            .clone()
            .list_views(pb::ListViewsRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("ListViews: {}", s.message()))?
            .into_inner()
            .views;
        let Some(v) = views.iter().find(|v| v.name == view) else {
            let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
            anyhow::bail!("--view {view}: the store serves no such view (it serves {names:?})");
        };
        if v.features.is_empty() {
            anyhow::bail!("--view {view}: the view has no features");
        }
        Ok(Self {
            join_key: v.join_key.clone(),
            int64: v.key_type == pb::EntityKeyType::Int64 as i32,
            features: v
                .features
                .iter()
                .map(|f| format!("{view}:{}", f.name))
                .collect(),
        })
    }
}

/// `--keys` random entities of the view: int64 keys in 1..=--cards, string keys
/// m000001..=--merchants.
fn lookup_request(
    rng: &mut impl Rng,
    shape: &LookupShape,
    args: &BenchArgs,
) -> pb::GetOnlineFeaturesRequest {
    let mut keys = pb::EntityKeyColumn {
        join_key: shape.join_key.clone(),
        ..Default::default()
    };
    for _ in 0..args.keys {
        if shape.int64 {
            keys.int64_keys
                .push(rng.random_range(1..=args.cards.max(1)));
        } else {
            let m = rng.random_range(1..=args.merchants.max(1));
            keys.string_keys.push(format!("m{m:06}"));
        }
    }
    pb::GetOnlineFeaturesRequest {
        features: shape.features.clone(),
        entities: vec![keys],
        event_times_per_view: args.event_times_per_view,
    }
}

/// Whether a Lookup answer has what was asked: a column per feature, each with a
/// status per entity.
fn lookup_answered(r: &pb::GetOnlineFeaturesResponse, shape: &LookupShape, keys: usize) -> bool {
    r.columns.len() == shape.features.len() && r.columns.iter().all(|c| c.statuses.len() == keys)
}

/// A Lookup answer as the bench reads it by default: each column's statuses and
/// nothing else. The values and event times are skipped by their lengths, not
/// decoded, as redis-benchmark reads an MGET reply's framing and not its values:
/// decoding 100 entities of 16 columns cost the bench about as much CPU as the
/// server spent answering, on the machine they share. `--decode-values` reads the
/// whole answer, as a client library does.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LookupStatuses {
    #[prost(message, repeated, tag = "1")]
    pub columns: Vec<StatusColumn>,
}

/// One column of [`LookupStatuses`]: `FeatureColumn.statuses`, a packed enum, read
/// as its bytes (one per entity: every status is below 128).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusColumn {
    #[prost(bytes = "bytes", tag = "3")]
    pub statuses: prost::bytes::Bytes,
}

fn statuses_answered(r: &LookupStatuses, shape: &LookupShape, keys: usize) -> bool {
    r.columns.len() == shape.features.len()
        && r.columns
            .iter()
            .all(|c| c.statuses.len() == keys && c.statuses.iter().all(|s| *s < 0x80))
}

/// One unary call to `path`, sent as `--grpc-client` says: [`unary::call`] (one
/// HEADERS and one DATA frame), or tonic's client (`tonic::client::Grpc`, what its
/// generated clients call, with their answer to a channel that is not ready).
async fn send<Req, Res>(
    c: &Clients,
    path: &'static str,
    req: tonic::Request<Req>,
) -> Result<Res, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Res: prost::Message + Default + Send + Sync + 'static,
{
    match &c.lean {
        Some(lean) => unary::call(lean, path, req).await,
        None => {
            let mut grpc = tonic::client::Grpc::new(c.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
            let path = http::uri::PathAndQuery::from_static(path);
            let codec = tonic_prost::ProstCodec::<Req, Res>::default();
            Ok(grpc.unary(req, path, codec).await?.into_inner())
        }
    }
}

/// An answer source as the report names it: `MODEL`, `BATCH_SCORE`, ...
fn source_name(source: i32) -> String {
    pb::AnswerSource::try_from(source)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ANSWER_SOURCE_")
                .to_owned()
        })
        .unwrap_or_default()
}

/// The server's time per stage, as a Decide answer carries it.
fn stages(tm: &pb::StageTimings) -> [(&'static str, u64); 7] {
    [
        ("validate", tm.validate_us),
        ("features", tm.features_us),
        ("preprocess", tm.preprocess_us),
        ("queue", tm.queue_us),
        ("compute", tm.compute_us),
        ("postprocess", tm.postprocess_us),
        ("total", tm.total_us),
    ]
}

#[derive(Clone)]
pub struct Clients {
    infer:
        oip::grpc_inference_service_client::GrpcInferenceServiceClient<tonic::transport::Channel>,
    features: pb::feature_store_client::FeatureStoreClient<tonic::transport::Channel>,
    /// The same channel, for the load's calls with `--grpc-client tonic` ([`send`]).
    channel: tonic::transport::Channel,
    /// The load's connection with `--grpc-client lean` ([`send`]); the channel then
    /// connects only if the bench's setup uses it (reading a model's or a view's
    /// shape), so that the load has one connection, not two.
    lean: Option<unary::Lean>,
    /// The Infer target's rows (read from the model before the load starts).
    pub shape: Arc<InferShape>,
    /// The Lookup target's request (read from the view before the load starts).
    pub lookup: Arc<LookupShape>,
}

impl Clients {
    /// One channel to `addr` (`--addr`), shared by the clients, and the lean
    /// client's connection when `client` is [`GrpcClient::Lean`].
    pub async fn connect(
        addr: &str,
        tls_ca: Option<&std::path::Path>,
        client: GrpcClient,
    ) -> anyhow::Result<Self> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(addr.to_owned())
            .with_context(|| format!("--addr {addr}"))?
            .tcp_nodelay(true);
        if let Some(ca) = tls_ca {
            let pem = std::fs::read(ca).with_context(|| format!("--tls-ca {}", ca.display()))?;
            let tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(pem));
            endpoint = endpoint.tls_config(tls).context("TLS settings")?;
        }
        let (channel, lean) = match client {
            GrpcClient::Lean => (
                endpoint.connect_lazy(),
                Some(unary::Lean::connect(addr, tls_ca).await?),
            ),
            GrpcClient::Tonic => (
                endpoint
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {addr}"))?,
                None,
            ),
        };
        Ok(Self {
            infer: oip::grpc_inference_service_client::GrpcInferenceServiceClient::new(
                channel.clone(),
            ),
            features: pb::feature_store_client::FeatureStoreClient::new(channel.clone()),
            channel,
            lean,
            shape: Arc::default(),
            lookup: Arc::default(),
        })
    }
}

impl Clients {
    /// Clients of the same targets over a connection of their own.
    pub async fn another(
        &self,
        addr: &str,
        tls_ca: Option<&std::path::Path>,
        client: GrpcClient,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            shape: self.shape.clone(),
            lookup: self.lookup.clone(),
            ..Self::connect(addr, tls_ca, client).await?
        })
    }
}

/// `msg` as a request with what is left of `--deadline-ms` since `intended` as its
/// grpc-timeout; `None` when nothing is left (the bench itself fell behind).
fn with_deadline<T>(msg: T, args: &BenchArgs, intended: Instant) -> Option<tonic::Request<T>> {
    let mut req = tonic::Request::new(msg);
    if let Some(d) = args.deadline() {
        let left = d.checked_sub(intended.elapsed()).filter(|l| !l.is_zero())?;
        req.set_timeout(left);
    }
    Some(req)
}

/// Whether an answer came from a model: any OK for Infer (and for Lookup, which has
/// no model: a complete answer); for Decide, the sources
/// MODEL and PREVIOUS_VERSION.
fn from_model(code: &str, source: Option<&str>) -> bool {
    code == "OK" && source.is_none_or(|s| s == "MODEL" || s == "PREVIOUS_VERSION")
}

/// Sends one request; records latency from `intended` and the outcome. With a
/// deadline that has passed before it could be sent, it is counted `NotSent`.
async fn one(
    c: &mut Clients,
    args: &BenchArgs,
    i: u64,
    rng: &mut rand::rngs::StdRng,
    intended: Instant,
    tally: &Mutex<Tally>,
) {
    let not_sent = || ("NotSent".to_owned(), None, None);
    // Taken before the request is built and sent; recorded with the answer, under
    // the one lock of the tally per request.
    let lag_us = intended.elapsed().as_micros() as u64;
    let (code, source, timings) = match args.target {
        Target::Decide => match with_deadline(decide_body(rng, i, args), args, intended) {
            None => not_sent(),
            Some(req) => match send::<_, pb::DecideResponse>(c, DECIDE, req).await {
                Ok(r) => ("OK".to_owned(), Some(source_name(r.source)), r.timings),
                Err(s) => (format!("{:?}", s.code()), None, None),
            },
        },
        Target::Infer => {
            match with_deadline(infer_request(rng, &args.model, &c.shape), args, intended) {
                None => not_sent(),
                Some(req) => match send::<_, oip::ModelInferResponse>(c, INFER, req).await {
                    Ok(_) => ("OK".to_owned(), None, None),
                    Err(s) => (format!("{:?}", s.code()), None, None),
                },
            }
        }
        Target::Lookup => {
            let shape = c.lookup.clone();
            match with_deadline(lookup_request(rng, &shape, args), args, intended) {
                None => not_sent(),
                Some(req) => {
                    let answered = if args.decode_values {
                        send::<_, pb::GetOnlineFeaturesResponse>(c, LOOKUP, req)
                            .await
                            .map(|r| lookup_answered(&r, &shape, args.keys))
                    } else {
                        send::<_, LookupStatuses>(c, LOOKUP, req)
                            .await
                            .map(|r| statuses_answered(&r, &shape, args.keys))
                    };
                    match answered {
                        Ok(true) => ("OK".to_owned(), None, None),
                        Ok(false) => ("WrongShape".to_owned(), None, None),
                        Err(s) => (format!("{:?}", s.code()), None, None),
                    }
                }
            }
        }
    };
    let us = intended.elapsed().as_micros() as u64;
    let mut t = tally.lock();
    t.send_lag(lag_us);
    t.record(intended, us, code == "OK");
    t.useful(us, from_model(&code, source.as_deref()), &code);
    let stages = timings.as_ref().map(stages);
    t.count(
        intended,
        code,
        source,
        stages.as_ref().map_or(&[], |s| &s[..]),
    );
}

/// Closed loop: `--concurrency` callers, each sending as soon as its last answer
/// arrived, until `end` or `max_requests` were sent.
pub async fn closed_loop(
    clients: &[Clients],
    args: &Arc<BenchArgs>,
    tally: &Arc<Mutex<Tally>>,
    end: Instant,
    max_requests: u64,
) {
    let sent = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..args.concurrency.max(1))
        .map(|w| {
            let (mut c, tally, args, sent) = (
                clients[w % clients.len()].clone(),
                tally.clone(),
                args.clone(),
                sent.clone(),
            );
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                while Instant::now() < end {
                    let i = sent.fetch_add(1, Ordering::Relaxed);
                    if i >= max_requests {
                        break;
                    }
                    one(&mut c, &args, i, &mut rng, Instant::now(), &tally).await;
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
}

/// Sleeps until a given instant on a timerfd that the runtime's reactor watches:
/// the kernel's high-resolution timers (tens of µs late) without a thread of
/// their own. tokio's timer counts in whole milliseconds.
struct Pacer {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl Pacer {
    // `AsyncFd::new` is deprecated because a type that only lends its descriptor
    // may close it while the reactor still watches it; an `OwnedFd` moved into the
    // `AsyncFd` is open exactly as long as the `AsyncFd` lives.
    #[allow(deprecated)]
    fn new() -> std::io::Result<Self> {
        use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        Ok(Self {
            fd: tokio::io::unix::AsyncFd::new(fd)?,
        })
    }

    /// Returns at `due` (at once if it has passed).
    async fn sleep_until(&self, due: Instant) -> std::io::Result<()> {
        use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags, Timespec};
        let left = due.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let at = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX),
                tv_nsec: left.subsec_nanos().into(),
            },
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &at)?;
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(read) => return read.map(|_| ()),
                Err(_would_block) => continue,
            }
        }
    }
}

/// `--alternate-addr`: whether the requests due in second `k` of a run (from 0) go to
/// the other server. The odd seconds do; the report names each window's server by
/// the same rule.
pub fn to_alternate(k: u64) -> bool {
    k % 2 == 1
}

/// Open loop: request i is due at `started + i/rate` whatever happened before,
/// with at most 64 × `--concurrency` outstanding.
///
/// The pacer is a task on the runtime that sleeps on a timerfd until each request
/// is due and starts it there. Paced by tokio's timer (whole milliseconds), every
/// request started up to 1 ms after it was due (a lag inside every latency
/// reported, since latency counts from the due time), and those due within one
/// millisecond left together, a burst the server then queued. A pacer thread of
/// its own, the next try, cost a sleep, a wake-up and a hand-off to the runtime's
/// thread per request. A request whose time has passed (the pacer fell behind, or
/// the outstanding limit held it) starts at once, its lag counted.
pub async fn open_loop(
    (clients, alternate): (&[Clients], &[Clients]),
    args: &Arc<BenchArgs>,
    tally: &Arc<Mutex<Tally>>,
    (started, end): (Instant, Instant),
    rate: f64,
    max_requests: u64,
) -> anyhow::Result<()> {
    // At most 64 x MAX_CONCURRENCY (BenchArgs::check): fits the u32 below.
    let permits = args.concurrency.max(1) * 64;
    let limit = Arc::new(tokio::sync::Semaphore::new(permits));
    let pacer = Pacer::new().context("the load generator's timer (timerfd)")?;
    let (clients, alternate, args, tally, pacer_limit) = (
        clients.to_vec(),
        alternate.to_vec(),
        args.clone(),
        tally.clone(),
        limit.clone(),
    );
    // The requests' tasks are detached: each frees its memory when it ends. Join
    // handles kept to the end held every finished task's memory for the whole run
    // (385 MB at 11,000/s for 8 s, against 47-55 MB now; a million tasks at
    // 100,000/s for 10 s). The end waits for the outstanding ones through the
    // limit's permits instead.
    let pace = async move {
        let mut i: u64 = 0;
        loop {
            let due = started + Duration::from_secs_f64(i as f64 / rate.max(1e-3));
            if due >= end || i >= max_requests {
                return Ok::<(), anyhow::Error>(());
            }
            pacer
                .sleep_until(due)
                .await
                .context("the load generator's timer")?;
            let permit = pacer_limit.clone().acquire_owned().await?;
            let to = if !alternate.is_empty() && to_alternate((due - started).as_secs()) {
                &alternate
            } else {
                &clients
            };
            let c = &to[(i % to.len() as u64) as usize];
            let (mut c, tally, args) = (c.clone(), tally.clone(), args.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i);
                one(&mut c, &args, i, &mut rng, due, &tally).await;
                drop(permit);
            });
            i += 1;
        }
    };
    // On a runtime thread, so that the requests it starts queue on that thread
    // instead of waking it from outside.
    tokio::spawn(pace)
        .await
        .map_err(|e| anyhow::anyhow!("the load generator's pacer failed: {e}"))??;
    // Every permit back: every request has ended (a task that panics drops its permit).
    let _all = limit
        .acquire_many(permits as u32)
        .await
        .context("waiting for the outstanding requests")?;
    Ok(())
}

/// Cumulative server-side statistics of the model (OIP ModelStatistics, summed
/// over versions): the Infer target's per-stage breakdown is the difference
/// between the end and the start of the run, as perf_analyzer reports it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerStats {
    inferences: u64,
    queue_ns: u64,
    input_ns: u64,
    infer_ns: u64,
    output_ns: u64,
}

impl ServerStats {
    /// Mean µs per inference in each stage between `before` and `self`.
    pub fn per_inference_since(&self, before: &Self) -> BTreeMap<String, f64> {
        let n = self.inferences.saturating_sub(before.inferences);
        if n == 0 {
            return BTreeMap::new();
        }
        let us = |a: u64, b: u64| a.saturating_sub(b) as f64 / n as f64 / 1e3;
        [
            ("queue", us(self.queue_ns, before.queue_ns)),
            ("compute_input", us(self.input_ns, before.input_ns)),
            ("compute_infer", us(self.infer_ns, before.infer_ns)),
            ("compute_output", us(self.output_ns, before.output_ns)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The model's statistics now (Infer only; none for Decide or on error).
    pub async fn fetch(c: &Clients, args: &BenchArgs) -> Option<Self> {
        if args.target != Target::Infer {
            return None;
        }
        let r = c
            .infer
            .clone()
            .model_statistics(oip::ModelStatisticsRequest {
                name: args.model.clone(),
                version: String::new(),
            })
            .await
            .ok()?
            .into_inner();
        let mut s = Self::default();
        for m in r.model_stats {
            s.inferences += m.inference_count;
            let i = m.inference_stats.unwrap_or_default();
            let ns = |d: Option<oip::StatisticDuration>| d.map_or(0, |d| d.ns);
            s.queue_ns += ns(i.queue);
            s.input_ns += ns(i.compute_input);
            s.infer_ns += ns(i.compute_infer);
            s.output_ns += ns(i.compute_output);
        }
        Some(s)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::args::tests::parse;
    use super::*;

    /// A grpc-timeout value in µs (tonic writes the most precise unit).
    fn timeout_us(v: &str) -> u64 {
        let (n, unit) = v.split_at(v.len() - 1);
        let n: u64 = n.parse().unwrap();
        match unit {
            "n" => n / 1_000,
            "u" => n,
            "m" => n * 1_000,
            "S" => n * 1_000_000,
            other => panic!("unit {other}"),
        }
    }

    /// The pacer never wakes before the time asked, and a time already past
    /// returns at once; it can be used again and again.
    #[tokio::test]
    async fn bench_pacer_wakes_at_the_time_asked_never_before() {
        let pacer = Pacer::new().unwrap();
        for ms in [3u64, 1, 5] {
            let due = Instant::now() + Duration::from_millis(ms);
            pacer.sleep_until(due).await.unwrap();
            let woke = Instant::now();
            assert!(woke >= due, "{ms} ms: woke {:?} early", due - woke);
            assert!(
                woke - due < Duration::from_secs(1),
                "{ms} ms: {:?} late",
                woke - due
            );
        }
        let before = Instant::now();
        pacer
            .sleep_until(before - Duration::from_millis(5))
            .await
            .unwrap();
        assert!(before.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn bench_server_stats_are_per_inference_over_the_run() {
        let before = ServerStats {
            inferences: 10,
            queue_ns: 5_000,
            ..Default::default()
        };
        let after = ServerStats {
            inferences: 14,
            queue_ns: 13_000,
            input_ns: 4_000,
            infer_ns: 40_000,
            output_ns: 0,
        };
        let s = after.per_inference_since(&before);
        assert_eq!(s["queue"], 2.0);
        assert_eq!(s["compute_input"], 1.0);
        assert_eq!(s["compute_infer"], 10.0);
        assert_eq!(s["compute_output"], 0.0);
        // No inferences in between: nothing to report.
        assert!(after.per_inference_since(&after).is_empty());
    }

    #[test]
    fn decide_bodies_are_the_requests_they_stand_for() {
        use prost::Message as _;
        for (cards, merchants, warm) in [
            (3, 2, false),
            (10_000, 1_000, true),
            (1_i64 << 40, 5, false),
            (7, u64::MAX, false),
        ] {
            let mut args = parse(&[
                "--cards",
                &cards.to_string(),
                "--merchants",
                &merchants.to_string(),
                "--model",
                "fraud_mlp",
            ]);
            args.warming_up = warm;
            let mut a = rand::rngs::StdRng::seed_from_u64(7);
            let mut b = rand::rngs::StdRng::seed_from_u64(7);
            for i in [0, 1, 2, 3, 127, 128, 1 << 33] {
                let body = decide_body(&mut a, i, &args);
                let decoded = pb::DecideRequest::decode(body.0.clone()).unwrap();
                assert_eq!(decoded, decide_request(&mut b, i, &args), "request {i}");
                assert_eq!(prost::Message::encoded_len(&body), body.0.len());
            }
        }
    }

    #[test]
    fn bench_requests_stay_in_the_key_ranges() {
        let args = parse(&["--cards", "3", "--merchants", "2", "--model", "m"]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for i in 0..50 {
            let r = decide_request(&mut rng, i, &args);
            assert_eq!(
                (r.request_id.as_str(), r.model.as_str()),
                (format!("bench-{i}").as_str(), "m")
            );
            let Some(pb::entity_key::Key::Int64Key(card)) = r.entities["card_id"].key else {
                panic!("card_id is not an int64 key: {r:?}");
            };
            assert!((1..=3).contains(&card), "{card}");
            let Some(pb::entity_key::Key::StringKey(m)) = &r.entities["merchant_id"].key else {
                panic!("merchant_id is not a string key: {r:?}");
            };
            assert!(m == "m000001" || m == "m000002", "{m}");
            assert_eq!(r.features.len(), 33);
        }
        let r = infer_request(&mut rng, "m", &InferShape::default());
        assert_eq!(r.raw_input_contents[0].len(), 32 * 4);
        assert_eq!(r.inputs[0].shape, vec![1, 32]);
        assert_eq!(source_name(pb::AnswerSource::Model as i32), "MODEL");
    }

    #[test]
    fn bench_deadlines_count_from_the_due_time_and_useful_means_a_model() {
        assert!(from_model("OK", None));
        assert!(from_model("OK", Some("PREVIOUS_VERSION")));
        assert!(!from_model("OK", Some("DEFAULT")));
        assert!(!from_model("ResourceExhausted", None));
        // A deadline counts from when the request was due.
        let a = parse(&["--deadline-ms", "50"]);
        let due = Instant::now();
        let req = with_deadline((), &a, due).unwrap();
        let t = req
            .metadata()
            .get("grpc-timeout")
            .unwrap()
            .to_str()
            .unwrap();
        let left = timeout_us(t);
        assert!((40_000..=50_000).contains(&left), "{t}");
        assert!(with_deadline((), &a, due - std::time::Duration::from_millis(60)).is_none());
        assert!(with_deadline((), &parse(&[]), due)
            .unwrap()
            .metadata()
            .get("grpc-timeout")
            .is_none());
    }

    #[test]
    fn infer_rows_follow_the_models_shape_and_codes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let shape = InferShape {
            input: "x".into(),
            datatype: "FP32".into(),
            width: 34,
            categorical: vec![32, 33],
        };
        for _ in 0..50 {
            let r = infer_request(&mut rng, "m", &shape);
            assert_eq!(
                (r.inputs[0].name.as_str(), &r.inputs[0].shape[..]),
                ("x", &[1, 34][..])
            );
            let row: Vec<f32> = r.raw_input_contents[0]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(row.len(), 34);
            assert!(row[..32].iter().all(|v| (-1.0..1.0).contains(v)));
            for code in &row[32..] {
                assert!(code.fract() == 0.0 && (0.0..16.0).contains(code), "{code}");
            }
        }
        let fp64 = InferShape {
            datatype: "FP64".into(),
            ..shape.clone()
        };
        assert_eq!(
            infer_request(&mut rng, "m", &fp64).raw_input_contents[0].len(),
            34 * 8
        );
        assert_eq!(parse_columns("32, 33", 34).unwrap(), [32, 33]);
        assert!(parse_columns("34", 34).is_err() && parse_columns("x", 34).is_err());
        assert!(parse_columns("", 34).unwrap().is_empty());
    }

    /// A whole GetOnlineFeatures answer, encoded as the server does, reads back as
    /// [`LookupStatuses`]: a column per feature with one status byte per entity,
    /// the values and event times skipped; a column short of an entity is caught.
    #[test]
    fn lookup_statuses_read_a_whole_answer() {
        use prost::Message;
        let shape = LookupShape {
            join_key: "card_id".into(),
            int64: true,
            features: vec!["card:a".into(), "card:b".into()],
        };
        let column = |name: &str, n: usize| pb::FeatureColumn {
            name: name.into(),
            r#type: pb::FeatureType::F32 as i32,
            statuses: (0..n)
                .map(|i| {
                    if i % 3 == 0 {
                        pb::FeatureStatus::NotFound as i32
                    } else {
                        pb::FeatureStatus::Present as i32
                    }
                })
                .collect(),
            event_time_unix_micros: vec![1_764_000_000_000_000; n],
            f32_values: vec![0.5; n],
            ..Default::default()
        };
        let whole = pb::GetOnlineFeaturesResponse {
            columns: vec![column("card:a", 100), column("card:b", 100)],
            ..Default::default()
        };
        let read = LookupStatuses::decode(whole.encode_to_vec().as_slice()).unwrap();
        assert!(lookup_answered(&whole, &shape, 100));
        assert!(statuses_answered(&read, &shape, 100));
        assert_eq!(
            read.columns[0].statuses[..3],
            [
                pb::FeatureStatus::NotFound as u8,
                pb::FeatureStatus::Present as u8,
                pb::FeatureStatus::Present as u8
            ]
        );
        assert!(!statuses_answered(&read, &shape, 99));
        let short = pb::GetOnlineFeaturesResponse {
            columns: vec![column("card:a", 100), column("card:b", 99)],
            ..Default::default()
        };
        let read = LookupStatuses::decode(short.encode_to_vec().as_slice()).unwrap();
        assert!(!lookup_answered(&short, &shape, 100));
        assert!(!statuses_answered(&read, &shape, 100));
    }
}
