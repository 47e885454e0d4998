//! `mesh features get` and `mesh features list`: read a running mesh's feature store
//! over gRPC (`mesh.v1.FeatureStore`), by hand.
use anyhow::{bail, Context};
use clap::Args;
use mesh_proto::mesh::v1 as pb;
use pb::feature_store_client::FeatureStoreClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

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

async fn views(client: &mut FeatureStoreClient<Channel>) -> anyhow::Result<Vec<pb::FeatureViewSpec>> {
    Ok(client
        .list_views(pb::ListViewsRequest {})
        .await
        .map_err(|s| status_err("ListViews", s))?
        .into_inner()
        .views)
}

fn type_name(t: i32) -> String {
    pb::FeatureType::try_from(t)
        .map(|t| t.as_str_name().trim_start_matches("FEATURE_TYPE_").to_lowercase())
        .unwrap_or_else(|_| t.to_string())
}

fn status_name(s: i32) -> String {
    pb::FeatureStatus::try_from(s)
        .map(|s| s.as_str_name().trim_start_matches("FEATURE_STATUS_").to_owned())
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
                format!("view '{}' is keyed by int64 {}; '{k}' is not a number", view.name, view.join_key)
            })?);
        } else {
            col.string_keys.push(k.clone());
        }
    }
    let features = if a.features.is_empty() {
        vec![format!("{}:*", view.name)]
    } else {
        a.features.iter().map(|f| format!("{}:{f}", view.name)).collect()
    };
    let cols = client
        .get_online_features(pb::GetOnlineFeaturesRequest {
            features,
            entities: vec![col],
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
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for r in &rows {
        println!("{} {} = {}", view.name, view.join_key, r[&view.join_key]);
        for f in r["features"].as_array().into_iter().flatten() {
            let age = f["age_seconds"]
                .as_f64()
                .map_or(String::new(), |s| format!("  ({s:.0}s old)"));
            println!(
                "  {:<32} {:<16} {}{age}",
                f["name"].as_str().unwrap_or_default(),
                f["status"].as_str().unwrap_or_default(),
                f["value"],
            );
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
            .map(|t| t.as_str_name().trim_start_matches("ENTITY_KEY_TYPE_").to_lowercase())
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
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for v in &all {
        println!(
            "{}  (entity {}, key {}: {}, max_age {} s)",
            v.name,
            v.entity,
            v.join_key,
            key_type(v.key_type),
            v.max_age_millis / 1000
        );
        for f in &v.features {
            println!("  {:<32} {}", f.name, type_name(f.r#type));
        }
    }
    Ok(())
}
