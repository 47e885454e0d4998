//! `mesh features ingest --addr`: a running store (which holds the sled lock) is
//! loaded through its Push API with the writer token, in batches; the direct mode
//! on that store fails with a message that points to --addr; the timestamp unit
//! applies on this path too.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;
use common::{args, root};

use std::path::Path;

use mesh_router::config::{MeshConfig, Role};

const TOKEN: &str = "writer-token-for-the-ingest-test-0123";
/// 2025-11-30T10:53:20Z in Unix microseconds.
const T_2025: i64 = 1_764_500_000_000_000;

/// The sample CSV of feature-store/README.md ("File formats", "Sample").
fn readme_sample_csv() -> String {
    let readme = std::fs::read_to_string(root().join("feature-store/README.md")).unwrap();
    let after = readme.split_once("### Sample").unwrap().1;
    let block = after.split_once("```csv\n").unwrap().1;
    block.split_once("```").unwrap().0.to_owned()
}

/// A feature store served on loopback (the example views), Push behind a writer token.
async fn store(dir: &Path) -> mesh_router::server::Running {
    let mut cfg = MeshConfig::default();
    cfg.server.grpc_port = 0;
    cfg.server.http_port = 0;
    cfg.server.role = Role::Features;
    cfg.features.path = Some(dir.join("db"));
    cfg.features.views = Some(root().join("examples/features/views.toml"));
    let token = dir.join("writer.token");
    std::fs::write(&token, TOKEN).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    cfg.writer.token_file = Some(token);
    mesh_router::server::start_mesh(&cfg).await.unwrap()
}

/// Runs the binary with `env` set: (exit code, stdout, stderr).
async fn mesh_cli(args: Vec<String>, env: Vec<(&'static str, String)>) -> (i32, String, String) {
    common::run_mesh(args, None, env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_into_a_running_store_through_push() {
    let dir = tempfile::tempdir().unwrap();
    let running = store(dir.path()).await;
    let addr = format!("http://{}", running.grpc_addr);
    let token_file = dir.path().join("writer.token").display().to_string();
    let merchants = dir.path().join("merchants.csv");
    std::fs::write(&merchants, readme_sample_csv()).unwrap();
    let merchants = merchants.display().to_string();

    // The README's sample, two rows per Push.
    let (code, out, err) = mesh_cli(
        args(&[
            "features",
            "ingest",
            "--addr",
            &addr,
            "--token-file",
            &token_file,
            "--view",
            "merchant",
            "--batch-rows",
            "2",
            &merchants,
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "ingested 4 rows into 'merchant' through {addr} (4 written, 0 skipped as older, 2 batches)"
        )),
        "{out}"
    );
    // Read back through the same mesh.
    let (code, out, err) = mesh_cli(
        args(&[
            "features", "get", "--addr", &addr, "--view", "merchant", "--key", "m000001", "--key",
            "m000004", "--json",
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let feature = |row: usize, name: &str| {
        v[row]["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == format!("merchant:{name}"))
            .cloned()
            .unwrap()
    };
    assert_eq!(feature(0, "txn_count_24h")["value"], 340);
    assert_eq!(
        feature(0, "txn_count_24h")["event_time_unix_micros"],
        T_2025
    );
    assert_eq!(feature(0, "is_high_risk_mcc")["value"], false);
    // (The rows are a year old: OUTSIDE_MAX_AGE, which the API answers for every
    // feature of a stale row, so the null risk_tier of m000004 cannot be told
    // apart here; the feature-store tests check it.)
    assert_eq!(feature(1, "avg_ticket_30d")["value"], 12.75);
    assert_eq!(
        feature(1, "risk_tier")["event_time_unix_micros"],
        T_2025 + 250_000
    );

    // Re-running is harmless: every row is at most as new as the stored one.
    let (code, out, err) = mesh_cli(
        args(&[
            "features", "ingest", "--addr", &addr, "--view", "merchant", &merchants,
        ]),
        vec![("MESH_WRITER_TOKEN", TOKEN.to_owned())],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("ingested 4 rows") && out.contains("1 batches"),
        "{out}"
    );

    // No token: refused by the writer plane, and the message says how to give one.
    let (code, out, err) = mesh_cli(
        args(&[
            "features", "ingest", "--addr", &addr, "--view", "merchant", &merchants,
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("--token-file") && err.contains("MESH_WRITER_TOKEN"),
        "{err}"
    );
    assert!(!err.contains("stack backtrace"), "{err}");

    // Millisecond epochs: refused as far future when read as seconds, in 2025 with
    // --timestamp-unit ms.
    let cards = dir.path().join("cards.csv");
    std::fs::write(
        &cards,
        "card_id,event_timestamp,txn_count_1h\n1,1764500000000,3\n",
    )
    .unwrap();
    let cards = cards.display().to_string();
    let (code, _, err) = ingest_cards(&addr, &token_file, &cards, &[]).await;
    assert_eq!(code, 1);
    assert!(err.contains("max_future_skew"), "{err}");
    let (code, out, err) =
        ingest_cards(&addr, &token_file, &cards, &["--timestamp-unit", "ms"]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let v = &txn_count_1h(&addr, &[1]).await[0];
    assert_eq!(v["event_time_unix_micros"], T_2025, "{v}");
    assert_eq!(v["value"], 3, "{v}");

    // The direct mode on the store the mesh holds: locked, and the message says
    // to go through the mesh.
    let db = dir.path().join("db").display().to_string();
    let views = root()
        .join("examples/features/views.toml")
        .display()
        .to_string();
    let (code, _, err) = mesh_cli(
        args(&[
            "features", "ingest", "--store", &db, "--views", &views, "--view", "merchant",
            &merchants,
        ]),
        vec![],
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("locked") && err.contains("--addr"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    running.shutdown().await;
}

/// `features ingest --addr` of `file` into the `card` view with the writer token,
/// missing columns allowed, `extra` arguments added: (exit code, stdout, stderr).
async fn ingest_cards(
    addr: &str,
    token_file: &str,
    file: &str,
    extra: &[&str],
) -> (i32, String, String) {
    let mut a = args(&[
        "features",
        "ingest",
        "--addr",
        addr,
        "--token-file",
        token_file,
        "--view",
        "card",
        "--allow-missing-columns",
    ]);
    a.extend(args(extra));
    a.push(file.to_owned());
    mesh_cli(a, vec![]).await
}

/// `features get --json` of cards `keys`: each card's `txn_count_1h` feature (its
/// value, event time and status).
async fn txn_count_1h(addr: &str, keys: &[i64]) -> Vec<serde_json::Value> {
    let mut a = args(&[
        "features",
        "get",
        "--addr",
        addr,
        "--view",
        "card",
        "--feature",
        "txn_count_1h",
        "--json",
    ]);
    for k in keys {
        a.extend(args(&["--key", &k.to_string()]));
    }
    let (code, out, err) = mesh_cli(a, vec![]).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (0..keys.len())
        .map(|i| v[i]["features"][0].clone())
        .collect()
}

/// The values of [`txn_count_1h`].
async fn txn_counts(addr: &str, keys: &[i64]) -> Vec<serde_json::Value> {
    txn_count_1h(addr, keys)
        .await
        .into_iter()
        .map(|f| f["value"].clone())
        .collect()
}

/// One minute ago in Unix seconds: an event time the card view holds fresh.
fn minute_ago() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 60
}

/// `name` in `dir`: a CSV of the card view's `txn_count_1h`, one line per (card,
/// event time in Unix seconds, count as written); its path.
fn txn_count_csv(
    dir: &Path,
    name: &str,
    lines: impl IntoIterator<Item = (i64, u64, String)>,
) -> String {
    let mut csv = String::from("card_id,event_timestamp,txn_count_1h\n");
    for (card, t, count) in lines {
        csv.push_str(&format!("{card},{t},{count}\n"));
    }
    let path = dir.join(name);
    std::fs::write(&path, csv).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_in_flight_keep_the_files_order_and_name_a_refused_batch() {
    let dir = tempfile::tempdir().unwrap();
    let running = store(dir.path()).await;
    let addr = format!("http://{}", running.grpc_addr);
    let token_file = dir.path().join("writer.token").display().to_string();
    let now = minute_ago();

    // 100 batches of 4 rows at the same event time; batch b holds cards 1000+b to
    // 1000+b+3, so each card is in up to four batches in a row, and must end with its
    // last line (the later write wins), as a direct ingest leaves it: a batch that
    // holds a key of a push in flight waits for it.
    let same = txn_count_csv(
        dir.path(),
        "same.csv",
        (0..400).map(|i| (1000 + i / 4 + i % 4, now, i.to_string())),
    );
    let (code, out, err) = ingest_cards(
        &addr,
        &token_file,
        &same,
        &["--batch-rows", "4", "--pushes-in-flight", "4"],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("ingested 400 rows")
            && out.contains("(400 written, 0 skipped as older, 100 batches)"),
        "{out}"
    );
    let cards: Vec<i64> = (0..=102).collect();
    let last_line = |k: i64| {
        let b = k.min(99);
        4 * b + (k - b)
    };
    let want: Vec<serde_json::Value> = cards.iter().map(|&k| last_line(k).into()).collect();
    let keys: Vec<i64> = cards.iter().map(|k| 1000 + k).collect();
    assert_eq!(txn_counts(&addr, &keys).await, want);

    // Disjoint batches, the third refused (an event time a day ahead): the message
    // names its first row, and the batches before it are stored.
    let refused = txn_count_csv(
        dir.path(),
        "refused.csv",
        (0..40i64).map(|i| {
            let t = if i == 9 { now + 86_400 } else { now };
            (100 + i, t, (1000 + i).to_string())
        }),
    );
    let (code, out, err) = ingest_cards(
        &addr,
        &token_file,
        &refused,
        &["--batch-rows", "4", "--pushes-in-flight", "3"],
    )
    .await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("the Push of the batch from data row 9 failed: InvalidArgument")
            && err.contains("max_future_skew")
            && err.contains("the batches before it are written"),
        "{err}"
    );
    assert_eq!(
        txn_counts(&addr, &[100, 107]).await,
        [1000, 1007],
        "the two batches before the refused one"
    );

    // A bad line in the file's third batch, with pushes in flight: the ingest stops
    // naming the line, after the pushes already sent were answered; the batches
    // before it are stored.
    let bad = txn_count_csv(
        dir.path(),
        "bad.csv",
        (0..40i64).map(|i| {
            let count = if i == 9 {
                "many".to_owned()
            } else {
                (2000 + i).to_string()
            };
            (200 + i, now, count)
        }),
    );
    let (code, out, err) = ingest_cards(
        &addr,
        &token_file,
        &bad,
        &["--batch-rows", "4", "--pushes-in-flight", "3"],
    )
    .await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("line 11") && err.contains("many"), "{err}");
    assert_eq!(
        txn_counts(&addr, &[200, 207]).await,
        [2000, 2007],
        "the two batches before the bad line"
    );

    // The setting's bounds, checked before anything is read.
    for bad in ["0", "17"] {
        let (code, _, err) = ingest_cards(
            &addr,
            &token_file,
            &same,
            &["--batch-rows", "4", "--pushes-in-flight", bad],
        )
        .await;
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("--pushes-in-flight") && err.contains("1..=16"),
            "{err}"
        );
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_per_second_spreads_the_pushes_over_time() {
    let dir = tempfile::tempdir().unwrap();
    let running = store(dir.path()).await;
    let addr = format!("http://{}", running.grpc_addr);
    let token_file = dir.path().join("writer.token").display().to_string();
    let now = minute_ago();
    let file = txn_count_csv(
        dir.path(),
        "paced.csv",
        (0..400i64).map(|i| (3000 + i, now, i.to_string())),
    );
    // 4 batches of 100 rows at 400 rows a second: the last is sent 0.75 s after the
    // first.
    let start = std::time::Instant::now();
    let (code, out, err) = ingest_cards(
        &addr,
        &token_file,
        &file,
        &["--batch-rows", "100", "--rows-per-second", "400"],
    )
    .await;
    let paced = start.elapsed();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("(400 written, 0 skipped as older, 4 batches)"),
        "{out}"
    );
    assert!(
        paced >= std::time::Duration::from_millis(750),
        "400 rows at 400 rows/s took {paced:?}"
    );
    assert_eq!(txn_counts(&addr, &[3000, 3399]).await, [0, 399]);

    // Without --addr there is nothing to pace; 0 is refused.
    for extra in [
        &["--rows-per-second", "0"][..],
        &["--store", "db2", "--rows-per-second", "10"][..],
    ] {
        let mut a = args(&["features", "ingest", "--view", "card"]);
        a.extend(args(extra));
        a.push(file.clone());
        let (code, _, err) = mesh_cli(a, vec![]).await;
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains("--rows-per-second"), "{extra:?}: {err}");
    }
    running.shutdown().await;
}
