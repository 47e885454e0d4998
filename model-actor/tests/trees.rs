//! The reference tree models (tests/data/fraud-trees, see tests/data/README.md) through
//! the whole actor path, kinds `xgboost` and `lightgbm`: every row of samples.csv
//! reproduces each library's probability within 1e-6, one row per request and in
//! batches; NaN and category codes follow model.toml's column declarations; a
//! model.toml that disagrees with the model file is refused at load while the old
//! version keeps serving.
#![allow(clippy::unwrap_used)]

mod common;
use common::{infer_rows, root};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mesh_model_actor::config::ColumnRules;
use mesh_model_actor::{ActorSystem, ModelError, ModelRepository, VersionHandle};

const TOLERANCE: f64 = 1e-6;
const FEATURES: usize = 34;

fn data_dir() -> PathBuf {
    root().join("tests/data/fraud-trees")
}

struct Samples {
    /// Row-major, NaN = missing.
    rows: Vec<Vec<f32>>,
    xgb: Vec<f64>,
    lgbm: Vec<f64>,
}

fn samples() -> Samples {
    let text = std::fs::read_to_string(data_dir().join("samples.csv")).expect("samples.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(header[33], "mcc");
    assert_eq!(header[34], "country");
    assert_eq!(header[36], "xgb_proba");
    assert_eq!(header[37], "lgbm_proba");
    let mut s = Samples {
        rows: Vec::new(),
        xgb: Vec::new(),
        lgbm: Vec::new(),
    };
    for line in lines.filter(|l| !l.is_empty()) {
        let cells: Vec<&str> = line.split(',').collect();
        s.rows.push(
            cells[1..=FEATURES]
                .iter()
                .map(|c| {
                    if c.is_empty() {
                        f32::NAN
                    } else {
                        c.parse().expect("feature")
                    }
                })
                .collect(),
        );
        s.xgb.push(cells[36].parse().expect("xgb_proba"));
        s.lgbm.push(cells[37].parse().expect("lgbm_proba"));
    }
    assert_eq!(s.rows.len(), 1000);
    s
}

/// (model name, file in the version directory, reference file, kind)
const MODELS: [(&str, &str, &str); 2] = [
    ("fraud_xgb", "model.json", "fraud_xgb.json"),
    ("fraud_lgbm", "model.txt", "fraud_lgbm.txt"),
];

/// Writes `<dst>/<name>/` from the example model.toml (with `edit` applied) and the
/// reference model file as each of `versions`.
fn write_model(dst: &Path, name: &str, versions: &[u64], edit: impl Fn(String) -> String) {
    let (_, file, reference) = MODELS
        .iter()
        .find(|m| m.0 == name)
        .copied()
        .expect("known model");
    let m = dst.join(name);
    let toml = std::fs::read_to_string(root().join(format!("examples/models/{name}/model.toml")))
        .expect("example model.toml");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("model.toml"), edit(toml)).unwrap();
    for v in versions {
        std::fs::create_dir_all(m.join(v.to_string())).unwrap();
        std::fs::copy(data_dir().join(reference), m.join(format!("{v}/{file}"))).unwrap();
    }
}

async fn infer(h: &VersionHandle, rows: &[Vec<f32>]) -> Result<Vec<f32>, ModelError> {
    infer_rows(h, rows, FEATURES).await
}

#[test]
fn the_examples_are_the_reference_files() {
    for (name, file, reference) in MODELS {
        let example = std::fs::read(root().join(format!("examples/models/{name}/1/{file}")))
            .expect("example model file");
        let want = std::fs::read(data_dir().join(reference)).unwrap();
        assert!(
            example == want,
            "examples/models/{name}/1/{file} differs from {reference}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_reproduces_the_library_one_row_and_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ..) in MODELS {
        // Room for a 1,000-row request; the example's other settings as they are.
        write_model(dir.path(), name, &[1], |t| {
            t.replace("max_batch_size = 64", "max_batch_size = 1000")
        });
    }
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load_all().await.unwrap();
    let s = Arc::new(samples());
    for (name, ..) in MODELS {
        let want = |i: usize| {
            if name == "fraud_xgb" {
                s.xgb[i]
            } else {
                s.lgbm[i]
            }
        };
        let h = repo.get(name, None).unwrap();
        assert_eq!(h.config.batching.max_batch_size.get(), 1000);

        // One row per request, all in flight at once: the batcher combines callers.
        let mut tasks = Vec::new();
        for i in 0..s.rows.len() {
            let (h, s) = (h.clone(), s.clone());
            tasks.push(tokio::spawn(async move {
                infer(&h, std::slice::from_ref(&s.rows[i])).await.unwrap()[0]
            }));
        }
        let mut worst = 0f64;
        for (i, t) in tasks.into_iter().enumerate() {
            let got = t.await.unwrap();
            worst = worst.max((f64::from(got) - want(i)).abs());
        }
        assert!(
            worst <= TOLERANCE,
            "{name} one row per request: max abs error {worst}"
        );

        // Requests of 7, 64 and 1,000 rows (the last chunk of each size is shorter).
        for size in [7usize, 64, 1000] {
            let mut worst = 0f64;
            for (c, chunk) in s.rows.chunks(size).enumerate() {
                let out = infer(&h, chunk).await.unwrap();
                for (j, got) in out.iter().enumerate() {
                    worst = worst.max((f64::from(*got) - want(c * size + j)).abs());
                }
            }
            assert!(
                worst <= TOLERANCE,
                "{name} batches of {size}: max abs error {worst}"
            );
        }
        println!("{name}: within {TOLERANCE} on all 1,000 rows");
    }
    system.stop();
}

/// An xgboost model file named `*.ubj` is read as XGBoost's UBJSON and serves the same
/// probabilities as the JSON file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xgboost_ubj_file_serves_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), "fraud_xgb", &[1], |t| {
        t.replace("file = \"model.json\"", "file = \"model.ubj\"")
    });
    let v1 = dir.path().join("fraud_xgb/1");
    std::fs::remove_file(v1.join("model.json")).unwrap();
    std::fs::copy(data_dir().join("fraud_xgb.ubj"), v1.join("model.ubj")).unwrap();
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load_all().await.unwrap();
    let h = repo.get("fraud_xgb", None).unwrap();
    let s = samples();
    let mut worst = 0f64;
    for (c, chunk) in s.rows.chunks(64).enumerate() {
        for (j, got) in infer(&h, chunk).await.unwrap().iter().enumerate() {
            worst = worst.max((f64::from(*got) - s.xgb[c * 64 + j]).abs());
        }
    }
    assert!(worst <= TOLERANCE, "ubj: max abs error {worst}");
    system.stop();
}

/// Requests of more rows than `max_batch_size` are refused; the example's own limit
/// (64) serves the 1,000 rows split into requests of at most 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_config_serves_the_rows_split_by_max_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ..) in MODELS {
        write_model(dir.path(), name, &[1], |t| t);
    }
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load_all().await.unwrap();
    let s = samples();
    for (name, ..) in MODELS {
        let h = repo.get(name, None).unwrap();
        let max = h.config.batching.max_batch_size.get();
        assert_eq!(max, 64);
        let err = infer(&h, &s.rows[..max + 1]).await.unwrap_err();
        assert!(matches!(err, ModelError::InvalidInput(_)), "{err}");
        let want = if name == "fraud_xgb" { &s.xgb } else { &s.lgbm };
        let mut got = Vec::new();
        for chunk in s.rows.chunks(max) {
            got.extend(infer(&h, chunk).await.unwrap());
        }
        let worst = got
            .iter()
            .zip(want)
            .map(|(g, w)| (f64::from(*g) - w).abs())
            .fold(0.0, f64::max);
        assert!(worst <= TOLERANCE, "{name}: max abs error {worst}");
    }
    system.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_and_category_codes_follow_the_column_declarations() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ..) in MODELS {
        write_model(dir.path(), name, &[1], |t| t);
    }
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load_all().await.unwrap();
    let s = samples();
    let base = s.rows[0].clone();
    let with = |c: usize, x: f32| {
        let mut r = base.clone();
        r[c] = x;
        vec![base.clone(), r]
    };
    for (name, ..) in MODELS {
        let h = repo.get(name, None).unwrap();
        // Declared missing (f4, f9, f20): NaN accepted and answered.
        for c in [4, 9, 20] {
            let out = infer(&h, &with(c, f32::NAN)).await.unwrap();
            assert!(
                out.iter().all(|p| (0.0..=1.0).contains(p)),
                "{name}: {out:?}"
            );
        }
        // mcc and country (32, 33): fraud_xgb declares them missing too (a decision
        // sends an unseen category as NaN), fraud_lgbm does not.
        let declared = |c: usize| h.config.columns.column(c) & ColumnRules::MISSING != 0;
        assert_eq!(declared(32) && declared(33), name == "fraud_xgb", "{name}");
        for c in [32, 33].into_iter().filter(|&c| declared(c)) {
            let out = infer(&h, &with(c, f32::NAN)).await.unwrap();
            assert!(out[1].is_finite(), "{name}: {out:?}");
        }
        // Every other column: NaN refused, naming the row and the column.
        for c in [0, 5, 31, 32, 33].into_iter().filter(|&c| !declared(c)) {
            match infer(&h, &with(c, f32::NAN)).await {
                Err(ModelError::InvalidInput(m)) => {
                    assert!(
                        m.contains(&format!("row 1 column {c}")) && m.contains("NaN"),
                        "{m}"
                    )
                }
                other => panic!("{name}: NaN in column {c}: {other:?}"),
            }
        }
        // Infinity: refused everywhere, missing columns included.
        for c in [0, 4, 32] {
            for x in [f32::INFINITY, f32::NEG_INFINITY] {
                match infer(&h, &with(c, x)).await {
                    Err(ModelError::InvalidInput(m)) => {
                        assert!(m.contains(&format!("row 1 column {c}")), "{m}")
                    }
                    other => panic!("{name}: {x} in column {c}: {other:?}"),
                }
            }
        }
        // Categorical (mcc 32, country 33): an integer code 0..2^24-1, nothing else.
        for c in [32, 33] {
            for bad in [-1.0, 2.5, -0.5, 16_777_216.0, 1e30] {
                match infer(&h, &with(c, bad)).await {
                    Err(ModelError::InvalidInput(m)) => assert!(
                        m.contains(&format!("row 1 column {c}")) && m.contains("categorical"),
                        "{m}"
                    ),
                    other => panic!("{name}: {bad} in column {c}: {other:?}"),
                }
            }
            // An unseen but valid code is answered (the trees' rule for unseen codes).
            let out = infer(&h, &with(c, 1000.0)).await.unwrap();
            assert!(out[1].is_finite());
        }
        // A fractional value in a numeric column is fine.
        infer(&h, &with(3, 0.25)).await.unwrap();
    }
    system.stop();
}

/// Each refusal names what disagrees; version 1 keeps serving every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_toml_that_disagrees_with_the_file_is_refused_and_the_old_version_serves() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ..) in MODELS {
        write_model(dir.path(), name, &[1], |t| t);
    }
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    repo.load_all().await.unwrap();
    let s = samples();
    let cases: [Case; 6] = [
        (
            "width",
            |t| t.replace("dims = [34]", "dims = [35]"),
            &["34 features", "dims [35]"],
        ),
        (
            // Refused when model.toml is parsed: the declared columns do not fit.
            "narrow",
            |t| t.replace("dims = [34]", "dims = [33]"),
            &["column 33", "33 columns"],
        ),
        (
            "categorical",
            |t| t.replace("categorical = [32, 33]", "categorical = [32]"),
            &["categorical", "[32, 33]", "[32]"],
        ),
        (
            "no categorical",
            |t| t.replace("categorical = [32, 33]", "categorical = []"),
            &["categorical", "[32, 33]", "[]"],
        ),
        (
            "outputs",
            |t| t.replace("dims = [1]", "dims = [2]"),
            &["1 value(s) per row", "dims [2]"],
        ),
        (
            "file",
            |t| {
                t.replace("[trees]\nfile = ", "[trees]\nfile = \"other\"\n# ")
                    .to_string()
            },
            &["2/other"],
        ),
    ];
    for (name, ..) in MODELS {
        let m = dir.path().join(name);
        let good = std::fs::read_to_string(m.join("model.toml")).unwrap();
        for (case, edit, named) in &cases {
            write_model(dir.path(), name, &[2], edit);
            let err = repo.load(name).await.unwrap_err().to_string();
            for n in *named {
                assert!(
                    err.contains(n),
                    "{name} {case}: {err:?} does not name {n:?}"
                );
            }
            if err.starts_with("loading") {
                assert!(
                    !err.contains(&dir.path().display().to_string()),
                    "the message shows the host path: {err}"
                );
            }
            let h = repo.get(name, None).unwrap();
            assert_eq!(h.version, 1, "{name} {case}");
            let out = infer(&h, &s.rows[..3]).await.unwrap();
            assert!(out.iter().all(|p| p.is_finite()));
            std::fs::remove_dir_all(m.join("2")).unwrap();
        }
        // The other library's file under this kind: refused by the parser.
        std::fs::write(m.join("model.toml"), &good).unwrap();
        std::fs::create_dir_all(m.join("2")).unwrap();
        let (wrong, file) = if name == "fraud_xgb" {
            ("fraud_lgbm.txt", "model.json")
        } else {
            ("fraud_xgb.json", "model.txt")
        };
        std::fs::copy(data_dir().join(wrong), m.join("2").join(file)).unwrap();
        let err = repo.load(name).await.unwrap_err().to_string();
        assert!(err.contains(&format!("2/{file}")), "{err}");
        assert_eq!(repo.get(name, None).unwrap().version, 1);
        std::fs::remove_dir_all(m.join("2")).unwrap();
    }
    // And a good version 2 swaps in.
    write_model(dir.path(), "fraud_xgb", &[2], |t| t);
    assert_eq!(repo.load("fraud_xgb").await.unwrap(), vec![2]);
    assert_eq!(repo.get("fraud_xgb", None).unwrap().version, 2);
    system.stop();
}

/// A refusal case: its name, the edit to model.toml, and what the error must say.
type Case = (&'static str, fn(String) -> String, &'static [&'static str]);
