//! Small models made by trees/tests/gen_models.py with xgboost 3.2.0 and lightgbm 4.7.0:
//! every objective the crate accepts beyond the fraud models, LightGBM's missing types
//! none / zero / NaN, and rows on the edges of each rule (values equal to a threshold and
//! its f32 neighbours, 0.0, -0.0, |x| <= 1e-35, NaN, negative, fractional, unseen and huge
//! category codes). Each must match the library's own prediction within 1e-6.

use std::path::PathBuf;

use mesh_trees::Forest;

const TOLERANCE: f64 = 1e-6;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/fraud-trees/generated")
}

fn load(name: &str) -> Forest {
    let path = dir().join(name);
    if name.ends_with(".json") {
        Forest::from_xgboost_json(&std::fs::read(&path).expect("read model")).expect(name)
    } else {
        Forest::from_lightgbm_text(&std::fs::read_to_string(&path).expect("read model"))
            .expect(name)
    }
}

/// Returns (rows, expected, features, outputs).
fn csv(name: &str) -> (Vec<f32>, Vec<f64>, usize, usize) {
    let text = std::fs::read_to_string(dir().join(name)).expect("read csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let f = header.iter().filter(|h| h.starts_with('f')).count();
    let k = header.len() - f;
    let (mut rows, mut expected) = (Vec::new(), Vec::new());
    for line in lines.filter(|l| !l.is_empty()) {
        let cells: Vec<&str> = line.split(',').collect();
        for c in &cells[..f] {
            rows.push(if c.is_empty() {
                f32::NAN
            } else {
                c.parse().expect("input")
            });
        }
        for c in &cells[f..] {
            expected.push(c.parse().expect("expected"));
        }
    }
    (rows, expected, f, k)
}

fn check(model: &str, objective: &str) {
    let forest = load(model);
    assert_eq!(forest.objective(), objective);
    let stem = model.rsplit_once('.').map(|(s, _)| s).unwrap_or(model);
    let (rows, expected, f, k) = csv(&format!("{stem}.csv"));
    assert_eq!(forest.num_features(), f);
    assert_eq!(forest.num_outputs(), k);
    assert_eq!(forest.categorical_features(), &[5]);
    let n = rows.len() / f;
    assert!(n > 300, "{model}: {n} rows");
    for batch in [1usize, 13, n] {
        let mut got = vec![f32::NAN; n * k];
        for start in (0..n).step_by(batch) {
            let end = (start + batch).min(n);
            forest
                .predict(
                    &rows[start * f..end * f],
                    end - start,
                    &mut got[start * k..end * k],
                )
                .expect("predict");
        }
        for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
            let d = (f64::from(g) - e).abs();
            assert!(
                d <= TOLERANCE,
                "{model} row {} output {} batch {batch}: got {g}, library {e}",
                i / k,
                i % k
            );
        }
    }
}

#[test]
fn xgboost_logitraw_uses_base_score_as_a_margin() {
    check("xgb_logitraw.json", "binary:logitraw");
}

#[test]
fn xgboost_logistic_with_base_score() {
    check("xgb_logistic_base.json", "binary:logistic");
}

#[test]
fn xgboost_reg_logistic() {
    check("xgb_reg_logistic.json", "reg:logistic");
}

#[test]
fn xgboost_squared_error() {
    check("xgb_squarederror.json", "reg:squarederror");
}

#[test]
fn xgboost_softprob_three_classes() {
    check("xgb_softprob.json", "multi:softprob");
}

#[test]
fn lightgbm_regression_missing_type_nan() {
    check("lgb_regression.txt", "regression");
}

#[test]
fn lightgbm_binary_sigmoid_two() {
    check("lgb_binary_sigmoid2.txt", "binary sigmoid:2");
}

#[test]
fn lightgbm_missing_type_zero() {
    check("lgb_zero_as_missing.txt", "regression");
}

#[test]
fn lightgbm_missing_type_none_reads_nan_as_zero() {
    check("lgb_no_missing.txt", "regression");
}

#[test]
fn lightgbm_multiclass_three_classes() {
    check("lgb_multiclass.txt", "multiclass num_class:3");
}
