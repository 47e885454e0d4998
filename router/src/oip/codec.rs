//! Tensors of the Open Inference Protocol in and out: typed contents or raw bytes
//! (gRPC), JSON arrays (REST), checked against the model's declared inputs and
//! turned into a `Batch`. Every rejection names the tensor and what was wrong.
use mesh_model_actor::{Batch, DataType, ModelConfig};

use crate::error::RouterError;

/// Tensor elements as they arrived, before conversion to the model's f32 rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    Fp32(Vec<f32>),
    Fp64(Vec<f64>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
}

impl Elements {
    pub fn len(&self) -> usize {
        match self {
            Self::Fp32(v) => v.len(),
            Self::Fp64(v) => v.len(),
            Self::Int32(v) => v.len(),
            Self::Int64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decodes little-endian raw bytes of `datatype`.
    pub fn from_raw(datatype: DataType, raw: &[u8]) -> Self {
        fn chunks<const N: usize, T>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
            raw.chunks_exact(N)
                .map(|c| f(c.try_into().unwrap_or([0; N])))
                .collect()
        }
        match datatype {
            DataType::Fp32 => Self::Fp32(chunks(raw, f32::from_le_bytes)),
            DataType::Fp64 => Self::Fp64(chunks(raw, f64::from_le_bytes)),
            DataType::Int32 => Self::Int32(chunks(raw, i32::from_le_bytes)),
            DataType::Int64 => Self::Int64(chunks(raw, i64::from_le_bytes)),
        }
    }

    /// Converts to f32 (an FP64 beyond f32's range becomes infinite, which the
    /// model's column rules then refuse).
    fn into_f32(self) -> Vec<f32> {
        match self {
            Self::Fp32(v) => v,
            Self::Fp64(v) => v.into_iter().map(|x| x as f32).collect(),
            Self::Int32(v) => v.into_iter().map(|x| x as f32).collect(),
            Self::Int64(v) => v.into_iter().map(|x| x as f32).collect(),
        }
    }
}

/// One decoded input tensor.
#[derive(Debug, Clone)]
pub struct InputTensor {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub data: Elements,
}

/// Checks a tensor's datatype name against the model and parses it.
pub fn parse_datatype(name: &str, datatype: &str, want: DataType) -> Result<DataType, RouterError> {
    match DataType::parse(datatype) {
        Some(d) if d == want => Ok(d),
        Some(_) | None => Err(RouterError::invalid(format!(
            "input '{name}' has datatype '{datatype}', but the model expects {}",
            want.as_str()
        ))),
    }
}

/// Elements a shape holds, or an error naming the tensor when a dimension is negative.
pub fn element_count(name: &str, shape: &[i64]) -> Result<usize, RouterError> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| {
                RouterError::invalid(format!("input '{name}' has an invalid shape {shape:?}"))
            })
    })
}

/// Turns the request's inputs into one batch for `config`'s single input: the
/// right name, datatype, shape `[rows, dims...]` and element count, and values the
/// model's column rules accept (`ModelConfig::check_values`: never infinity; NaN only
/// in columns `[trees] missing` declares, none for the MLP; integer codes in
/// categorical columns). A refusal names the row and column.
pub fn to_batch(config: &ModelConfig, inputs: Vec<InputTensor>) -> Result<Batch, RouterError> {
    let spec = config.input();
    if inputs.is_empty() {
        return Err(RouterError::invalid(format!(
            "the request has no inputs; model '{}' expects '{}'",
            config.name, spec.name
        )));
    }
    if let Some(extra) = inputs.iter().find(|t| t.name != spec.name) {
        return Err(RouterError::invalid(format!(
            "unknown input '{}': model '{}' has one input, '{}'",
            extra.name, config.name, spec.name
        )));
    }
    if inputs.len() > 1 {
        return Err(RouterError::invalid(format!(
            "input '{}' is given {} times",
            spec.name,
            inputs.len()
        )));
    }
    let Some(t) = inputs.into_iter().next() else {
        return Err(RouterError::invalid("the request has no inputs"));
    };
    let want_shape: Vec<i64> = spec.dims.iter().map(|&d| d as i64).collect();
    if t.shape.len() != want_shape.len() + 1 || t.shape[1..] != want_shape[..] || t.shape[0] < 1 {
        return Err(RouterError::invalid(format!(
            "input '{}' has shape {:?}, but the model expects [N, {}] with N >= 1",
            t.name,
            t.shape,
            want_shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let expected = element_count(&t.name, &t.shape)?;
    if t.data.len() != expected {
        return Err(RouterError::invalid(format!(
            "input '{}' has {} elements, but its shape {:?} holds {expected}",
            t.name,
            t.data.len(),
            t.shape
        )));
    }
    let rows = t.shape[0] as usize;
    let cols = spec.row_width();
    // The values are checked against the model's column rules once, where every
    // caller passes: `VersionHandle::infer`.
    let data = t.data.into_f32();
    Ok(Batch { rows, cols, data })
}

/// Checks that every requested output exists.
pub fn check_outputs<'a>(
    config: &ModelConfig,
    requested: impl IntoIterator<Item = &'a str>,
) -> Result<(), RouterError> {
    for name in requested {
        if !config.outputs.iter().any(|o| o.name == name) {
            return Err(RouterError::invalid(format!(
                "unknown output '{name}': model '{}' has output '{}'",
                config.name,
                config.output().name
            )));
        }
    }
    Ok(())
}

/// Little-endian bytes of f32 values.
pub fn f32_to_le_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        ModelConfig::parse(
            r#"
            kind = "mlp"
            [[inputs]]
            name = "input"
            datatype = "FP32"
            dims = [2]
            [[outputs]]
            name = "p"
            datatype = "FP32"
            dims = [1]
            [mlp]
            activations = []
            output_activation = "none"
            "#,
            "m",
        )
        .unwrap()
    }

    fn input(shape: Vec<i64>, data: Elements) -> InputTensor {
        InputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape,
            data,
        }
    }

    #[test]
    fn good_input_becomes_a_batch() {
        let b = to_batch(
            &cfg(),
            vec![input(vec![2, 2], Elements::Fp32(vec![1.0, 2.0, 3.0, 4.0]))],
        )
        .unwrap();
        assert_eq!((b.rows, b.cols, b.data), (2, 2, vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn a_shape_that_is_not_rows_of_the_models_width_is_refused() {
        for shape in [
            vec![2],
            vec![2, 3],
            vec![2, -2],
            vec![1, 2, 1],
            vec![0, 2],
            vec![-1, 2],
        ] {
            let e = to_batch(
                &cfg(),
                vec![input(shape.clone(), Elements::Fp32(vec![0.0; 4]))],
            )
            .unwrap_err();
            assert!(
                e.message().contains(&format!(
                    "has shape {shape:?}, but the model expects [N, 2]"
                )),
                "{shape:?}: {e}"
            );
        }
        assert!(to_batch(
            &cfg(),
            vec![input(vec![1, 2], Elements::Fp32(vec![0.0; 2]))]
        )
        .is_ok());
    }

    #[test]
    fn every_datatype_decodes_from_raw() {
        assert_eq!(
            Elements::from_raw(DataType::Fp32, &1.5f32.to_le_bytes()),
            Elements::Fp32(vec![1.5])
        );
        assert_eq!(
            Elements::from_raw(DataType::Fp64, &2.5f64.to_le_bytes()),
            Elements::Fp64(vec![2.5])
        );
        assert_eq!(
            Elements::from_raw(DataType::Int32, &(-3i32).to_le_bytes()),
            Elements::Int32(vec![-3])
        );
        assert_eq!(
            Elements::from_raw(DataType::Int64, &7i64.to_le_bytes()),
            Elements::Int64(vec![7])
        );
        assert_eq!(Elements::Int64(vec![7, -1]).into_f32(), vec![7.0, -1.0]);
        assert_eq!(Elements::Fp64(vec![0.5]).into_f32(), vec![0.5]);
    }

    fn trees_cfg() -> ModelConfig {
        ModelConfig::parse(
            r#"
            kind = "xgboost"
            [[inputs]]
            name = "input"
            datatype = "FP32"
            dims = [3]
            [[outputs]]
            name = "p"
            datatype = "FP32"
            dims = [1]
            [trees]
            categorical = [2]
            missing = [0]
            "#,
            "t",
        )
        .unwrap()
    }

    /// to_batch converts; the model's column rules (checked once, by
    /// `VersionHandle::infer`, for every caller) judge what it produced.
    #[test]
    fn column_rules_come_from_the_model_config() {
        let c = trees_cfg();
        let batch = |v: Vec<f32>| {
            let n = v.len() as i64 / 3;
            let b = to_batch(&c, vec![input(vec![n, 3], Elements::Fp32(v))]).unwrap();
            c.check_values(&b.data, b.cols).map(|()| b)
        };
        // NaN in the declared missing column, codes in the categorical one: accepted.
        let b = batch(vec![f32::NAN, 1.5, 3.0, 0.0, -2.0, 0.0]).unwrap();
        assert!(b.data[0].is_nan());
        let msg = |v: Vec<f32>| batch(v).unwrap_err();
        let e = msg(vec![0.0, 0.0, 0.0, 0.0, f32::NAN, 1.0]);
        assert!(e.contains("row 1 column 1") && e.contains("NaN"), "{e}");
        let e = msg(vec![0.0, 0.0, 0.0, f32::INFINITY, 0.0, 1.0]);
        assert!(
            e.contains("row 1 column 0") && e.contains("infinite"),
            "{e}"
        );
        for bad in [-1.0, 2.5, 1e9, f32::NAN] {
            let e = msg(vec![0.0, 0.0, bad]);
            assert!(e.contains("row 0 column 2"), "{bad}: {e}");
        }
        // FP64 beyond f32's range is infinite once converted.
        let b = to_batch(
            &c,
            vec![input(vec![1, 3], Elements::Fp64(vec![1e300, 0.0, 0.0]))],
        )
        .unwrap();
        let e = c.check_values(&b.data, b.cols).unwrap_err();
        assert!(e.contains("infinite"), "{e}");
    }

    #[test]
    fn bad_inputs_are_named() {
        let c = cfg();
        let msg = |r: Result<Batch, RouterError>| r.unwrap_err().to_string();
        assert!(msg(to_batch(
            &c,
            vec![input(vec![1, 3], Elements::Fp32(vec![0.0; 3]))]
        ))
        .contains("shape [1, 3]"));
        assert!(msg(to_batch(
            &c,
            vec![input(vec![2, 2], Elements::Fp32(vec![0.0; 3]))]
        ))
        .contains("3 elements"));
        // NaN for the MLP: refused by its column rules (checked in VersionHandle::infer).
        let nan = to_batch(
            &c,
            vec![input(vec![1, 2], Elements::Fp32(vec![f32::NAN, 0.0]))],
        )
        .unwrap();
        assert!(c
            .check_values(&nan.data, nan.cols)
            .unwrap_err()
            .contains("NaN"));
        let mut wrong = input(vec![1, 2], Elements::Fp32(vec![0.0; 2]));
        wrong.name = "x".into();
        assert!(msg(to_batch(&c, vec![wrong])).contains("unknown input 'x'"));
        assert!(msg(to_batch(&c, vec![])).contains("no inputs"));
        assert!(parse_datatype("input", "FP64", DataType::Fp32)
            .unwrap_err()
            .to_string()
            .contains("FP64"));
        assert!(element_count("input", &[-1, 2]).is_err());
        assert!(check_outputs(&c, ["q"])
            .unwrap_err()
            .to_string()
            .contains("unknown output 'q'"));
    }
}
