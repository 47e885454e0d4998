//! A client of a `mesh serve --role features` (`mesh.v1.FeatureStore`), for a
//! router whose `[features] remote` names one. The views are read once at start
//! (`ListViews`, retried for up to `[features] remote_wait`), so the input specs
//! are checked against them as against a local store; lookups carry the
//! decision's remaining time as their gRPC timeout and are bounded by it here
//! too. An answer that does not fit its request (a column of the wrong length,
//! an unknown type or status) is a failed lookup, never a value.
use std::time::{Duration, Instant};

use mesh_feature_store::{
    ColumnValues, Degraded, FeatureColumn, FeatureInfo, FeatureStatus, FeatureType, KeyColumn,
    KeyType, LookupRequest, LookupResponse, ViewInfo,
};
use mesh_proto::mesh::v1 as pb;
use pb::feature_store_client::FeatureStoreClient;
use tonic::transport::Channel;

use super::replica::remote_channel;

/// A lookup is not sent with less time left than this: it could not come back.
pub const MIN_LOOKUP_TIME: Duration = Duration::from_micros(200);

/// How often the start retries `ListViews` while the features role is not up.
const RETRY_EVERY: Duration = Duration::from_millis(250);

/// The features role of `[features] remote`.
pub struct RemoteFeatures {
    url: String,
    client: FeatureStoreClient<Channel>,
    views: Vec<ViewInfo>,
    /// `[features] lookup_timeout`: a cap below the decision's remaining time.
    timeout: Option<Duration>,
}

impl RemoteFeatures {
    /// Connects to `url` and reads its views, retrying for up to `wait`. `Err`
    /// names the URL and the last failure (the start fails: without the views the
    /// input specs cannot be checked nor the lookups keyed).
    pub async fn connect(
        url: &str,
        wait: Duration,
        timeout: Option<Duration>,
    ) -> Result<Self, String> {
        let client = FeatureStoreClient::new(remote_channel(url, None)?);
        let until = Instant::now() + wait;
        let views = loop {
            let mut req = tonic::Request::new(pb::ListViewsRequest {});
            req.set_timeout(Duration::from_secs(2));
            match client.clone().list_views(req).await {
                Ok(r) => break r.into_inner().views,
                Err(s) if Instant::now() + RETRY_EVERY < until => {
                    tracing::info!(url, status = %s.code(), message = s.message(), "waiting for the features role");
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Err(s) => {
                    return Err(format!(
                        "[features] remote '{url}': ListViews failed for {wait:?} ({}: {}); is `mesh serve --role features` running there?",
                        s.code(),
                        s.message()
                    ))
                }
            }
        };
        let views = views
            .into_iter()
            .enumerate()
            .map(|(i, v)| view_from_proto(i, v))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("[features] remote '{url}': ListViews: {e}"))?;
        tracing::info!(url, views = ?views.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), "reading features from a features role");
        Ok(Self {
            url: url.to_owned(),
            client,
            views,
            timeout,
        })
    }

    /// A client that has not read its views (unit tests of the stages).
    #[cfg(test)]
    pub fn unconnected(url: &str, views: Vec<ViewInfo>, timeout: Option<Duration>) -> Self {
        Self {
            url: url.to_owned(),
            #[allow(clippy::unwrap_used)]
            client: FeatureStoreClient::new(remote_channel(url, None).unwrap()),
            views,
            timeout,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn views(&self) -> &[ViewInfo] {
        &self.views
    }

    /// One lookup, ending by `deadline` (or `[features] lookup_timeout`, if sooner).
    pub async fn lookup(
        &self,
        req: LookupRequest,
        deadline: Instant,
    ) -> Result<LookupResponse, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        let time = self.timeout.map_or(left, |t| t.min(left));
        if time < MIN_LOOKUP_TIME {
            return Err(format!(
                "{time:?} left for the lookup, less than {MIN_LOOKUP_TIME:?}"
            ));
        }
        let rows = req.entities.first().map_or(0, |(_, k)| k.len());
        let asked = req.features.clone();
        let mut call = tonic::Request::new(lookup_to_proto(req));
        call.set_timeout(time);
        let mut client = self.client.clone();
        let answer = tokio::time::timeout(time, client.get_online_features(call))
            .await
            .map_err(|_| format!("{} did not answer within {time:?}", self.url))?
            .map_err(|s| format!("{}: {}: {}", self.url, s.code(), s.message()))?;
        lookup_from_proto(answer.into_inner(), rows, &asked)
            .map_err(|e| format!("{}: the answer does not fit the lookup: {e}", self.url))
    }
}

fn feature_type(t: i32) -> Result<FeatureType, String> {
    Ok(match pb::FeatureType::try_from(t) {
        Ok(pb::FeatureType::F32) => FeatureType::F32,
        Ok(pb::FeatureType::F64) => FeatureType::F64,
        Ok(pb::FeatureType::I64) => FeatureType::I64,
        Ok(pb::FeatureType::Bool) => FeatureType::Bool,
        Ok(pb::FeatureType::String) => FeatureType::String,
        Ok(pb::FeatureType::F32Vector) => FeatureType::F32Vector,
        _ => return Err(format!("unknown feature type {t}")),
    })
}

fn feature_status(s: i32) -> Result<FeatureStatus, String> {
    Ok(match pb::FeatureStatus::try_from(s) {
        Ok(pb::FeatureStatus::Present) => FeatureStatus::Present,
        Ok(pb::FeatureStatus::NotFound) => FeatureStatus::NotFound,
        Ok(pb::FeatureStatus::Null) => FeatureStatus::Null,
        Ok(pb::FeatureStatus::OutsideMaxAge) => FeatureStatus::OutsideMaxAge,
        Ok(pb::FeatureStatus::Unavailable) => FeatureStatus::Unavailable,
        _ => return Err(format!("unknown feature status {s}")),
    })
}

/// A view as `ListViews` describes it (`id` is its place in the list: a remote's
/// ids are its own business).
fn view_from_proto(i: usize, v: pb::FeatureViewSpec) -> Result<ViewInfo, String> {
    let key_type = match pb::EntityKeyType::try_from(v.key_type) {
        Ok(pb::EntityKeyType::Int64) => KeyType::Int64,
        Ok(pb::EntityKeyType::String) => KeyType::String,
        _ => {
            return Err(format!(
                "view '{}' has an unknown key type {}",
                v.name, v.key_type
            ))
        }
    };
    let features = v
        .features
        .into_iter()
        .enumerate()
        .map(|(j, f)| {
            Ok(FeatureInfo {
                id: u16::try_from(j)
                    .map_err(|_| format!("view '{}' has too many features", v.name))?,
                dtype: feature_type(f.r#type).map_err(|e| format!("{}:{}: {e}", v.name, f.name))?,
                name: f.name,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(ViewInfo {
        id: u32::try_from(i).unwrap_or(u32::MAX),
        name: v.name,
        entity: v.entity,
        join_key: v.join_key,
        key_type,
        max_age: Duration::from_millis(v.max_age_millis),
        timestamp_field: v.timestamp_field,
        features,
    })
}

/// The wire form of a lookup.
pub fn lookup_to_proto(req: LookupRequest) -> pb::GetOnlineFeaturesRequest {
    let entities = req
        .entities
        .into_iter()
        .map(|(join_key, keys)| {
            let mut col = pb::EntityKeyColumn {
                join_key,
                ..Default::default()
            };
            match keys {
                KeyColumn::Int64(k) => col.int64_keys = k,
                KeyColumn::String(k) => col.string_keys = k,
            }
            col
        })
        .collect();
    pb::GetOnlineFeaturesRequest {
        features: req.features.to_vec(),
        entities,
        // A decision asks for a few features per view: one event time per column
        // costs little, and every column is then checked on its own.
        event_times_per_view: false,
    }
}

/// An answer of `rows` rows for the features `asked`, checked: every column is
/// one that was asked for, and has a status, an event time and a value per row.
pub fn lookup_from_proto(
    resp: pb::GetOnlineFeaturesResponse,
    rows: usize,
    asked: &[String],
) -> Result<LookupResponse, String> {
    // A features role on Redis that could not answer some entities in time says so
    // (UNAVAILABLE statuses, cached values as OUTSIDE_MAX_AGE, and this reason);
    // the proto does not say which rows, so every row carries the reason.
    let degraded = (!resp.degraded_reason.is_empty()).then(|| Degraded {
        reason: resp.degraded_reason.clone(),
        rows: vec![true; rows],
    });
    let mut columns = Vec::with_capacity(resp.columns.len());
    for c in resp.columns {
        let wildcard = c
            .name
            .split_once(':')
            .is_some_and(|(view, _)| asked.iter().any(|a| *a == format!("{view}:*")));
        if !asked.contains(&c.name) && !wildcard {
            return Err(format!("column '{}' was not asked for", c.name));
        }
        let dtype = feature_type(c.r#type).map_err(|e| format!("column '{}': {e}", c.name))?;
        let statuses = c
            .statuses
            .iter()
            .map(|s| feature_status(*s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("column '{}': {e}", c.name))?;
        let values = match dtype {
            FeatureType::F32 => ColumnValues::F32(c.f32_values),
            FeatureType::F64 => ColumnValues::F64(c.f64_values),
            FeatureType::I64 => ColumnValues::I64(c.i64_values),
            FeatureType::Bool => ColumnValues::Bool(c.bool_values),
            FeatureType::String => ColumnValues::String(c.string_values),
            FeatureType::F32Vector => {
                ColumnValues::F32Vector(c.f32_vector_values.into_iter().map(|v| v.values).collect())
            }
        };
        let lens = [
            statuses.len(),
            c.event_time_unix_micros.len(),
            values_len(&values),
        ];
        if lens.iter().any(|n| *n != rows) {
            return Err(format!(
                "column '{}' has {} statuses, {} event times and {} values for {rows} rows",
                c.name, lens[0], lens[1], lens[2]
            ));
        }
        columns.push(FeatureColumn {
            name: c.name.into(),
            dtype,
            statuses,
            event_times: c.event_time_unix_micros,
            values,
        });
    }
    Ok(LookupResponse {
        rows,
        columns,
        degraded,
    })
}

fn values_len(v: &ColumnValues) -> usize {
    match v {
        ColumnValues::F32(x) => x.len(),
        ColumnValues::F64(x) => x.len(),
        ColumnValues::I64(x) => x.len(),
        ColumnValues::Bool(x) => x.len(),
        ColumnValues::String(x) => x.len(),
        ColumnValues::F32Vector(x) => x.len(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn column(name: &str, statuses: Vec<i32>, values: Vec<f32>) -> pb::FeatureColumn {
        pb::FeatureColumn {
            name: name.into(),
            r#type: pb::FeatureType::F32 as i32,
            event_time_unix_micros: vec![5; statuses.len()],
            statuses,
            f32_values: values,
            ..Default::default()
        }
    }

    #[test]
    fn a_lookup_goes_out_column_by_column() {
        let req = LookupRequest::new(["card:f31", "merchant:m"])
            .with_keys("card_id", KeyColumn::Int64(vec![7, 9]))
            .with_keys(
                "merchant_id",
                KeyColumn::String(vec!["a".into(), "b".into()]),
            );
        let p = lookup_to_proto(req);
        assert_eq!(p.features, ["card:f31", "merchant:m"]);
        assert_eq!(p.entities[0].join_key, "card_id");
        assert_eq!(p.entities[0].int64_keys, [7, 9]);
        assert!(p.entities[0].string_keys.is_empty());
        assert_eq!(p.entities[1].string_keys, ["a", "b"]);
    }

    #[test]
    fn an_answer_that_fits_is_read_with_its_statuses() {
        let present = pb::FeatureStatus::Present as i32;
        let missing = pb::FeatureStatus::NotFound as i32;
        let resp = pb::GetOnlineFeaturesResponse {
            columns: vec![column("card:f31", vec![present, missing], vec![0.25, 0.0])],
            ..Default::default()
        };
        let r = lookup_from_proto(resp, 2, &["card:f31".into()]).unwrap();
        assert_eq!(r.degraded, None);
        let c = r.column("card:f31").unwrap();
        assert_eq!(
            c.statuses,
            [FeatureStatus::Present, FeatureStatus::NotFound]
        );
        assert_eq!(c.values, ColumnValues::F32(vec![0.25, 0.0]));
        assert_eq!(c.event_times, [5, 5]);
        // A view's wildcard admits its columns.
        let resp = pb::GetOnlineFeaturesResponse {
            columns: vec![column("card:f31", vec![present], vec![1.0])],
            ..Default::default()
        };
        assert!(lookup_from_proto(resp, 1, &["card:*".into()]).is_ok());
        // A features role on Redis that missed its lookup budget: UNAVAILABLE, and
        // the reason reaches every row.
        let unavailable = pb::FeatureStatus::Unavailable as i32;
        let resp = pb::GetOnlineFeaturesResponse {
            columns: vec![column(
                "card:f31",
                vec![unavailable, present],
                vec![0.0, 1.0],
            )],
            degraded_reason: "redis: no answer within the budget".into(),
            ..Default::default()
        };
        let r = lookup_from_proto(resp, 2, &["card:f31".into()]).unwrap();
        assert_eq!(
            r.column("card:f31").unwrap().statuses,
            [FeatureStatus::Unavailable, FeatureStatus::Present]
        );
        let d = r.degraded.unwrap();
        assert_eq!(d.rows, [true, true]);
        assert!(d.reason.starts_with("redis"), "{}", d.reason);
    }

    #[test]
    fn an_answer_that_does_not_fit_is_a_failure() {
        let present = pb::FeatureStatus::Present as i32;
        let asked = ["card:f31".to_string()];
        let cases = [
            (column("card:f31", vec![present], vec![1.0]), "for 2 rows"),
            (
                column("card:f31", vec![present, present], vec![1.0]),
                "1 values",
            ),
            (
                column("card:f31", vec![present, 0], vec![1.0, 2.0]),
                "unknown feature status 0",
            ),
            (
                column("card:f31", vec![present, 9], vec![1.0, 2.0]),
                "unknown feature status 9",
            ),
            (
                column("card:other", vec![present, present], vec![1.0, 2.0]),
                "not asked for",
            ),
            (
                pb::FeatureColumn {
                    r#type: 42,
                    ..column("card:f31", vec![present, present], vec![1.0, 2.0])
                },
                "unknown feature type 42",
            ),
        ];
        for (c, want) in cases {
            let e = lookup_from_proto(
                pb::GetOnlineFeaturesResponse {
                    columns: vec![c],
                    ..Default::default()
                },
                2,
                &asked,
            )
            .unwrap_err();
            assert!(e.contains(want), "{e} (want {want})");
        }
    }

    #[test]
    fn views_come_from_list_views() {
        let v = pb::FeatureViewSpec {
            name: "card".into(),
            entity: "card".into(),
            join_key: "card_id".into(),
            key_type: pb::EntityKeyType::Int64 as i32,
            features: vec![pb::FeatureSpec {
                name: "f31".into(),
                r#type: pb::FeatureType::F32 as i32,
            }],
            max_age_millis: 3_600_000,
            timestamp_field: "ts".into(),
        };
        let info = view_from_proto(3, v.clone()).unwrap();
        assert_eq!(
            (info.id, info.join_key.as_str(), info.key_type),
            (3, "card_id", KeyType::Int64)
        );
        assert_eq!(info.max_age, Duration::from_secs(3600));
        assert_eq!(info.features[0].dtype, FeatureType::F32);
        let bad = pb::FeatureViewSpec { key_type: 0, ..v };
        assert!(view_from_proto(0, bad)
            .unwrap_err()
            .contains("unknown key type"));
    }
}
