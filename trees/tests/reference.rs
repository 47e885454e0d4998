//! The reference models reproduce each library's probability on 1,000 holdout rows
//! within 1e-6, one row at a time and in batches (tests/data/fraud-trees, see
//! tests/data/README.md).

use std::path::PathBuf;

use mesh_trees::{Forest, ModelFormat};

const TOLERANCE: f64 = 1e-6;
const FEATURES: usize = 34;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/fraud-trees")
}

struct Samples {
    rows: Vec<f32>,
    xgb: Vec<f64>,
    lgbm: Vec<f64>,
    n: usize,
}

fn samples() -> Samples {
    let text = std::fs::read_to_string(data_dir().join("samples.csv")).expect("samples.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(header.len(), 1 + FEATURES + 3, "header {header:?}");
    assert_eq!(header[1], "f0");
    assert_eq!(header[33], "mcc");
    assert_eq!(header[34], "country");
    assert_eq!(header[36], "xgb_proba");
    assert_eq!(header[37], "lgbm_proba");
    let (mut rows, mut xgb, mut lgbm) = (Vec::new(), Vec::new(), Vec::new());
    for line in lines.filter(|l| !l.is_empty()) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        for c in &cells[1..=FEATURES] {
            rows.push(if c.is_empty() {
                f32::NAN
            } else {
                c.parse().expect("feature")
            });
        }
        xgb.push(cells[36].parse().expect("xgb_proba"));
        lgbm.push(cells[37].parse().expect("lgbm_proba"));
    }
    let n = xgb.len();
    Samples { rows, xgb, lgbm, n }
}

fn xgb() -> Forest {
    let bytes = std::fs::read(data_dir().join("fraud_xgb.json")).expect("fraud_xgb.json");
    Forest::from_xgboost_json(&bytes).expect("load xgboost")
}

fn lgbm() -> Forest {
    let text = std::fs::read_to_string(data_dir().join("fraud_lgbm.txt")).expect("fraud_lgbm.txt");
    Forest::from_lightgbm_text(&text).expect("load lightgbm")
}

/// Checks every row, one at a time and in batches of each size in `batches`.
fn check(forest: &Forest, s: &Samples, expected: &[f64], name: &str) {
    assert_eq!(s.n, 1000);
    let mut worst = 0.0f64;
    for batch in [1usize, 7, 64, 1000] {
        let mut got = vec![f32::NAN; s.n];
        for start in (0..s.n).step_by(batch) {
            let end = (start + batch).min(s.n);
            forest
                .predict(
                    &s.rows[start * FEATURES..end * FEATURES],
                    end - start,
                    &mut got[start..end],
                )
                .expect("predict");
        }
        for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
            let d = (f64::from(g) - e).abs();
            assert!(
                d <= TOLERANCE,
                "{name} row {i} batch {batch}: got {g}, library {e}, diff {d:e}"
            );
            worst = worst.max(d);
        }
    }
    eprintln!("{name}: worst absolute difference {worst:e}");
}

#[test]
fn xgboost_reproduces_library_probabilities() {
    let s = samples();
    let f = xgb();
    assert_eq!(f.format(), ModelFormat::XGBoost);
    assert_eq!(f.num_features(), FEATURES);
    assert_eq!(f.num_trees(), 300);
    assert_eq!(f.num_outputs(), 1);
    assert_eq!(f.objective(), "binary:logistic");
    assert_eq!(f.categorical_features(), &[32, 33]);
    assert_eq!(f.feature_names()[32], "mcc");
    assert!(f.handles_missing());
    check(&f, &s, &s.xgb, "xgboost");
}

#[test]
fn xgboost_ubjson_reproduces_library_probabilities_like_its_json() {
    let s = samples();
    let bytes = std::fs::read(data_dir().join("fraud_xgb.ubj")).expect("fraud_xgb.ubj");
    let f = Forest::from_xgboost_ubjson(&bytes).expect("load xgboost ubjson");
    let json = xgb();
    assert_eq!(f.num_trees(), 300);
    assert_eq!(f.objective(), "binary:logistic");
    assert_eq!(f.categorical_features(), &[32, 33]);
    assert_eq!(f.feature_names(), json.feature_names());
    check(&f, &s, &s.xgb, "xgboost ubjson");
    // The same bits as the JSON model, row by row.
    let (mut a, mut b) = (vec![0f32; s.n], vec![0f32; s.n]);
    f.predict(&s.rows, s.n, &mut a).expect("ubjson");
    json.predict(&s.rows, s.n, &mut b).expect("json");
    assert_eq!(a, b);
    // The JSON loader refuses the binary file and the binary loader the JSON one.
    assert!(Forest::from_xgboost_json(&bytes).is_err());
    let text = std::fs::read(data_dir().join("fraud_xgb.json")).expect("fraud_xgb.json");
    let e = Forest::from_xgboost_ubjson(&text).unwrap_err().to_string();
    assert!(e.contains("UBJSON"), "{e}");
    // A truncated file is refused, not half-loaded.
    let e = Forest::from_xgboost_ubjson(&bytes[..bytes.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(e.contains("UBJSON") && e.contains("offset"), "{e}");
}

#[test]
fn lightgbm_reproduces_library_probabilities() {
    let s = samples();
    let f = lgbm();
    assert_eq!(f.format(), ModelFormat::LightGBM);
    assert_eq!(f.num_features(), FEATURES);
    assert_eq!(f.num_trees(), 300);
    assert_eq!(f.num_outputs(), 1);
    assert_eq!(f.objective(), "binary sigmoid:1");
    assert_eq!(f.categorical_features(), &[32, 33]);
    check(&f, &s, &s.lgbm, "lightgbm");
}

#[test]
fn the_samples_exercise_missing_values_and_categories() {
    // Guards the test data itself: without NaN cells or varied codes the checks above
    // would not cover the missing and categorical rules.
    let s = samples();
    let nan_rows = s
        .rows
        .chunks(FEATURES)
        .filter(|r| r.iter().any(|x| x.is_nan()))
        .count();
    assert!(nan_rows > 100, "only {nan_rows} rows have a missing value");
    let mut mcc: Vec<i64> = s.rows.chunks(FEATURES).map(|r| r[32] as i64).collect();
    mcc.sort_unstable();
    mcc.dedup();
    assert!(mcc.len() >= 40, "only {} distinct mcc codes", mcc.len());
    let fraud = s.xgb.iter().filter(|&&p| p > 0.5).count();
    assert!(fraud > 10 && fraud < 990, "{fraud} rows above 0.5");
}

#[test]
fn shapes_are_checked() {
    let f = xgb();
    let rows = vec![0.0f32; 2 * FEATURES];
    let mut out = vec![0.0f32; 2];
    assert!(f.predict(&rows[..FEATURES + 1], 1, &mut out[..1]).is_err());
    assert!(f.predict(&rows, 2, &mut out[..1]).is_err());
    assert!(f.predict(&rows, usize::MAX, &mut out).is_err());
    f.predict(&rows, 2, &mut out).expect("two rows");
    assert_eq!(out[0], out[1]);
    f.predict(&[], 0, &mut []).expect("no rows");
}
