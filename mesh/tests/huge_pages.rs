//! `mesh features ingest` into a store turns transparent huge pages off for its
//! process, read from the kernel (`THP_enabled` in /proc/PID/status) while a real
//! ingest waits for its file (a FIFO), and the ingest then loads what it is given.
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

#[test]
fn a_bulk_ingest_runs_without_transparent_huge_pages() {
    // The child inherits this process's setting: start from "on", so that "off" is
    // the ingest's own doing.
    rustix::thread::disable_transparent_huge_pages(false).unwrap();
    assert_eq!(thp_enabled(std::process::id()), "1");

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
