//! Unary gRPC calls sent the way grpc-go, gRPC C++ and h2load send them: one
//! HEADERS frame and one DATA frame that carries the message and ends the stream.
//!
//! tonic's client sends the message in a DATA frame and ends the stream with a
//! second, empty DATA frame, written on its own; a tonic server starts the
//! handler only when the stream has ended (it reads the trailers of a unary
//! request first). So each call costs the client one more write and the server
//! one more read and wake-up, and the handler waits for that second frame. The
//! bench uses this client by default so that its figures are the server's, not
//! tonic's client's; `--grpc-client tonic` measures with tonic's client instead.
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use tonic::transport::Channel;
use tower::ServiceExt;

/// The gRPC message prefix: a compression flag and the length (big-endian u32).
const PREFIX: usize = 5;

/// Sends `req` to `path` on `channel` and decodes the answer as `Res`. Every
/// failure is a `Status`: the server's (`grpc-status` in the trailers, or in the
/// headers of a trailers-only answer), or one that names what was wrong with the
/// answer (HTTP status, framing, protobuf).
pub async fn call<Req, Res>(
    channel: &Channel,
    path: &'static str,
    req: tonic::Request<Req>,
) -> Result<Res, tonic::Status>
where
    Req: prost::Message,
    Res: prost::Message + Default,
{
    let (metadata, _, msg) = req.into_parts();
    let mut body = BytesMut::with_capacity(PREFIX + msg.encoded_len());
    body.put_u8(0);
    body.put_u32(msg.encoded_len() as u32);
    msg.encode(&mut body)
        .map_err(|e| tonic::Status::internal(format!("encoding the request: {e}")))?;
    let mut request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(Full::new(body.freeze())))
        .map_err(|e| tonic::Status::internal(format!("building the request: {e}")))?;
    request.headers_mut().extend(metadata.into_headers());
    // Transport errors as tonic's client reports them: its own expired
    // grpc-timeout is CANCELLED, a refused connection UNAVAILABLE, an HTTP/2
    // reset by its code.
    let answer = channel
        .clone()
        .oneshot(request)
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
    let (parts, body) = answer.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(tonic::Status::unknown(format!(
            "HTTP status {} from the server",
            parts.status
        )));
    }
    // A trailers-only answer (an error before any message) has its status here.
    if let Some(status) = tonic::Status::from_header_map(&parts.headers) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    let collected = body
        .collect()
        .await
        .map_err(|e| tonic::Status::from_error(e.into()))?;
    let status = collected
        .trailers()
        .and_then(tonic::Status::from_header_map)
        .ok_or_else(|| tonic::Status::unknown("the answer has no grpc-status"))?;
    if status.code() != tonic::Code::Ok {
        return Err(status);
    }
    decode(collected.to_bytes())
}

/// The one message of an answer's body.
fn decode<Res: prost::Message + Default>(mut body: Bytes) -> Result<Res, tonic::Status> {
    let bad = |what: String| tonic::Status::internal(format!("the answer's body: {what}"));
    if body.len() < PREFIX {
        return Err(bad(format!(
            "{} bytes, shorter than a message prefix",
            body.len()
        )));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(bad("a compressed message (none was asked for)".into()));
    }
    if body.len() != len {
        return Err(bad(format!(
            "the prefix says {len} bytes, the body has {}",
            body.len()
        )));
    }
    Res::decode(body).map_err(|e| bad(format!("not the expected message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_proto::inference as oip;
    use mesh_proto::mesh::v1 as pb;

    /// Against a real mesh serving the example models: an answer decodes, and the
    /// server's error comes back as its status, code and message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_a_real_mesh_and_gives_back_its_answers_and_its_errors() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cfg = mesh_router::config::ServerConfig {
            grpc_port: 0,
            http_port: 0,
            models: root.join("examples/models"),
            ..Default::default()
        };
        let server = mesh_router::server::start(&cfg).await.unwrap();
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let row = |model: &str| oip::ModelInferRequest {
            model_name: model.to_owned(),
            inputs: vec![oip::model_infer_request::InferInputTensor {
                name: "input".into(),
                datatype: "FP32".into(),
                shape: vec![1, 32],
                ..Default::default()
            }],
            raw_input_contents: vec![vec![0u8; 32 * 4]],
            ..Default::default()
        };
        const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
        let mut req = tonic::Request::new(row("fraud_mlp"));
        req.set_timeout(std::time::Duration::from_secs(5));
        let answer: oip::ModelInferResponse = call(&channel, INFER, req).await.unwrap();
        assert_eq!(answer.model_name, "fraud_mlp");
        assert_eq!(answer.outputs.len(), answer.raw_output_contents.len());
        assert!(!answer.raw_output_contents.is_empty());

        let e =
            call::<_, oip::ModelInferResponse>(&channel, INFER, tonic::Request::new(row("nope")))
                .await
                .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        assert!(e.message().contains("nope"), "{e:?}");
        server.shutdown().await;
    }

    fn framed(msg: &impl prost::Message) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(0);
        b.put_u32(msg.encoded_len() as u32);
        msg.encode(&mut b).unwrap();
        b.freeze()
    }

    #[test]
    fn an_answer_body_reads_back_as_its_message() {
        let msg = pb::DecideResponse {
            request_id: "r-1".into(),
            score: Some(0.25),
            ..Default::default()
        };
        let back: pb::DecideResponse = decode(framed(&msg)).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn a_body_that_is_not_one_whole_message_is_an_error_that_says_why() {
        let msg = pb::DecideResponse {
            request_id: "r-1".into(),
            ..Default::default()
        };
        let whole = framed(&msg);
        let short = whole.slice(..whole.len() - 1);
        let e = decode::<pb::DecideResponse>(short).unwrap_err();
        assert!(e.message().contains("the prefix says"), "{e}");
        let e = decode::<pb::DecideResponse>(whole.slice(..3)).unwrap_err();
        assert!(e.message().contains("shorter than a message prefix"), "{e}");
        let mut compressed = BytesMut::from(&whole[..]);
        compressed[0] = 1;
        let e = decode::<pb::DecideResponse>(compressed.freeze()).unwrap_err();
        assert!(e.message().contains("compressed"), "{e}");
    }
}
