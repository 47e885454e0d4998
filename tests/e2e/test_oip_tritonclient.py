"""`mesh serve` driven by the stock Python tritonclient (gRPC and HTTP)."""
import json
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import Mesh, SHARED, copy_repo

MODEL = "fraud_mlp"


def infer(client, x, model=MODEL, version="", dtype="FP32"):
    inp = grpcclient.InferInput("input", list(x.shape), dtype)
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], model_version=version, outputs=[grpcclient.InferRequestedOutput("probability")])


def test_live_ready_metadata(mesh):
    c = grpcclient.InferenceServerClient(mesh.grpc)
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready(MODEL)
    assert not c.is_model_ready(MODEL, "7")
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "inference-mesh"
    assert "statistics" in meta["extensions"]
    m = c.get_model_metadata(MODEL, as_json=True)
    # The example serves versions 1 and 2 (the same weights; 1 is the fallback).
    assert m["versions"] == ["1", "2"]
    assert m["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": ["-1", "32"]}
    assert m["outputs"][0]["name"] == "probability"
    cfg = c.get_model_config(MODEL, as_json=True)["config"]
    assert cfg["max_batch_size"] == 64
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert "dynamic_batching" in cfg


def test_infer_matches_reference_one_row_and_batched(mesh, samples):
    x, p = samples
    c = grpcclient.InferenceServerClient(mesh.grpc)
    worst = 0.0
    for i in range(len(x)):
        r = infer(c, x[i : i + 1])
        assert r.get_response().model_version == "2"
        worst = max(worst, abs(float(r.as_numpy("probability")[0, 0]) - float(p[i])))
    assert worst <= 1e-5, worst
    for size in (5, 64):
        for s in range(0, len(x), size):
            got = infer(c, x[s : s + size]).as_numpy("probability")[:, 0]
            np.testing.assert_allclose(got, p[s : s + size], atol=1e-5, rtol=0)


def test_http_client_matches_reference(mesh, samples):
    x, p = samples
    c = httpclient.InferenceServerClient(mesh.http)
    assert c.is_server_ready()
    inp = httpclient.InferInput("input", [16, 32], "FP32")
    inp.set_data_from_numpy(x[:16], binary_data=False)
    r = c.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("probability", binary_data=False)])
    np.testing.assert_allclose(r.as_numpy("probability")[:, 0], p[:16], atol=1e-5, rtol=0)


def expect(code, needle, fn):
    with pytest.raises(InferenceServerException) as e:
        fn()
    assert e.value.status() == f"StatusCode.{code}", (e.value.status(), e.value.message())
    assert needle in e.value.message(), e.value.message()


def test_bad_input_statuses(mesh, samples):
    x, _ = samples
    c = grpcclient.InferenceServerClient(mesh.grpc)
    one = x[:1]
    expect("NOT_FOUND", "nope", lambda: infer(c, one, model="nope"))
    expect("NOT_FOUND", "7", lambda: infer(c, one, version="7"))
    expect("INVALID_ARGUMENT", "FP64", lambda: infer(c, one.astype(np.float64), dtype="FP64"))
    expect("INVALID_ARGUMENT", "INT32", lambda: infer(c, one.astype(np.int32), dtype="INT32"))
    expect("INVALID_ARGUMENT", "shape", lambda: infer(c, x[:1, :31]))
    expect("INVALID_ARGUMENT", "64", lambda: infer(c, np.repeat(one, 65, axis=0)))
    nan = one.copy()
    nan[0, 5] = np.nan
    expect("INVALID_ARGUMENT", "NaN", lambda: infer(c, nan))
    # Over the 1 MiB limit this server was started with.
    expect("RESOURCE_EXHAUSTED", "too large", lambda: infer(c, np.repeat(one, 9000, axis=0)))

    # Malformed requests tritonclient would refuse to build: the raw stub.
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(mesh.grpc))

    def raw(name="input", shape=(1, 32), payload=one.tobytes()):
        req = service_pb2.ModelInferRequest(model_name=MODEL)
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.extend(shape)
        req.raw_input_contents.append(payload)
        return req

    for req, needle in [
        (raw(shape=(2, 32)), "bytes"),
        (raw(payload=one.tobytes()[:-4]), "bytes"),
        (raw(name="features"), "features"),
    ]:
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.details()


def test_http_errors_are_json(mesh, samples):
    x, _ = samples
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 31], "datatype": "FP32", "data": x[0, :31].tolist()}]})
    for path, status, needle in [
        (f"/v2/models/{MODEL}/infer", 400, "shape"),
        ("/v2/models/nope/infer", 404, "nope"),
    ]:
        req = urllib.request.Request(f"http://{mesh.http}{path}", data=body.encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == status
        assert needle in json.loads(e.value.read())["error"]


def test_statistics_and_metrics(mesh, samples):
    x, _ = samples
    c = grpcclient.InferenceServerClient(mesh.grpc)
    for i in range(10):
        infer(c, x[i : i + 1])
    # One entry per served version; version 2 answered.
    all_stats = c.get_inference_statistics(MODEL, as_json=True)["model_stats"]
    assert [x["version"] for x in all_stats] == ["1", "2"]
    stats = all_stats[1]
    assert int(stats["inference_count"]) >= 10
    assert int(stats["inference_stats"]["queue"]["count"]) >= 10
    text = urllib.request.urlopen(f"http://{mesh.http}/metrics", timeout=10).read().decode()
    assert 'mesh_router_requests_total{model="fraud_mlp",version="2",protocol="grpc",code="ok"}' in text
    assert "mesh_model_batch_size_bucket" in text


def test_reflection_lists_the_services(mesh):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    db = ProtoReflectionDescriptorDatabase(grpc.insecure_channel(mesh.grpc))
    services = set(db.get_services())
    assert "inference.GRPCInferenceService" in services
    assert "grpc.health.v1.Health" in services


def test_hot_load_under_load_fails_nothing(tmp_path, samples):
    x, p = samples
    repo = copy_repo(tmp_path / "models")
    # Model control is off by default and behind the admin token when on.
    token = "admin-token-for-the-hot-load-test-0123456789"
    (tmp_path / "admin.token").write_text(token)
    cfg = tmp_path / "mesh.toml"
    cfg.write_text(f'[admin]\nmodel_control = "explicit"\ntoken_file = "{tmp_path / "admin.token"}"\n')
    auth = {"authorization": f"Bearer {token}"}
    m = Mesh(repo, "--config", str(cfg))
    try:
        stop = threading.Event()
        results = {"ok": 0, "failed": [], "versions": set()}
        lock = threading.Lock()

        def worker(k):
            c = grpcclient.InferenceServerClient(m.grpc)
            i = k
            while not stop.is_set():
                try:
                    r = infer(c, x[i % len(x) : i % len(x) + 1])
                    got = float(r.as_numpy("probability")[0, 0])
                    assert abs(got - float(p[i % len(x)])) <= 1e-5
                    with lock:
                        results["ok"] += 1
                        results["versions"].add(r.get_response().model_version)
                except Exception as e:  # noqa: BLE001 - every failure is recorded
                    with lock:
                        results["failed"].append(repr(e))
                i += 8

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        (repo / MODEL / "2").mkdir()
        (repo / MODEL / "2" / "model.safetensors").write_bytes((SHARED / "fraud_mlp.safetensors").read_bytes())
        admin = grpcclient.InferenceServerClient(m.grpc)
        with pytest.raises(InferenceServerException) as e:
            admin.load_model(MODEL)  # no credential
        assert "UNAUTHENTICATED" in str(e.value.status())
        admin.load_model(MODEL, headers=auth)
        time.sleep(1.0)
        # A broken version 3: its load fails, version 2 keeps serving.
        (repo / MODEL / "3").mkdir()
        (repo / MODEL / "3" / "model.safetensors").write_bytes(b"broken")
        with pytest.raises(InferenceServerException) as e:
            admin.load_model(MODEL, headers=auth)
        assert "UNAUTHENTICATED" not in str(e.value.status()), e.value
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()
        assert results["failed"] == []
        assert results["ok"] > 100
        assert results["versions"] == {"1", "2"}
        assert admin.get_model_metadata(MODEL, as_json=True)["versions"] == ["2"]
        index = admin.get_model_repository_index(as_json=True)["models"]
        assert any(e["version"] == "3" and e["state"] == "UNAVAILABLE" for e in index)
    finally:
        m.stop()
