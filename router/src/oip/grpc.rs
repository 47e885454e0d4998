//! `inference.GRPCInferenceService`: the Open Inference Protocol v2 over gRPC, with
//! Triton's ModelConfig, ModelStatistics and repository RPCs.
use std::sync::atomic::Ordering::Relaxed;

use mesh_model_actor::{DataType, ModelConfig, VersionHandle};
use mesh_proto::inference as pb;
use pb::grpc_inference_service_server::GrpcInferenceService;
use tonic::{Request, Response, Status};

use super::codec::{
    check_outputs, element_count, f32_to_le_bytes, parse_datatype, to_batch, Elements, InputTensor,
};
use super::Core;
use crate::error::RouterError;
use crate::request::parse_version;

/// Extensions announced in ServerMetadata. `statistics` and `model_configuration`
/// are what perf_analyzer looks for before asking for the server-side breakdown.
pub const EXTENSIONS: &[&str] = &[
    "model_repository",
    "model_configuration",
    "statistics",
    "schedule_policy",
];

pub struct OipGrpc {
    core: Core,
    /// Repository load/unload go through the admin plane.
    admin: crate::admin::Admin,
}

impl OipGrpc {
    pub fn new(core: Core, admin: crate::admin::Admin) -> Self {
        Self { core, admin }
    }
}

/// Decodes the inputs of a ModelInferRequest, from typed contents or raw bytes.
fn decode_inputs(
    req: &mut pb::ModelInferRequest,
    want: DataType,
) -> Result<Vec<InputTensor>, RouterError> {
    let raw = std::mem::take(&mut req.raw_input_contents);
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(RouterError::invalid(format!(
            "raw_input_contents has {} entries for {} inputs",
            raw.len(),
            req.inputs.len()
        )));
    }
    let mut out = Vec::with_capacity(req.inputs.len());
    for (i, t) in std::mem::take(&mut req.inputs).into_iter().enumerate() {
        let dt = parse_datatype(&t.name, &t.datatype, want)?;
        let data = match (raw.get(i), t.contents) {
            (Some(_), Some(_)) => {
                return Err(RouterError::invalid(format!(
                    "input '{}' has contents while raw_input_contents is used",
                    t.name
                )))
            }
            (Some(bytes), None) => {
                let n = element_count(&t.name, &t.shape)?;
                if bytes.len() != n * dt.size() {
                    return Err(RouterError::invalid(format!(
                        "input '{}': raw_input_contents[{i}] has {} bytes, but shape {:?} of {} needs {}",
                        t.name,
                        bytes.len(),
                        t.shape,
                        dt.as_str(),
                        n * dt.size()
                    )));
                }
                Elements::from_raw(dt, bytes)
            }
            (None, Some(c)) => match dt {
                DataType::Fp32 => Elements::Fp32(c.fp32_contents),
                DataType::Fp64 => Elements::Fp64(c.fp64_contents),
                DataType::Int32 => Elements::Int32(c.int_contents),
                DataType::Int64 => Elements::Int64(c.int64_contents),
            },
            (None, None) => {
                return Err(RouterError::invalid(format!(
                    "input '{}' has no data (neither contents nor raw)",
                    t.name
                )))
            }
        };
        out.push(InputTensor {
            name: t.name,
            datatype: t.datatype,
            shape: t.shape,
            data,
        });
    }
    Ok(out)
}

pub fn tensor_meta(
    name: &str,
    dt: &str,
    dims: &[usize],
) -> pb::model_metadata_response::TensorMetadata {
    pb::model_metadata_response::TensorMetadata {
        name: name.to_owned(),
        datatype: dt.to_owned(),
        shape: std::iter::once(-1)
            .chain(dims.iter().map(|&d| d as i64))
            .collect(),
    }
}

fn config_datatype(d: DataType) -> i32 {
    (match d {
        DataType::Fp32 => pb::DataType::TypeFp32,
        DataType::Fp64 => pb::DataType::TypeFp64,
        DataType::Int32 => pb::DataType::TypeInt32,
        DataType::Int64 => pb::DataType::TypeInt64,
    }) as i32
}

/// What the input columns take, as ModelConfig `parameters` (for clients that build
/// rows, such as `mesh bench`): `categorical_columns` (integer codes) and
/// `missing_columns` (NaN accepted; `any`), comma-separated; absent when none.
fn column_parameters(c: &ModelConfig) -> std::collections::HashMap<String, pb::ModelParameter> {
    use mesh_model_actor::config::ColumnRules;
    let width = c.input().row_width();
    let cols = |flag: u8| {
        let v: Vec<String> = (0..width)
            .filter(|&i| c.columns.column(i) & flag != 0)
            .map(|i| i.to_string())
            .collect();
        match v.len() {
            0 => None,
            n if n == width && flag == ColumnRules::MISSING && width > 1 => Some("any".to_owned()),
            _ => Some(v.join(",")),
        }
    };
    [
        ("categorical_columns", cols(ColumnRules::CATEGORICAL)),
        ("missing_columns", cols(ColumnRules::MISSING)),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_owned(), pb::ModelParameter { string_value: v? })))
    .collect()
}

/// The model's configuration in Triton's shape.
pub fn model_config(c: &ModelConfig) -> pb::ModelConfig {
    use mesh_model_actor::config::VersionPolicy;
    let policy = match &c.version_policy {
        VersionPolicy::Latest(n) => {
            pb::model_version_policy::PolicyChoice::Latest(pb::model_version_policy::Latest {
                num_versions: n.get() as u32,
            })
        }
        VersionPolicy::All => {
            pb::model_version_policy::PolicyChoice::All(pb::model_version_policy::All {})
        }
        VersionPolicy::Specific(v) => {
            pb::model_version_policy::PolicyChoice::Specific(pb::model_version_policy::Specific {
                versions: v.iter().map(|&x| x as i64).collect(),
            })
        }
    };
    pb::ModelConfig {
        name: c.name.clone(),
        platform: c.platform.clone(),
        backend: c.kind.backend().to_owned(),
        version_policy: Some(pb::ModelVersionPolicy {
            policy_choice: Some(policy),
        }),
        max_batch_size: c.batching.max_batch_size.get() as i32,
        input: c
            .inputs
            .iter()
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: config_datatype(t.datatype),
                dims: t.dims.iter().map(|&d| d as i64).collect(),
                optional: false,
            })
            .collect(),
        output: c
            .outputs
            .iter()
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: config_datatype(t.datatype),
                dims: t.dims.iter().map(|&d| d as i64).collect(),
            })
            .collect(),
        instance_group: vec![pb::ModelInstanceGroup {
            name: format!("{}_0", c.name),
            count: c.batching.runner_instances.get() as i32,
            gpus: vec![],
            kind: if c.device == "cpu" {
                pb::model_instance_group::Kind::Cpu as i32
            } else {
                pb::model_instance_group::Kind::Gpu as i32
            },
        }],
        scheduling_choice: Some(pb::model_config::SchedulingChoice::DynamicBatching(
            pb::ModelDynamicBatching {
                preferred_batch_size: vec![],
                max_queue_delay_microseconds: c.batching.max_queue_delay_us,
                preserve_ordering: false,
            },
        )),
        parameters: column_parameters(c),
        model_warmup: vec![pb::ModelWarmup {
            name: "zeros".to_owned(),
            batch_size: c.warmup.batch_size as u32,
            count: c.warmup.batches as u32,
        }],
    }
}

fn sum(
    handles: &[std::sync::Arc<VersionHandle>],
    f: impl Fn(&mesh_model_actor::stats::VersionStats) -> &mesh_model_actor::stats::Duration2,
) -> Option<pb::StatisticDuration> {
    let (count, ns) = handles
        .iter()
        .map(|h| f(&h.stats).get())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    Some(pb::StatisticDuration { count, ns })
}

/// Triton-shaped statistics of one version: the sum over its actor groups.
pub fn model_statistics(handles: &[std::sync::Arc<VersionHandle>]) -> Option<pb::ModelStatistics> {
    let first = handles.first()?;
    let total = |f: fn(&mesh_model_actor::stats::VersionStats) -> u64| {
        handles.iter().map(|h| f(&h.stats)).sum::<u64>()
    };
    let mut by_size: std::collections::BTreeMap<u64, mesh_model_actor::stats::BatchStat> =
        Default::default();
    for h in handles {
        for (size, b) in h.stats.by_batch_size.lock().iter() {
            let e = by_size.entry(*size).or_default();
            e.count += b.count;
            e.input_ns += b.input_ns;
            e.infer_ns += b.infer_ns;
            e.output_ns += b.output_ns;
        }
    }
    Some(pb::ModelStatistics {
        name: first.config.name.clone(),
        version: first.version.to_string(),
        last_inference: handles
            .iter()
            .map(|h| h.stats.last_inference_ms.load(Relaxed))
            .max()
            .unwrap_or(0),
        inference_count: total(|s| s.inference_count.load(Relaxed)),
        execution_count: total(|s| s.execution_count.load(Relaxed)),
        inference_stats: Some(pb::InferStatistics {
            success: sum(handles, |s| &s.success),
            fail: sum(handles, |s| &s.fail),
            queue: sum(handles, |s| &s.queue),
            compute_input: sum(handles, |s| &s.compute_input),
            compute_infer: sum(handles, |s| &s.compute_infer),
            compute_output: sum(handles, |s| &s.compute_output),
            cache_hit: Some(pb::StatisticDuration::default()),
            cache_miss: Some(pb::StatisticDuration::default()),
        }),
        batch_stats: by_size
            .into_iter()
            .map(|(size, b)| pb::InferBatchStatistics {
                batch_size: size,
                compute_input: Some(pb::StatisticDuration {
                    count: b.count,
                    ns: b.input_ns,
                }),
                compute_infer: Some(pb::StatisticDuration {
                    count: b.count,
                    ns: b.infer_ns,
                }),
                compute_output: Some(pb::StatisticDuration {
                    count: b.count,
                    ns: b.output_ns,
                }),
            })
            .collect(),
    })
}

/// Statistics for `name` ("" = every model) and `version` ("" = every served version).
pub fn statistics(
    core: &Core,
    name: &str,
    version: &str,
) -> Result<Vec<pb::ModelStatistics>, RouterError> {
    let models = if name.is_empty() {
        core.repo.models()
    } else {
        vec![core.repo.model(name)?]
    };
    let wanted = parse_version(name, version)?;
    let mut out = Vec::new();
    for m in models {
        for (v, replicas) in &m.replicas {
            if wanted.is_none_or(|w| w == *v) {
                out.extend(model_statistics(replicas));
            }
        }
    }
    if out.is_empty() && wanted.is_some() {
        return Err(RouterError::NotFound(format!(
            "model '{name}' has no version '{version}'"
        )));
    }
    Ok(out)
}

#[tonic::async_trait]
impl GrpcInferenceService for OipGrpc {
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
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.core.ready(),
        }))
    }

    async fn model_ready(
        &self,
        req: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = req.into_inner();
        let v = parse_version(&r.name, &r.version)?;
        // An unknown model is NOT_FOUND; a known one answers ready true/false.
        self.core.repo.model(&r.name).map_err(RouterError::from)?;
        Ok(Response::new(pb::ModelReadyResponse {
            ready: self.core.repo.get(&r.name, v).is_ok(),
        }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "inference-mesh".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            extensions: EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let v = parse_version(&r.name, &r.version)?;
        let h = self.core.repo.get(&r.name, v).map_err(RouterError::from)?;
        let m = self.core.repo.model(&r.name).map_err(RouterError::from)?;
        let c = &h.config;
        Ok(Response::new(pb::ModelMetadataResponse {
            name: c.name.clone(),
            versions: m.versions.keys().map(|v| v.to_string()).collect(),
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
        let timeout = crate::request::timeout_of(&req);
        let arrival = crate::arrival::Arrival::of_grpc(&req);
        let mut r = req.into_inner();
        let version = parse_version(&r.model_name, &r.model_version)?;
        let requested: Vec<String> = r.outputs.iter().map(|o| o.name.clone()).collect();
        let model = std::mem::take(&mut r.model_name);
        let (h, out) = self
            .core
            .infer(
                "grpc",
                &model,
                version,
                &r.id.clone(),
                |h| {
                    check_outputs(&h.config, requested.iter().map(String::as_str))?;
                    let inputs = decode_inputs(&mut r, h.config.input().datatype)?;
                    to_batch(&h.config, inputs)
                },
                (arrival, timeout),
            )
            .await?;
        let spec = h.config.output();
        Ok(Response::new(pb::ModelInferResponse {
            model_name: h.config.name.clone(),
            model_version: out.version.to_string(),
            id: r.id,
            parameters: Default::default(),
            outputs: vec![pb::model_infer_response::InferOutputTensor {
                name: spec.name.clone(),
                datatype: "FP32".to_owned(),
                shape: std::iter::once(out.rows as i64)
                    .chain(spec.dims.iter().map(|&d| d as i64))
                    .collect(),
                parameters: Default::default(),
                contents: None,
            }],
            // Raw output, as Triton answers: what tritonclient reads.
            raw_output_contents: vec![f32_to_le_bytes(&out.data)],
        }))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = req.into_inner();
        let v = parse_version(&r.name, &r.version)?;
        let h = self.core.repo.get(&r.name, v).map_err(RouterError::from)?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(model_config(&h.config)),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = req.into_inner();
        Ok(Response::new(pb::ModelStatisticsResponse {
            model_stats: statistics(&self.core, &r.name, &r.version)?,
        }))
    }

    async fn repository_index(
        &self,
        req: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let ready_only = req.into_inner().ready;
        let models = self
            .core
            .repo
            .index()
            .into_iter()
            .filter(|e| !ready_only || e.state == "READY")
            .map(|e| pb::repository_index_response::ModelIndex {
                name: e.model,
                version: e.version.to_string(),
                state: e.state.to_owned(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let name = req.into_inner().model_name;
        self.admin.load(&name).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let name = req.into_inner().model_name;
        self.admin.unload(&name).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }
}
