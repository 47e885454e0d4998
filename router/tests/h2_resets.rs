//! HTTP/2 streams that a client resets before the server has taken them up (a
//! client whose deadlines ran out while a stalled server left its requests waiting,
//! or the "rapid reset" attack), on a real gRPC port: past `[server.connections]
//! max_pending_accept_reset_streams` on one connection the server closes it with
//! GOAWAY ENHANCE_YOUR_CALM; within it, the connection stays up and answers.
#![allow(clippy::unwrap_used)] // tests may unwrap
use std::net::SocketAddr;
use std::time::Duration;

use mesh_router::config::MeshConfig;
use mesh_router::server::{start_mesh, Running};

mod common;

async fn serve(models: &std::path::Path, limit: Option<usize>) -> Running {
    let setting = limit.map_or_else(String::new, |n| {
        format!("max_pending_accept_reset_streams = {n}")
    });
    let cfg = MeshConfig::from_toml(&format!(
        r#"
        [server]
        grpc_port = 0
        http_port = 0
        models = "{models}"
        [server.connections]
        shutdown_grace = "100ms"
        {setting}
        "#,
        models = models.display(),
    ))
    .unwrap();
    start_mesh(&cfg).await.unwrap()
}

fn health_check(addr: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// On one connection: `resets` calls, each reset as soon as it is sent, all written
/// in one burst (the test's runtime has one thread, so the connection task writes
/// them together when this task first waits); then one health check on the same
/// connection. Its grpc-status, or the reason the connection was closed.
async fn burst_then_check(addr: SocketAddr, resets: usize) -> Result<String, h2::Reason> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    for _ in 0..resets {
        let (_answer, mut send) = client.send_request(health_check(addr), false).unwrap();
        send.send_reset(h2::Reason::CANCEL);
        client = client.ready().await.unwrap();
    }
    // Let the burst reach the server and its answer (a GOAWAY, or nothing) come back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reason = |e: h2::Error| e.reason().unwrap_or(h2::Reason::INTERNAL_ERROR);
    if conn.is_finished() {
        return Err(match conn.await.unwrap() {
            Err(e) => reason(e),
            Ok(()) => h2::Reason::NO_ERROR,
        });
    }
    let mut client = client.ready().await.map_err(reason)?;
    let (answer, mut send) = client
        .send_request(health_check(addr), false)
        .map_err(reason)?;
    // An empty HealthCheckRequest: the message prefix only (no compression, length 0).
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .map_err(reason)?;
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("an answer within 10 s")
        .map_err(reason)?;
    let fields = common::grpc_status_fields(answer).await.map_err(reason)?;
    Ok(fields
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default())
}

#[tokio::test]
async fn resets_past_the_limit_close_the_connection_and_within_it_do_not() {
    let models = tempfile::tempdir().unwrap();
    // The default (h2's 20): 60 resets in one burst close the connection.
    let running = serve(models.path(), None).await;
    let addr = running.grpc_addr;
    assert_eq!(
        burst_then_check(addr, 60).await,
        Err(h2::Reason::ENHANCE_YOUR_CALM)
    );
    // A few stay within it: the same connection answers afterwards.
    assert_eq!(burst_then_check(addr, 10).await, Ok("0".to_owned()));
    running.shutdown().await;
    // Raised to 100: the same 60 leave the connection up.
    let running = serve(models.path(), Some(100)).await;
    assert_eq!(
        burst_then_check(running.grpc_addr, 60).await,
        Ok("0".to_owned())
    );
    running.shutdown().await;
}

#[test]
fn a_bound_out_of_range_refuses_the_file_naming_the_key() {
    for bad in ["0", "1001"] {
        let e = MeshConfig::from_toml(&format!(
            "[server.connections]\nmax_pending_accept_reset_streams = {bad}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("max_pending_accept_reset_streams") && e.contains(bad),
            "{e}"
        );
    }
}
