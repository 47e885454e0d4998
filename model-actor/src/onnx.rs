//! Kind `onnx`: an ONNX model run by ONNX Runtime through the `ort` crate.
//!
//! The runtime is not linked: `libonnxruntime.so` is loaded when the first ONNX
//! model loads, from `[onnx] runtime_library`, else `ORT_DYLIB_PATH`, else the
//! system's library search path (the `onnxruntime` PyPI wheel ships it under
//! `onnxruntime/capi/`). A missing library fails that load with a message that says
//! how to provide it; nothing panics. One library and one ONNX Runtime environment
//! serve the whole process.
//!
//! The model file is read once per version; each runner instance owns a session
//! built from those bytes (`Session::run` takes `&mut self`).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{TensorElementType, TensorRef, ValueType};
use parking_lot::Mutex;

use crate::config::{ModelConfig, OnnxConfig};
use crate::error::ModelError;
use crate::model::{Batch, Forward, Model};

/// Largest ONNX model file accepted (bytes). Protobuf caps a single-file model at
/// 2 GiB; fraud models are kilobytes to a few hundred megabytes.
pub const MAX_MODEL_BYTES: u64 = 1 << 30;

/// The environment variable naming the ONNX Runtime library.
pub const DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// The library loaded into this process and its environment (at most one of each).
struct Runtime {
    library: PathBuf,
    env: ort::environment::Environment,
}

static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);

/// How to provide the library, appended to every failure to load it.
const HOW: &str = "install the onnxruntime wheel (pip install onnxruntime==1.32.0; scripts/test \
     does) and set ORT_DYLIB_PATH to its onnxruntime/capi/libonnxruntime.so.<version>, or \
     name the library in model.toml: [onnx] runtime_library = \"/path/to/libonnxruntime.so\"";

/// The library path to load: `configured` (model.toml), else `ORT_DYLIB_PATH`, else
/// the bare file name (the dynamic loader's search path).
fn library_path(configured: Option<&str>) -> PathBuf {
    match configured {
        Some(p) => PathBuf::from(p),
        None => match std::env::var_os(DYLIB_ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from(format!(
                "{}onnxruntime{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            )),
        },
    }
}

/// Loads ONNX Runtime (once per process) and returns its environment. A failed load
/// is retried by the next call (the library may have been installed since).
fn runtime(configured: Option<&str>) -> Result<Arc<Runtime>, String> {
    let mut slot = RUNTIME.lock();
    let wanted = library_path(configured);
    if let Some(rt) = slot.as_ref() {
        if configured.is_some() && rt.library != wanted {
            return Err(format!(
                "ONNX Runtime is already loaded from {} in this process; [onnx] runtime_library \
                 names {} (one library per process: name the same one, or leave it out)",
                rt.library.display(),
                wanted.display()
            ));
        }
        return Ok(rt.clone());
    }
    let from = if configured.is_some() {
        "[onnx] runtime_library"
    } else if std::env::var_os(DYLIB_ENV).is_some_and(|p| !p.is_empty()) {
        DYLIB_ENV
    } else {
        "the library search path (ORT_DYLIB_PATH is not set)"
    };
    let builder = ort::init_from(&wanted).map_err(|e| {
        format!(
            "cannot load ONNX Runtime ({} from {from}): {e}; {HOW}",
            wanted.display()
        )
    })?;
    let env = builder
        .with_name("inference-mesh")
        .build()
        .map_err(|e| format!("ONNX Runtime environment: {e}"))?;
    tracing::info!(library = %wanted.display(), "ONNX Runtime loaded");
    let rt = Arc::new(Runtime {
        library: wanted,
        env,
    });
    *slot = Some(rt.clone());
    Ok(rt)
}

/// What a version loads once and every runner instance shares.
struct Shared {
    bytes: Vec<u8>,
    threads: usize,
    runtime: Arc<Runtime>,
    input: String,
    output: String,
    column: usize,
    columns: usize,
    input_width: usize,
    /// The session built (and checked) at load: the first runner instance takes it.
    first: Mutex<Option<Session>>,
}

/// An ONNX model as a [`Model`]: one session per runner instance.
pub struct Onnx {
    shared: Arc<Shared>,
    /// `Err`: building this instance's session failed (reported by `forward`).
    session: Result<Session, String>,
}

/// A version's loaded model; [`OnnxModel::instance`] makes one [`Onnx`] per runner.
#[derive(Clone)]
pub struct OnnxModel {
    shared: Arc<Shared>,
}

fn build_session(rt: &Runtime, bytes: &[u8], threads: usize) -> Result<Session, String> {
    let err = |e: ort::Error<ort::session::builder::SessionBuilder>| e.to_string();
    Session::builder(&rt.env)
        .map_err(|e| e.to_string())?
        .with_optimization_level(GraphOptimizationLevel::Level3)
        .map_err(err)?
        .with_intra_threads(threads)
        .map_err(err)?
        .with_inter_threads(1)
        .map_err(err)?
        .commit_from_memory(bytes)
        .map_err(|e| format!("ONNX Runtime refused the model: {e}"))
}

/// The last two parts of `path` (`<version>/<file>`).
fn shown(path: &Path) -> String {
    let mut parts: Vec<_> = path.iter().rev().take(2).collect();
    parts.reverse();
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn tensor_shape(v: &ValueType) -> Option<(TensorElementType, Vec<i64>)> {
    match v {
        ValueType::Tensor { ty, shape, .. } => Some((*ty, shape.iter().copied().collect())),
        _ => None,
    }
}

/// Checks the session's input and output against `model.toml`; returns the served
/// output column and the output's number of columns.
fn check_session(
    session: &Session,
    config: &ModelConfig,
    onnx: &OnnxConfig,
) -> Result<(usize, usize), String> {
    let input = config.input();
    let width = input.row_width();
    let inputs = session.inputs();
    let names = |o: &[ort::value::Outlet]| {
        o.iter()
            .map(|o| format!("'{}'", o.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if inputs.len() != 1 {
        return Err(format!(
            "the model has {} inputs ({}); kind onnx serves models with one input",
            inputs.len(),
            names(inputs)
        ));
    }
    let m_in = &inputs[0];
    if m_in.name() != input.name {
        return Err(format!(
            "model.toml declares input '{}', but the model's input is '{}'",
            input.name,
            m_in.name()
        ));
    }
    match tensor_shape(m_in.dtype()) {
        Some((TensorElementType::Float32, dims)) if dims.len() == 2 => {
            if dims[1] >= 0 && dims[1] as usize != width {
                return Err(format!(
                    "the model's input '{}' has {} columns, but model.toml declares dims [{width}]",
                    m_in.name(),
                    dims[1]
                ));
            }
        }
        _ => {
            return Err(format!(
                "the model's input '{}' is {:?}; kind onnx needs a float32 tensor [N, features]",
                m_in.name(),
                m_in.dtype()
            ))
        }
    }
    let outputs = session.outputs();
    let Some(m_out) = outputs.iter().find(|o| o.name() == onnx.output) else {
        return Err(format!(
            "[onnx] output = '{}' is not an output of the model (its outputs: {})",
            onnx.output,
            names(outputs)
        ));
    };
    let dims = match tensor_shape(m_out.dtype()) {
        Some((TensorElementType::Float32, dims)) if (1..=2).contains(&dims.len()) => dims,
        _ => {
            return Err(format!(
                "the model's output '{}' is {:?}; kind onnx serves a float32 tensor [N] or [N, C]",
                onnx.output,
                m_out.dtype()
            ))
        }
    };
    let columns = if dims.len() == 1 { 1 } else { dims[1] };
    match onnx.output_column {
        None if columns == 1 => Ok((0, 1)),
        None => Err(format!(
            "the model's output '{}' has {} columns; name the one to serve with [onnx] \
             output_column (for scikit-learn probabilities [N, 2], 1 is the positive class)",
            onnx.output,
            if columns < 0 {
                "a dynamic number of".to_owned()
            } else {
                columns.to_string()
            }
        )),
        Some(c) if columns >= 0 && c as i64 >= columns => Err(format!(
            "[onnx] output_column = {c}, but the model's output '{}' has {columns} columns",
            onnx.output
        )),
        Some(_) if dims.len() == 1 => Err(format!(
            "[onnx] output_column is for an output of [N, C]; the model's output '{}' is [N]",
            onnx.output
        )),
        // A dynamic column count is checked on every batch.
        Some(c) => Ok((c, if columns < 0 { 0 } else { columns as usize })),
    }
}

impl OnnxModel {
    /// Loads the `[onnx] file` of a version directory (and ONNX Runtime, the first
    /// time) and checks the model against `config`.
    pub fn load(config: &ModelConfig, version_dir: &Path) -> Result<Self, String> {
        let onnx = config
            .onnx
            .as_ref()
            .ok_or("kind = \"onnx\" needs an [onnx] table")?;
        crate::config::check_relative_path("[onnx] file", &onnx.file)?;
        let path = crate::repository::weights_inside(version_dir, &onnx.file)?;
        let len = std::fs::metadata(&path)
            .map_err(|e| format!("{}: {e}", shown(&path)))?
            .len();
        if len > MAX_MODEL_BYTES {
            return Err(format!(
                "{} is {len} bytes; an ONNX model file may have at most {} MiB",
                shown(&path),
                MAX_MODEL_BYTES >> 20
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", shown(&path)))?;
        let runtime = runtime(onnx.runtime_library.as_deref())?;
        let threads = onnx.threads.get();
        let session = build_session(&runtime, &bytes, threads)
            .map_err(|e| format!("{}: {e}", shown(&path)))?;
        let (column, columns) = check_session(&session, config, onnx)?;
        tracing::info!(
            model = %config.name,
            file = %shown(&path),
            output = %onnx.output,
            column,
            threads,
            "onnx model read"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                bytes,
                threads,
                runtime,
                input: config.input().name.clone(),
                output: onnx.output.clone(),
                column,
                columns,
                input_width: config.input().row_width(),
                first: Mutex::new(Some(session)),
            }),
        })
    }

    /// A model instance for one runner: the session built at load for the first,
    /// a new session from the same bytes for the others.
    pub fn instance(&self) -> Onnx {
        let s = &self.shared;
        let session = match s.first.lock().take() {
            Some(session) => Ok(session),
            None => build_session(&s.runtime, &s.bytes, s.threads),
        };
        if let Err(e) = &session {
            tracing::error!(error = %e, "onnx runner instance has no session");
        }
        Onnx {
            shared: s.clone(),
            session,
        }
    }
}

impl Model for Onnx {
    fn input_width(&self) -> usize {
        self.shared.input_width
    }

    fn output_width(&self) -> usize {
        1
    }

    fn forward(&mut self, batch: &Batch) -> Result<Forward, ModelError> {
        let s = &self.shared;
        batch.check_width(s.input_width)?;
        let session = self
            .session
            .as_mut()
            .map_err(|e| ModelError::Compute(e.clone()))?;
        let compute = |e: ort::Error| ModelError::Compute(format!("ONNX Runtime: {e}"));
        let t0 = Instant::now();
        let x = TensorRef::from_array_view(([batch.rows, batch.cols], &batch.data[..]))
            .map_err(compute)?;
        let t1 = Instant::now();
        let outputs = session
            .run(ort::inputs![s.input.as_str() => x])
            .map_err(compute)?;
        let t2 = Instant::now();
        let value = outputs.get(&s.output).ok_or_else(|| {
            ModelError::Compute(format!("the model returned no output '{}'", s.output))
        })?;
        let (shape, values) = value.try_extract_tensor::<f32>().map_err(compute)?;
        let cols = if shape.len() == 2 {
            shape[1].max(0) as usize
        } else {
            1
        };
        if values.len() != batch.rows * cols
            || (s.columns != 0 && cols != s.columns)
            || s.column >= cols
        {
            return Err(ModelError::Compute(format!(
                "the model's output '{}' is {shape} for {} rows; expected [{}, {}]",
                s.output,
                batch.rows,
                batch.rows,
                s.columns.max(s.column + 1)
            )));
        }
        let data = values
            .iter()
            .skip(s.column)
            .step_by(cols)
            .copied()
            .collect();
        Ok(Forward {
            data,
            cols: 1,
            input: t1 - t0,
            infer: t2 - t1,
            output: t2.elapsed(),
        })
    }
}
