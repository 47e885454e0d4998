"""`--log-format json`: one JSON object per line, each request's lines carrying its id."""
import json
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Mesh, mesh_binary


def test_json_logs_carry_the_request_id(monkeypatch):
    monkeypatch.setenv("RUST_LOG", "info,mesh_router=debug")
    m = Mesh(ROOT / "examples" / "models", "--log-format", "json")
    try:
        c = grpcclient.InferenceServerClient(m.grpc)
        ok = grpcclient.InferInput("input", [1, 32], "FP32")
        ok.set_data_from_numpy(np.zeros((1, 32), np.float32))
        c.infer("fraud_mlp", [ok], request_id="log-ok-1")
        bad = grpcclient.InferInput("input", [1, 31], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 31), np.float32))
        with pytest.raises(InferenceServerException):
            c.infer("fraud_mlp", [bad], request_id="log-bad-2")
        # Decisions through the mesh's own load generator (request ids bench-<n>).
        out = subprocess.run(
            [mesh_binary(), "bench", "--addr", f"http://{m.grpc}", "--target", "decide",
             "--seconds", "0.5", "--concurrency", "1", "--json"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["codes"].get("OK", 0) > 0, out.stdout
        # The server's own time (arrival to answer) of every OK answer: inside what the
        # bench measured for the same request, so no percentile of it is larger.
        server = report["server"]
        assert server["answers"] == report["codes"]["OK"], report
        assert 0 < server["p50_us"] <= report["p50_us"], report
        assert server["p99_us"] <= report["p99_us"] and server["max_us"] <= report["max_us"], report
        # Per second as well: every window with an OK answer has the server's p99.
        assert all(w.get("server_p99_us", 0) > 0 for w in report["windows"] if w["requests"] > w["errors"]), report
        # Each stage's own p99 (the answers carry every stage), and what the total
        # has beyond them: none past the total's own largest.
        by_stage = server["stages_p99_us"]
        assert set(by_stage) == {"validate", "features", "preprocess", "queue", "compute", "postprocess", "other"}, by_stage
        assert all(0 <= v <= server["max_us"] for v in by_stage.values()), by_stage
        assert by_stage["features"] > 0, by_stage
    finally:
        m.stop()
    text = "".join(m.lines)  # everything it printed (Mesh keeps reading it)
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))  # every log line is a JSON object
    assert records, text[:2000]
    assert all({"timestamp", "level", "target"} <= r.keys() for r in records)

    def of(rid):
        return [r for r in records if r.get("span", {}).get("request_id") == rid or r.get("request_id") == rid]

    answered = of("log-ok-1")
    assert any(r["message"] == "answered" and r["span"]["name"] == "infer" for r in answered), answered
    rejected = of("log-bad-2")
    assert any(r.get("code") == "invalid_argument" and "shape" in r.get("error", "") for r in rejected), rejected
    decided = of("bench-0")
    assert any(r["message"] in ("decided", "answered by a fallback") for r in decided), decided
    assert any(r.get("span", {}).get("name") == "decide" for r in decided), decided
