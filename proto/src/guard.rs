//! Bounds on what decoding a request can cost, checked on the wire bytes before
//! prost allocates anything.
//!
//! Protobuf lets a small message ask for a lot of memory: an empty repeated
//! sub-message or map entry is two bytes on the wire and a struct of 100-200 bytes
//! once decoded (a 16 MiB ModelInfer of empty `inputs` decoded to 2.5 GB). The
//! [`GuardedCodec`] walks the message's fields first (a cheap scan, no allocation),
//! counts the repeated fields named in a [`Shape`] against their limits and every
//! sub-message and repeated string against one budget, [`MAX_ITEMS`], and refuses
//! the request with RESOURCE_EXHAUSTED (naming the field and the limit) before
//! decoding. Decoded, a request then holds at most about `MAX_ITEMS` x 200 bytes of
//! structure (about 20 MB) on top of its own size, plus up to 8x the bytes of packed
//! integer fields (a 1-byte varint becomes an 8-byte `i64`).
//!
//! A message that is not valid protobuf (bad UTF-8 in a string, say) is
//! INVALID_ARGUMENT: the caller sent it, not a server fault.
use std::any::TypeId;
use std::marker::PhantomData;

use prost::bytes::Buf;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use crate::inference as oip;
use crate::mesh::v1 as mesh;

/// Most sub-messages, map entries and repeated strings in one request, at every
/// depth together.
pub const MAX_ITEMS: u64 = 100_000;

/// Deepest nesting of sub-messages the guard follows.
const MAX_DEPTH: u32 = 16;

/// A repeated field's limit and, for a message field, the shape of its elements.
pub struct Field {
    pub number: u32,
    pub name: &'static str,
    pub max: u64,
    pub shape: Option<&'static Shape>,
}

/// The bounded fields of one message type; fields not listed are scalars (or
/// strings) whose decoded size is about their wire size.
pub struct Shape {
    pub name: &'static str,
    pub fields: &'static [Field],
}

const fn f(number: u32, name: &'static str, max: u64, shape: Option<&'static Shape>) -> Field {
    Field {
        number,
        name,
        max,
        shape,
    }
}

/// Parameters (`map<string, InferParameter>`) of any OIP message.
const OIP_PARAMETERS: u64 = 64;
/// Inputs or outputs of one OIP request.
pub const MAX_TENSORS: u64 = 64;

static INFER_INPUT: Shape = Shape {
    name: "inputs[]",
    fields: &[
        f(3, "shape", 16, None),
        f(4, "parameters", OIP_PARAMETERS, None),
        f(5, "contents", 1, Some(&TENSOR_CONTENTS)),
    ],
};
static TENSOR_CONTENTS: Shape = Shape {
    name: "contents",
    // bytes_contents: each element is a Vec<u8> once decoded.
    fields: &[f(8, "bytes_contents", MAX_ITEMS, None)],
};
static INFER_OUTPUT: Shape = Shape {
    name: "outputs[]",
    fields: &[f(2, "parameters", OIP_PARAMETERS, None)],
};
static MODEL_INFER: Shape = Shape {
    name: "ModelInferRequest",
    fields: &[
        f(4, "parameters", OIP_PARAMETERS, None),
        f(5, "inputs", MAX_TENSORS, Some(&INFER_INPUT)),
        f(6, "outputs", MAX_TENSORS, Some(&INFER_OUTPUT)),
        f(7, "raw_input_contents", MAX_TENSORS, None),
    ],
};

/// Entity keys, request features and categorical features of one Decide request.
pub const MAX_DECIDE_ENTITIES: u64 = 16;
pub const MAX_DECIDE_FEATURES: u64 = 1024;
static DECIDE: Shape = Shape {
    name: "DecideRequest",
    fields: &[
        f(4, "entities", MAX_DECIDE_ENTITIES, None),
        f(5, "features", MAX_DECIDE_FEATURES, None),
        f(6, "categorical", MAX_DECIDE_FEATURES, None),
    ],
};
/// Items of one DecideBatch on the wire (the configured `max_batch_items` is
/// checked after decoding and is usually lower).
pub const MAX_DECIDE_BATCH: u64 = 4096;
static DECIDE_BATCH: Shape = Shape {
    name: "DecideBatchRequest",
    fields: &[f(1, "requests", MAX_DECIDE_BATCH, Some(&DECIDE))],
};

/// Feature names and key columns of one lookup.
pub const MAX_LOOKUP_FEATURES: u64 = 1024;
static KEY_COLUMN: Shape = Shape {
    name: "entities[]",
    fields: &[f(3, "string_keys", MAX_ITEMS, None)],
};
static GET_FEATURES: Shape = Shape {
    name: "GetOnlineFeaturesRequest",
    fields: &[
        f(1, "features", MAX_LOOKUP_FEATURES, None),
        f(2, "entities", 16, Some(&KEY_COLUMN)),
    ],
};
/// Values of one pushed row, and feature columns of one columnar push.
pub const MAX_PUSH_VALUES: u64 = 1024;
static PUSH_ROW: Shape = Shape {
    name: "rows[]",
    fields: &[f(1, "key", 1, None), f(3, "values", MAX_PUSH_VALUES, None)],
};
static PUSH_COLUMN: Shape = Shape {
    name: "columns.features[]",
    fields: &[
        f(7, "string_values", MAX_ITEMS, None),
        f(8, "f32_vector_values", MAX_ITEMS, None),
    ],
};
static PUSH_COLUMNS: Shape = Shape {
    name: "columns",
    fields: &[
        f(2, "string_keys", MAX_ITEMS, None),
        f(4, "features", MAX_PUSH_VALUES, Some(&PUSH_COLUMN)),
    ],
};
static PUSH: Shape = Shape {
    name: "PushRequest",
    fields: &[
        f(2, "rows", MAX_ITEMS, Some(&PUSH_ROW)),
        f(4, "columns", 1, Some(&PUSH_COLUMNS)),
    ],
};

/// The shape of the request types that carry repeated fields.
fn shape_of<U: 'static>() -> Option<&'static Shape> {
    let t = TypeId::of::<U>();
    [
        (TypeId::of::<oip::ModelInferRequest>(), &MODEL_INFER),
        (TypeId::of::<mesh::DecideRequest>(), &DECIDE),
        (TypeId::of::<mesh::DecideBatchRequest>(), &DECIDE_BATCH),
        (
            TypeId::of::<mesh::GetOnlineFeaturesRequest>(),
            &GET_FEATURES,
        ),
        (TypeId::of::<mesh::PushRequest>(), &PUSH),
    ]
    .into_iter()
    .find(|(id, _)| *id == t)
    .map(|(_, s)| s)
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err("truncated varint".into());
        };
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes".into())
}

fn skip(buf: &mut &[u8], n: u64) -> Result<&'static str, String> {
    let n = usize::try_from(n).map_err(|_| "length out of range".to_owned())?;
    if buf.len() < n {
        return Err("truncated field".into());
    }
    *buf = &buf[n..];
    Ok("")
}

/// Checks one message's bytes against `shape`, spending `budget`.
pub fn check(mut buf: &[u8], shape: &Shape, budget: &mut u64, depth: u32) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("{}: nested deeper than {MAX_DEPTH}", shape.name));
    }
    let mut counts = [0u64; 8];
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let (number, wire) = (key >> 3, key & 7);
        let field = shape
            .fields
            .iter()
            .position(|f| u64::from(f.number) == number);
        match wire {
            0 => {
                varint(&mut buf)?;
            }
            1 => {
                skip(&mut buf, 8)?;
            }
            5 => {
                skip(&mut buf, 4)?;
            }
            2 => {
                let len = varint(&mut buf)?;
                let start = buf;
                skip(&mut buf, len)?;
                let body = &start[..start.len() - buf.len()];
                let Some(i) = field else { continue };
                let fd = &shape.fields[i];
                counts[i] += 1;
                if counts[i] > fd.max {
                    return Err(format!(
                        "{}.{}: more than {} entries",
                        shape.name, fd.name, fd.max
                    ));
                }
                if *budget == 0 {
                    return Err(format!(
                        "more than {MAX_ITEMS} repeated entries in one request"
                    ));
                }
                *budget -= 1;
                if let Some(inner) = fd.shape {
                    check(body, inner, budget, depth + 1)?;
                }
            }
            _ => return Err(format!("wire type {wire} is not supported")),
        }
        // Packed scalars arrive as one length-delimited field (counted above as one);
        // unpacked ones as many varints: count those too.
        if wire != 2 {
            if let Some(i) = field {
                counts[i] += 1;
                if counts[i] > shape.fields[i].max {
                    return Err(format!(
                        "{}.{}: more than {} entries",
                        shape.name, shape.fields[i].name, shape.fields[i].max
                    ));
                }
            }
        }
    }
    Ok(())
}

/// prost encoding and decoding, with the [`check`] before decoding a request type
/// that has a [`Shape`]. The generated services and clients use it (proto/build.rs).
#[derive(Debug, Clone)]
pub struct GuardedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for GuardedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for GuardedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = GuardedEncoder<T>;
    type Decoder = GuardedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        GuardedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        GuardedDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct GuardedEncoder<T>(PhantomData<T>);

impl<T: Message + 'static> Encoder for GuardedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // A feature lookup's answer, encoded by hand (the same bytes, less CPU).
        if let Some(r) =
            (&item as &dyn std::any::Any).downcast_ref::<mesh::GetOnlineFeaturesResponse>()
        {
            if crate::features_wire::covers(r) {
                crate::features_wire::encode(r, buf);
                return Ok(());
            }
        }
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding the message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[derive(Debug)]
pub struct GuardedDecoder<U>(PhantomData<U>);

impl<U: Message + Default + 'static> Decoder for GuardedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if let Some(shape) = shape_of::<U>() {
            // tonic hands the whole message in one contiguous buffer.
            let bytes = buf.chunk();
            if bytes.len() == buf.remaining() {
                let mut budget = MAX_ITEMS;
                check(bytes, shape, &mut budget, 0).map_err(|e| {
                    Status::resource_exhausted(format!("request refused before decoding: {e}"))
                })?;
            }
        }
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("request is not valid protobuf: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check_msg<M: Message + 'static>(m: &M) -> Result<(), String> {
        let mut budget = MAX_ITEMS;
        check(&m.encode_to_vec(), shape_of::<M>().unwrap(), &mut budget, 0)
    }

    #[test]
    fn ordinary_requests_pass() {
        let mut r = oip::ModelInferRequest {
            model_name: "fraud".into(),
            ..Default::default()
        };
        r.inputs.push(oip::model_infer_request::InferInputTensor {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![8, 32],
            parameters: Default::default(),
            contents: Some(oip::InferTensorContents {
                fp32_contents: vec![0.5; 256],
                ..Default::default()
            }),
        });
        check_msg(&r).unwrap();
        let d = mesh::DecideRequest {
            request_id: "r".into(),
            features: (0..100).map(|i| (format!("f{i}"), 1.0)).collect(),
            ..Default::default()
        };
        check_msg(&d).unwrap();
    }

    #[test]
    fn many_empty_entries_are_refused_naming_the_field() {
        let r = oip::ModelInferRequest {
            inputs: vec![Default::default(); 65],
            ..Default::default()
        };
        let e = check_msg(&r).unwrap_err();
        assert!(
            e.contains("ModelInferRequest.inputs") && e.contains("64"),
            "{e}"
        );
        let b = mesh::DecideBatchRequest {
            requests: vec![Default::default(); 5000],
        };
        let e = check_msg(&b).unwrap_err();
        assert!(e.contains("requests"), "{e}");
        // Nested: one batch item with too many features.
        let b = mesh::DecideBatchRequest {
            requests: vec![mesh::DecideRequest {
                features: (0..2000).map(|i| (format!("f{i}"), 1.0)).collect(),
                ..Default::default()
            }],
        };
        let e = check_msg(&b).unwrap_err();
        assert!(e.contains("DecideRequest.features"), "{e}");
        // Push: rows x values over the total budget.
        let row = mesh::PushRow {
            values: vec![Default::default(); 1000],
            ..Default::default()
        };
        let p = mesh::PushRequest {
            view: "card".into(),
            rows: vec![row; 200],
            ..Default::default()
        };
        let e = check_msg(&p).unwrap_err();
        assert!(e.contains(&MAX_ITEMS.to_string()), "{e}");
        // Columnar push: too many feature columns, and string values over the budget.
        let columns = |features| mesh::PushRequest {
            view: "card".into(),
            columns: Some(mesh::PushColumns {
                int64_keys: vec![1],
                event_time_unix_micros: vec![1],
                features,
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = check_msg(&columns(vec![Default::default(); 1025])).unwrap_err();
        assert!(e.contains("columns.features: more than 1024"), "{e}");
        let strings = mesh::PushColumn {
            string_values: vec![String::new(); 60_000],
            ..Default::default()
        };
        let e = check_msg(&columns(vec![strings.clone(), strings.clone()])).unwrap_err();
        assert!(e.contains(&MAX_ITEMS.to_string()), "{e}");
        // Packed lists are one field each, whatever their length.
        let floats = mesh::PushColumn {
            f32_values: vec![1.0; 100_000],
            null_rows: (0..100_000).collect(),
            ..Default::default()
        };
        assert!(check_msg(&columns(vec![floats; 16])).is_ok());
        assert!(check_msg(&columns(vec![strings])).is_ok());
    }

    #[test]
    fn malformed_bytes_are_errors_not_panics() {
        let shape = &MODEL_INFER;
        for bytes in [
            &[0x2a][..],             // field 5, LEN, missing length
            &[0x2a, 0x05, 0x00][..], // length past the end
            &[0x2b][..],             // wire type 3 (group)
            &[0xff; 11][..],         // varint too long
        ] {
            let mut budget = MAX_ITEMS;
            assert!(check(bytes, shape, &mut budget, 0).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn only_request_types_are_checked() {
        assert!(shape_of::<oip::ModelInferResponse>().is_none());
        assert!(shape_of::<mesh::DecideBatchRequest>().is_some());
    }
}
