//! A do-nothing OIP v2 gRPC server: it describes one model from a `model.toml`
//! and answers every ModelInfer at once with zeros of the right shape. Run under
//! the same load as `mesh serve`, it measures the limit of the transport (tonic,
//! HTTP/2, protobuf) on this machine.
//!
//! `cargo run --release -p mesh --example null_oip -- examples/models/fraud_mlp 8101`
use std::path::PathBuf;

use mesh_model_actor::ModelConfig;
use mesh_proto::inference as pb;
use mesh_router::oip::grpc::{model_config, tensor_meta, EXTENSIONS};
use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use tonic::{Request, Response, Status};

struct Null {
    config: ModelConfig,
    /// Requests answered (reported as successes with zero time, as Triton would).
    served: std::sync::atomic::AtomicU64,
}

#[tonic::async_trait]
impl GrpcInferenceService for Null {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }
    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse { ready: true }))
    }
    async fn model_ready(
        &self,
        _: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        Ok(Response::new(pb::ModelReadyResponse { ready: true }))
    }
    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "null-oip".into(),
            version: "0".into(),
            extensions: EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }
    async fn model_metadata(
        &self,
        _: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let c = &self.config;
        Ok(Response::new(pb::ModelMetadataResponse {
            name: c.name.clone(),
            versions: vec!["1".into()],
            platform: c.platform.clone(),
            inputs: c
                .inputs
                .iter()
                .map(|t| tensor_meta(&t.name, t.datatype.as_str(), &t.dims))
                .collect(),
            outputs: c
                .outputs
                .iter()
                .map(|t| tensor_meta(&t.name, t.datatype.as_str(), &t.dims))
                .collect(),
        }))
    }
    async fn model_infer(
        &self,
        req: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let r = req.into_inner();
        let rows = r
            .inputs
            .first()
            .and_then(|t| t.shape.first().copied())
            .unwrap_or(1)
            .max(1);
        let out = self.config.output();
        let n = rows as usize * out.row_width();
        Ok(Response::new(pb::ModelInferResponse {
            model_name: r.model_name,
            model_version: "1".into(),
            id: r.id,
            outputs: vec![pb::model_infer_response::InferOutputTensor {
                name: out.name.clone(),
                datatype: "FP32".into(),
                shape: std::iter::once(rows)
                    .chain(out.dims.iter().map(|&d| d as i64))
                    .collect(),
                ..Default::default()
            }],
            raw_output_contents: vec![vec![0u8; n * 4]],
            ..Default::default()
        }))
    }
    async fn model_config(
        &self,
        _: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(model_config(&self.config)),
        }))
    }
    async fn model_statistics(
        &self,
        _: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        // perf_analyzer reads the statistics of the version it loaded: counts, no time.
        let n = self.served.load(std::sync::atomic::Ordering::Relaxed);
        let zero = || Some(pb::StatisticDuration { count: n, ns: 0 });
        Ok(Response::new(pb::ModelStatisticsResponse {
            model_stats: vec![pb::ModelStatistics {
                name: self.config.name.clone(),
                version: "1".into(),
                last_inference: 1,
                inference_count: n,
                execution_count: n,
                inference_stats: Some(pb::InferStatistics {
                    success: zero(),
                    fail: zero(),
                    queue: zero(),
                    compute_input: zero(),
                    compute_infer: zero(),
                    compute_output: zero(),
                    cache_hit: zero(),
                    cache_miss: zero(),
                }),
                ..Default::default()
            }],
        }))
    }
    async fn repository_index(
        &self,
        _: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        Ok(Response::new(pb::RepositoryIndexResponse::default()))
    }
    async fn repository_model_load(
        &self,
        _: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        Err(Status::unimplemented("null server"))
    }
    async fn repository_model_unload(
        &self,
        _: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        Err(Status::unimplemented("null server"))
    }
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
    let port: u16 = args.next().map(|p| p.parse()).transpose()?.unwrap_or(8101);
    let config = ModelConfig::load(&dir)?;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    println!("null OIP server for '{}' on {addr}", config.name);
    tonic::transport::Server::builder()
        .add_service(GrpcInferenceServiceServer::new(Null {
            config,
            served: Default::default(),
        }))
        .serve(addr)
        .await?;
    Ok(())
}
