#![allow(clippy::unwrap_used)]
//! The label join against small, hand-checkable logs.

use mesh_prediction_log::commands::{run_join, JoinArgs};
use mesh_prediction_log::{
    join, source, JoinOptions, LogConfig, PredictionLog, PredictionRecord, Protocol, Role,
    StageMicros,
};
use std::path::Path;

struct P {
    id: &'static str,
    version: &'static str,
    role: Role,
    score: f64,
    decision: Option<&'static str>,
    source: &'static str,
    total: u64,
}

fn p(
    id: &'static str,
    version: &'static str,
    role: Role,
    score: f64,
    decision: Option<&'static str>,
) -> P {
    P {
        id,
        version,
        role,
        score,
        decision,
        source: source::MODEL,
        total: 100,
    }
}

/// v1 primary: separated scores; v2 shadow (same requests): reversed; v3 canary: all tied.
fn predictions() -> Vec<P> {
    let mut v = vec![
        P {
            total: 100,
            ..p("a1", "1", Role::Primary, 0.9, Some("decline"))
        },
        P {
            total: 200,
            ..p("a2", "1", Role::Primary, 0.8, Some("review"))
        },
        P {
            total: 300,
            source: source::RULES,
            ..p("a3", "1", Role::Primary, 0.2, Some("review"))
        },
        P {
            total: 400,
            ..p("a4", "1", Role::Primary, 0.1, Some("approve"))
        },
        P {
            total: 500,
            source: source::DEFAULT,
            ..p("a5", "1", Role::Primary, 0.3, Some("approve"))
        },
        p("a1", "2", Role::Shadow, 0.1, None),
        p("a2", "2", Role::Shadow, 0.2, None),
        p("a3", "2", Role::Shadow, 0.8, None),
        p("a4", "2", Role::Shadow, 0.9, None),
    ];
    for (id, _) in [("c1", 1), ("c2", 0), ("c3", 1), ("c4", 0)] {
        v.push(p(id, "3", Role::Canary, 0.5, Some("review")));
    }
    v
}

const LABELS_CSV: &str = "request_id,label,note\n\
a1,1,\n a2 ,true,\n a3,0,\n a4,no,\n\
c1,1,\nc2,0,\nc3,1,\nc4,0,\n\
a1,1,dup same\na4,1,dup conflicting\n\
zz1,1,unknown\nzz2,0,unknown\n\
a5,maybe,invalid\n";

async fn write_log(dir: &Path) {
    let (log, writer) = PredictionLog::start(LogConfig::new(dir)).unwrap();
    for x in predictions() {
        let mut r = PredictionRecord::new(x.id, "fraud", x.version, x.role);
        r.entity_keys = vec![("card_id".into(), format!("card-{}", &x.id[..1]))];
        r.score = Some(x.score);
        r.decision = x.decision.map(str::to_string);
        r.source = x.source.to_string();
        r.stages = StageMicros {
            validate: 1,
            compute: 10,
            total: x.total,
            ..StageMicros::default()
        };
        log.record_wait(r).await.unwrap();
    }
    log.shutdown().await.unwrap();
    writer.join().unwrap();
}

#[tokio::test]
async fn join_metrics_and_label_anomalies() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path()).await;
    let labels = dir.path().join("labels.csv");
    std::fs::write(&labels, LABELS_CSV).unwrap();
    let r = join(dir.path(), &labels, &JoinOptions::default()).unwrap();

    assert_eq!(r.records, 13);
    assert_eq!(r.labels.rows, 13);
    assert_eq!(r.labels.distinct_keys, 10);
    assert_eq!(r.labels.duplicate_rows, 2);
    assert_eq!(r.labels.conflicting_duplicates, 1);
    assert_eq!(r.labels.invalid_rows, 1);
    assert_eq!(r.labels.unknown_keys, 2);
    assert_eq!(r.unlabelled_predictions, 1); // a5

    let keys: Vec<(&str, &str, Role)> = r
        .groups
        .iter()
        .map(|g| (g.model.as_str(), g.version.as_str(), g.role))
        .collect();
    assert_eq!(
        keys,
        [
            ("fraud", "1", Role::Primary),
            ("fraud", "2", Role::Shadow),
            ("fraud", "3", Role::Canary)
        ]
    );
    let (v1, v2, v3) = (&r.groups[0], &r.groups[1], &r.groups[2]);

    assert_eq!(
        (v1.predictions, v1.labelled, v1.positives, v1.unlabelled),
        (5, 4, 2, 1)
    );
    assert_eq!(v1.roc_auc, Some(1.0));
    assert!((v1.brier.unwrap() - 0.025).abs() < 1e-12, "{:?}", v1.brier);
    let decline = &v1.operating_points[0];
    assert_eq!(
        (decline.flagged, decline.true_positives, decline.evaluated),
        (1, 1, 4)
    );
    assert_eq!((decline.precision, decline.recall), (Some(1.0), Some(0.5)));
    let review = &v1.operating_points[1];
    assert_eq!(
        (
            review.flagged,
            review.true_positives,
            review.false_positives
        ),
        (3, 2, 1)
    );
    assert_eq!(
        (review.precision, review.recall),
        (Some(2.0 / 3.0), Some(1.0))
    );
    assert!((v1.fallback_rate - 0.4).abs() < 1e-12);
    assert_eq!(v1.sources["RULES"].count, 1);
    assert_eq!(v1.sources["DEFAULT"].count, 1);
    assert_eq!(v1.sources["MODEL"].count, 3);
    assert_eq!(
        (v1.stages["total"].p50_us, v1.stages["total"].p99_us),
        (300, 500)
    );
    assert_eq!(v1.stages["compute"].p99_us, 10);

    assert_eq!((v2.predictions, v2.labelled), (4, 4));
    assert_eq!(v2.roc_auc, Some(0.0));
    assert_eq!(
        v2.operating_points[0].evaluated, 0,
        "shadow records have no decision"
    );
    assert_eq!(v2.operating_points[0].precision, None);

    assert_eq!(v3.roc_auc, Some(0.5));
    assert_eq!(v3.operating_points[1].recall, Some(1.0));
    assert_eq!(v3.operating_points[1].precision, Some(0.5));
    assert_eq!(v3.fallback_rate, 0.0);
}

#[tokio::test]
async fn parquet_labels_give_the_same_report_and_cli_prints_json_and_text() {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path()).await;
    let csv_path = dir.path().join("labels.csv");
    std::fs::write(&csv_path, LABELS_CSV).unwrap();
    // The same labels (minus the invalid row, which Parquet's int column cannot hold).
    let rows: Vec<(&str, i64)> = vec![
        ("a1", 1),
        ("a2", 1),
        ("a3", 0),
        ("a4", 0),
        ("c1", 1),
        ("c2", 0),
        ("c3", 1),
        ("c4", 0),
        ("a1", 1),
        ("a4", 1),
        ("zz1", 1),
        ("zz2", 0),
    ];
    let batch = RecordBatch::try_from_iter([
        (
            "request_id",
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
        ),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))) as ArrayRef,
        ),
    ])
    .unwrap();
    let pq_path = dir.path().join("labels.parquet");
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&pq_path).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let from_csv = join(dir.path(), &csv_path, &JoinOptions::default()).unwrap();
    let from_pq = join(dir.path(), &pq_path, &JoinOptions::default()).unwrap();
    assert_eq!(
        serde_json::to_value(&from_csv.groups).unwrap(),
        serde_json::to_value(&from_pq.groups).unwrap()
    );
    assert_eq!(from_pq.labels.duplicate_rows, 2);
    assert_eq!(from_pq.labels.unknown_keys, 2);

    let mut args = JoinArgs {
        logs: dir.path().to_path_buf(),
        labels: csv_path.clone(),
        key: "request_id".into(),
        label: "label".into(),
        thresholds: vec![0.5],
        include_wal: false,
        protocol: None,
        json: true,
    };
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["groups"][0]["roc_auc"], 1.0);
    assert_eq!(
        v["groups"][0]["operating_points"][2]["rule"],
        "score >= 0.5"
    );
    assert_eq!(v["groups"][0]["operating_points"][2]["recall"], 1.0);
    assert_eq!(v["labels"]["unknown_keys"], 2);
    args.json = false;
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("2 unknown keys"), "{text}");
    assert!(text.contains("fraud version 2 (shadow, decide)"), "{text}");

    // A missing label column is an error that names the columns there are.
    args.label = "outcome".into();
    let err = run_join(&args, &mut Vec::new()).unwrap_err().to_string();
    assert!(
        err.contains("outcome") && err.contains("request_id"),
        "{err}"
    );
}

#[tokio::test]
async fn join_on_an_entity_key() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path()).await;
    let labels = dir.path().join("cards.csv");
    std::fs::write(&labels, "card_id,fraud\ncard-a,1\ncard-x,0\n").unwrap();
    let opts = JoinOptions {
        key: "card_id".into(),
        label: "fraud".into(),
        ..JoinOptions::default()
    };
    let r = join(dir.path(), &labels, &opts).unwrap();
    assert_eq!(r.groups[0].labelled, 5);
    assert_eq!(r.groups[0].positives, 5);
    assert_eq!(r.groups[2].labelled, 0);
    assert_eq!(r.labels.unknown_keys, 1);
}

fn has_duckdb() -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        eprintln!("SKIP: python3 with the duckdb package is not available");
    }
    has
}

/// The DuckDB check of .ci/run, run here too when python3 has the `duckdb` package.
#[tokio::test]
async fn duckdb_reads_the_same_counts_and_auc() {
    if !has_duckdb() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("log");
    write_log(&logs).await;
    let labels = dir.path().join("labels.csv");
    std::fs::write(&labels, LABELS_CSV).unwrap();
    duckdb_check(dir.path(), &logs, &labels);
}

/// Runs tests/duckdb_check.py against `mesh logs join --json` of `logs`.
fn duckdb_check(dir: &Path, logs: &Path, labels: &Path) {
    let (logs, labels) = (logs.to_path_buf(), labels.to_path_buf());
    let args = JoinArgs {
        logs: logs.clone(),
        labels: labels.clone(),
        key: "request_id".into(),
        label: "label".into(),
        thresholds: vec![],
        include_wal: false,
        protocol: None,
        json: true,
    };
    let json = dir.join("join.json");
    run_join(&args, &mut std::fs::File::create(&json).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/duckdb_check.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg("--logs")
        .arg(&logs)
        .arg("--labels")
        .arg(&labels)
        .arg("--join")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("counts and AUC match"), "{stdout}");
}

/// `mesh logs join` on a running writer: the records still in the write-ahead file
/// are counted and --include-wal is suggested; a missing --logs path is an error.
#[tokio::test]
async fn join_names_records_in_the_wal_and_refuses_a_missing_dir() {
    let dir = tempfile::tempdir().unwrap();
    let labels = dir.path().join("labels.csv");
    std::fs::write(&labels, LABELS_CSV).unwrap();
    let logs = dir.path().join("logs");
    let (log, writer) = PredictionLog::start(LogConfig::new(&logs)).unwrap();
    for i in 0..3 {
        log.record_wait(PredictionRecord::new(
            format!("w{i}"),
            "fraud",
            "1",
            Role::Primary,
        ))
        .await
        .unwrap();
    }
    assert_eq!(log.flush().await.unwrap(), 3);
    let mut args = JoinArgs {
        logs: logs.clone(),
        labels: labels.clone(),
        key: "request_id".into(),
        label: "label".into(),
        thresholds: vec![],
        include_wal: false,
        protocol: None,
        json: false,
    };
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("predictions: 0 records"), "{text}");
    assert!(
        text.contains("note: 3 records are still in the write-ahead file")
            && text.contains("add --include-wal"),
        "{text}"
    );
    args.include_wal = true;
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("predictions: 3 records"), "{text}");
    assert!(!text.contains("write-ahead"), "{text}");
    log.shutdown().await.unwrap();
    writer.join().unwrap();

    args.logs = dir.path().join("no-such-dir");
    let e = run_join(&args, &mut Vec::new()).unwrap_err().to_string();
    assert!(
        e.contains("no-such-dir") && e.contains("does not exist"),
        "{e}"
    );
}

/// Decisions and OIP calls of the same model version and role (a `mesh bench --target
/// infer` run next to live traffic) land in separate groups, and `--protocol` keeps one.
#[tokio::test]
async fn join_separates_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("log");
    let (log, writer) = PredictionLog::start(LogConfig::new(&logs)).unwrap();
    // Decisions: a1..a4, well separated. OIP gRPC: the same ids, reversed scores, 3 times
    // (a bench); OIP HTTP: one row.
    let decide = [("a1", 0.9), ("a2", 0.8), ("a3", 0.2), ("a4", 0.1)];
    for (id, s) in decide {
        let mut r = PredictionRecord::new(id, "fraud", "1", Role::Primary);
        r.score = Some(s);
        r.decision = Some("approve".into());
        log.record_wait(r).await.unwrap();
    }
    for _ in 0..3 {
        for (id, s) in decide {
            let mut r = PredictionRecord::new(id, "fraud", "1", Role::Primary);
            r.protocol = Protocol::OipGrpc;
            r.score = Some(1.0 - s);
            log.record_wait(r).await.unwrap();
        }
    }
    let mut r = PredictionRecord::new("a1", "fraud", "1", Role::Primary);
    r.protocol = Protocol::OipHttp;
    r.score = Some(0.5);
    log.record_wait(r).await.unwrap();
    log.shutdown().await.unwrap();
    writer.join().unwrap();
    let labels = dir.path().join("labels.csv");
    std::fs::write(&labels, "request_id,label\na1,1\na2,1\na3,0\na4,0\n").unwrap();

    let r = join(&logs, &labels, &JoinOptions::default()).unwrap();
    assert_eq!(r.records, 17);
    let groups: Vec<(Protocol, u64, Option<f64>)> = r
        .groups
        .iter()
        .map(|g| {
            assert_eq!(
                (g.model.as_str(), g.version.as_str(), g.role),
                ("fraud", "1", Role::Primary)
            );
            (g.protocol, g.predictions, g.roc_auc)
        })
        .collect();
    assert_eq!(
        groups,
        vec![
            (Protocol::Decide, 4, Some(1.0)),
            (Protocol::OipGrpc, 12, Some(0.0)),
            (Protocol::OipHttp, 1, None),
        ]
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["groups"][1]["protocol"], "oip_grpc");

    // --protocol keeps one.
    let mut args = JoinArgs {
        logs: logs.clone(),
        labels: labels.clone(),
        key: "request_id".into(),
        label: "label".into(),
        thresholds: vec![],
        include_wal: false,
        protocol: Some(Protocol::Decide),
        json: false,
    };
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("protocol:    decide only"), "{text}");
    assert!(text.contains("predictions: 4 records"), "{text}");
    assert!(text.contains("fraud version 1 (primary, decide)"), "{text}");
    assert!(!text.contains("oip_grpc"), "{text}");
    args.protocol = Some(Protocol::OipGrpc);
    args.json = true;
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["protocol"], "oip_grpc");
    assert_eq!(v["records"], 12);
    assert_eq!(v["groups"].as_array().unwrap().len(), 1);
    assert_eq!(v["groups"][0]["protocol"], "oip_grpc");
    assert_eq!(v["groups"][0]["labelled"], 12);
    args.protocol = None;
    let mut out = Vec::new();
    run_join(&args, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["protocol"], serde_json::Value::Null);
    assert_eq!(v["records"], 17);

    if has_duckdb() {
        duckdb_check(dir.path(), &logs, &labels);
    }
}
