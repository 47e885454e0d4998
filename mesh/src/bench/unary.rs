//! Unary gRPC calls sent the way grpc-go, gRPC C++ and h2load send them: one
//! HEADERS frame and one DATA frame that carries the message and ends the stream,
//! written to the socket together.
//!
//! tonic's client sends the message in a DATA frame and ends the stream with a
//! second, empty DATA frame, written on its own; a tonic server starts the
//! handler only when the stream has ended (it reads the trailers of a unary
//! request first). hyper's client, under it, writes the HEADERS frame and the DATA
//! frame in two writes (the body is piped to the stream once the connection has
//! sent the headers). So each call cost the client one or two more writes and the
//! server more reads and wake-ups (two TCP segments a request: `strace` of the
//! bench showed a 41-byte write of the headers, then one of the message). This
//! client drives `h2` directly: the request's headers and its one DATA frame are
//! queued before the connection task runs, which writes both in one `writev`. The
//! bench uses it by default so that its figures are the server's, not tonic's
//! client's; `--grpc-client tonic` measures with tonic's client instead.
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::{Authority, Scheme};

/// The gRPC message prefix: a compression flag and the length (big-endian u32).
const PREFIX: usize = 5;

/// HTTP/2 windows the answers flow in: hyper's client defaults (5 MB for the
/// connection, 2 MB a stream), so that the server rarely waits for a
/// WINDOW_UPDATE and the client rarely writes one.
const CONN_WINDOW: u32 = 5 << 20;
const STREAM_WINDOW: u32 = 2 << 20;

/// One HTTP/2 connection for [`call`]s: `h2`'s client, its connection driven by a
/// task of its own. Clones share the connection. A call that finds the connection
/// closed (a GOAWAY, a reset) connects again, once for all the calls that found it
/// closed, as tonic's channel does.
#[derive(Clone)]
pub struct Lean {
    inner: Arc<Inner>,
}

struct Inner {
    dial: Dial,
    /// The current connection and its generation (how many connects came before).
    sender: parking_lot::Mutex<(u64, h2::client::SendRequest<Bytes>)>,
    /// Held while connecting again, so that one caller connects and the others wait.
    reconnecting: tokio::sync::Mutex<()>,
}

impl Lean {
    /// Connects to `addr` (`http://` or, with `tls_ca`, `https://`).
    pub async fn connect(addr: &str, tls_ca: Option<&std::path::Path>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let uri: http::Uri = addr.parse().with_context(|| format!("--addr {addr}"))?;
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = uri
            .authority()
            .cloned()
            .with_context(|| format!("--addr {addr}: no host"))?;
        let https = scheme == Scheme::HTTPS;
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        // An IPv6 literal is written in brackets in a URI, not to the resolver.
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls = match (https, tls_ca) {
            (true, Some(ca)) => Some(tls_connector(ca)?),
            (true, None) => anyhow::bail!("--addr {addr} is https: give --tls-ca"),
            (false, Some(_)) => anyhow::bail!("--tls-ca is for an https:// --addr, not {addr}"),
            (false, None) => None,
        };
        let dial = Dial {
            scheme,
            authority,
            host,
            port,
            tls,
        };
        let first = dial
            .handshake()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        Ok(Self {
            inner: Arc::new(Inner {
                dial,
                sender: parking_lot::Mutex::new((0, first)),
                reconnecting: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// A sender ready for one more stream, connecting again if the connection has
    /// closed.
    async fn ready(&self) -> Result<h2::client::SendRequest<Bytes>, tonic::Status> {
        let (generation, sender) = self.inner.sender.lock().clone();
        match sender.ready().await {
            Ok(ready) => Ok(ready),
            Err(_closed) => {
                let _one = self.inner.reconnecting.lock().await;
                let current = self.inner.sender.lock().0;
                if current == generation {
                    let fresh = self.inner.dial.handshake().await.map_err(|e| {
                        tonic::Status::unavailable(format!("connecting again: {e:#}"))
                    })?;
                    *self.inner.sender.lock() = (generation + 1, fresh);
                }
                let sender = self.inner.sender.lock().1.clone();
                sender.ready().await.map_err(h2_status)
            }
        }
    }
}

#[cfg(test)]
impl Lean {
    /// A client whose connection runs over `io`, and that cannot connect again.
    async fn over_io<T>(io: T) -> Self
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let dial = Dial {
            scheme: Scheme::HTTP,
            authority: Authority::from_static("test.invalid:1"),
            host: "test.invalid".into(),
            port: 1,
            tls: None,
        };
        Self {
            inner: Arc::new(Inner {
                dial,
                sender: parking_lot::Mutex::new((0, over(io).await.unwrap())),
                reconnecting: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

/// Where and how a [`Lean`] connects.
struct Dial {
    scheme: Scheme,
    authority: Authority,
    /// The address's host and port.
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Dial {
    /// A new connection: TCP (no Nagle), TLS when asked, the HTTP/2 handshake, and
    /// a task that drives the connection until it closes.
    async fn handshake(&self) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => over(tcp).await,
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())?;
                over(tls.connect(name, tcp).await?).await
            }
        }
    }
}

/// The HTTP/2 handshake over `io`, and a task that drives the connection until it
/// closes.
async fn over<T>(io: T) -> anyhow::Result<h2::client::SendRequest<Bytes>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .handshake(io)
        .await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// A TLS client that trusts the CA certificates in `ca` (PEM) and speaks HTTP/2.
fn tls_connector(ca: &std::path::Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use anyhow::Context as _;
    let pem = std::fs::read(ca).with_context(|| format!("--tls-ca {}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        roots
            .add(cert.with_context(|| format!("--tls-ca {}", ca.display()))?)
            .with_context(|| format!("--tls-ca {}", ca.display()))?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "--tls-ca {}: no certificate in it",
        ca.display()
    );
    // ring, as the server's TLS: named, not the process default, which is unset
    // when more than one provider is built in.
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// An `h2` error as tonic's client reports it: a reset or GOAWAY by its reason
/// (CANCEL is CANCELLED, REFUSED_STREAM UNAVAILABLE, ENHANCE_YOUR_CALM
/// RESOURCE_EXHAUSTED), a broken connection UNAVAILABLE.
fn h2_status(e: h2::Error) -> tonic::Status {
    use h2::Reason;
    use tonic::Code;
    let code = match e.reason() {
        Some(Reason::CANCEL) => Code::Cancelled,
        Some(Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) => Code::Internal,
        None if e.is_io() => Code::Unavailable,
        None => Code::Unknown,
    };
    tonic::Status::new(code, format!("h2: {e}"))
}

/// Sends `req` to `path` on `conn` and decodes the answer as `Res`. Every failure
/// is a `Status`: the server's (`grpc-status` in the trailers, or in the headers
/// of a trailers-only answer), or one that names what was wrong with the answer
/// (HTTP status, framing, protobuf). A call still unanswered when its
/// `grpc-timeout` runs out is reset and CANCELLED, as tonic's client does.
pub async fn call<Req, Res>(
    conn: &Lean,
    path: &'static str,
    req: tonic::Request<Req>,
) -> Result<Res, tonic::Status>
where
    Req: prost::Message,
    Res: prost::Message + Default,
{
    // The router's own reading of `grpc-timeout`, as the server does.
    let timeout = mesh_router::request::timeout_of(&req);
    let answer = exchange(conn, path, req);
    match timeout {
        None => answer.await,
        // Dropping the unfinished exchange drops its stream: h2 resets it (CANCEL).
        Some(t) => tokio::time::timeout(t, answer)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::cancelled("Timeout expired"))),
    }
}

async fn exchange<Req, Res>(
    conn: &Lean,
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
    let uri = http::Uri::builder()
        .scheme(conn.inner.dial.scheme.clone())
        .authority(conn.inner.dial.authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|e| tonic::Status::internal(format!("building the request: {e}")))?;
    let mut request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(())
        .map_err(|e| tonic::Status::internal(format!("building the request: {e}")))?;
    request.headers_mut().extend(metadata.into_headers());
    let mut sender = conn.ready().await?;
    // Headers and the one DATA frame are both queued before the connection task
    // runs: one write.
    let (answer, mut stream) = sender.send_request(request, false).map_err(h2_status)?;
    stream.send_data(body.freeze(), true).map_err(h2_status)?;
    let answer = answer.await.map_err(h2_status)?;
    let (parts, mut body) = answer.into_parts();
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
    // The answer's DATA frames: one, nearly always; more are joined.
    let mut message: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(h2_status)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        match message.take() {
            None if joined.is_empty() => message = Some(chunk),
            first => {
                joined.extend_from_slice(&first.unwrap_or_default());
                joined.extend_from_slice(&chunk);
            }
        }
    }
    let trailers = body.trailers().await.map_err(h2_status)?;
    let status = trailers
        .as_ref()
        .and_then(tonic::Status::from_header_map)
        .ok_or_else(|| tonic::Status::unknown("the answer has no grpc-status"))?;
    if status.code() != tonic::Code::Ok {
        return Err(status);
    }
    decode(message.unwrap_or_else(|| joined.freeze()))
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
    use std::sync::Arc;

    /// Against a real mesh serving the example models: an answer decodes, and the
    /// server's error comes back as its status, code and message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_a_real_mesh_and_gives_back_its_answers_and_its_errors() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cfg = mesh_router::config::ServerConfig::on_any_port(root.join("examples/models"));
        let server = mesh_router::server::start(&cfg).await.unwrap();
        let conn = Lean::connect(&format!("http://{}", server.grpc_addr), None)
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
        let answer: oip::ModelInferResponse = call(&conn, INFER, req).await.unwrap();
        assert_eq!(answer.model_name, "fraud_mlp");
        assert_eq!(answer.outputs.len(), answer.raw_output_contents.len());
        assert!(!answer.raw_output_contents.is_empty());

        let e = call::<_, oip::ModelInferResponse>(&conn, INFER, tonic::Request::new(row("nope")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        assert!(e.message().contains("nope"), "{e:?}");
        server.shutdown().await;
    }

    /// An HTTP/2 server on `io` (h2's own) that answers each unary call with
    /// `answer` after `delay`, and sends what it saw of each stream's end (a reset's
    /// reason, or `None` for an answer) on `seen`.
    async fn serve_h2<T>(
        io: T,
        answer: pb::DecideResponse,
        delay: std::time::Duration,
        seen: tokio::sync::mpsc::UnboundedSender<Option<h2::Reason>>,
    ) where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mut conn = h2::server::handshake(io).await.unwrap();
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let (answer, seen) = (answer.clone(), seen.clone());
            tokio::spawn(async move {
                let mut body = req.into_body();
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                tokio::select! {
                    reason = std::future::poll_fn(|cx| respond.poll_reset(cx)) => {
                        let _ = seen.send(reason.ok());
                    }
                    _ = tokio::time::sleep(delay) => {
                        let head = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let mut send = respond.send_response(head, false).unwrap();
                        send.send_data(framed(&answer), false).unwrap();
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        send.send_trailers(trailers).unwrap();
                        let _ = seen.send(None);
                    }
                }
            });
        }
    }

    /// The client's side of a connection, recording every write the client makes
    /// as one buffer: what a socket would take in one `write` or `writev`.
    struct Recorder {
        io: tokio::io::DuplexStream,
        writes: Arc<parking_lot::Mutex<Vec<Vec<u8>>>>,
    }

    impl tokio::io::AsyncRead for Recorder {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for Recorder {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let written = std::pin::Pin::new(&mut self.io).poll_write(cx, &joined);
            if let std::task::Poll::Ready(Ok(n)) = written {
                self.writes.lock().push(joined[..n].to_vec());
            }
            written
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    /// The HTTP/2 frames in `writes` (after the client's preface): for each, its
    /// type, flags, stream and the writes its first and last byte went out in.
    fn frames(writes: &[Vec<u8>]) -> Vec<(u8, u8, u32, usize, usize)> {
        const PREFACE: usize = 24;
        let which: Vec<usize> = writes
            .iter()
            .enumerate()
            .flat_map(|(i, w)| std::iter::repeat_n(i, w.len()))
            .collect();
        let bytes: Vec<u8> = writes.concat();
        let mut out = Vec::new();
        let mut at = PREFACE;
        while at + 9 <= bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & !(1 << 31);
            let end = (at + 9 + len).min(bytes.len()) - 1;
            out.push((bytes[at + 3], bytes[at + 4], stream, which[at], which[end]));
            at += 9 + len;
        }
        out
    }

    /// Each call's HEADERS frame and its DATA frame that ends the stream go out in
    /// one write, as h2load and grpc-go send them (hyper's client, under tonic,
    /// wrote them in two).
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_goes_out_in_one_write() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let answer = pb::DecideResponse {
            request_id: "r-1".into(),
            score: Some(0.5),
            ..Default::default()
        };
        let (seen, _rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(serve_h2(
            server,
            answer.clone(),
            std::time::Duration::ZERO,
            seen,
        ));
        let recorder = Recorder {
            io: client,
            writes: writes.clone(),
        };
        let conn = Lean::over_io(recorder).await;
        const DECIDE: &str = "/mesh.v1.DecisionService/Decide";
        for _ in 0..3 {
            let req = tonic::Request::new(pb::DecideRequest::default());
            let got: pb::DecideResponse = call(&conn, DECIDE, req).await.unwrap();
            assert_eq!(got, answer);
        }
        let (headers, data, end_stream) = (1, 0, 1);
        let frames = frames(&writes.lock());
        for stream in [1, 3, 5] {
            let of = |kind: u8| {
                frames
                    .iter()
                    .filter(|f| f.0 == kind && f.2 == stream)
                    .copied()
                    .collect::<Vec<_>>()
            };
            let (h, d) = (of(headers), of(data));
            assert_eq!(h.len(), 1, "stream {stream}: {frames:?}");
            assert_eq!(d.len(), 1, "stream {stream}: {frames:?}");
            assert_eq!(d[0].1 & end_stream, end_stream, "{d:?}");
            // Both frames, whole, in one write.
            assert_eq!(
                (h[0].3, h[0].4),
                (d[0].3, d[0].4),
                "stream {stream}: {frames:?}"
            );
            assert_eq!(h[0].3, h[0].4, "{h:?}");
        }
    }

    /// A call still unanswered when its grpc-timeout runs out is CANCELLED, and
    /// its stream is reset (CANCEL) so that the server can stop working on it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_past_its_timeout_is_cancelled_and_its_stream_reset() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (seen, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let slow = std::time::Duration::from_secs(30);
        tokio::spawn(serve_h2(server, pb::DecideResponse::default(), slow, seen));
        let conn = Lean::over_io(client).await;
        let mut req = tonic::Request::new(pb::DecideRequest::default());
        req.set_timeout(std::time::Duration::from_millis(50));
        let started = std::time::Instant::now();
        let e = call::<_, pb::DecideResponse>(&conn, "/mesh.v1.DecisionService/Decide", req)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Cancelled, "{e:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let reason = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reason, Some(h2::Reason::CANCEL));
    }

    /// A connection the server closed is made again by the next call.
    #[tokio::test(flavor = "current_thread")]
    async fn a_closed_connection_is_made_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer = pb::DecideResponse {
            request_id: "again".into(),
            ..Default::default()
        };
        let (seen, _rx) = tokio::sync::mpsc::unbounded_channel();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        let served = answer.clone();
        tokio::spawn(async move {
            // The first connection: answers nothing, closed at once.
            let (first, _) = listener.accept().await.unwrap();
            drop(first);
            let _ = closed_tx.send(());
            // The next ones answer.
            loop {
                let (next, _) = listener.accept().await.unwrap();
                tokio::spawn(serve_h2(
                    next,
                    served.clone(),
                    std::time::Duration::ZERO,
                    seen.clone(),
                ));
            }
        });
        // The handshake's first write succeeds before the server closes.
        let conn = match Lean::connect(&format!("http://{addr}"), None).await {
            Ok(c) => c,
            Err(e) => panic!("{e:#}"),
        };
        closed.await.unwrap();
        const DECIDE: &str = "/mesh.v1.DecisionService/Decide";
        let mut answered = None;
        for _ in 0..3 {
            let req = tonic::Request::new(pb::DecideRequest::default());
            match call::<_, pb::DecideResponse>(&conn, DECIDE, req).await {
                Ok(a) => {
                    answered = Some(a);
                    break;
                }
                // A call that was already on the closed connection fails.
                Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}"),
            }
        }
        assert_eq!(answered, Some(answer));
        assert_eq!(conn.inner.sender.lock().0, 1, "connected again once");
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
