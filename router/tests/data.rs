//! The repository stands alone: the reference data the tests read is in
//! tests/data (see its README), and the example model is the reference model.
mod common;

#[test]
fn the_example_model_is_the_reference_model() {
    // Both versions of the example (see examples/models/fraud_mlp/README.md).
    let reference = std::fs::read(common::reference_weights()).expect("reference weights");
    for v in [1, 2] {
        let example = std::fs::read(
            common::root().join(format!("examples/models/fraud_mlp/{v}/model.safetensors")),
        )
        .expect("example weights");
        assert_eq!(example.len(), reference.len());
        assert!(
            example == reference,
            "examples/models/fraud_mlp/{v} differs from tests/data/fraud-mlp"
        );
    }
}

#[test]
fn the_reference_rows_are_all_there() {
    let rows = common::samples();
    assert_eq!(rows.len(), 1000);
    assert!(rows
        .iter()
        .all(|(x, p)| x.len() == 32 && (0.0..=1.0).contains(p)));
    // 100 fraud rows out of 1,000: the label column is the 34th.
    let text =
        std::fs::read_to_string(common::root().join("tests/data/fraud-mlp/samples.csv")).unwrap();
    let fraud = text
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(33) == Some("1"))
        .count();
    assert_eq!(fraud, 100);
}
