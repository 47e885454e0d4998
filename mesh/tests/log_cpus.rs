//! `[prediction_log] reserved_cpus`: a real `mesh serve` sets the last of its CPUs aside
//! for the log's threads and runs every other thread on the rest, read from the kernel
//! (`Cpus_allowed_list` of each thread in /proc), and refuses to start, naming the
//! setting, when it has no CPU to spare. The server is started under `taskset` on CPUs
//! of this process, so what it may run on is known whatever the machine.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The CPUs this process may run on.
fn my_cpus() -> Vec<usize> {
    mesh_prediction_log::priority::current_cpus().unwrap()
}

/// Each thread of `pid`: (name, its `Cpus_allowed_list`).
fn threads(pid: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = t.unwrap().path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // a thread that ended meanwhile
        };
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_owned();
        out.push((comm.trim().to_owned(), cpus));
    }
    out
}

/// A mesh.toml serving the example models and a feature store, with the log on and
/// `reserved_cpus = 1`.
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("mesh.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
grpc_port = 0
http_port = 0
models = {:?}
[features]
path = {:?}
views = {:?}
[prediction_log]
dir = {:?}
reserved_cpus = 1
"#,
            common::root().join("examples/models"),
            dir.join("features"),
            common::root().join("examples/features/views.toml"),
            dir.join("predictions"),
        ),
    )
    .unwrap();
    path
}

/// `taskset -c <cpus> mesh serve --role <role> --config <config>`.
fn serve_as(role: &str, cpus: &[usize], config: &std::path::Path) -> Command {
    let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    let mut cmd = Command::new("taskset");
    cmd.arg("-c")
        .arg(list.join(","))
        .arg(env!("CARGO_BIN_EXE_mesh"))
        .args(["serve", "--role", role, "--config"])
        .arg(config)
        .env_remove("MESH_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("TOKIO_WORKER_THREADS");
    cmd
}

#[test]
fn the_log_runs_on_the_last_cpu_and_every_other_thread_on_the_rest() {
    let mine = my_cpus();
    if mine.len() < 2 {
        eprintln!(
            "skipped: this process may run on {} CPU, and the split needs two",
            mine.len()
        );
        return;
    }
    let (serving, log) = (mine[0], mine[1]);
    let dir = tempfile::tempdir().unwrap();
    let (mut child, stderr) =
        common::start_serving(serve_as("model", &[serving, log], &config(dir.path())));
    // The log's three threads start with the log, before the server answers; give
    // them a moment all the same.
    let since = Instant::now();
    let seen = loop {
        let seen = threads(child.id());
        let log_threads = seen.iter().filter(|(n, _)| n.starts_with("plog-")).count();
        if log_threads >= 3 || since.elapsed() > Duration::from_secs(10) {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let log_text = stderr.join().unwrap();

    let mut by_cpus: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, cpus) in &seen {
        by_cpus.entry(cpus.clone()).or_default().push(name.clone());
    }
    let plog: Vec<_> = seen
        .iter()
        .filter(|(n, _)| n.starts_with("plog-"))
        .collect();
    let names: Vec<&str> = plog.iter().map(|(n, _)| n.as_str()).collect();
    for want in ["plog-writer", "plog-encoder", "plog-closer"] {
        assert!(names.contains(&want), "no {want} among {seen:?}");
    }
    for (name, cpus) in &plog {
        assert_eq!(cpus, &log.to_string(), "{name}: {by_cpus:?}");
    }
    let others: Vec<_> = seen
        .iter()
        .filter(|(n, _)| !n.starts_with("plog-"))
        .collect();
    assert!(others.len() >= 3, "{seen:?}");
    for (name, cpus) in &others {
        assert_eq!(cpus, &serving.to_string(), "{name}: {by_cpus:?}");
    }
    // One serving CPU: one runtime worker (`worker_threads = 0` is one per CPU the
    // process may use; the runtime's blocking threads share the workers' name, so
    // the count is the one the server reports).
    assert!(log_text.contains("worker_threads=1 "), "{log_text}");
    assert!(
        log_text.contains(&format!("log_cpus={log}"))
            && log_text.contains(&format!("serving_cpus={serving}")),
        "{log_text}"
    );
}

#[test]
fn a_server_with_no_cpu_to_spare_is_refused_naming_the_setting_unless_it_runs_no_log() {
    let dir = tempfile::tempdir().unwrap();
    let only = my_cpus()[0];
    let out = serve_as("model", &[only], &config(dir.path()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "[prediction_log] reserved_cpus = 1: this process may run on 1 CPU ({only})"
        )) && err.contains("none"),
        "{err}"
    );
    // Refused before anything started: no log directory.
    assert!(!dir.path().join("predictions").exists());
    // A features-only server runs no log, sets nothing aside, and serves.
    let (mut child, stderr) =
        common::start_serving(serve_as("features", &[only], &config(dir.path())));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!stderr.join().unwrap().contains("reserved_cpus"));
}
