//! Batched online lookups: many entity rows, one or more views, one answer column
//! per requested feature, every value with a status and its event time.
//!
//! Freshness is enforced here, at read time, for both backends: a row whose event
//! time is older than its view's `max_age` is reported as `OutsideMaxAge` (with its
//! values, for diagnosis), never as `Present`. The Redis path (cache, budget,
//! fallback) is in `redis_store/lookup.rs`; it shares the plan and the filling.
use std::sync::Arc;
use std::time::Instant;

use crate::cache::Hit;
use crate::encoding::{self, FieldRef};
use crate::error::{FeatureStoreError, Result};
use crate::metrics as m;
use crate::registry::ViewInfo;
use crate::store::{validate_key, Backend, FeatureStore, FetchStrategy, Inner, Limits};
use crate::types::{now_micros, EntityKey, FeatureStatus, FeatureType, Micros, Value};

/// One column of entity keys.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyColumn {
    Int64(Vec<i64>),
    String(Vec<String>),
}

impl KeyColumn {
    pub fn len(&self) -> usize {
        match self {
            KeyColumn::Int64(v) => v.len(),
            KeyColumn::String(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn key(&self, i: usize) -> EntityKey {
        match self {
            KeyColumn::Int64(v) => EntityKey::Int64(v[i]),
            KeyColumn::String(v) => EntityKey::String(v[i].clone()),
        }
    }

    /// Key `i`, borrowed (the Redis key layout).
    pub(crate) fn key_ref(&self, i: usize) -> crate::redis_store::keys::KeyRef<'_> {
        use crate::redis_store::keys::KeyRef;
        match self {
            KeyColumn::Int64(v) => KeyRef::Int(v[i]),
            KeyColumn::String(v) => KeyRef::Str(&v[i]),
        }
    }

    /// Encodes key `i` without cloning it (the hot path of every lookup).
    fn encode(&self, view_id: u32, i: usize, out: &mut Vec<u8>) {
        match self {
            KeyColumn::Int64(v) => encoding::encode_key(view_id, &EntityKey::Int64(v[i]), out),
            KeyColumn::String(v) => encoding::encode_string_key(view_id, &v[i], out),
        }
    }
}

/// A lookup: feature references and the entity rows to answer them for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LookupRequest {
    /// `"view:feature"`, or `"view:*"` for all live features of a view. Shared, so a
    /// caller that asks for the same features every time (the router, per model)
    /// hands over its list without copying it.
    pub features: Arc<[String]>,
    /// `(join key, keys)`: one column per join key the requested views need, all of
    /// the same length (the number of rows). Columns no view needs are ignored.
    pub entities: Vec<(String, KeyColumn)>,
}

impl LookupRequest {
    pub fn new(features: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::shared(features.into_iter().map(Into::into).collect())
    }

    /// A lookup of a list the caller keeps (no copy of its names).
    pub fn shared(features: Arc<[String]>) -> Self {
        LookupRequest {
            features,
            entities: Vec::new(),
        }
    }

    pub fn with_keys(mut self, join_key: impl Into<String>, keys: KeyColumn) -> Self {
        self.entities.push((join_key.into(), keys));
        self
    }
}

/// Values of one column; slots that are not `Present`/`OutsideMaxAge` hold the
/// type's default.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValues {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    F32Vector(Vec<Vec<f32>>),
}

impl ColumnValues {
    pub(crate) fn defaults(dtype: FeatureType, n: usize) -> Self {
        match dtype {
            FeatureType::F32 => ColumnValues::F32(vec![0.0; n]),
            FeatureType::F64 => ColumnValues::F64(vec![0.0; n]),
            FeatureType::I64 => ColumnValues::I64(vec![0; n]),
            FeatureType::Bool => ColumnValues::Bool(vec![false; n]),
            FeatureType::String => ColumnValues::String(vec![String::new(); n]),
            FeatureType::F32Vector => ColumnValues::F32Vector(vec![Vec::new(); n]),
        }
    }

    /// Sets slot `i`; false if the stored field's type does not match the column.
    fn set(&mut self, i: usize, f: FieldRef<'_>) -> bool {
        match (self, f) {
            (ColumnValues::F32(v), FieldRef::F32(x)) => v[i] = x,
            (ColumnValues::F64(v), FieldRef::F64(x)) => v[i] = x,
            (ColumnValues::I64(v), FieldRef::I64(x)) => v[i] = x,
            (ColumnValues::Bool(v), FieldRef::Bool(x)) => v[i] = x,
            (ColumnValues::String(v), FieldRef::String(s)) => v[i] = s.to_owned(),
            (ColumnValues::F32Vector(v), FieldRef::F32Vector(b)) => v[i] = encoding::f32s(b),
            _ => return false,
        }
        true
    }

    /// Sets slot `i` from a decoded value; false if its type does not match.
    fn set_value(&mut self, i: usize, val: &Value) -> bool {
        match (self, val) {
            (ColumnValues::F32(v), Value::F32(x)) => v[i] = *x,
            (ColumnValues::F64(v), Value::F64(x)) => v[i] = *x,
            (ColumnValues::I64(v), Value::I64(x)) => v[i] = *x,
            (ColumnValues::Bool(v), Value::Bool(x)) => v[i] = *x,
            (ColumnValues::String(v), Value::String(s)) => v[i].clone_from(s),
            (ColumnValues::F32Vector(v), Value::F32Vector(xs)) => v[i].clone_from(xs),
            _ => return false,
        }
        true
    }

    fn append(&mut self, other: ColumnValues) {
        match (self, other) {
            (ColumnValues::F32(a), ColumnValues::F32(b)) => a.extend(b),
            (ColumnValues::F64(a), ColumnValues::F64(b)) => a.extend(b),
            (ColumnValues::I64(a), ColumnValues::I64(b)) => a.extend(b),
            (ColumnValues::Bool(a), ColumnValues::Bool(b)) => a.extend(b),
            (ColumnValues::String(a), ColumnValues::String(b)) => a.extend(b),
            (ColumnValues::F32Vector(a), ColumnValues::F32Vector(b)) => a.extend(b),
            // Chunks of one plan always have the same column types.
            _ => {}
        }
    }
}

/// The answer for one requested feature, aligned to the request's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureColumn {
    /// `"view:feature"` (shared with every answer of the same store).
    pub name: Arc<str>,
    pub dtype: FeatureType,
    pub statuses: Vec<FeatureStatus>,
    /// Event time of the stored row (Unix µs); 0 where `NotFound`.
    pub event_times: Vec<Micros>,
    pub values: ColumnValues,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LookupResponse {
    pub rows: usize,
    pub columns: Vec<FeatureColumn>,
    /// Set when the backend (Redis) did not answer some entity rows within the
    /// lookup budget: those rows hold cached values as `OutsideMaxAge`, or
    /// `Unavailable`. `None` for a complete answer (always, on sled).
    pub degraded: Option<Degraded>,
}

/// Which rows of a lookup the backend failed to answer, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Degraded {
    /// For the decision's reasons and the log, e.g. `redis: no answer within the
    /// budget (20ms); 3 entity rows from the cache as OUTSIDE_MAX_AGE, 1 unavailable`.
    pub reason: String,
    /// Per request row: whether any of its values came from the fallback.
    pub rows: Vec<bool>,
}

impl LookupResponse {
    pub fn column(&self, name: &str) -> Option<&FeatureColumn> {
        self.columns.iter().find(|c| &*c.name == name)
    }
}

/// The validated form of a request: which reads answer which columns.
pub(crate) struct Plan {
    pub(crate) rows: usize,
    pub(crate) columns: Columns,
    pub(crate) groups: Vec<Group>,
}

pub(crate) struct Group {
    pub(crate) view: usize,
    /// Index into the request's entity columns.
    pub(crate) key_column: usize,
    /// Output column per stored feature id (`None`: not requested).
    column_by_id: Vec<Option<usize>>,
    /// Output columns this view fills.
    pub(crate) columns: Vec<usize>,
}

impl FeatureStore {
    /// Answers a lookup without blocking the async runtime for long. A lookup of up
    /// to `StoreOptions::on_task_max_keys` keys runs on the calling task: the
    /// row cache's probe (when there is one), then sled's reads of the keys it did not
    /// hold, `StoreOptions::inline_max_keys` at a time with a yield between, so the
    /// worker is never held longer than a small lookup holds it and a caller's
    /// deadline can end the lookup between turns. Larger lookups run on tokio's
    /// blocking pool (one task, or several with `FetchStrategy::Parallel`), as do
    /// all sled reads with `inline_max_keys = 0`.
    pub async fn get_online_features(&self, req: LookupRequest) -> Result<LookupResponse> {
        let limits = self.inner.options.limits;
        self.get_online_features_with_limits(req, &limits).await
    }

    /// [`Self::get_online_features`] under other limits than the store's (the gRPC
    /// service has its own).
    pub async fn get_online_features_with_limits(
        &self,
        req: LookupRequest,
        limits: &Limits,
    ) -> Result<LookupResponse> {
        let start = Instant::now();
        let plan = plan(&self.inner, &req, limits)?;
        let keys = plan.rows * plan.groups.len();
        let now = now_micros();
        if let Backend::Redis(r) = &self.inner.backend {
            let resp = crate::redis_store::lookup::lookup(&self.inner, r, &req, &plan, now).await?;
            finish(&self.inner, &plan, &resp, start.elapsed(), keys);
            return Ok(resp);
        }
        let chunks = match self.inner.options.fetch {
            FetchStrategy::Parallel { tasks, min_keys } if keys >= min_keys && plan.rows > 1 => {
                tasks.get().min(plan.rows)
            }
            _ => 1,
        };
        let options = &self.inner.options;
        let plan = std::sync::Arc::new(plan);
        if chunks == 1 && keys <= options.inline_max_keys.max(options.on_task_max_keys) {
            // The row cache (if any) answers on this task, and so does sled for what
            // it did not hold: at once while that is few, else a few keys a turn.
            let mut pending = probe(&self.inner, &req, &plan, 0..plan.rows, now)?;
            let pending = if pending.misses.len() <= options.inline_max_keys {
                read_misses(&self.inner, &plan, &mut pending, now)?;
                pending
            } else if options.inline_max_keys > 0 {
                read_misses_in_turns(
                    &self.inner,
                    &plan,
                    &mut pending,
                    now,
                    options.inline_max_keys,
                )
                .await?;
                pending
            } else {
                let (inner, plan2) = (self.inner.clone(), plan.clone());
                tokio::task::spawn_blocking(move || {
                    read_misses(&inner, &plan2, &mut pending, now).map(|()| pending)
                })
                .await
                .map_err(|e| FeatureStoreError::Internal(format!("lookup task failed: {e}")))??
            };
            let resp = pending.into_response(&plan);
            finish(&self.inner, &plan, &resp, start.elapsed(), keys);
            // Counts against the task's cooperative budget: a caller that loops on
            // small lookups still lets the worker's other tasks run.
            tokio::task::consume_budget().await;
            return Ok(resp);
        }
        let req = std::sync::Arc::new(req);
        let resp = if chunks == 1 {
            let (inner, req2, plan2) = (self.inner.clone(), req.clone(), plan.clone());
            tokio::task::spawn_blocking(move || fetch(&inner, &req2, &plan2, 0..plan2.rows, now))
                .await
                .map_err(|e| FeatureStoreError::Internal(format!("lookup task failed: {e}")))??
        } else {
            let per = plan.rows.div_ceil(chunks);
            let mut tasks = Vec::with_capacity(chunks);
            for c in 0..chunks {
                let range = (c * per)..((c + 1) * per).min(plan.rows);
                let (inner, req2, plan2) = (self.inner.clone(), req.clone(), plan.clone());
                tasks.push(tokio::task::spawn_blocking(move || {
                    fetch(&inner, &req2, &plan2, range, now)
                }));
            }
            let mut parts = Vec::with_capacity(chunks);
            for t in tasks {
                parts.push(t.await.map_err(|e| {
                    FeatureStoreError::Internal(format!("lookup task failed: {e}"))
                })??);
            }
            concat(parts)
        };
        finish(&self.inner, &plan, &resp, start.elapsed(), keys);
        Ok(resp)
    }

    /// The same lookup on the calling thread (for callers already off the async
    /// runtime, and benchmarks). `now` is the time freshness is judged against.
    pub fn get_online_features_blocking(
        &self,
        req: &LookupRequest,
        now: Micros,
    ) -> Result<LookupResponse> {
        let start = Instant::now();
        let plan = plan(&self.inner, req, &self.inner.options.limits)?;
        let resp = match &self.inner.backend {
            Backend::Sled(_) => fetch(&self.inner, req, &plan, 0..plan.rows, now)?,
            Backend::Redis(r) => r.block_on(crate::redis_store::lookup::lookup(
                &self.inner,
                r,
                req,
                &plan,
                now,
            ))?,
        };
        finish(
            &self.inner,
            &plan,
            &resp,
            start.elapsed(),
            plan.rows * plan.groups.len(),
        );
        Ok(resp)
    }
}

fn finish(
    inner: &Inner,
    plan: &Plan,
    resp: &LookupResponse,
    elapsed: std::time::Duration,
    keys: usize,
) {
    inner.meters.record_lookup(elapsed, keys);
    for g in &plan.groups {
        let mut counts = [0u64; 5];
        for &c in &g.columns {
            for s in &resp.columns[c].statuses {
                counts[s.index()] += 1;
            }
        }
        inner
            .meters
            .record_values(g.view, &inner.views[g.view].name, &counts);
    }
}

fn plan(inner: &Inner, req: &LookupRequest, limits: &Limits) -> Result<Plan> {
    let (columns, groups) = plan_columns(inner, req)?;
    let rows = check_rows(req, groups.len(), limits)?;
    check_keys(inner, req, &groups)?;
    // Duplicate asks of one feature share a read: fill them after the fetch.
    Ok(Plan {
        rows,
        columns,
        groups,
    })
}

/// A lookup's output columns: qualified name and type.
type Columns = Vec<(Arc<str>, FeatureType)>;

/// The output columns of a lookup and, per view, which stored features fill them.
fn plan_columns(inner: &Inner, req: &LookupRequest) -> Result<(Columns, Vec<Group>)> {
    let invalid = |s: String| Err(FeatureStoreError::InvalidArgument(s));
    if req.features.is_empty() {
        return invalid("lookup names no features".into());
    }
    let mut columns: Columns = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    for r in req.features.iter() {
        let Some((view, feature)) = r.split_once(':') else {
            return invalid(format!("feature reference {r:?} is not \"view:feature\""));
        };
        let vi = inner.view_index(view)?;
        let v = &inner.views[vi];
        let gi = match groups.iter().position(|g| g.view == vi) {
            Some(gi) => gi,
            None => {
                let Some(key_column) = req.entities.iter().position(|(jk, _)| *jk == v.join_key)
                else {
                    return invalid(format!(
                        "lookup lacks the {:?} key column that view {view:?} needs",
                        v.join_key
                    ));
                };
                let max_id = v.features.iter().map(|f| f.id as usize).max().unwrap_or(0);
                groups.push(Group {
                    view: vi,
                    key_column,
                    column_by_id: vec![None; max_id + 1],
                    columns: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let names = &inner.qualified[vi];
        let mut add = |i: usize, columns: &mut Columns| {
            let (f, g) = (&v.features[i], &mut groups[gi]);
            // A feature asked for twice is answered once per ask; the later column
            // is filled from the same read.
            let c = columns.len();
            columns.push((names[i].clone(), f.dtype));
            if g.column_by_id[f.id as usize].is_none() {
                g.column_by_id[f.id as usize] = Some(c);
            }
            g.columns.push(c);
        };
        if feature == "*" {
            for i in 0..v.features.len() {
                add(i, &mut columns);
            }
        } else {
            let i = v
                .feature_index(feature)
                .ok_or_else(|| FeatureStoreError::UnknownFeature {
                    view: view.to_owned(),
                    feature: feature.to_owned(),
                })?;
            add(i, &mut columns);
        }
    }
    Ok((columns, groups))
}

/// The number of entity rows, after checking every key column has that many and the
/// lookup stays within `max_keys_per_lookup` (rows x views).
fn check_rows(req: &LookupRequest, views: usize, limits: &Limits) -> Result<usize> {
    let invalid = |s: String| Err(FeatureStoreError::InvalidArgument(s));
    let rows = req.entities.first().map(|(_, k)| k.len()).unwrap_or(0);
    for (jk, keys) in &req.entities {
        if keys.len() != rows {
            return invalid(format!(
                "key column {jk:?} has {} keys, {:?} has {rows}",
                keys.len(),
                req.entities[0].0
            ));
        }
    }
    if rows == 0 {
        return invalid("lookup has no entity keys".into());
    }
    let total = rows * views;
    if total > limits.max_keys_per_lookup {
        return Err(FeatureStoreError::LimitExceeded {
            what: "entity keys in one lookup (rows x views)",
            got: total,
            limit: limits.max_keys_per_lookup,
            setting: "max_keys_per_lookup",
        });
    }
    Ok(rows)
}

/// Every key is valid for the view it reads.
fn check_keys(inner: &Inner, req: &LookupRequest, groups: &[Group]) -> Result<()> {
    for g in groups {
        let v = &inner.views[g.view];
        let (jk, keys) = &req.entities[g.key_column];
        let bad =
            |i: usize, e: String| FeatureStoreError::InvalidArgument(format!("{jk}[{i}]: {e}"));
        match (v.key_type, keys) {
            // Int64 keys of an int64 view are always valid: skip the per-key check.
            (crate::types::KeyType::Int64, KeyColumn::Int64(_)) => {}
            (_, KeyColumn::Int64(_)) => {
                return Err(bad(
                    0,
                    validate_key(v, &keys.key(0)).err().unwrap_or_default(),
                ))
            }
            (_, KeyColumn::String(ks)) => {
                for (i, k) in ks.iter().enumerate() {
                    if k.is_empty()
                        || k.len() > crate::store::MAX_STRING_KEY_BYTES
                        || v.key_type != crate::types::KeyType::String
                    {
                        return Err(bad(
                            i,
                            validate_key(v, &keys.key(i)).err().unwrap_or_default(),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Reads rows `range` of the plan and answers them (columns of `range.len()`).
fn fetch(
    inner: &Inner,
    req: &LookupRequest,
    plan: &Plan,
    range: std::ops::Range<usize>,
    now: Micros,
) -> Result<LookupResponse> {
    let mut pending = probe(inner, req, plan, range, now)?;
    read_misses(inner, plan, &mut pending, now)?;
    Ok(pending.into_response(plan))
}

/// A sled lookup between the row cache and sled: the rows the cache answered are
/// filled, the keys it did not hold wait to be read.
struct Pending {
    rows: usize,
    cols: Vec<FeatureColumn>,
    /// Every key of the lookup, encoded, back to back.
    keybuf: Vec<u8>,
    misses: Vec<PendingRead>,
    hits: u64,
}

struct PendingRead {
    group: usize,
    /// Row within the lookup's range.
    row: usize,
    /// The key's bytes in `keybuf`.
    key: std::ops::Range<usize>,
    /// The cache's epoch for the key, taken before sled is read.
    epoch: u64,
}

impl Pending {
    fn into_response(mut self, plan: &Plan) -> LookupResponse {
        for g in &plan.groups {
            copy_duplicates(plan, g, &mut self.cols);
        }
        LookupResponse {
            rows: self.rows,
            columns: self.cols,
            degraded: None,
        }
    }
}

/// The sled backend of a store the lookup was planned for as sled.
fn sled_of(inner: &Inner) -> Result<&crate::sled_store::SledStore> {
    match &inner.backend {
        Backend::Sled(sled) => Ok(sled),
        Backend::Redis(_) => Err(FeatureStoreError::Internal(
            "sled fetch on another backend".into(),
        )),
    }
}

/// Encodes the keys of rows `range` and answers what the row cache holds (a hash
/// lookup each, cheap enough for the async task: see `on_task_max_keys`).
fn probe(
    inner: &Inner,
    req: &LookupRequest,
    plan: &Plan,
    range: std::ops::Range<usize>,
    now: Micros,
) -> Result<Pending> {
    let sled = sled_of(inner)?;
    let n = range.len();
    let mut p = Pending {
        rows: n,
        cols: empty_columns(plan, n),
        keybuf: Vec::with_capacity(n * plan.groups.len() * 16),
        misses: Vec::with_capacity(n * plan.groups.len()),
        hits: 0,
    };
    // Every key first, then the cache's answers for all of them at once.
    let mut rows = Vec::with_capacity(n * plan.groups.len());
    let mut scratch = Vec::with_capacity(32);
    for (gi, g) in plan.groups.iter().enumerate() {
        let v: &ViewInfo = &inner.views[g.view];
        let keys = &req.entities[g.key_column].1;
        for (row, i) in range.clone().enumerate() {
            keys.encode(v.id, i, &mut scratch);
            let at = p.keybuf.len();
            p.keybuf.extend_from_slice(&scratch);
            rows.push((gi, row, at..p.keybuf.len()));
        }
    }
    if !sled.cache.enabled() {
        p.misses
            .extend(rows.into_iter().map(|(group, row, key)| PendingRead {
                group,
                row,
                key,
                epoch: 0,
            }));
        return Ok(p);
    }
    let keys: Vec<&[u8]> = rows.iter().map(|(_, _, k)| &p.keybuf[k.clone()]).collect();
    let (cols, misses, hits) = (&mut p.cols, &mut p.misses, &mut p.hits);
    let mut failed = None;
    sled.cache.get_many(&keys, Instant::now(), |i, hit, epoch| {
        let (gi, row, key) = &rows[i];
        match hit {
            Some(Hit::Fresh(cached) | Hit::Old(cached)) => {
                *hits += 1;
                if let Some(bytes) = cached {
                    let g = &plan.groups[*gi];
                    if let Err(e) = fill_row(&inner.views[g.view], g, cols, *row, bytes, now) {
                        failed.get_or_insert(e);
                    }
                }
            }
            None => misses.push(PendingRead {
                group: *gi,
                row: *row,
                key: key.clone(),
                epoch,
            }),
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(p),
    }
}

/// Reads from sled the keys the row cache did not hold, fills their rows and
/// caches what was read. Blocking for as many keys as it reads.
fn read_misses(inner: &Inner, plan: &Plan, p: &mut Pending, now: Micros) -> Result<()> {
    let mut reads = Reads::start(inner, p)?;
    reads.next(inner, plan, usize::MAX, now)?;
    reads.finish();
    Ok(())
}

/// [`read_misses`] on the calling async task, `per_turn` keys at a time with a yield
/// between turns: the worker is held for as long as a small lookup holds it
/// (`inline_max_keys`), its other tasks (and a deadline's timer) run between turns,
/// and no thread is woken to read and then to answer, as a hop to the blocking pool
/// does. A caller that gives up (its deadline passed) stops the reads at the next
/// turn.
async fn read_misses_in_turns(
    inner: &Inner,
    plan: &Plan,
    p: &mut Pending,
    now: Micros,
    per_turn: usize,
) -> Result<()> {
    let mut reads = Reads::start(inner, p)?;
    while reads.next(inner, plan, per_turn.max(1), now)? {
        tokio::task::yield_now().await;
    }
    reads.finish();
    Ok(())
}

/// The sled reads of a lookup's misses, in key order: neighbouring keys share sled
/// nodes, so sorted reads touch each node once while it is hot.
struct Reads<'p> {
    sled: &'p crate::sled_store::SledStore,
    keybuf: &'p [u8],
    misses: &'p [PendingRead],
    cols: &'p mut [FeatureColumn],
    hits: u64,
    /// Misses read so far.
    done: usize,
    /// What was read, for the cache (with each key's epoch from before the read).
    read: Vec<(&'p [u8], Option<sled::IVec>, u64)>,
    /// When the reads began: an entry's age counts from before the read, as the row
    /// it holds may.
    filled: Instant,
}

impl<'p> Reads<'p> {
    fn start(inner: &'p Inner, p: &'p mut Pending) -> Result<Self> {
        let sled = sled_of(inner)?;
        let Pending {
            keybuf,
            misses,
            cols,
            hits,
            ..
        } = p;
        let keybuf = &keybuf[..];
        misses.sort_unstable_by(|a, b| keybuf[a.key.clone()].cmp(&keybuf[b.key.clone()]));
        let caching = sled.cache.enabled();
        Ok(Self {
            sled,
            keybuf,
            read: Vec::with_capacity(if caching { misses.len() } else { 0 }),
            misses,
            cols,
            hits: *hits,
            done: 0,
            filled: Instant::now(),
        })
    }

    /// Reads the next `n` misses; whether any are left.
    fn next(&mut self, inner: &Inner, plan: &Plan, n: usize, now: Micros) -> Result<bool> {
        let caching = self.sled.cache.enabled();
        let end = self.done.saturating_add(n).min(self.misses.len());
        for miss in &self.misses[self.done..end] {
            let key = &self.keybuf[miss.key.clone()];
            let got = self.sled.rows.get(key)?;
            if let Some(bytes) = &got {
                let g = &plan.groups[miss.group];
                fill_row(&inner.views[g.view], g, self.cols, miss.row, bytes, now)?;
            }
            if caching {
                self.read.push((key, got, miss.epoch));
            }
        }
        self.done = end;
        Ok(end < self.misses.len())
    }

    /// Puts what was read into the row cache (under one hold of its lock).
    fn finish(self) {
        let sled = self.sled;
        if sled.cache.enabled() {
            let misses = self.misses.len() as u64;
            sled.cache.insert_many(self.read, self.filled);
            m::record_cache(self.hits, misses);
            m::record_cache_bytes(sled.cache.bytes());
        }
    }
}

/// The answer columns of `plan` for `n` rows, every value `NotFound`.
pub(crate) fn empty_columns(plan: &Plan, n: usize) -> Vec<FeatureColumn> {
    plan.columns
        .iter()
        .map(|(name, dtype)| FeatureColumn {
            name: name.clone(),
            dtype: *dtype,
            statuses: vec![FeatureStatus::NotFound; n],
            event_times: vec![0; n],
            values: ColumnValues::defaults(*dtype, n),
        })
        .collect()
}

/// Columns asked for twice: copy from the first column of the same feature.
pub(crate) fn copy_duplicates(plan: &Plan, g: &Group, cols: &mut [FeatureColumn]) {
    for &c in &g.columns {
        if let Some(first) = first_column_for(g, &plan.columns, c) {
            if first != c {
                cols[c] = FeatureColumn {
                    name: cols[c].name.clone(),
                    ..cols[first].clone()
                };
            }
        }
    }
}

/// Fills row `i` of the group's columns from a decoded row (the Redis path), by
/// the same rules as [`fill_row`]; `stale` forces `OutsideMaxAge` (a row served
/// from the cache because Redis failed).
pub(crate) fn fill_decoded(
    v: &ViewInfo,
    g: &Group,
    cols: &mut [FeatureColumn],
    i: usize,
    row: &crate::cache::DecodedRow,
    now: Micros,
    stale: bool,
) -> Result<()> {
    let stale = stale || now.saturating_sub(row.event_time) > v.max_age_micros();
    for &c in &g.columns {
        cols[c].statuses[i] = FeatureStatus::Null;
        cols[c].event_times[i] = row.event_time;
    }
    let status = if stale {
        FeatureStatus::OutsideMaxAge
    } else {
        FeatureStatus::Present
    };
    for (id, val) in &row.fields {
        if let Some(Some(c)) = g.column_by_id.get(*id as usize) {
            if !cols[*c].values.set_value(i, val) {
                return Err(FeatureStoreError::Decode {
                    view: v.name.clone(),
                    what: format!(
                        "feature id {id} stored as {}, registry says otherwise",
                        val.feature_type()
                    ),
                });
            }
            cols[*c].statuses[i] = status;
        }
    }
    if stale {
        for &c in &g.columns {
            cols[c].statuses[i] = FeatureStatus::OutsideMaxAge;
        }
    }
    Ok(())
}

/// Marks row `i` of the group's columns `Unavailable`.
pub(crate) fn mark_unavailable(g: &Group, cols: &mut [FeatureColumn], i: usize) {
    for &c in &g.columns {
        cols[c].statuses[i] = FeatureStatus::Unavailable;
        cols[c].event_times[i] = 0;
    }
}

/// Fills row `i` of the group's columns from one stored row: each value with its
/// status (present, or outside max age when the row is stale; null where the row
/// has no value) and the row's event time.
fn fill_row(
    v: &ViewInfo,
    g: &Group,
    cols: &mut [FeatureColumn],
    i: usize,
    bytes: &[u8],
    now: Micros,
) -> Result<()> {
    let event_time =
        encoding::decode_event_time(bytes).map_err(|what| FeatureStoreError::Decode {
            view: v.name.clone(),
            what,
        })?;
    let stale = now.saturating_sub(event_time) > v.max_age_micros();
    for &c in &g.columns {
        cols[c].statuses[i] = FeatureStatus::Null;
        cols[c].event_times[i] = event_time;
    }
    let status = if stale {
        FeatureStatus::OutsideMaxAge
    } else {
        FeatureStatus::Present
    };
    let mut mismatch = None;
    encoding::decode_value(bytes, |id, field| {
        if let Some(Some(c)) = g.column_by_id.get(id as usize) {
            if cols[*c].values.set(i, field) {
                cols[*c].statuses[i] = status;
            } else {
                mismatch = Some((id, field.feature_type()));
            }
        }
    })
    .map_err(|what| FeatureStoreError::Decode {
        view: v.name.clone(),
        what,
    })?;
    if let Some((id, t)) = mismatch {
        return Err(FeatureStoreError::Decode {
            view: v.name.clone(),
            what: format!("feature id {id} stored as {t}, registry says otherwise"),
        });
    }
    // Stale rows: nulls are stale too; nothing in this row is live.
    if stale {
        for &c in &g.columns {
            cols[c].statuses[i] = FeatureStatus::OutsideMaxAge;
        }
    }
    Ok(())
}

fn first_column_for(g: &Group, columns: &[(Arc<str>, FeatureType)], c: usize) -> Option<usize> {
    g.column_by_id
        .iter()
        .flatten()
        .copied()
        .find(|&f| columns[f].0 == columns[c].0)
}

fn concat(parts: Vec<LookupResponse>) -> LookupResponse {
    let mut it = parts.into_iter();
    let Some(mut acc) = it.next() else {
        return LookupResponse {
            rows: 0,
            columns: Vec::new(),
            degraded: None,
        };
    };
    for p in it {
        acc.rows += p.rows;
        for (a, b) in acc.columns.iter_mut().zip(p.columns) {
            a.statuses.extend(b.statuses);
            a.event_times.extend(b.event_times);
            a.values.append(b.values);
        }
    }
    acc
}
