"""The Helm chart's scaling signal works, on loopback: two `mesh serve --role model`
processes stand for two pods of the chart's `model` value set, a real Prometheus
scrapes both with the `namespace` and `pod` labels Kubernetes service discovery
would attach, `mesh bench` loads both, and the PromQL query of the rendered
ScaledObject (deploy/helm/golden/model.yaml, which deploy/check.sh keeps equal to
`helm template`) is evaluated through Prometheus' HTTP API: below the ScaledObject's
threshold before the load, above it under load, and back to 0 once the replicas are
idle for the query's window.

The model is the example MLP made to queue: one runner, batches of one row, nothing
computed on the callers' threads (`inline_below_us = 0`), and candle's thread pool
on (`--compute-threads 8`), so each forward pass takes ~100 µs and 16 callers per
replica wait behind each other.

Skipped only when the `prometheus` binary is missing and MESH_REQUIRE_PROMETHEUS is
unset (CI sets it: there a missing binary fails)."""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, Mesh, mesh_binary
from test_prometheus import Prometheus, prometheus_binary, wait_for

GOLDEN = ROOT / "deploy" / "helm" / "golden" / "model.yaml"
MODEL = "fraud_mlp"
LOAD_SECONDS = 15
CALLERS = 16


def rendered() -> dict:
    """What the chart rendered for the model value set: the ScaledObject's query,
    threshold and window, the Deployment's name and namespace."""
    docs = [d for d in yaml.safe_load_all(GOLDEN.read_text()) if d]
    so = next(d for d in docs if d["kind"] == "ScaledObject")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    trigger = so["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger.get("metricType") == "Value", trigger
    query = trigger["metadata"]["query"]
    windows = set(re.findall(r"\[(\d+)([smh])\]", query))
    assert len(windows) == 1, f"one rate window expected in {query}"
    n, unit = windows.pop()
    return {
        "query": query,
        "threshold": float(trigger["metadata"]["threshold"]),
        "window_s": int(n) * {"s": 1, "m": 60, "h": 3600}[unit],
        "deployment": dep["metadata"]["name"],
        "namespace": dep["metadata"]["namespace"],
        "target": so["spec"]["scaleTargetRef"]["name"],
        "min": so["spec"]["minReplicaCount"],
    }


def slow_repo(dst: Path) -> Path:
    """The example fraud_mlp with one runner, one-row batches and no computing on the
    callers' threads, so requests queue."""
    src = ROOT / "examples" / "models" / MODEL
    shutil.copytree(src, dst / MODEL)
    toml = (dst / MODEL / "model.toml").read_text()
    for key, value in [("max_batch_size", "1"), ("runner_instances", "1"), ("replicas", "1"),
                       ("batch_size", "1"), ("batches", "2"), ("inline_below_us", "0")]:
        toml, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", toml, flags=re.M)
        assert n == 1, f"model.toml has no single {key}"
    (dst / MODEL / "model.toml").write_text(toml)
    return dst


def prometheus_config(work: Path, pods: dict[str, str], namespace: str) -> Path:
    """One job with a target per mesh, labelled as Kubernetes pod discovery labels
    a pod (namespace, pod), scraped every second."""
    static = [{"targets": [addr], "labels": {"namespace": namespace, "pod": pod}} for pod, addr in pods.items()]
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "kubernetes-pods", "static_configs": static}],
    }
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def value(prom: Prometheus, query: str) -> float | None:
    r = prom.query(query)
    assert r.get("status") == "success", f"Prometheus refused the chart's query: {r}"
    res = r["data"]["result"]
    assert len(res) <= 1, f"the query must answer one value (KEDA refuses several): {res}"
    return float(res[0]["value"][1]) if res else None


def bench(grpc: str) -> subprocess.Popen:
    return subprocess.Popen(
        [mesh_binary(), "bench", "--addr", f"http://{grpc}", "--target", "infer", "--model", MODEL,
         "--concurrency", str(CALLERS), "--seconds", str(LOAD_SECONDS)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    prom_bin = prometheus_binary()
    work = tmp_path_factory.mktemp("scaling")
    r = rendered()
    repo = slow_repo(work / "models")
    started = []
    try:
        meshes = {}
        # Pod names as the Deployment's ReplicaSet would give them.
        for pod in (f"{r['deployment']}-5d8f7c9b6d-x7k2p", f"{r['deployment']}-5d8f7c9b6d-q4m9n"):
            m = Mesh(repo, "--role", "model", "--compute-threads", "8")
            started.append(m)
            meshes[pod] = m
        for m in meshes.values():
            # The chart's readiness probe.
            with urllib.request.urlopen(f"http://{m.http}/readyz", timeout=5) as resp:
                assert resp.status == 200
        prom = Prometheus(prom_bin, prometheus_config(work, {p: m.http for p, m in meshes.items()}, r["namespace"]), work)
        started.append(prom)

        def both_up():
            res = prom.query('up{job="kubernetes-pods"}').get("data", {}).get("result", [])
            return len(res) == 2 and all(x["value"][1] == "1" for x in res)

        wait_for("Prometheus to scrape both replicas", both_up)
        yield {"meshes": meshes, "prom": prom, **r}
    finally:
        errors = []
        for p in reversed(started):
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - stop the others too, then report
                errors.append(e)
        if errors:
            raise errors[0]


def test_the_chart_scales_on_mean_queue_wait_in_microseconds(replicas):
    """What the test below relies on: the query is the mean queue wait across the
    release's pods, in microseconds, against a threshold in microseconds."""
    q, threshold = replicas["query"], replicas["threshold"]
    assert "mesh_model_queue_wait_seconds_sum" in q and "mesh_model_queue_wait_seconds_count" in q, q
    assert "1e6" in q, f"the query should answer microseconds (KEDA keeps three decimals): {q}"
    assert f'namespace="{replicas["namespace"]}"' in q, q
    assert replicas["target"] == replicas["deployment"]
    assert threshold == 50, f"the model value set keeps the default 50 µs target, got {threshold}"


def test_queue_wait_crosses_the_threshold_under_load_and_falls_back_when_idle(replicas):
    prom, q, threshold = replicas["prom"], replicas["query"], replicas["threshold"]
    meshes = replicas["meshes"]

    # Before any request: nothing waited, the signal is below the target.
    time.sleep(3)
    before = value(prom, q)
    assert before is not None, "the query answered nothing (no series matched the pods' labels)"
    assert before < threshold, f"idle replicas already read {before} µs (threshold {threshold})"

    loads = [bench(m.grpc) for m in meshes.values()]
    peak, under_load = 0.0, []
    try:
        deadline = time.time() + LOAD_SECONDS
        while time.time() < deadline and all(p.poll() is None for p in loads):
            v = value(prom, q)
            if v is not None:
                under_load.append(v)
                peak = max(peak, v)
            time.sleep(1)
    finally:
        outs = [p.communicate(timeout=120)[0] for p in loads]
    for p, out in zip(loads, outs):
        assert p.returncode == 0, f"mesh bench failed:\n{out}"
    assert peak > threshold, (
        f"under load the signal peaked at {peak:.1f} µs, not above the {threshold} µs target; "
        f"samples {under_load}\n" + "\n".join(o[-1500:] for o in outs))
    # Both replicas were loaded and both count in the signal.
    per_pod = prom.query(f'sum by (pod) (increase(mesh_model_queue_wait_seconds_count{{namespace="{replicas["namespace"]}"}}[1m]))')
    loaded = {x["metric"]["pod"]: float(x["value"][1]) for x in per_pod["data"]["result"]}
    assert set(loaded) == set(meshes) and all(n > 0 for n in loaded.values()), loaded
    desired = math.ceil(len(meshes) * peak / threshold)
    print(f"\nscaling signal: before {before:.1f} µs, peak {peak:.1f} µs under load "
          f"(the HPA would ask for {desired} replicas from {len(meshes)}), target {threshold:.0f} µs")

    # Idle: once the query's window has passed the load, the signal is 0.
    stopped = time.time()
    settled = wait_for("the signal to fall below the threshold once idle",
                       lambda: (lambda v: v is not None and v < threshold and (v,))(value(prom, q)),
                       timeout=replicas["window_s"] + 45, every=1)
    fell_after = time.time() - stopped
    final = wait_for("the signal to read 0 when idle",
                     lambda: (lambda v: v == 0.0 and (v,))(value(prom, q)),
                     timeout=replicas["window_s"] + 45, every=1)
    print(f"idle: below the target after {fell_after:.0f} s ({settled[0]:.1f} µs), then {final[0]}")
    assert final[0] == 0.0
