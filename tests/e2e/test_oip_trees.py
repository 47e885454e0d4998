"""Kinds `xgboost` and `lightgbm` (examples/models/fraud_xgb, fraud_lgbm) served by
`mesh serve` and driven by the stock tritonclient over gRPC: every reference row of
tests/data/fraud-trees reproduces each library's probability within 1e-6, one row per
request and in batches; NaN where model.toml declares missing values; refusals name
the row and column."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT

TREES = ROOT / "tests" / "data" / "fraud-trees"
MODELS = {"fraud_xgb": ("xgb_proba", "xgboost_json"), "fraud_lgbm": ("lgbm_proba", "lightgbm_text")}
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def tree_samples():
    header = (TREES / "samples.csv").read_text().splitlines()[0].split(",")
    data = np.genfromtxt(TREES / "samples.csv", delimiter=",", skip_header=1, dtype=np.float64)
    assert header[1:35] == [f"f{i}" for i in range(32)] + ["mcc", "country"]
    x = data[:, 1:35].astype(np.float32)  # empty cells are NaN: missing
    assert np.isnan(x[:, [4, 9, 20]]).any() and not np.isnan(np.delete(x, [4, 9, 20], axis=1)).any()
    want = {m: data[:, header.index(col)] for m, (col, _) in MODELS.items()}
    return x, want


def infer(client, model, x):
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput("probability")])


@pytest.mark.parametrize("model", MODELS)
def test_metadata_and_config_name_the_kind(mesh, model):
    c = grpcclient.InferenceServerClient(mesh.grpc)
    assert c.is_model_ready(model)
    m = c.get_model_metadata(model, as_json=True)
    assert m["platform"] == MODELS[model][1]
    assert m["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": ["-1", "34"]}
    assert m["outputs"][0] == {"name": "probability", "datatype": "FP32", "shape": ["-1", "1"]}
    cfg = c.get_model_config(model, as_json=True)["config"]
    assert cfg["backend"] == "mesh_trees"
    assert cfg["platform"] == MODELS[model][1]
    assert cfg["max_batch_size"] == 64
    # What the columns take, for clients that build rows (mesh bench --target infer).
    assert cfg["parameters"]["categorical_columns"] == {"string_value": "32,33"}
    missing = "4,9,20,32,33" if model == "fraud_xgb" else "4,9,20"
    assert cfg["parameters"]["missing_columns"] == {"string_value": missing}


@pytest.mark.parametrize("model", MODELS)
def test_every_row_matches_the_library_one_row_and_batched(mesh, tree_samples, model):
    x, want = tree_samples
    p = want[model]
    c = grpcclient.InferenceServerClient(mesh.grpc)
    got = np.array([infer(c, model, x[i : i + 1]).as_numpy("probability")[0, 0] for i in range(len(x))])
    worst = float(np.max(np.abs(got.astype(np.float64) - p)))
    assert worst <= TOLERANCE, worst
    for size in (7, 64):
        for s in range(0, len(x), size):
            r = infer(c, model, x[s : s + size]).as_numpy("probability")
            assert r.shape == (len(x[s : s + size]), 1) and r.dtype == np.float32
            np.testing.assert_allclose(r[:, 0].astype(np.float64), p[s : s + size], atol=TOLERANCE, rtol=0)


def expect_invalid(needle, fn):
    with pytest.raises(InferenceServerException) as e:
        fn()
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", (e.value.status(), e.value.message())
    assert needle in e.value.message(), e.value.message()


@pytest.mark.parametrize("model", MODELS)
def test_nan_and_category_codes_follow_model_toml(mesh, tree_samples, model):
    x, _ = tree_samples
    c = grpcclient.InferenceServerClient(mesh.grpc)
    two = x[:2].copy()
    two[1, [4, 9, 20]] = np.nan  # declared missing: answered
    assert np.isfinite(infer(c, model, two).as_numpy("probability")).all()
    for col, value, needle in [
        (0, np.nan, "row 1 column 0 is NaN"),
        (31, np.nan, "row 1 column 31 is NaN"),
        (4, np.inf, "row 1 column 4 is infinite"),
        (32, 2.5, "row 1 column 32 is categorical"),
        (33, -1.0, "row 1 column 33 is categorical"),
    ]:
        bad = x[:2].copy()
        bad[1, col] = value
        expect_invalid(needle, lambda: infer(c, model, bad))


def test_the_mlp_still_refuses_nan(mesh):
    c = grpcclient.InferenceServerClient(mesh.grpc)
    x = np.zeros((1, 32), np.float32)
    x[0, 4] = np.nan
    inp = grpcclient.InferInput("input", [1, 32], "FP32")
    inp.set_data_from_numpy(x)
    expect_invalid("NaN", lambda: c.infer("fraud_mlp", [inp]))
