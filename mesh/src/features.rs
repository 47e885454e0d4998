//! `mesh features get` and `mesh features list`: read a running mesh's feature store
//! over gRPC (`mesh.v1.FeatureStore`), by hand.
use anyhow::{bail, Context};
use clap::Args;
use mesh_proto::mesh::v1 as pb;
use pb::feature_store_client::FeatureStoreClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

/// Adds the writer credential to every Push (cloned with the client, one clone a push
/// in flight).
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.0 {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples (the demo's keys: cards 1..=10000, merchants m000001..m001000):
  mesh features get --view card --key 17
  mesh features get --view merchant --key m000017 --feature risk_tier")]
pub struct GetArgs {
    /// gRPC address of the mesh (or of a `mesh serve --role features`).
    #[arg(long, env = "MESH_ADDR", default_value = "http://127.0.0.1:8001")]
    pub addr: String,
    /// The view to read.
    #[arg(long)]
    pub view: String,
    /// The entity's key (a number for an int64 key); repeatable for several entities.
    #[arg(long = "key", required = true)]
    pub keys: Vec<String>,
    /// Only these features (default: every feature of the view); repeatable.
    #[arg(long = "feature")]
    pub features: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// gRPC address of the mesh (or of a `mesh serve --role features`).
    #[arg(long, env = "MESH_ADDR", default_value = "http://127.0.0.1:8001")]
    pub addr: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

async fn connect(addr: &str) -> anyhow::Result<FeatureStoreClient<Channel>> {
    FeatureStoreClient::connect(addr.to_owned())
        .await
        .with_context(|| format!("connecting to the feature store at {addr}"))
}

fn status_err(what: &str, s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{what} failed: {:?}: {}", s.code(), s.message())
}

async fn views(
    client: &mut FeatureStoreClient<Channel>,
) -> anyhow::Result<Vec<pb::FeatureViewSpec>> {
    Ok(client
        .list_views(pb::ListViewsRequest {})
        .await
        .map_err(|s| status_err("ListViews", s))?
        .into_inner()
        .views)
}

fn type_name(t: i32) -> String {
    pb::FeatureType::try_from(t)
        .map(|t| {
            t.as_str_name()
                .trim_start_matches("FEATURE_TYPE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| t.to_string())
}

fn status_name(s: i32) -> String {
    pb::FeatureStatus::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("FEATURE_STATUS_")
                .to_owned()
        })
        .unwrap_or_else(|_| s.to_string())
}

/// Value `i` of a column, as JSON (null when the status says there is none).
fn value_of(c: &pb::FeatureColumn, i: usize) -> Value {
    let v = if !c.f32_values.is_empty() {
        c.f32_values.get(i).map(|x| json!(x))
    } else if !c.f64_values.is_empty() {
        c.f64_values.get(i).map(|x| json!(x))
    } else if !c.i64_values.is_empty() {
        c.i64_values.get(i).map(|x| json!(x))
    } else if !c.bool_values.is_empty() {
        c.bool_values.get(i).map(|x| json!(x))
    } else if !c.string_values.is_empty() {
        c.string_values.get(i).map(|x| json!(x))
    } else {
        c.f32_vector_values.get(i).map(|x| json!(x.values))
    };
    v.unwrap_or(Value::Null)
}

/// `mesh features get`.
pub async fn get(a: GetArgs) -> anyhow::Result<()> {
    let mut client = connect(&a.addr).await?;
    let all = views(&mut client).await?;
    let Some(view) = all.iter().find(|v| v.name == a.view) else {
        let names: Vec<&str> = all.iter().map(|v| v.name.as_str()).collect();
        bail!("no view '{}' (views: {})", a.view, names.join(", "));
    };
    let int_keys = view.key_type == pb::EntityKeyType::Int64 as i32;
    let mut col = pb::EntityKeyColumn {
        join_key: view.join_key.clone(),
        ..Default::default()
    };
    for k in &a.keys {
        if int_keys {
            col.int64_keys.push(k.parse().with_context(|| {
                format!(
                    "view '{}' is keyed by int64 {}; '{k}' is not a number",
                    view.name, view.join_key
                )
            })?);
        } else {
            col.string_keys.push(k.clone());
        }
    }
    let features = if a.features.is_empty() {
        vec![format!("{}:*", view.name)]
    } else {
        a.features
            .iter()
            .map(|f| format!("{}:{f}", view.name))
            .collect()
    };
    let cols = client
        .get_online_features(pb::GetOnlineFeaturesRequest {
            features,
            entities: vec![col],
            ..Default::default()
        })
        .await
        .map_err(|s| status_err("GetOnlineFeatures", s))?
        .into_inner()
        .columns;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let mut rows = Vec::new();
    for (i, key) in a.keys.iter().enumerate() {
        let mut feats = Vec::new();
        for c in &cols {
            let t = c.event_time_unix_micros.get(i).copied().unwrap_or(0);
            let status = status_name(c.statuses.get(i).copied().unwrap_or(0));
            let value = if status == "PRESENT" || status == "OUTSIDE_MAX_AGE" {
                value_of(c, i)
            } else {
                Value::Null
            };
            feats.push(json!({
                "name": c.name,
                "type": type_name(c.r#type),
                "status": status,
                "value": value,
                "event_time_unix_micros": (t != 0).then_some(t),
                "age_seconds": (t != 0).then(|| (now_us - t) as f64 / 1e6),
            }));
        }
        rows.push(json!({ "view": view.name, view.join_key.clone(): key, "features": feats }));
    }
    if a.json {
        crate::outln!("{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    for r in &rows {
        crate::outln!("{} {} = {}", view.name, view.join_key, r[&view.join_key])?;
        for f in r["features"].as_array().into_iter().flatten() {
            let age = f["age_seconds"]
                .as_f64()
                .map_or(String::new(), |s| format!("  ({s:.0}s old)"));
            crate::outln!(
                "  {:<32} {:<16} {}{age}",
                f["name"].as_str().unwrap_or_default(),
                f["status"].as_str().unwrap_or_default(),
                f["value"],
            )?;
        }
    }
    Ok(())
}

/// `mesh features list`.
pub async fn list(a: ListArgs) -> anyhow::Result<()> {
    let mut client = connect(&a.addr).await?;
    let all = views(&mut client).await?;
    let key_type = |t: i32| {
        pb::EntityKeyType::try_from(t)
            .map(|t| {
                t.as_str_name()
                    .trim_start_matches("ENTITY_KEY_TYPE_")
                    .to_lowercase()
            })
            .unwrap_or_else(|_| t.to_string())
    };
    let out: Vec<Value> = all
        .iter()
        .map(|v| {
            json!({
                "name": v.name,
                "entity": v.entity,
                "join_key": v.join_key,
                "key_type": key_type(v.key_type),
                "max_age_millis": v.max_age_millis,
                "timestamp_field": v.timestamp_field,
                "features": v.features.iter().map(|f| json!({"name": f.name, "type": type_name(f.r#type)})).collect::<Vec<_>>(),
            })
        })
        .collect();
    if a.json {
        crate::outln!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(());
    }
    for v in &all {
        crate::outln!(
            "{}  (entity {}, key {}: {}, max_age {} s)",
            v.name,
            v.entity,
            v.join_key,
            key_type(v.key_type),
            v.max_age_millis / 1000
        )?;
        for f in &v.features {
            crate::outln!("  {:<32} {}", f.name, type_name(f.r#type))?;
        }
    }
    Ok(())
}

/// `mesh features ingest --addr`: the file read in batches as the direct ingest
/// reads it, each batch sent as one `Push` to a running store (so the store's lock
/// is no obstacle: the process that holds it does the writes).
pub struct PushIngest {
    pub addr: String,
    pub view: String,
    pub file: std::path::PathBuf,
    /// The writer-plane token, sent as `authorization: Bearer`.
    pub token: Option<String>,
    /// How to read the file (`sync_each_batch` becomes `wait_for_sync`).
    pub opts: mesh_feature_store::IngestOptions,
    /// Pushes sent before the first of them is answered (1: one at a time).
    pub in_flight: usize,
    /// At most this many rows sent a second: a batch is sent no earlier than the
    /// rows before it allow (None: as fast as the store answers).
    pub rows_per_second: Option<u32>,
}

/// Pushes in flight by default: the store decodes and checks one while it writes the
/// one before, and the file is read meanwhile.
pub const DEFAULT_PUSHES_IN_FLIGHT: u16 = 2;
/// The most `--pushes-in-flight` accepts: each holds a batch in this process's memory
/// and in the store's.
pub const MAX_PUSHES_IN_FLIGHT: u16 = 16;

type WriterClient =
    FeatureStoreClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

async fn writer_client(addr: &str, token: Option<String>) -> anyhow::Result<WriterClient> {
    let channel = tonic::transport::Endpoint::from_shared(addr.to_owned())
        .with_context(|| format!("--addr {addr} is not a URL like http://127.0.0.1:8001"))?
        .connect()
        .await
        .with_context(|| format!("connecting to the feature store at {addr}"))?;
    let header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> = match token {
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| anyhow::anyhow!("the writer token is not valid header text"))?,
        ),
        None => None,
    };
    Ok(
        FeatureStoreClient::with_interceptor(channel, Bearer(header))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX),
    )
}

fn feature_type(t: i32) -> anyhow::Result<mesh_feature_store::FeatureType> {
    use mesh_feature_store::FeatureType as F;
    Ok(match pb::FeatureType::try_from(t) {
        Ok(pb::FeatureType::F32) => F::F32,
        Ok(pb::FeatureType::F64) => F::F64,
        Ok(pb::FeatureType::I64) => F::I64,
        Ok(pb::FeatureType::Bool) => F::Bool,
        Ok(pb::FeatureType::String) => F::String,
        Ok(pb::FeatureType::F32Vector) => F::F32Vector,
        _ => bail!("the store answered an unknown feature type {t}"),
    })
}

/// The view as the running store declares it (ListViews), in the shape the file
/// readers take.
fn view_info(v: &pb::FeatureViewSpec) -> anyhow::Result<mesh_feature_store::ViewInfo> {
    let key_type = match pb::EntityKeyType::try_from(v.key_type) {
        Ok(pb::EntityKeyType::Int64) => mesh_feature_store::KeyType::Int64,
        Ok(pb::EntityKeyType::String) => mesh_feature_store::KeyType::String,
        _ => bail!("view '{}' has an unknown key type {}", v.name, v.key_type),
    };
    let features = v
        .features
        .iter()
        .enumerate()
        .map(|(i, f)| {
            Ok(mesh_feature_store::FeatureInfo {
                id: u16::try_from(i).unwrap_or(u16::MAX),
                name: f.name.clone(),
                dtype: feature_type(f.r#type)?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(mesh_feature_store::ViewInfo {
        id: 0,
        name: v.name.clone(),
        entity: v.entity.clone(),
        join_key: v.join_key.clone(),
        key_type,
        max_age: std::time::Duration::from_millis(v.max_age_millis),
        timestamp_field: v.timestamp_field.clone(),
        features,
    })
}

/// A push sent and not yet answered.
struct Sent {
    /// Its first row, counted from 0 over the file's data rows.
    at: u64,
    rows: usize,
    keys: std::collections::HashSet<mesh_feature_store::EntityKey>,
    answer: tokio::task::JoinHandle<Result<tonic::Response<pb::PushResponse>, tonic::Status>>,
    /// Where the reader was after this batch (set once the reader reported it).
    progress: Option<(u64, u64, mesh_feature_store::ProgressUnit)>,
}

/// The pushes of one ingest: up to `limit` in flight, answered in the order sent.
struct Pushes<F> {
    limit: usize,
    sent: std::collections::VecDeque<Sent>,
    /// Acknowledged so far, in order.
    batches: u64,
    rows_acked: u64,
    written: u64,
    skipped_older: u64,
    /// The first push refused, and what the pushes sent after it wrote: (batches,
    /// rows written).
    refused: Option<(u64, tonic::Status)>,
    after_refused: (u64, u64),
    on_batch: F,
}

impl<F: FnMut(&mesh_feature_store::BatchCommitted)> Pushes<F> {
    /// Waits for the oldest push in flight and accounts for its answer.
    fn settle_oldest(&mut self, rt: &tokio::runtime::Runtime) {
        let Some(s) = self.sent.pop_front() else {
            return;
        };
        let answer = rt.block_on(s.answer).unwrap_or_else(|e| {
            Err(tonic::Status::internal(format!(
                "the push task failed: {e}"
            )))
        });
        match (answer, self.refused.is_some()) {
            (Ok(r), false) => {
                let r = r.into_inner();
                self.rows_acked += s.rows as u64;
                self.written += r.rows_written;
                self.skipped_older += r.rows_skipped_older;
                let (position, total, unit) =
                    s.progress
                        .unwrap_or((0, 0, mesh_feature_store::ProgressUnit::Rows));
                (self.on_batch)(&mesh_feature_store::BatchCommitted {
                    batch_index: self.batches,
                    rows_in_batch: s.rows,
                    rows_read_total: self.rows_acked,
                    synced: r.synced,
                    position,
                    total,
                    unit,
                });
                self.batches += 1;
            }
            (Ok(r), true) => {
                self.after_refused.0 += 1;
                self.after_refused.1 += r.into_inner().rows_written;
            }
            (Err(status), false) => self.refused = Some((s.at, status)),
            (Err(_), true) => self.after_refused.0 += 1,
        }
    }

    /// Whether a batch with these keys must wait: the limit is reached, or a push in
    /// flight holds one of its keys (the later row of a key must be written later, as
    /// the direct ingest writes it, for rows of equal event times).
    fn must_wait(&self, keys: &std::collections::HashSet<mesh_feature_store::EntityKey>) -> bool {
        self.sent.len() >= self.limit || self.sent.iter().any(|s| !s.keys.is_disjoint(keys))
    }
}

/// Runs a [`PushIngest`] on this thread (the file is read on a thread of its own,
/// each batch pushed on `rt`, which must be a multi-thread runtime so that pushes in
/// flight progress while this thread waits for the file), calling `on_batch` after
/// each acknowledged push, in the file's order.
pub fn push_ingest(
    rt: &tokio::runtime::Runtime,
    mut job: PushIngest,
    on_batch: impl FnMut(&mesh_feature_store::BatchCommitted),
) -> anyhow::Result<mesh_feature_store::IngestReport> {
    let start = std::time::Instant::now();
    let client = rt.block_on(writer_client(&job.addr, job.token.take()))?;
    let all = rt
        .block_on(client.clone().list_views(pb::ListViewsRequest {}))
        .map_err(|s| status_err(&format!("ListViews at {}", job.addr), s))?
        .into_inner()
        .views;
    let Some(spec) = all.iter().find(|v| v.name == job.view) else {
        let names: Vec<&str> = all.iter().map(|v| v.name.as_str()).collect();
        bail!(
            "the store at {} has no view '{}' (views: {})",
            job.addr,
            job.view,
            names.join(", ")
        );
    };
    let view = view_info(spec)?;
    let wait_for_sync = job.opts.sync_each_batch;
    let pushes = std::cell::RefCell::new(Pushes {
        limit: job.in_flight.clamp(1, usize::from(MAX_PUSHES_IN_FLIGHT)),
        sent: std::collections::VecDeque::new(),
        batches: 0,
        rows_acked: 0,
        written: 0,
        skipped_older: 0,
        refused: None,
        after_refused: (0, 0),
        on_batch,
    });
    let mut first_row = 0u64;
    // Sends the batch and returns at once (what it wrote is counted when its answer
    // comes); refuses once a push was refused, which stops the reader.
    let write = |rows: &[mesh_feature_store::Row]| {
        if let Some(rate) = job.rows_per_second {
            // The rows sent so far at `rate` are due this long after the start.
            let due =
                start + std::time::Duration::from_secs_f64(first_row as f64 / f64::from(rate));
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        }
        let keys: std::collections::HashSet<_> = rows.iter().map(|r| r.key.clone()).collect();
        let mut p = pushes.borrow_mut();
        while p.refused.is_none() && p.must_wait(&keys) {
            p.settle_oldest(rt);
        }
        if p.refused.is_some() {
            return Err(mesh_feature_store::FeatureStoreError::Internal(
                "push refused".into(),
            ));
        }
        let req = pb::PushRequest {
            view: view.name.clone(),
            columns: Some(mesh_feature_store::service::push_columns(&view, rows)),
            wait_for_sync,
            ..Default::default()
        };
        let mut c = client.clone();
        p.sent.push_back(Sent {
            at: first_row,
            rows: rows.len(),
            keys,
            answer: rt.spawn(async move { c.push(req).await }),
            progress: None,
        });
        first_row += rows.len() as u64;
        Ok(mesh_feature_store::WriteReport::default())
    };
    // The reader reports where it is after each batch it handed over: kept with that
    // batch for its acknowledgement.
    let sent_batch = |b: &mesh_feature_store::BatchCommitted| {
        if let Some(s) = pushes.borrow_mut().sent.back_mut() {
            s.progress = Some((b.position, b.total, b.unit));
        }
    };
    let result =
        mesh_feature_store::read_file_observed(&view, &job.file, &job.opts, write, sent_batch);
    let mut p = pushes.into_inner();
    while !p.sent.is_empty() {
        p.settle_oldest(rt);
    }
    match (result, p.refused) {
        (Ok(mut r), None) => {
            r.rows_written = p.written;
            r.rows_skipped_older = p.skipped_older;
            r.elapsed = start.elapsed();
            r.rows_per_sec = r.rows_read as f64 / r.elapsed.as_secs_f64().max(1e-9);
            Ok(r)
        }
        (_, Some((at, s))) => {
            let hint = match s.code() {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    " (the writer plane needs its token: --token-file FILE or MESH_WRITER_TOKEN)"
                }
                tonic::Code::ResourceExhausted | tonic::Code::OutOfRange => {
                    " (a smaller --batch-rows makes smaller pushes)"
                }
                _ => "",
            };
            let after = match p.after_refused {
                (0, _) => String::new(),
                (n, rows) => format!(
                    ", and of the {n} batch(es) sent after it (none holds a key of it), {rows} rows"
                ),
            };
            Err(anyhow::anyhow!(
                "the Push of the batch from data row {} failed: {:?}: {}{hint}; the batches before it are written{after}",
                at + 1,
                s.code(),
                s.message()
            ))
        }
        (Err(e), None) => Err(anyhow::Error::new(e)),
    }
}
