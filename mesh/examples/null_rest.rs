//! A do-nothing OIP v2 REST server: it parses every inference request body exactly
//! as `mesh serve` does ([`mesh_router::oip::http::parse_infer_body`]) and answers a
//! fixed OIP response of zeros of the right shape. Run under the same load as the
//! mesh's REST port, it measures the limit of the transport (hyper, axum, JSON) on
//! this machine; `bench/compare.sh` runs it next to the mesh.
//!
//! `cargo run --release -p mesh --example null_rest -- examples/models/fraud_mlp 8102`
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mesh_model_actor::ModelConfig;
use mesh_router::oip::http::parse_infer_body;
use serde_json::json;

async fn infer(
    State(config): State<Arc<ModelConfig>>,
    Path(model): Path<String>,
    body: Bytes,
) -> Response {
    let req = match parse_infer_body(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({ "error": e.to_string() })),
            )
                .into_response()
        }
    };
    let (id, inputs) = req.summary();
    let width = config.input().row_width().max(1);
    let rows = inputs.first().map_or(1, |(_, n)| (n / width).max(1));
    let out = config.output();
    let shape: Vec<i64> = std::iter::once(rows as i64)
        .chain(out.dims.iter().map(|&d| d as i64))
        .collect();
    let mut body = json!({
        "model_name": model,
        "model_version": "1",
        "outputs": [{
            "name": out.name, "datatype": "FP32", "shape": shape,
            "data": vec![0.0f32; rows * out.row_width()],
        }],
    });
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    Json(body).into_response()
}

/// The mesh's own allocator, so that the comparison is of the work, not of malloc.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The memory the mesh runs with: no transparent huge pages (README "Allocator").
    mesh::cli::set_transparent_huge_pages(false)?;
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "examples/models/fraud_mlp".into()),
    );
    let port: u16 = args.next().map(|p| p.parse()).transpose()?.unwrap_or(8102);
    let config = Arc::new(ModelConfig::load(&dir)?);
    let app = Router::new()
        .route("/v2/health/ready", get(|| async { StatusCode::OK }))
        .route("/v2/models/{model}/infer", post(infer))
        .with_state(config.clone());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    println!("null OIP REST server for '{}' on {addr}", config.name);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
