//! Kind `mlp`: dense layers read from safetensors (`l{i}.weight` `[out, in]` and
//! `l{i}.bias` `[out]`, the torch `Linear` layout), run with candle.
//!
//! A small batch of a small f32 model on the CPU is computed directly from the same
//! weights instead ([`DIRECT_MAX_MACS`]): there candle's cost per operation (a new
//! tensor and storage for each of some sixteen operations) is most of the forward pass.
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};

use crate::config::{Activation, DeviceSpec, MlpConfig, OutputActivation, Precision};
use crate::device::DeviceLock;
use crate::error::{candle_message, ModelError};
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
    /// The same layers as plain f32 rows, for batches of at most [`DIRECT_MAX_MACS`]
    /// multiply-adds: f32 on the CPU, activations relu, tanh or none.
    direct: Option<Arc<Direct>>,
    /// Scratch for the direct path's hidden layers.
    scratch: Vec<f32>,
}

/// Batches of an f32 MLP on the CPU that take at most this many multiply-adds (rows x
/// weights) are computed directly rather than through candle: the direct path costs
/// about 0.11 ns per multiply-add, candle about 3 µs a batch plus its matrix kernels,
/// which are faster per multiply-add. Measured with `cargo bench -p mesh-model-actor
/// --bench forward` on the fraud MLP (32-64-32-1, 4,128 weights), portable build: 1 row
/// 0.56 µs direct against 2.95 µs through candle, 4 rows 1.97 against 3.08 µs, 16 rows
/// 7.63 against 4.51 µs (candle wins from about 8 rows, 33k multiply-adds). So this
/// model takes the direct path up to 3 rows, and a model of a million weights never.
pub const DIRECT_MAX_MACS: usize = 16_384;

/// One dense layer as f32 rows: `w` is `[out][inp]` (the torch layout), so each output
/// is the bias plus one contiguous dot product.
#[derive(Clone)]
struct DirectDense {
    w: Vec<f32>,
    b: Vec<f32>,
    inp: usize,
    out: usize,
    act: Activation,
}

/// The layers of an [`Mlp`] for the direct path.
#[derive(Clone)]
struct Direct {
    layers: Vec<DirectDense>,
    /// The most rows a batch may have to take this path (at least 1).
    max_rows: usize,
}

/// `a · b` over equal lengths, in eight independent sums (which the compiler keeps in
/// vector registers), then the rest.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

impl DirectDense {
    /// `rows` rows of `input` ([rows][inp]) through this layer into `out` ([rows][out]).
    fn apply(&self, input: &[f32], rows: usize, out: &mut Vec<f32>) {
        out.clear();
        out.reserve(rows * self.out);
        for x in input.chunks_exact(self.inp).take(rows) {
            for (w, b) in self.w.chunks_exact(self.inp).zip(&self.b) {
                let v = b + dot(w, x);
                out.push(match self.act {
                    // NaN stays NaN (and is refused downstream), never becomes 0.
                    Activation::Relu => {
                        if v < 0.0 {
                            0.0
                        } else {
                            v
                        }
                    }
                    Activation::Tanh => v.tanh(),
                    // GELU never gets here (`Direct::of` leaves such models to candle).
                    Activation::None | Activation::Gelu => v,
                });
            }
        }
    }
}

impl Direct {
    /// The direct form of `layers`, where it applies: f32 weights on the CPU and no
    /// GELU (whose erf candle computes its own way).
    fn of(layers: &[Dense], device: &Device, dtype: DType) -> Result<Option<Self>, String> {
        if !matches!(device, Device::Cpu)
            || dtype != DType::F32
            || layers.iter().any(|l| l.act == Activation::Gelu)
        {
            return Ok(None);
        }
        let macs: usize = layers.iter().map(|l| l.w_t.elem_count()).sum();
        let max_rows = DIRECT_MAX_MACS / macs.max(1);
        if max_rows == 0 {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(layers.len());
        for l in layers {
            // w_t is [in, out]; the direct path reads [out][in].
            let w = l
                .w_t
                .t()
                .and_then(|t| t.contiguous())
                .map_err(|e| candle_message(&e))?;
            let (o, i) = w.dims2().map_err(|e| candle_message(&e))?;
            out.push(DirectDense {
                w: w.flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| candle_message(&e))?,
                b: l.b.to_vec1::<f32>().map_err(|e| candle_message(&e))?,
                inp: i,
                out: o,
                act: l.act,
            });
        }
        Ok(Some(Self {
            layers: out,
            max_rows,
        }))
    }

    /// The forward pass of `rows` rows of `x`, with `output` applied to each row.
    fn run(
        &self,
        x: &[f32],
        rows: usize,
        output: OutputActivation,
        scratch: &mut Vec<f32>,
    ) -> Vec<f32> {
        let mut cur = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            if i == 0 {
                l.apply(x, rows, &mut cur);
            } else {
                l.apply(&cur, rows, scratch);
                std::mem::swap(&mut cur, scratch);
            }
        }
        let width = self.layers.last().map_or(0, |l| l.out);
        match output {
            // As candle's path computes it: 1 / (1 + e^-x).
            OutputActivation::Sigmoid => {
                cur.iter_mut().for_each(|v| *v = 1.0 / ((-*v).exp() + 1.0))
            }
            OutputActivation::Softmax => {
                for row in cur.chunks_exact_mut(width.max(1)) {
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    row.iter_mut().for_each(|v| *v = (*v - max).exp());
                    let sum: f32 = row.iter().sum();
                    row.iter_mut().for_each(|v| *v /= sum);
                }
            }
            OutputActivation::None => {}
        }
        cur
    }
}

/// Opens the candle device for a model.
pub fn open_device(spec: DeviceSpec) -> Result<Device, String> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => {
            Device::new_cuda(n).map_err(|e| format!("cuda:{n}: {}", candle_message(&e)))
        }
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
        .map_err(|e| candle_message(&e))?;
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
            .map_err(|e| format!("reading {}: {}", shown(path), candle_message(&e)))?;
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
            let (out, inp) = w
                .dims2()
                .map_err(|e| format!("l{i}.weight: {}", candle_message(&e)))?;
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
            let conv = |t: &Tensor| t.to_dtype(dtype).map_err(|e| candle_message(&e));
            let w_t = conv(
                &w.t()
                    .and_then(|t| t.contiguous())
                    .map_err(|e| candle_message(&e))?,
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
        let direct = Direct::of(&layers, device, dtype)?.map(Arc::new);
        Ok(Self {
            layers,
            output_activation: cfg.output_activation,
            device: device.clone(),
            dtype,
            input_width,
            output_width,
            direct,
            scratch: Vec::new(),
        })
    }

    /// The most rows a batch may have to take the direct path; 0 when none does (see
    /// [`DIRECT_MAX_MACS`]).
    pub fn direct_rows(&self) -> usize {
        self.direct.as_ref().map_or(0, |d| d.max_rows)
    }

    /// This model without the direct path: every batch through candle (for tests and
    /// benchmarks that compare the two).
    pub fn candle_only(mut self) -> Self {
        self.direct = None;
        self
    }

    /// This model with the direct path taking batches of up to `rows` rows, whatever
    /// their size (for benchmarks that show where it stops paying). Nothing changes for
    /// a model the direct path cannot run (GELU, f16/bf16, GPU).
    pub fn with_direct_rows(mut self, rows: usize) -> Self {
        if let Some(d) = self.direct.as_mut() {
            Arc::make_mut(d).max_rows = rows;
        }
        self
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

    /// On a GPU, its lock: one pass at a time (see [`crate::device`]).
    fn device_lock(&self) -> Option<Arc<DeviceLock>> {
        match self.device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => Some(crate::device::gpu(gpu_id)),
            _ => None,
        }
    }

    fn forward(&mut self, batch: &Batch) -> Result<Forward, ModelError> {
        batch.check_width(self.input_width)?;
        if let Some(direct) = self.direct.as_ref().filter(|d| batch.rows <= d.max_rows) {
            // No tensors to build or copy back: the caller's clock around this call
            // is the whole time, counted as infer (`Forward`).
            let data = direct.run(
                &batch.data,
                batch.rows,
                self.output_activation,
                &mut self.scratch,
            );
            return Ok(Forward {
                data,
                cols: self.output_width,
                input: std::time::Duration::ZERO,
                infer: std::time::Duration::ZERO,
                output: std::time::Duration::ZERO,
            });
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An MLP of `widths` with seeded random weights and biases.
    fn mlp(widths: &[usize], acts: Vec<Activation>, out: OutputActivation) -> Mlp {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let mut tensors = HashMap::new();
        let dev = Device::Cpu;
        for (i, w) in widths.windows(2).enumerate() {
            let scale = (1.0 / w[0] as f64).sqrt() as f32;
            tensors.insert(
                format!("l{i}.weight"),
                Tensor::randn(0f32, scale, (w[1], w[0]), &dev).unwrap(),
            );
            tensors.insert(
                format!("l{i}.bias"),
                Tensor::randn(0f32, 0.5, w[1], &dev).unwrap(),
            );
        }
        candle_core::safetensors::save(&tensors, &path).unwrap();
        let cfg = MlpConfig {
            weights: "m.safetensors".into(),
            activations: acts,
            output_activation: out,
        };
        let n = widths.len();
        Mlp::load(&path, &cfg, Precision::F32, &dev, widths[0], widths[n - 1]).unwrap()
    }

    fn batch(rows: usize, cols: usize, seed: usize) -> Batch {
        let data = (0..rows * cols)
            .map(|i| (((i + seed) * 7919) % 2001) as f32 / 500.0 - 2.0)
            .collect();
        Batch { rows, cols, data }
    }

    /// The direct path answers what candle answers, for every activation it takes, up
    /// to its largest batch and past it.
    #[test]
    fn the_direct_path_matches_candle() {
        use Activation::{None as Lin, Relu, Tanh};
        let cases = [
            (
                vec![32, 64, 32, 1],
                vec![Relu, Relu],
                OutputActivation::Sigmoid,
            ),
            (vec![13, 20, 7], vec![Tanh], OutputActivation::Softmax),
            (vec![9, 17, 3], vec![Lin], OutputActivation::None),
            (vec![5, 1], vec![], OutputActivation::Sigmoid),
        ];
        for (widths, acts, out) in cases {
            let mut direct = mlp(&widths, acts, out);
            let max = direct.direct_rows();
            let macs: usize = widths.windows(2).map(|w| w[0] * w[1]).sum();
            assert_eq!(max, DIRECT_MAX_MACS / macs, "{widths:?}");
            assert!(max >= 1, "{widths:?}");
            let mut candle = direct.clone().candle_only();
            assert_eq!(candle.direct_rows(), 0);
            for rows in [1, 2, 3, max, max + 1] {
                let b = batch(rows, widths[0], rows);
                let d = direct.forward(&b).unwrap();
                let c = candle.forward(&b).unwrap();
                assert_eq!((d.cols, d.data.len()), (c.cols, c.data.len()));
                for (x, y) in d.data.iter().zip(&c.data) {
                    assert!(
                        (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                        "{widths:?} rows {rows}: {x} vs {y}"
                    );
                }
            }
        }
    }

    /// A NaN input stays NaN through the direct path (relu included): it is never
    /// turned into a score.
    #[test]
    fn the_direct_path_keeps_nan_as_nan() {
        let mut m = mlp(
            &[4, 8, 1],
            vec![Activation::Relu],
            OutputActivation::Sigmoid,
        );
        let b = Batch {
            rows: 1,
            cols: 4,
            data: vec![f32::NAN, 0.0, 0.0, 0.0],
        };
        assert!(m.forward(&b).unwrap().data[0].is_nan());
    }

    /// GELU keeps candle's path, and so does a model too large for the direct path to
    /// win even at one row.
    #[test]
    fn gelu_and_large_models_keep_the_candle_path() {
        let m = mlp(
            &[4, 8, 1],
            vec![Activation::Gelu],
            OutputActivation::Sigmoid,
        );
        assert_eq!(m.direct_rows(), 0);
        let m = mlp(
            &[64, 512, 1],
            vec![Activation::Relu],
            OutputActivation::Sigmoid,
        );
        assert_eq!(m.direct_rows(), 0);
        // The example fraud MLP (32-64-32-1): up to 3 rows.
        let m = mlp(
            &[32, 64, 32, 1],
            vec![Activation::Relu; 2],
            OutputActivation::Sigmoid,
        );
        assert_eq!(m.direct_rows(), 3);
    }
}
