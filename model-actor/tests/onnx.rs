//! Kind `onnx`: the scikit-learn fraud MLP exported to ONNX
//! (tests/data/fraud-mlp/fraud_mlp.onnx), run by ONNX Runtime through the actor path,
//! reproduces `expected_proba` of samples.csv within 1e-5 on every row, one row per
//! request and in batches; a model.toml that disagrees with the model is refused at
//! load while the old version keeps serving.
//!
//! ONNX Runtime is loaded at run time from `ORT_DYLIB_PATH` (scripts/test sets it to
//! the onnxruntime wheel in the test venv). Without it these tests fail, saying how to
//! set it; they never skip.
#![allow(clippy::unwrap_used)] // a test fails loudly on the first surprise
mod common;
use common::*;

use std::path::Path;

use mesh_model_actor::{ActorSystem, ModelError, ModelRepository, VersionHandle};

const NAME: &str = "fraud_onnx";

/// Writes `<dst>/fraud_onnx/` from the example model.toml (with `edit` applied) and
/// the reference ONNX file as each of `versions`.
fn write_model(dst: &Path, versions: &[u64], edit: impl Fn(String) -> String) {
    let m = dst.join(NAME);
    let toml = std::fs::read_to_string(root().join("examples/models-onnx/fraud_onnx/model.toml"))
        .expect("example model.toml");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("model.toml"), edit(toml)).unwrap();
    for v in versions {
        std::fs::create_dir_all(m.join(v.to_string())).unwrap();
        std::fs::copy(
            reference_dir().join("fraud_mlp.onnx"),
            m.join(format!("{v}/model.onnx")),
        )
        .unwrap();
    }
}

/// Loads the repository; a missing ONNX Runtime fails the test with how to set it.
async fn load_all(repo: &ModelRepository) {
    if let Err(e) = repo.load_all().await {
        panic!(
            "{e}\n\nThese tests need ONNX Runtime: set ORT_DYLIB_PATH to libonnxruntime.so, e.g. \
             from the onnxruntime wheel (pip install -r tests/e2e/requirements.txt):\n  \
             export ORT_DYLIB_PATH=$(ls $(python -c 'import onnxruntime, os; \
             print(os.path.dirname(onnxruntime.__file__))')/capi/libonnxruntime.so*)\n\
             scripts/test sets it. ORT_DYLIB_PATH is now {:?}.",
            std::env::var_os("ORT_DYLIB_PATH")
        );
    }
}

async fn infer(h: &VersionHandle, rows: &[&[f32]]) -> Result<Vec<f32>, ModelError> {
    infer_rows(h, rows, 32).await
}

#[test]
fn the_example_is_the_reference_file() {
    let example =
        std::fs::read(root().join("examples/models-onnx/fraud_onnx/1/model.onnx")).unwrap();
    let want = std::fs::read(reference_dir().join("fraud_mlp.onnx")).unwrap();
    assert!(
        example == want,
        "examples/models-onnx/fraud_onnx/1/model.onnx differs from fraud_mlp.onnx"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_reproduces_expected_proba_one_row_and_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &[1], |t| t);
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    load_all(&repo).await;
    let h = repo.get(NAME, None).unwrap();
    assert_eq!(h.version, 1);
    let rows = samples();
    assert_eq!(rows.len(), 1000);

    // One row per request, all in flight at once: the batcher forms batches out of
    // separate callers.
    let mut tasks = Vec::new();
    for (x, want) in rows.clone() {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let out = infer(&h, &[&x]).await.unwrap();
            (out[0], want)
        }));
    }
    let mut worst = 0f32;
    for t in tasks {
        let (got, want) = t.await.unwrap();
        worst = worst.max((got - want).abs());
    }
    assert!(worst <= 1e-5, "one row per request: max abs error {worst}");

    // Batches of several sizes, one request each.
    for size in [2usize, 7, 32, 64] {
        let mut worst = 0f32;
        for chunk in rows.chunks(size) {
            let x: Vec<&[f32]> = chunk.iter().map(|(x, _)| x.as_slice()).collect();
            let out = infer(&h, &x).await.unwrap();
            assert_eq!(out.len(), chunk.len());
            for (got, (_, want)) in out.iter().zip(chunk) {
                worst = worst.max((got - want).abs());
            }
        }
        assert!(worst <= 1e-5, "batches of {size}: max abs error {worst}");
    }
    assert_batches_formed(&h);
    system.stop();
}

/// Each refusal names what disagrees; version 1 keeps serving every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_toml_that_disagrees_with_the_model_is_refused_and_the_old_version_serves() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &[1], |t| t);
    let system = ActorSystem::start().unwrap();
    let repo = ModelRepository::new(dir.path(), system.clone()).unwrap();
    load_all(&repo).await;
    let rows = samples();
    let cases: [Case; 8] = [
        (
            "missing output",
            |t| t.replace("output = \"probabilities\"", "output = \"proba\""),
            &["'proba' is not an output", "'label'", "'probabilities'"],
        ),
        (
            "width",
            |t| t.replace("dims = [32]", "dims = [31]"),
            &["32 columns", "dims [31]"],
        ),
        (
            "input name",
            |t| t.replacen("name = \"input\"", "name = \"features\"", 1),
            &["declares input 'features'", "'input'"],
        ),
        (
            "column out of range",
            |t| t.replace("output_column = 1", "output_column = 2"),
            &["output_column = 2", "2 columns"],
        ),
        (
            "no column for [N, 2]",
            |t| t.replace("output_column = 1", ""),
            &["2 columns", "output_column"],
        ),
        (
            "int64 output",
            |t| {
                t.replace("output = \"probabilities\"", "output = \"label\"")
                    .replace("output_column = 1", "")
            },
            &["'label'", "float32"],
        ),
        (
            "file outside the version directory",
            |t| t.replace("file = \"model.onnx\"", "file = \"../1/model.onnx\""),
            &["relative path"],
        ),
        (
            "absent file",
            |t| t.replace("file = \"model.onnx\"", "file = \"other.onnx\""),
            &["2/other.onnx"],
        ),
    ];
    for (case, edit, named) in &cases {
        write_model(dir.path(), &[2], edit);
        let err = repo.load(NAME).await.unwrap_err().to_string();
        for n in *named {
            assert!(err.contains(n), "{case}: {err:?} does not name {n:?}");
        }
        // Load failures name the file relative to the repository (configuration
        // errors name model.toml by its path, as for every kind).
        if err.starts_with("loading") {
            assert!(
                !err.contains(&dir.path().display().to_string()),
                "{case}: the message shows the host path: {err}"
            );
        }
        let h = repo.get(NAME, None).unwrap();
        assert_eq!(h.version, 1, "{case}");
        let out = infer(&h, &[&rows[0].0]).await.unwrap();
        assert!((out[0] - rows[0].1).abs() <= 1e-5, "{case}");
        std::fs::remove_dir_all(dir.path().join(NAME).join("2")).unwrap();
    }
    // A file that is not an ONNX model.
    write_model(dir.path(), &[2], |t| t);
    std::fs::write(dir.path().join(NAME).join("2/model.onnx"), b"not onnx").unwrap();
    let err = repo.load(NAME).await.unwrap_err().to_string();
    assert!(err.contains("2/model.onnx"), "{err}");
    assert_eq!(repo.get(NAME, None).unwrap().version, 1);
    std::fs::remove_dir_all(dir.path().join(NAME).join("2")).unwrap();

    // A runtime library that does not exist: refused with how to provide one (if
    // another test of this process loaded the library already, the message says a
    // different one is loaded). Never a panic.
    write_model(dir.path(), &[2], |t| {
        t.replace(
            "threads = 1",
            "threads = 1\nruntime_library = \"/nonexistent/libonnxruntime.so\"",
        )
    });
    let err = repo.load(NAME).await.unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/libonnxruntime.so") && err.contains("runtime_library"),
        "{err}"
    );
    assert_eq!(repo.get(NAME, None).unwrap().version, 1);
    std::fs::remove_dir_all(dir.path().join(NAME).join("2")).unwrap();

    // And a good version 2 swaps in.
    write_model(dir.path(), &[2], |t| t);
    assert_eq!(repo.load(NAME).await.unwrap(), vec![2]);
    let h = repo.get(NAME, None).unwrap();
    assert_eq!(h.version, 2);
    let out = infer(&h, &[&rows[1].0]).await.unwrap();
    assert!((out[0] - rows[1].1).abs() <= 1e-5);
    system.stop();
}

/// `[onnx]` rules checked when model.toml is parsed.
#[test]
fn onnx_config_refusals_are_named() {
    use mesh_model_actor::ModelConfig;
    let toml =
        std::fs::read_to_string(root().join("examples/models-onnx/fraud_onnx/model.toml")).unwrap();
    let c = ModelConfig::parse(&toml, NAME).unwrap();
    assert_eq!(c.platform, "onnxruntime_onnx");
    assert_eq!(c.kind.backend(), "onnxruntime");
    let o = c.onnx.as_ref().unwrap();
    assert_eq!(
        (
            o.file.as_str(),
            o.output.as_str(),
            o.output_column,
            o.threads.get()
        ),
        ("model.onnx", "probabilities", Some(1), 1)
    );
    let cases = [
        ("dims = [1]", "dims = [2]", "dims [1]"),
        ("threads = 1", "threads = 1000", "threads"),
        ("threads = 1", "thread = 1", "thread"),
        (
            "kind = \"onnx\"",
            "kind = \"onnx\"\ndevice = \"cuda:0\"",
            "cpu",
        ),
        (
            "kind = \"onnx\"",
            "kind = \"onnx\"\ndtype = \"f16\"",
            "dtype",
        ),
        (
            "kind = \"onnx\"",
            "kind = \"xgboost\"",
            "[onnx] is for kind onnx",
        ),
        (
            "file = \"model.onnx\"",
            "file = \"/etc/passwd\"",
            "relative path",
        ),
    ];
    for (from, to, named) in cases {
        let err = ModelConfig::parse(&toml.replace(from, to), NAME).unwrap_err();
        assert!(err.contains(named), "{to}: {err}");
    }
    let no_table = toml.split("\n[onnx]").next().unwrap();
    let err = ModelConfig::parse(no_table, NAME).unwrap_err();
    assert!(err.contains("needs an [onnx] table"), "{err}");
}

/// A refusal case: its name, the edit to model.toml, and what the error must say.
type Case = (&'static str, fn(String) -> String, &'static [&'static str]);
