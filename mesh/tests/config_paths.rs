//! Relative paths in mesh.toml resolve against the file's directory (not the
//! working directory), defaults stay as they are, and `mesh serve --help` shows
//! the defaults.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::{Path, PathBuf};

use mesh_router::config::MeshConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A deployment directory: mesh.toml with relative paths, the example model, the
/// example views and a writer token, all next to each other.
fn deployment(dir: &Path) {
    let m = dir.join("models/fraud_mlp");
    std::fs::create_dir_all(m.join("1")).unwrap();
    let ex = root().join("examples/models/fraud_mlp");
    std::fs::copy(ex.join("model.toml"), m.join("model.toml")).unwrap();
    std::fs::copy(
        ex.join("1/model.safetensors"),
        m.join("1/model.safetensors"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    std::fs::copy(
        root().join("examples/features/views.toml"),
        dir.join("conf/views.toml"),
    )
    .unwrap();
    std::fs::write(
        dir.join("conf/writer.token"),
        "a-writer-token-of-enough-length",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("conf/writer.token"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("mesh.toml"),
        r#"
[server]
grpc_port = 0
http_port = 0
models = "models"
[features]
path = "data/features"
views = "conf/views.toml"
[prediction_log]
dir = "data/predictions"
[writer]
token_file = "conf/writer.token"
[tls.client]
ca = "conf/ca.pem"
[[decisions.deployments]]
model = "fraud_mlp"
"#,
    )
    .unwrap();
}

#[test]
fn relative_paths_resolve_against_the_files_directory() {
    let dir = tempfile::tempdir().unwrap();
    deployment(dir.path());
    let c = MeshConfig::from_file(&dir.path().join("mesh.toml")).unwrap();
    let d = dir.path();
    assert_eq!(c.server.models, d.join("models"));
    assert_eq!(c.features.path, Some(d.join("data/features")));
    assert_eq!(c.features.views, Some(d.join("conf/views.toml")));
    assert_eq!(c.prediction_log.unwrap().dir, d.join("data/predictions"));
    assert_eq!(c.writer.token_file, Some(d.join("conf/writer.token")));
    assert_eq!(c.tls.client.ca, Some(d.join("conf/ca.pem")));

    // Absolute paths are kept; a default the file does not set stays as it is.
    std::fs::write(
        d.join("other.toml"),
        "[features]\npath = \"/var/lib/mesh/features\"\nviews = \"v.toml\"\n",
    )
    .unwrap();
    let c = MeshConfig::from_file(&d.join("other.toml")).unwrap();
    assert_eq!(
        c.features.path,
        Some(PathBuf::from("/var/lib/mesh/features"))
    );
    assert_eq!(c.features.views, Some(d.join("v.toml")));
    assert_eq!(c.server.models, PathBuf::from("examples/models"));
    // The Redis password file too.
    std::fs::write(
        d.join("redis.toml"),
        "[features]\nbackend = \"redis\"\nredis_url = \"redis://127.0.0.1:6379\"\nviews = \"v.toml\"\nredis_password_file = \"secrets/redis\"\n",
    )
    .unwrap();
    let c = MeshConfig::from_file(&d.join("redis.toml")).unwrap();
    assert_eq!(
        c.features.redis_password_file,
        Some(d.join("secrets/redis"))
    );
    // No file: the built-in defaults, relative to the working directory.
    assert_eq!(
        MeshConfig::default().server.models,
        PathBuf::from("examples/models")
    );
    // The text alone has no directory: paths stay as written.
    let c = MeshConfig::from_toml("[server]\nmodels = \"models\"\n").unwrap();
    assert_eq!(c.server.models, PathBuf::from("models"));

    // The example file, read from wherever, names the example repository and views.
    let c = MeshConfig::from_file(&root().join("examples/mesh.toml")).unwrap();
    assert!(
        c.server.models.join("fraud_mlp/model.toml").is_file(),
        "{:?}",
        c.server.models
    );
    assert!(c.features.views.unwrap().is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_serves_from_the_files_directory() {
    // The test's working directory is mesh/, which has none of these paths.
    let dir = tempfile::tempdir().unwrap();
    deployment(dir.path());
    let mut cfg = MeshConfig::from_file(&dir.path().join("mesh.toml")).unwrap();
    // (The test has no CA to give; the path checks above cover [tls.client].)
    cfg.tls.client.ca = None;
    let running = mesh_router::server::start_mesh(&cfg).await.unwrap();
    assert!(running.store.is_some(), "the store opened");
    assert!(dir.path().join("data/features").is_dir());
    let repo = running.core.as_ref().unwrap().repo.clone();
    assert_eq!(repo.get("fraud_mlp", None).unwrap().version, 1);
    running.shutdown().await;
    assert!(!Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/features")
        .exists());
}

#[test]
fn serve_help_shows_the_defaults() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mesh"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "[default: examples/models]",
        "[default: 127.0.0.1]",
        "[default: 8001]",
        "[default: 8000]",
        "[default: all]",
        "resolve against the file's directory",
    ] {
        assert!(help.contains(want), "{want}: {help}");
    }
}

/// `[server] worker_threads` sizes the runtime that serves requests (the start
/// says how many it has); 0, the default, is one per CPU core.
#[test]
fn serve_runs_on_the_configured_worker_threads() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let models = root().join("examples/models");
    for (workers, flag, want) in [
        (3, None, 3),
        (0, None, std::thread::available_parallelism().unwrap().get()),
        // The flag (or MESH_WORKER_THREADS) over the file.
        (3, Some("2"), 2),
    ] {
        let cfg = dir.path().join("mesh.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\ngrpc_port = 0\nhttp_port = 0\nmodels = {:?}\nworker_threads = {workers}\n",
                models.display().to_string()
            ),
        )
        .unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mesh"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .args(flag.map(|f| ["--worker-threads", f]).into_iter().flatten())
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let line = stderr
            .lines()
            .map(Result::unwrap)
            .find(|l| l.contains("serving runtime"));
        child.kill().unwrap();
        child.wait().unwrap();
        let line = line.expect("the start names its runtime");
        assert!(
            line.contains(&format!("worker_threads={want}")),
            "{workers} {flag:?}: {line}"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mesh"))
        .args(["serve", "--worker-threads", "1025", "--models"])
        .arg(&models)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--worker-threads 1025: must be 0 (one per CPU core) to 1024"),
        "{err}"
    );
}
