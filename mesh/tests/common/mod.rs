//! What the `mesh` binary's integration tests share: the repository root and a way
//! to run the built binary.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The repository root.
pub fn root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A server on ports the OS picks (127.0.0.1:0) serving the example models
/// (fraud_mlp, fraud_xgb, fraud_lgbm), for `mesh_router::server::start`.
pub fn examples_server() -> mesh_router::config::ServerConfig {
    mesh_router::config::ServerConfig::on_any_port(root().join("examples/models"))
}

/// Owned command-line arguments.
pub fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// Runs the built `mesh` binary off the runtime's threads, with `stdin` written to
/// it and `env` set, and returns (exit code, stdout, stderr). It runs as a user's
/// shell would with backtraces on, and without the `MESH_*` and `RUST_LOG`
/// variables of the environment the tests run in.
pub async fn run_mesh(
    args: Vec<String>,
    stdin: Option<&str>,
    env: Vec<(&'static str, String)>,
) -> (i32, String, String) {
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesh"));
        cmd.args(&args)
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LOG")
            .env_remove("MESH_WRITER_TOKEN")
            .env_remove("MESH_FEATURES")
            .env_remove("MESH_VIEWS")
            .env_remove("MESH_FEATURES_REMOTE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            pipe.write_all(s.as_bytes()).unwrap();
        }
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// `mesh bench` arguments for a count-bounded closed loop of ModelInfer on
/// fraud_mlp against `addr`: one thread, the lean client, 4 callers on one
/// connection, 300 requests. Tests set what they vary.
pub fn bench_args(addr: &str) -> mesh::bench::BenchArgs {
    mesh::bench::BenchArgs {
        addr: addr.to_owned(),
        tls_ca: None,
        alternate_addr: None,
        target: mesh::bench::Target::Infer,
        model: "fraud_mlp".into(),
        rate: None,
        concurrency: 4,
        connections: 1,
        grpc_client: mesh::bench::GrpcClient::Lean,
        threads: 1,
        seconds: None,
        warmup: 0.0,
        warming_up: false,
        requests: Some(300),
        cards: 10,
        merchants: 10,
        json: false,
        html: None,
        deadline_ms: None,
        view: "card".into(),
        keys: 10,
        event_times_per_view: false,
        decode_values: false,
    }
}

/// Starts `cmd` (a `mesh serve`) and waits until it serves: until it prints `mesh
/// serving: grpc=... http=...`, once both listeners are up. Returns the child and its
/// stderr, read to the end once the child exits. Panics with that stderr when the
/// server exits before serving.
pub fn start_serving(mut cmd: Command) -> (Child, std::thread::JoinHandle<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            s.push_str(&line);
            s.push('\n');
        }
        s
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("mesh serving") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            child.kill().ok();
            panic!(
                "mesh serve exited before serving: {}",
                stderr.join().unwrap()
            );
        }
    }
    (child, stderr)
}
