//! `mesh bench` against a mesh that speaks TLS (a throwaway CA made here with
//! rcgen): its own HTTP/2 client checks the server's certificate against
//! `--tls-ca` and the address's host, and every call answers OK; a certificate
//! from another CA, or `--tls-ca` with a plain address, is refused before any load.
#![allow(clippy::unwrap_used)]

use mesh::bench::{BenchArgs, GrpcClient};
use mesh_router::config::MeshConfig;

mod common;
use common::{bench_args, examples_server};

/// A self-signed CA's certificate (PEM) and what signs with it.
fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    (p.self_signed(&key).unwrap(), key)
}

fn args(addr: &str, tls_ca: Option<std::path::PathBuf>, grpc_client: GrpcClient) -> BenchArgs {
    BenchArgs {
        tls_ca,
        grpc_client,
        requests: Some(200),
        ..bench_args(addr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_speaks_tls_and_checks_the_servers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_cert, ca_key) = ca("bench test CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    let mut p =
        rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = p.signed_by(&server_key, &ca_cert, &ca_key).unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let ca_pem = write("ca.pem", ca_cert.pem());
    let other_pem = write("other.pem", ca("another CA").0.pem());
    let mut mesh = MeshConfig {
        server: examples_server(),
        ..MeshConfig::default()
    };
    mesh.tls.cert = Some(write("server.pem", server_cert.pem()));
    mesh.tls.key = Some(write("server.key", server_key.serialize_pem()));
    let server = mesh_router::server::start_mesh(&mesh).await.unwrap();
    let port = server.grpc_addr.port();

    // By IP address and by name, with the bench's own client and with tonic's.
    for host in ["127.0.0.1", "localhost"] {
        for client in [GrpcClient::Lean, GrpcClient::Tonic] {
            let addr = format!("https://{host}:{port}");
            let report = mesh::bench::run(args(&addr, Some(ca_pem.clone()), client))
                .await
                .unwrap_or_else(|e| panic!("{addr} {client:?}: {e:#}"));
            assert_eq!(
                report.codes.into_iter().collect::<Vec<_>>(),
                [("OK".to_string(), 200)],
                "{addr} {client:?}"
            );
        }
    }
    // A server certificate that the given CA did not sign: no load is sent.
    let addr = format!("https://127.0.0.1:{port}");
    let e = mesh::bench::run(args(&addr, Some(other_pem), GrpcClient::Lean))
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("connecting to") && e.contains("certificate"),
        "{e}"
    );
    // The CA with a plain address, and an https address without a CA.
    let plain = format!("http://127.0.0.1:{port}");
    let e = mesh::bench::run(args(&plain, Some(ca_pem), GrpcClient::Lean))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("--tls-ca is for an https://"),
        "{e:#}"
    );
    let e = mesh::bench::run(args(&addr, None, GrpcClient::Lean))
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("give --tls-ca"), "{e:#}");
    // A CA file with no certificate in it, and one that is not there: named.
    let empty = write("empty.pem", "not a certificate\n".into());
    let e = mesh::bench::run(args(&addr, Some(empty), GrpcClient::Lean))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("empty.pem: no certificate in it"),
        "{e:#}"
    );
    let missing = dir.path().join("missing.pem");
    let e = mesh::bench::run(args(&addr, Some(missing), GrpcClient::Lean))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("--tls-ca") && format!("{e:#}").contains("missing.pem"),
        "{e:#}"
    );
    server.shutdown().await;
}
