//! Kind `mlp`: dense layers read from safetensors (`l{i}.weight` [out, in] and
//! `l{i}.bias` [out], the torch `Linear` layout), run with candle.
use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};

use crate::config::{Activation, DeviceSpec, MlpConfig, OutputActivation, Precision};
use crate::error::ModelError;
use crate::model::{Batch, Forward, Model};

/// One dense layer, weight stored transposed ([in, out]) so the forward pass is a
/// plain `x @ w`.
#[derive(Clone)]
struct Dense {
    w_t: Tensor,
    b: Tensor,
    act: Activation,
}

/// A multi-layer perceptron on one device. Cloning shares the weights.
#[derive(Clone)]
pub struct Mlp {
    layers: Vec<Dense>,
    output_activation: OutputActivation,
    device: Device,
    dtype: DType,
    input_width: usize,
    output_width: usize,
}

/// Opens the candle device for a model.
pub fn open_device(spec: DeviceSpec) -> Result<Device, String> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => Device::new_cuda(n).map_err(|e| format!("cuda:{n}: {e}")),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(n) => Err(format!(
            "device cuda:{n} asked for, but this build has no GPU support (rebuild with `--features cuda`)"
        )),
    }
}

fn dtype_of(p: Precision) -> DType {
    match p {
        Precision::F32 => DType::F32,
        Precision::F16 => DType::F16,
        Precision::Bf16 => DType::BF16,
    }
}

/// The last two parts of `path` (`<version>/<file>`): messages name the file
/// without the host's absolute path.
fn shown(path: &Path) -> String {
    let mut parts: Vec<_> = path.iter().rev().take(2).collect();
    parts.reverse();
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether every element of `t` is finite (checked in f32, which f16/bf16 widen to).
fn all_finite(t: &Tensor) -> Result<bool, String> {
    let v = t
        .to_dtype(candle_core::DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| e.to_string())?;
    Ok(v.iter().all(|x| x.is_finite()))
}

impl Mlp {
    /// Reads `path` (safetensors) onto `device` in `precision`. Checks that layer
    /// shapes chain, that there is one activation per hidden layer, and that the
    /// first and last widths match `input_width`/`output_width`.
    pub fn load(
        path: &Path,
        cfg: &MlpConfig,
        precision: Precision,
        device: &Device,
        input_width: usize,
        output_width: usize,
    ) -> Result<Self, String> {
        let tensors = candle_core::safetensors::load(path, device)
            .map_err(|e| format!("reading {}: {e}", shown(path)))?;
        let dtype = dtype_of(precision);
        let mut layers = Vec::new();
        let mut width = input_width;
        let n_layers = (0..)
            .take_while(|i| tensors.contains_key(&format!("l{i}.weight")))
            .count();
        if n_layers == 0 {
            return Err(format!("{} has no tensor named l0.weight", shown(path)));
        }
        if cfg.activations.len() + 1 != n_layers {
            return Err(format!(
                "{} has {n_layers} layers, so [mlp].activations needs {} entries (one per hidden layer), not {}",
                shown(path),
                n_layers - 1,
                cfg.activations.len()
            ));
        }
        for i in 0..n_layers {
            let w = &tensors[&format!("l{i}.weight")];
            let b = tensors
                .get(&format!("l{i}.bias"))
                .ok_or_else(|| format!("{}: l{i}.bias is missing", shown(path)))?;
            let (out, inp) = w.dims2().map_err(|e| format!("l{i}.weight: {e}"))?;
            for (name, t) in [("weight", w), ("bias", b)] {
                if !all_finite(t)? {
                    return Err(format!(
                        "l{i}.{name} holds NaN or infinite values; refused (a model with them answers garbage)"
                    ));
                }
            }
            if inp != width {
                return Err(format!(
                    "l{i}.weight is [{out}, {inp}] but its input width should be {width}"
                ));
            }
            if b.dims() != [out] {
                return Err(format!(
                    "l{i}.bias has shape {:?}, expected [{out}]",
                    b.dims()
                ));
            }
            let conv = |t: &Tensor| t.to_dtype(dtype).map_err(|e| e.to_string());
            let w_t = conv(
                &w.t()
                    .and_then(|t| t.contiguous())
                    .map_err(|e| e.to_string())?,
            )?;
            let act = cfg.activations.get(i).copied().unwrap_or(Activation::None);
            layers.push(Dense {
                w_t,
                b: conv(b)?,
                act,
            });
            width = out;
        }
        if width != output_width {
            return Err(format!(
                "the last layer has {width} outputs but the model declares {output_width}"
            ));
        }
        Ok(Self {
            layers,
            output_activation: cfg.output_activation,
            device: device.clone(),
            dtype,
            input_width,
            output_width,
        })
    }

    fn run(&self, x: Tensor) -> candle_core::Result<Tensor> {
        let mut x = x;
        for l in &self.layers {
            x = x.matmul(&l.w_t)?.broadcast_add(&l.b)?;
            x = match l.act {
                Activation::Relu => x.relu()?,
                Activation::Gelu => x.gelu_erf()?,
                Activation::Tanh => x.tanh()?,
                Activation::None => x,
            };
        }
        match self.output_activation {
            // 1 / (1 + e^-x); saturates cleanly to 0 and 1 at the extremes.
            OutputActivation::Sigmoid => x.neg()?.exp()?.affine(1.0, 1.0)?.recip(),
            OutputActivation::Softmax => {
                let max = x.max_keepdim(D::Minus1)?;
                let e = x.broadcast_sub(&max)?.exp()?;
                let sum = e.sum_keepdim(D::Minus1)?;
                e.broadcast_div(&sum)
            }
            OutputActivation::None => Ok(x),
        }
    }
}

impl Model for Mlp {
    fn input_width(&self) -> usize {
        self.input_width
    }

    fn output_width(&self) -> usize {
        self.output_width
    }

    fn forward(&mut self, batch: &Batch) -> Result<Forward, ModelError> {
        batch.check_width(self.input_width)?;
        let t0 = Instant::now();
        let x = Tensor::from_slice(&batch.data, (batch.rows, batch.cols), &self.device)?
            .to_dtype(self.dtype)?;
        let t1 = Instant::now();
        let y = self.run(x)?;
        // Force the computation to finish before the clock stops (matters on GPU).
        self.device.synchronize()?;
        let t2 = Instant::now();
        let data = y.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let t3 = Instant::now();
        Ok(Forward {
            data,
            cols: self.output_width,
            input: t1 - t0,
            infer: t2 - t1,
            output: t3 - t2,
        })
    }
}
