//! A `mesh` process runs without transparent huge pages unless asked
//! (`--transparent-huge-pages`, `MESH_TRANSPARENT_HUGE_PAGES`), read from the kernel
//! (`THP_enabled` in /proc/PID/status), not from our own log: a real `mesh serve`,
//! and a real `mesh features ingest` held at its file (a FIFO), which then loads
//! what it is given.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .unwrap_or_else(|| panic!("no THP_enabled in /proc/{pid}/status:\n{status}"))
        .trim()
        .to_owned()
}

/// A child inherits this process's setting: start from "on", so that "off" is the
/// child's own doing.
fn huge_pages_on_here() {
    rustix::thread::disable_transparent_huge_pages(false).unwrap();
    assert_eq!(thp_enabled(std::process::id()), "1");
}

/// `mesh serve` of the example models on any free ports, with no setting of huge
/// pages or configuration file from this process's environment.
fn mesh_serve() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mesh"));
    cmd.current_dir(common::root())
        .args([
            "serve",
            "--role",
            "model",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
        ])
        .env_remove("MESH_TRANSPARENT_HUGE_PAGES")
        .env_remove("MESH_CONFIG");
    cmd
}

/// Starts `mesh serve` (the example models, any free ports) with `extra` flags and
/// `env`, waits until it serves, and returns its `THP_enabled` and its log.
fn thp_of_a_serving_mesh(extra: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = mesh_serve();
    cmd.args(extra).envs(env.iter().copied());
    let (mut child, log) = common::start_serving(cmd);
    let thp = thp_enabled(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    (thp, log.join().unwrap())
}

#[test]
fn a_server_runs_without_transparent_huge_pages_unless_asked() {
    huge_pages_on_here();
    let (thp, log) = thp_of_a_serving_mesh(&[], &[]);
    assert_eq!(thp, "0", "off by default");
    assert!(log.contains("transparent_huge_pages=false"), "{log}");

    let (thp, log) = thp_of_a_serving_mesh(&["--transparent-huge-pages"], &[]);
    assert_eq!(thp, "1", "--transparent-huge-pages leaves them on");
    assert!(log.contains("transparent_huge_pages=true"), "{log}");

    for (value, want) in [("true", "1"), ("1", "1"), ("false", "0"), ("off", "0")] {
        let (thp, _) = thp_of_a_serving_mesh(&[], &[("MESH_TRANSPARENT_HUGE_PAGES", value)]);
        assert_eq!(thp, want, "MESH_TRANSPARENT_HUGE_PAGES={value}");
    }

    // A value that says neither is refused before anything starts.
    let out = mesh_serve()
        .env("MESH_TRANSPARENT_HUGE_PAGES", "maybe")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value 'maybe' for '--transparent-huge-pages'"),
        "{err}"
    );
}

#[test]
fn a_bulk_ingest_runs_without_transparent_huge_pages() {
    huge_pages_on_here();

    let dir = tempfile::tempdir().unwrap();
    let views = dir.path().join("views.toml");
    std::fs::write(
        &views,
        r#"
[[entities]]
name = "card"
join_key = "card_id"
key_type = "int64"

[[views]]
name = "card"
entity = "card"
max_age = "7d"
timestamp_field = "event_timestamp"
features = [{ name = "amount", type = "f32" }]
"#,
    )
    .unwrap();
    let rows = dir.path().join("rows.csv");
    let made = Command::new("mkfifo").arg(&rows).status().unwrap();
    assert!(made.success());

    let mut child = Command::new(env!("CARGO_BIN_EXE_mesh"))
        .env_remove("MESH_TRANSPARENT_HUGE_PAGES")
        .args(["features", "ingest", "--view", "card", "--store"])
        .arg(dir.path().join("db"))
        .arg("--views")
        .arg(&views)
        .arg(&rows)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until something writes the FIFO, the ingest waits in its open, after it has
    // opened the store.
    let since = Instant::now();
    loop {
        if let Some(code) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the ingest exited ({code}) before reading its file: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if thp_enabled(child.id()) == "0" {
            break;
        }
        if since.elapsed() > Duration::from_secs(20) {
            // It would wait on the FIFO for ever.
            child.kill().unwrap();
            panic!("the ingest never turned transparent huge pages off");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    {
        let mut fifo = std::fs::OpenOptions::new().write(true).open(&rows).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        write!(
            fifo,
            "card_id,event_timestamp,amount\n1,{now},2.5\n2,{now},7\n"
        )
        .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ingested 2 rows into 'card' (2 written"),
        "{stdout}"
    );
}
