"""Kind `onnx` (examples/models-onnx/fraud_onnx: the reference fraud MLP exported to
ONNX by skl2onnx) served by `mesh serve` and driven by the stock tritonclient over
gRPC and HTTP: every reference row of tests/data/fraud-mlp reproduces scikit-learn's
`expected_proba` within 1e-5, one row per request and in batches. ONNX Runtime comes
from ORT_DYLIB_PATH (scripts/test points it at the onnxruntime wheel's library)."""
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Mesh

MODEL = "fraud_onnx"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def onnx_mesh():
    lib = os.environ.get("ORT_DYLIB_PATH", "")
    # A missing runtime is a failure with the way to fix it, never a skip.
    assert lib and Path(lib).exists(), (
        "ORT_DYLIB_PATH must name libonnxruntime.so (scripts/test sets it from the onnxruntime wheel)"
    )
    m = Mesh(ROOT / "examples" / "models-onnx")
    yield m
    m.stop()


def infer(client, x):
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(MODEL, [inp], outputs=[grpcclient.InferRequestedOutput("probability")])


def test_metadata_and_config_name_onnx_runtime(onnx_mesh):
    c = grpcclient.InferenceServerClient(onnx_mesh.grpc)
    assert c.is_model_ready(MODEL)
    m = c.get_model_metadata(MODEL, as_json=True)
    assert m["platform"] == "onnxruntime_onnx"
    assert m["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": ["-1", "32"]}
    assert m["outputs"][0] == {"name": "probability", "datatype": "FP32", "shape": ["-1", "1"]}
    cfg = c.get_model_config(MODEL, as_json=True)["config"]
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 64


def test_every_row_matches_expected_proba_one_row_and_batched(onnx_mesh, samples):
    x, p = samples
    c = grpcclient.InferenceServerClient(onnx_mesh.grpc)
    got = np.array([infer(c, x[i : i + 1]).as_numpy("probability")[0, 0] for i in range(len(x))])
    worst = float(np.max(np.abs(got.astype(np.float64) - p.astype(np.float64))))
    assert worst <= TOLERANCE, worst
    for size in (7, 64):
        for s in range(0, len(x), size):
            r = infer(c, x[s : s + size]).as_numpy("probability")
            assert r.shape == (len(x[s : s + size]), 1) and r.dtype == np.float32
            np.testing.assert_allclose(r[:, 0], p[s : s + size], atol=TOLERANCE, rtol=0)


def test_http_client_and_refusals(onnx_mesh, samples):
    x, p = samples
    h = httpclient.InferenceServerClient(onnx_mesh.http)
    inp = httpclient.InferInput("input", [16, 32], "FP32")
    inp.set_data_from_numpy(x[:16], binary_data=False)
    out = httpclient.InferRequestedOutput("probability", binary_data=False)
    got = h.infer(MODEL, [inp], outputs=[out]).as_numpy("probability")[:, 0]
    np.testing.assert_allclose(got, p[:16], atol=TOLERANCE, rtol=0)
    c = grpcclient.InferenceServerClient(onnx_mesh.grpc)
    bad = x[:2].copy()
    bad[1, 3] = np.nan  # ONNX models take finite values only
    with pytest.raises(InferenceServerException) as e:
        infer(c, bad)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.message()
    assert "row 1 column 3 is NaN" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer(c, np.zeros((1, 31), np.float32))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.message()
