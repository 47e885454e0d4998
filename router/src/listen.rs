//! Accepting connections with bounds: at most `max_connections` open at once per
//! port (the next client waits in the kernel's backlog until one closes, so file
//! descriptors never run out), and a connection that sends nothing for
//! `idle_timeout` is closed (a socket that never speaks, a client that stopped
//! mid-request). Together with the per-request timeout, the HTTP/2 keepalive pings
//! and the maximum connection age set on the servers, no client can hold a slot
//! for ever. TCP_NODELAY is set on every connection: small answers must not wait
//! for delayed ACKs (~40 ms).
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// `[server.connections]`: how long and how many connections may live, on both ports.
///
/// ```toml
/// [server.connections]
/// max_connections = 1024        # per port; the next client waits for a free slot
/// idle_timeout = "60s"          # nothing received for this long closes a connection
/// request_timeout = "30s"       # a whole request, body included (slow bodies end here)
/// keepalive_interval = "30s"    # HTTP/2 pings to each gRPC client
/// keepalive_timeout = "10s"     # a ping unanswered this long closes the connection
/// max_connection_age = "30m"    # gRPC connections are asked to reconnect after this
/// shutdown_grace = "10s"        # SIGTERM: requests in flight get this long, then all close
/// max_pending_accept_reset_streams = 20  # gRPC: resets before accept, then GOAWAY
/// ```
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionConfig {
    pub max_connections: usize,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub idle_timeout: Duration,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub request_timeout: Duration,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub keepalive_interval: Duration,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub keepalive_timeout: Duration,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub max_connection_age: Duration,
    #[serde(deserialize_with = "mesh_stack::config::duration::deserialize")]
    pub shutdown_grace: Duration,
    /// gRPC port: how many HTTP/2 streams of one connection the client may reset
    /// before the server has taken them up. One more, and the server closes the
    /// connection with GOAWAY `ENHANCE_YOUR_CALM` (every call on it fails: a tonic
    /// client sees RESOURCE_EXHAUSTED, and UNKNOWN for calls in flight). This is the
    /// defence against the HTTP/2 "rapid reset" attack; the default is the `h2`
    /// library's own, 20. A client that cancels calls when their deadlines run out can
    /// reach it too, when a stall of the server (or of its machine) leaves a burst of
    /// its requests untaken past their deadlines. Raise it for such clients, within
    /// [`MAX_PENDING_ACCEPT_RESETS`].
    pub max_pending_accept_reset_streams: usize,
}

/// The most `max_pending_accept_reset_streams` may be: enough for a client's burst of
/// expired calls, still a bound on what one connection can make the server queue.
pub const MAX_PENDING_ACCEPT_RESETS: usize = 1_000;

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(30 * 60),
            shutdown_grace: Duration::from_secs(10),
            max_pending_accept_reset_streams: 20,
        }
    }
}

impl ConnectionConfig {
    /// The accept-time bounds.
    pub fn limits(&self) -> ConnLimits {
        ConnLimits {
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("[server.connections] max_connections must be at least 1".into());
        }
        if !(1..=MAX_PENDING_ACCEPT_RESETS).contains(&self.max_pending_accept_reset_streams) {
            return Err(format!(
                "[server.connections] max_pending_accept_reset_streams = {}: must be 1 to {MAX_PENDING_ACCEPT_RESETS}",
                self.max_pending_accept_reset_streams
            ));
        }
        for (name, d) in [
            ("idle_timeout", self.idle_timeout),
            ("request_timeout", self.request_timeout),
            ("keepalive_interval", self.keepalive_interval),
            ("keepalive_timeout", self.keepalive_timeout),
            ("max_connection_age", self.max_connection_age),
        ] {
            if d.is_zero() {
                return Err(format!("[server.connections] {name} must be more than 0"));
            }
        }
        Ok(())
    }

    /// Settings that work but hurt, for the start's log. The idle close is an
    /// abrupt close of the socket (no HTTP/2 GOAWAY): a gRPC client that sends as
    /// it happens gets UNAVAILABLE instead of a transparent retry. With
    /// `idle_timeout` above `keepalive_interval`, the answer to the server's ping
    /// keeps a live client's connection from ever idling out.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.idle_timeout <= self.keepalive_interval {
            out.push(format!(
                "[server.connections] idle_timeout ({}) is not above keepalive_interval ({}): \
                 idle gRPC clients that are still alive will have their connections closed \
                 without a GOAWAY, and a call sent at that moment fails with UNAVAILABLE",
                mesh_stack::format_duration(self.idle_timeout),
                mesh_stack::format_duration(self.keepalive_interval)
            ));
        }
        out
    }
}

/// Bounds on the connections of one port.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// A connection from which nothing arrives for this long is closed.
    pub idle_timeout: Duration,
}

/// Who is at the other end of a connection: its address and, under mTLS, the
/// identities of its client certificate (DNS/URI/email SANs and the subject
/// CN). The connection info of both servers (tonic request extensions,
/// axum's `ConnectInfo<PeerInfo>`).
#[derive(Debug, Clone, Default)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Whether the client presented a certificate (verified against the client CA).
    pub client_cert: bool,
    pub client_names: Arc<Vec<String>>,
}

impl PeerInfo {
    /// The caller, for logs: its address, or `unknown`.
    pub fn who(&self) -> String {
        self.remote
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string())
    }
}

/// Most time a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener that admits at most `max_connections` at once (and, with TLS,
/// completes each handshake on its own task, so a slow client holds only its
/// own slot).
pub struct Limited {
    inner: Accepting,
}

enum Accepting {
    Plain {
        listener: TcpListener,
        permits: Arc<Semaphore>,
        idle_timeout: Duration,
    },
    Tls {
        local: SocketAddr,
        ready: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<(Conn, SocketAddr)>>,
        _task: AbortOnDrop,
    },
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Limited {
    pub fn new(listener: TcpListener, limits: ConnLimits) -> Self {
        Self {
            inner: Accepting::Plain {
                listener,
                permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
                idle_timeout: limits.idle_timeout,
            },
        }
    }

    /// TLS on every connection when `tls` is set (the acceptor's current
    /// certificates at the time of each handshake); plain otherwise.
    pub fn with_tls(
        listener: TcpListener,
        limits: ConnLimits,
        tls: Option<crate::tls::Acceptor>,
    ) -> io::Result<Self> {
        let Some(tls) = tls else {
            return Ok(Self::new(listener, limits));
        };
        let local = listener.local_addr()?;
        let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        let idle_timeout = limits.idle_timeout;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, addr) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) if is_connection_error(&e) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed; retrying in 50 ms");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                metrics::gauge!(crate::telemetry::names::OPEN_CONNECTIONS).increment(1.0);
                let idle = Idle::new(tcp, permit, idle_timeout);
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(idle)).await {
                        Ok(Ok(stream)) => {
                            let (client_cert, client_names) =
                                crate::tls::client_identity(stream.get_ref().1);
                            let conn = Conn {
                                io: Io::Tls(Box::new(stream)),
                                peer: PeerInfo {
                                    remote: Some(addr),
                                    tls: true,
                                    client_cert,
                                    client_names: Arc::new(client_names),
                                },
                            };
                            let _ = tx.send((conn, addr)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %addr, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(peer = %addr, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(Self {
            inner: Accepting::Tls {
                local,
                ready: tokio::sync::Mutex::new(rx),
                _task: AbortOnDrop(task),
            },
        })
    }

    /// Waits for a free slot, then for a client (with TLS: one whose handshake
    /// is done).
    pub async fn accept_conn(&self) -> io::Result<(Conn, SocketAddr)> {
        match &self.inner {
            Accepting::Plain {
                listener,
                permits,
                idle_timeout,
            } => {
                let permit = permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| io::Error::other("listener closed"))?;
                let (tcp, addr) = listener.accept().await?;
                let _ = tcp.set_nodelay(true);
                metrics::gauge!(crate::telemetry::names::OPEN_CONNECTIONS).increment(1.0);
                let conn = Conn {
                    io: Io::Plain(Idle::new(tcp, permit, *idle_timeout)),
                    peer: PeerInfo {
                        remote: Some(addr),
                        ..PeerInfo::default()
                    },
                };
                Ok((conn, addr))
            }
            Accepting::Tls { ready, .. } => ready
                .lock()
                .await
                .recv()
                .await
                .ok_or_else(|| io::Error::other("listener closed")),
        }
    }

    fn local(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Accepting::Plain { listener, .. } => listener.local_addr(),
            Accepting::Tls { local, .. } => Ok(*local),
        }
    }

    /// The connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    pub fn into_stream(self) -> impl futures::Stream<Item = io::Result<Conn>> + Send {
        futures::stream::unfold(self, |l| async move {
            loop {
                match l.accept_conn().await {
                    Ok((c, _)) => return Some((Ok(c), l)),
                    // A client that reset before accept is not the listener's failure.
                    Err(e) if is_connection_error(&e) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed; retrying in 50 ms");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        })
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

impl axum::serve::Listener for Limited {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            match self.accept_conn().await {
                Ok(c) => return c,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying in 50 ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.local()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Limited>> for PeerInfo {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Limited>) -> Self {
        stream.io().peer.clone()
    }
}

/// An accepted connection (plain or TLS) and who is at the other end.
pub struct Conn {
    io: Io,
    peer: PeerInfo,
}

enum Io {
    Plain(Idle),
    Tls(Box<tokio_rustls::server::TlsStream<Idle>>),
}

impl Conn {
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}

/// A TCP connection that holds its slot until dropped, and fails its reads once
/// nothing has arrived for the idle timeout (below TLS: raw bytes count).
///
/// A read that brings bytes only notes the time; the timer is moved when it fires
/// and bytes came since it was set. Moving it at every read re-registered it with
/// the runtime's timer each time: 0.8% of the server's CPU under REST load
/// (`perf`, wrk at concurrency 32).
pub struct Idle {
    tcp: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    /// When bytes last arrived (the connection's start before any).
    last_read: Instant,
    idle: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(tcp: TcpStream, permit: OwnedSemaphorePermit, idle_timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            tcp,
            _permit: permit,
            idle_timeout,
            last_read: now,
            idle: Box::pin(tokio::time::sleep_until(now + idle_timeout)),
        }
    }

    /// Whether nothing has arrived for the idle timeout; registers the waker for
    /// when that may be true.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.last_read + self.idle_timeout;
            if due <= self.idle.deadline() {
                return true;
            }
            // Bytes came after the timer was set: it runs on from the last of them.
            self.idle.as_mut().reset(due);
        }
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::names::OPEN_CONNECTIONS).decrement(1.0);
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !self.poll_idle(cx) {
                    return Poll::Pending;
                }
                metrics::counter!(crate::telemetry::names::IDLE_CLOSED).increment(1);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle past idle_timeout",
                )))
            }
        }
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn listener(max: usize, idle_ms: u64) -> (Limited, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ConnLimits {
            max_connections: max,
            idle_timeout: Duration::from_millis(idle_ms),
        };
        (Limited::new(l, limits), addr)
    }

    #[test]
    fn an_idle_timeout_within_the_keepalive_interval_is_warned_about() {
        let mut c = ConnectionConfig::default();
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        c.idle_timeout = Duration::from_secs(2);
        let w = c.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("idle_timeout (2s)") && w[0].contains("keepalive_interval (30s)"),
            "{w:?}"
        );
        c.idle_timeout = c.keepalive_interval;
        assert_eq!(c.warnings().len(), 1);
        assert!(c.validate().is_ok(), "a warning, not a refusal");
    }

    #[test]
    fn pending_accept_resets_are_bounded_both_ways() {
        let mut c = ConnectionConfig::default();
        assert_eq!(c.max_pending_accept_reset_streams, 20, "h2's own default");
        for ok in [1, MAX_PENDING_ACCEPT_RESETS] {
            c.max_pending_accept_reset_streams = ok;
            assert!(c.validate().is_ok(), "{ok}");
        }
        for bad in [0, MAX_PENDING_ACCEPT_RESETS + 1] {
            c.max_pending_accept_reset_streams = bad;
            let e = c.validate().unwrap_err();
            assert!(
                e.contains("max_pending_accept_reset_streams") && e.contains(&bad.to_string()),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_idle_timeout() {
        let (l, addr) = listener(4, 200).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut conn, _) = l.accept_conn().await.unwrap();
        // Bytes keep it open...
        client.write_all(b"ab").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 2);
        // ...silence closes it.
        let started = std::time::Instant::now();
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(150));
    }

    #[tokio::test]
    async fn bytes_that_keep_coming_keep_a_connection_open_past_the_idle_timeout() {
        let (l, addr) = listener(4, 200).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut conn, _) = l.accept_conn().await.unwrap();
        let opened = std::time::Instant::now();
        let mut buf = [0u8; 8];
        // A byte every 80 ms for well past the 200 ms timeout: each read succeeds.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(80)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        }
        assert!(opened.elapsed() >= Duration::from_millis(400));
        // Then silence: closed one timeout after the last byte, not sooner.
        let last = std::time::Instant::now();
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let silent = last.elapsed();
        assert!(
            silent >= Duration::from_millis(150) && silent < Duration::from_secs(2),
            "{silent:?}"
        );
    }

    #[tokio::test]
    async fn no_more_than_max_connections_are_accepted_at_once() {
        let (l, addr) = listener(2, 60_000).await;
        let _c1 = TcpStream::connect(addr).await.unwrap();
        let _c2 = TcpStream::connect(addr).await.unwrap();
        let _c3 = TcpStream::connect(addr).await.unwrap();
        let (a, _) = l.accept_conn().await.unwrap();
        let (_b, _) = l.accept_conn().await.unwrap();
        // The third waits for a slot...
        let third = tokio::time::timeout(Duration::from_millis(200), l.accept_conn()).await;
        assert!(
            third.is_err(),
            "a third connection was accepted past the cap"
        );
        // ...and gets one when a connection closes.
        drop(a);
        let third = tokio::time::timeout(Duration::from_secs(5), l.accept_conn()).await;
        assert!(third.is_ok());
    }
}
