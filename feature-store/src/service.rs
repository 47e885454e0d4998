//! The `mesh.v1.FeatureStore` gRPC service over a [`FeatureStore`].
//!
//! Translation only: requests become library calls, answers become protobuf, and
//! every error leaves as a `tonic::Status` through `From<FeatureStoreError>`
//! (error.rs). The service has its own [`Limits`], so remote callers can be held
//! to tighter bounds than in-process ones.
use std::collections::HashMap;
use std::sync::Arc;

use mesh_proto::mesh::v1 as pb;
use pb::feature_store_server::FeatureStoreServer;
use tonic::{Request, Response, Status};

use crate::error::FeatureStoreError;
use crate::lookup::{ColumnValues, KeyColumn, LookupRequest, LookupResponse};
use crate::registry::ViewInfo;
use crate::store::{FeatureStore, Limits};
use crate::types::{Durability, EntityKey, FeatureStatus, FeatureType, KeyType, Row, Value};

/// gRPC front of a [`FeatureStore`].
#[derive(Debug, Clone)]
pub struct FeatureStoreService {
    store: Arc<FeatureStore>,
    limits: Limits,
}

impl FeatureStoreService {
    pub fn new(store: Arc<FeatureStore>, limits: Limits) -> Self {
        FeatureStoreService { store, limits }
    }

    /// The tonic server wrapper, ready for `Server::builder().add_service(..)`.
    pub fn into_server(self) -> FeatureStoreServer<Self> {
        FeatureStoreServer::new(self)
    }
}

fn invalid(s: impl Into<String>) -> FeatureStoreError {
    FeatureStoreError::InvalidArgument(s.into())
}

pub(crate) fn lookup_from_proto(
    req: pb::GetOnlineFeaturesRequest,
) -> Result<LookupRequest, FeatureStoreError> {
    let mut entities: Vec<(String, KeyColumn)> = Vec::with_capacity(req.entities.len());
    for col in req.entities {
        if col.join_key.is_empty() {
            return Err(invalid("an entity key column has no join_key"));
        }
        if entities.iter().any(|(jk, _)| *jk == col.join_key) {
            return Err(invalid(format!(
                "entity key column {:?} is given twice",
                col.join_key
            )));
        }
        let keys = match (col.int64_keys.is_empty(), col.string_keys.is_empty()) {
            (false, false) => {
                return Err(invalid(format!(
                    "entity key column {:?} has both int64 and string keys",
                    col.join_key
                )))
            }
            (_, true) => KeyColumn::Int64(col.int64_keys),
            (true, false) => KeyColumn::String(col.string_keys),
        };
        entities.push((col.join_key, keys));
    }
    Ok(LookupRequest {
        features: req.features.into(),
        entities,
    })
}

fn type_to_proto(t: FeatureType) -> pb::FeatureType {
    match t {
        FeatureType::F32 => pb::FeatureType::F32,
        FeatureType::F64 => pb::FeatureType::F64,
        FeatureType::I64 => pb::FeatureType::I64,
        FeatureType::Bool => pb::FeatureType::Bool,
        FeatureType::String => pb::FeatureType::String,
        FeatureType::F32Vector => pb::FeatureType::F32Vector,
    }
}

fn status_to_proto(s: FeatureStatus) -> i32 {
    (match s {
        FeatureStatus::Present => pb::FeatureStatus::Present,
        FeatureStatus::NotFound => pb::FeatureStatus::NotFound,
        FeatureStatus::Null => pb::FeatureStatus::Null,
        FeatureStatus::OutsideMaxAge => pb::FeatureStatus::OutsideMaxAge,
        FeatureStatus::Unavailable => pb::FeatureStatus::Unavailable,
    }) as i32
}

/// The answer on the wire; with `per_view`, each view's event times once (every
/// column of a view has its rows' event times) instead of in every column.
pub(crate) fn lookup_to_proto(
    resp: LookupResponse,
    per_view: bool,
) -> pb::GetOnlineFeaturesResponse {
    let degraded_reason = resp.degraded.map(|d| d.reason).unwrap_or_default();
    let mut view_event_times: Vec<pb::ViewEventTimes> = Vec::new();
    let columns = resp
        .columns
        .into_iter()
        .map(|c| {
            let mut event_times = c.event_times;
            if per_view {
                let view = c.name.split_once(':').map_or(&c.name[..], |(v, _)| v);
                if !view_event_times.iter().any(|t| t.view == view) {
                    view_event_times.push(pb::ViewEventTimes {
                        view: view.to_owned(),
                        event_time_unix_micros: std::mem::take(&mut event_times),
                    });
                }
                event_times = Vec::new();
            }
            let mut out = pb::FeatureColumn {
                name: c.name.to_string(),
                r#type: type_to_proto(c.dtype) as i32,
                statuses: c.statuses.into_iter().map(status_to_proto).collect(),
                event_time_unix_micros: event_times,
                ..Default::default()
            };
            match c.values {
                ColumnValues::F32(v) => out.f32_values = v,
                ColumnValues::F64(v) => out.f64_values = v,
                ColumnValues::I64(v) => out.i64_values = v,
                ColumnValues::Bool(v) => out.bool_values = v,
                ColumnValues::String(v) => out.string_values = v,
                ColumnValues::F32Vector(v) => {
                    out.f32_vector_values = v
                        .into_iter()
                        .map(|values| pb::FloatVector { values })
                        .collect()
                }
            }
            out
        })
        .collect();
    pb::GetOnlineFeaturesResponse {
        columns,
        degraded_reason,
        view_event_times,
    }
}

/// Turns a push's rows into rows of `v`, checking names and keys; any error rejects
/// the whole push before anything is written (types and values are checked when the
/// rows are written, as for every write).
pub(crate) fn push_rows(v: &ViewInfo, rows: &[pb::PushRow]) -> Result<Vec<Row>, FeatureStoreError> {
    let index: HashMap<&str, usize> = v
        .features
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.as_str(), i))
        .collect();
    let mut out = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        let key = match row.key.as_ref().and_then(|k| k.key.as_ref()) {
            Some(pb::entity_key::Key::Int64Key(k)) => EntityKey::Int64(*k),
            Some(pb::entity_key::Key::StringKey(k)) => EntityKey::String(k.clone()),
            None => return Err(invalid(format!("row {r}: no entity key"))),
        };
        check_event_time(r, row.event_time_unix_micros)?;
        let mut values: Vec<Option<Value>> = vec![None; v.features.len()];
        let mut seen = vec![false; v.features.len()];
        for nv in &row.values {
            let i =
                *index
                    .get(nv.name.as_str())
                    .ok_or_else(|| FeatureStoreError::UnknownFeature {
                        view: v.name.clone(),
                        feature: nv.name.clone(),
                    })?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(invalid(format!(
                    "row {r}: feature {:?} is given twice",
                    nv.name
                )));
            }
            // An unset value is an explicit null.
            values[i] = nv
                .value
                .as_ref()
                .and_then(|x| x.value.as_ref())
                .map(value_from_proto);
        }
        out.push(Row {
            key,
            event_time: row.event_time_unix_micros,
            values,
        });
    }
    Ok(out)
}

fn check_event_time(row: usize, t: i64) -> Result<(), FeatureStoreError> {
    if t <= 0 {
        return Err(invalid(format!(
            "row {row}: event_time_unix_micros must be set (> 0)"
        )));
    }
    Ok(())
}

/// The number of rows of a columnar push: its keys.
fn column_rows_len(c: &pb::PushColumns) -> usize {
    c.int64_keys.len() + c.string_keys.len()
}

/// Turns a columnar push into rows of `v`, checking that every list is aligned to the
/// keys, that each column names a feature of the view once and fills the list of its
/// type only; any error rejects the whole push before anything is written. The caller
/// has bounded the number of rows.
pub(crate) fn push_column_rows(
    v: &ViewInfo,
    cols: pb::PushColumns,
) -> Result<Vec<Row>, FeatureStoreError> {
    let keys: Vec<EntityKey> = match (cols.int64_keys.is_empty(), cols.string_keys.is_empty()) {
        (false, false) => {
            return Err(invalid(
                "columns: both int64_keys and string_keys are set; a push has one key type",
            ))
        }
        (_, true) => cols.int64_keys.into_iter().map(EntityKey::Int64).collect(),
        (true, false) => cols
            .string_keys
            .into_iter()
            .map(EntityKey::String)
            .collect(),
    };
    let n = keys.len();
    let times = cols.event_time_unix_micros;
    if times.len() != n {
        return Err(invalid(format!(
            "columns: {} event times for {n} keys; there must be one per key",
            times.len()
        )));
    }
    for (r, t) in times.iter().enumerate() {
        check_event_time(r, *t)?;
    }
    let width = v.features.len();
    let mut values: Vec<Vec<Option<Value>>> = (0..n).map(|_| vec![None; width]).collect();
    let mut seen = vec![false; width];
    for c in cols.features {
        let Some(i) = v.features.iter().position(|f| f.name == c.name) else {
            return Err(FeatureStoreError::UnknownFeature {
                view: v.name.clone(),
                feature: c.name,
            });
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(invalid(format!(
                "columns: feature {:?} has two columns",
                c.name
            )));
        }
        let mut prev: Option<u32> = None;
        for &r in &c.null_rows {
            if prev.is_some_and(|p| r <= p) || r as usize >= n {
                return Err(invalid(format!(
                    "column {:?}: null_rows must be strictly increasing row numbers below \
                     {n}; {r} is not",
                    c.name
                )));
            }
            prev = Some(r);
        }
        let dtype = v.features[i].dtype;
        let lists = [
            (FeatureType::F32, c.f32_values.len()),
            (FeatureType::F64, c.f64_values.len()),
            (FeatureType::I64, c.i64_values.len()),
            (FeatureType::Bool, c.bool_values.len()),
            (FeatureType::String, c.string_values.len()),
            (FeatureType::F32Vector, c.f32_vector_values.len()),
        ];
        if let Some((t, _)) = lists.iter().find(|(t, len)| *t != dtype && *len > 0) {
            return Err(invalid(format!(
                "column {:?}: feature {:?} is {dtype}, got {t} values",
                c.name, c.name
            )));
        }
        let present = n - c.null_rows.len();
        let got = lists.iter().find(|(t, _)| *t == dtype).map_or(0, |l| l.1);
        if got != present {
            return Err(invalid(format!(
                "column {:?}: {got} values for {present} rows that are not null ({n} rows, \
                 {} null); there must be one value per row that is not null",
                c.name,
                c.null_rows.len()
            )));
        }
        let mut vals: Box<dyn Iterator<Item = Value>> = match dtype {
            FeatureType::F32 => Box::new(c.f32_values.into_iter().map(Value::F32)),
            FeatureType::F64 => Box::new(c.f64_values.into_iter().map(Value::F64)),
            FeatureType::I64 => Box::new(c.i64_values.into_iter().map(Value::I64)),
            FeatureType::Bool => Box::new(c.bool_values.into_iter().map(Value::Bool)),
            FeatureType::String => Box::new(c.string_values.into_iter().map(Value::String)),
            FeatureType::F32Vector => Box::new(
                c.f32_vector_values
                    .into_iter()
                    .map(|x| Value::F32Vector(x.values)),
            ),
        };
        let mut nulls = c.null_rows.iter().map(|&r| r as usize).peekable();
        for (r, row) in values.iter_mut().enumerate() {
            if nulls.next_if_eq(&r).is_none() {
                row[i] = vals.next();
            }
        }
    }
    Ok(keys
        .into_iter()
        .zip(times)
        .zip(values)
        .map(|((key, event_time), values)| Row {
            key,
            event_time,
            values,
        })
        .collect())
}

/// `rows` of `v` as one columnar push (`PushRequest.columns`): the keys, the event
/// times, and one list per feature that is not null in every row (a feature without
/// a column is null), its values in row order and its null rows listed. What
/// `push_column_rows` reads back.
pub fn push_columns(v: &ViewInfo, rows: &[Row]) -> pb::PushColumns {
    let mut out = pb::PushColumns {
        event_time_unix_micros: rows.iter().map(|r| r.event_time).collect(),
        ..Default::default()
    };
    for r in rows {
        match &r.key {
            EntityKey::Int64(k) => out.int64_keys.push(*k),
            EntityKey::String(k) => out.string_keys.push(k.clone()),
        }
    }
    for (i, f) in v.features.iter().enumerate() {
        let mut c = pb::PushColumn {
            name: f.name.clone(),
            ..Default::default()
        };
        for (r, row) in rows.iter().enumerate() {
            match row.values.get(i).and_then(Option::as_ref) {
                // Rows past u32::MAX are over any max_rows_per_push: refused there.
                None => c.null_rows.push(u32::try_from(r).unwrap_or(u32::MAX)),
                Some(Value::F32(x)) => c.f32_values.push(*x),
                Some(Value::F64(x)) => c.f64_values.push(*x),
                Some(Value::I64(x)) => c.i64_values.push(*x),
                Some(Value::Bool(x)) => c.bool_values.push(*x),
                Some(Value::String(x)) => c.string_values.push(x.clone()),
                Some(Value::F32Vector(x)) => c
                    .f32_vector_values
                    .push(pb::FloatVector { values: x.clone() }),
            }
        }
        if c.null_rows.len() < rows.len() {
            out.features.push(c);
        }
    }
    out
}

fn value_from_proto(v: &pb::feature_value::Value) -> Value {
    use pb::feature_value::Value as P;
    match v {
        P::F32Value(x) => Value::F32(*x),
        P::F64Value(x) => Value::F64(*x),
        P::I64Value(x) => Value::I64(*x),
        P::BoolValue(x) => Value::Bool(*x),
        P::StringValue(x) => Value::String(x.clone()),
        P::F32VectorValue(x) => Value::F32Vector(x.values.clone()),
    }
}

#[tonic::async_trait]
impl pb::feature_store_server::FeatureStore for FeatureStoreService {
    async fn get_online_features(
        &self,
        request: Request<pb::GetOnlineFeaturesRequest>,
    ) -> Result<Response<pb::GetOnlineFeaturesResponse>, Status> {
        let request = request.into_inner();
        let per_view = request.event_times_per_view;
        let req = lookup_from_proto(request)?;
        let resp = self
            .store
            .get_online_features_with_limits(req, &self.limits)
            .await?;
        Ok(Response::new(lookup_to_proto(resp, per_view)))
    }

    async fn push(
        &self,
        request: Request<pb::PushRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        let pb::PushRequest {
            view,
            rows,
            wait_for_sync,
            columns,
        } = request.into_inner();
        // The size first, before any row is built.
        let n = match &columns {
            Some(_) if !rows.is_empty() => {
                return Err(invalid("push has both rows and columns; send one of the two").into())
            }
            Some(c) => column_rows_len(c),
            None => rows.len(),
        };
        if n == 0 {
            return Err(invalid("push has no rows").into());
        }
        if n > self.limits.max_rows_per_push {
            return Err(FeatureStoreError::LimitExceeded {
                what: "rows in one push",
                got: n,
                limit: self.limits.max_rows_per_push,
                setting: "max_rows_per_push",
            }
            .into());
        }
        let v = self.store.view(&view)?;
        let rows = match columns {
            Some(c) => push_column_rows(v, c)?,
            None => push_rows(v, &rows)?,
        };
        let durability = if wait_for_sync {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        let w = self.store.push(&view, rows, durability).await?;
        Ok(Response::new(pb::PushResponse {
            rows_written: w.rows_written,
            rows_skipped_older: w.rows_skipped_older,
            synced: w.synced,
        }))
    }

    async fn list_views(
        &self,
        _request: Request<pb::ListViewsRequest>,
    ) -> Result<Response<pb::ListViewsResponse>, Status> {
        let views = self
            .store
            .views()
            .iter()
            .map(|v| pb::FeatureViewSpec {
                name: v.name.clone(),
                entity: v.entity.clone(),
                join_key: v.join_key.clone(),
                key_type: match v.key_type {
                    KeyType::Int64 => pb::EntityKeyType::Int64,
                    KeyType::String => pb::EntityKeyType::String,
                } as i32,
                features: v
                    .features
                    .iter()
                    .map(|f| pb::FeatureSpec {
                        name: f.name.clone(),
                        r#type: type_to_proto(f.dtype) as i32,
                    })
                    .collect(),
                max_age_millis: u64::try_from(v.max_age.as_millis()).unwrap_or(u64::MAX),
                timestamp_field: v.timestamp_field.clone(),
            })
            .collect();
        Ok(Response::new(pb::ListViewsResponse { views }))
    }
}
