"""The dashboards against a real mesh and a real Prometheus: `mesh serve` with the
feature store, decisions and the prediction log, driven by `mesh bench` (decide and
infer) with every replica failing for a while (fallbacks, breaker transitions) and a
few bad requests (error codes); Prometheus scrapes it with dashboards/prometheus/
prometheus.yml (target and intervals replaced) and the alert rules loaded. Every
metric the Grafana dashboard and the alert rules name is exported, every panel query
and rule expression evaluates (and every panel shows data), and every rule loads
with health ok.

Skipped only when the `prometheus` binary is missing and MESH_REQUIRE_PROMETHEUS is
unset (CI sets it: there a missing binary fails)."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, Mesh, mesh_binary

sys.path.insert(0, str(ROOT / "dashboards"))
from queries import PROM_DIR, dashboard, expand, panels, prometheus_config  # noqa: E402
MODEL = "fraud_mlp"


def prometheus_binary() -> str:
    path = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if Path(path).exists():
        return path
    if os.environ.get("MESH_REQUIRE_PROMETHEUS"):
        pytest.fail(f"prometheus binary not found ({path}) and MESH_REQUIRE_PROMETHEUS is set")
    pytest.skip("prometheus binary not found (apt-get install prometheus); set MESH_REQUIRE_PROMETHEUS to fail instead")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ADMIN_TOKEN = "prometheus-e2e-admin-token-0123456789"


def http_json(url: str, data: bytes | None = None, timeout: float = 10, admin: bool = False):
    headers = {"Content-Type": "application/json"} if data else {}
    if admin:  # the admin plane needs its credential
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def http_status(url: str, data: bytes) -> int:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class Prometheus:
    """A `prometheus` process on a free loopback port, its data in `work`."""

    def __init__(self, binary: str, config: Path, work: Path):
        self.log_path = work / "prometheus.log"
        self.log = open(self.log_path, "w")
        self.proc = None
        for _ in range(5):  # the free port may be taken between probe and bind
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
                stdout=self.log, stderr=subprocess.STDOUT,
            )
            deadline = time.time() + 60
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                time.sleep(0.2)
            self.stop()
        raise RuntimeError("prometheus did not start:\n" + self.log_tail())

    def log_tail(self, n: int = 40) -> str:
        self.log.flush()
        return "".join(self.log_path.read_text().splitlines(True)[-n:])

    def api(self, path: str, **params):
        q = urllib.parse.urlencode(params)
        r = http_json(f"{self.url}/api/v1/{path}" + (f"?{q}" if q else ""))
        assert r["status"] == "success", r
        return r["data"]

    def query(self, expr: str) -> dict:
        """The raw /api/v1/query answer: status success or error (with the error)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            return http_json(url)
        except urllib.error.HTTPError as e:  # 400/422: bad expression
            return json.loads(e.read() or b"{}") or {"status": "error", "error": str(e)}

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


MESH_TOML = """\
[features]
path = "{store}"
views = "{views}"

[prediction_log]
dir = "{logs}"
flush_interval = "50ms"

[decisions]
deadline = "50ms"
default_decision = "review"

[decisions.stack]
per_try_timeout = "20ms"

[[decisions.rules]]
name = "large_amount"
feature = "amount"
above = 5000.0
decision = "review"

[[decisions.deployments]]
model = "{model}"
batch_score = {{ view = "fraud_scores", feature = "score" }}

[admin]
token_file = "{token}"
fault_injection = true
"""


def bench(grpc: str, target: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        [mesh_binary(), "bench", "--addr", f"http://{grpc}", "--target", target, "--seconds", str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(p: subprocess.Popen, what: str) -> str:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, f"{what} failed:\n{out}"
    return out


def set_faults(http: str, replicas: list[str], fail: bool):
    for r in replicas:
        http_json(f"http://{http}/admin/faults", json.dumps({"replica": r, "fail": fail}).encode(), admin=True)


def drive(mesh) -> dict:
    """Decisions with every replica failing for 1.5 s in the middle, OIP inference,
    and two bad OIP requests. Returns what happened, for the assertion messages."""
    out = {}
    p = bench(mesh.grpc, "decide", 3)
    try:
        # Replicas (and their breakers) exist once the first decision needs them.
        deadline = time.time() + 20
        replicas = []
        while time.time() < deadline and not replicas:
            replicas = [r["replica"] for r in http_json(f"http://{mesh.http}/admin/replicas", admin=True)["replicas"]]
            time.sleep(0.1)
        assert replicas, "no replica listed by /admin/replicas under decide traffic"
        out["replicas"] = replicas
        time.sleep(0.5)
        set_faults(mesh.http, replicas, True)
        try:
            time.sleep(1.5)
        finally:
            set_faults(mesh.http, replicas, False)
    finally:
        out["decide"] = finish(p, "mesh bench --target decide")
    # The example serves two versions: with version 2's replicas failing, version 1
    # answered as the previous version, so its replicas (and breakers) exist now too.
    out["replicas_at_end"] = [
        r["replica"] for r in http_json(f"http://{mesh.http}/admin/replicas", admin=True)["replicas"]
    ]
    out["infer"] = finish(bench(mesh.grpc, "infer", 3), "mesh bench --target infer")
    # Error codes: a shape the model does not take, a model that does not exist.
    bad = {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    out["invalid"] = http_status(f"http://{mesh.http}/v2/models/{MODEL}/infer", json.dumps(bad).encode())
    out["unknown"] = http_status(f"http://{mesh.http}/v2/models/no_such_model/infer", json.dumps(bad).encode())
    assert out["invalid"] == 400 and out["unknown"] == 404, out
    return out


def wait_for(what: str, check, timeout: float = 30, every: float = 0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prom_bin = prometheus_binary()
    work = tmp_path_factory.mktemp("prometheus")
    store = work / "features"
    subprocess.run(
        [mesh_binary(), "features", "demo", "--store", str(store), "--views", str(ROOT / "examples/features/views.toml")],
        check=True, capture_output=True, text=True,
    )
    token = work / "admin.token"
    token.write_text(ADMIN_TOKEN + "\n")
    token.chmod(0o600)
    cfg = work / "mesh.toml"
    cfg.write_text(MESH_TOML.format(store=store, views=ROOT / "examples/features/views.toml",
                                    logs=work / "predictions", model=MODEL, token=token))
    started = []
    try:
        mesh = Mesh(ROOT / "examples" / "models", "--config", str(cfg))
        started.append(mesh)
        prom = Prometheus(prom_bin, prometheus_config(work, mesh.http), work)
        started.append(prom)

        def target_up():
            r = prom.query('up{job="inference-mesh"}')
            res = r.get("data", {}).get("result", [])
            return res and all(x["value"][1] == "1" for x in res)

        wait_for("Prometheus to scrape the mesh (up == 1)", target_up)
        traffic = drive(mesh)
        # Let Prometheus scrape what the traffic left (1 s scrapes).
        wait_for("the faults to show in Prometheus",
                 lambda: prom.query("sum(mesh_router_fallbacks_total)").get("data", {}).get("result"))
        time.sleep(3)
        yield {"mesh": mesh, "prom": prom, "traffic": traffic}
    finally:
        errors = []
        for p in reversed(started):
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - stop the others too, then report
                errors.append(e)
        if errors:
            raise errors[0]


# ---- what the dashboard and the rules use


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every query target."""
    out = []
    for p in panels(dashboard()["panels"]):
        for t in p.get("targets", []):
            out.append((f'{p["title"]} / {t.get("refId")}', t["expr"]))
    return out


def variable_queries() -> list[str]:
    out = []
    for v in dashboard()["templating"]["list"]:
        if v.get("type") == "query":
            q = v.get("query")
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def rule_names_in_file() -> set[str]:
    return set(re.findall(r"^\s*-\s*alert:\s*(\S+)", (PROM_DIR / "alerts.yml").read_text(), re.M))


def loaded_rules(prom) -> list[dict]:
    return [r for g in prom.api("rules")["groups"] for r in g["rules"]]


def substitute(expr: str, model: str) -> str:
    """Grafana's variables as Grafana would expand them for one range query."""
    expr = expand(expr, model)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


# Metrics a server exports only with a model on a GPU (`mesh_model_device_wait_seconds`,
# `mesh_device_runners`). The stack serves on the CPU, so the panel that shows them is
# checked to evaluate, not to show data, and they are not required on /metrics
# (bench/gpu_panel.sh shows its data on a GPU).
GPU_ONLY = {"mesh_model_device_wait_seconds_bucket", "mesh_device_runners"}


def metric_names(expr: str) -> set[str]:
    """The mesh_ metric names an expression selects (string literals removed first)."""
    return set(re.findall(r"\bmesh_[A-Za-z0-9_:]*", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)))


# ---- the tests


def test_every_metric_the_dashboards_use_is_exported(stack):
    prom = stack["prom"]
    rules = loaded_rules(prom)
    used = {}  # name -> where
    for where, expr in dashboard_exprs():
        for n in metric_names(expr):
            used.setdefault(n, where)
    for q in variable_queries():
        for n in metric_names(q):
            used.setdefault(n, f"variable query {q}")
    for r in rules:
        for n in metric_names(r["query"]):
            used.setdefault(n, f'rule {r["name"]}')
    assert len(used) >= 20, sorted(used)
    assert GPU_ONLY <= set(used), sorted(GPU_ONLY - set(used))
    used = {n: w for n, w in used.items() if n not in GPU_ONLY}
    res = prom.query('count by (__name__) ({__name__=~"mesh_.+"})')["data"]["result"]
    exported = {x["metric"]["__name__"] for x in res}
    missing = {n: w for n, w in used.items() if n not in exported}
    assert not missing, (
        "metrics used by the dashboard/alerts but not in Prometheus (scraped from /metrics):\n"
        + "\n".join(f"  {n}  (used by {w})" for n, w in sorted(missing.items()))
    )
    # Series suffixes match the exported type: _bucket only on histograms, _sum and
    # _count on histograms or summaries, _total on counters.
    meta = prom.api("metadata")
    wrong = []
    for n in sorted(used):
        for suffix, types in [("_bucket", {"histogram"}), ("_sum", {"histogram", "summary"}),
                              ("_count", {"histogram", "summary"}), ("_total", {"counter"})]:
            if n.endswith(suffix):
                family = n[: -len(suffix)] if suffix != "_total" else n
                got = {m["type"] for m in meta.get(family, [])}
                if not got & types:
                    wrong.append(f"{n}: {family} is {got or 'not described'}, expected {types}")
                break
    assert not wrong, "\n".join(wrong)
    # The model variable lists the served model.
    models = prom.api("label/model/values", **{"match[]": "mesh_model_queue_capacity"})
    assert MODEL in models, models


@pytest.mark.parametrize("model", [".*", MODEL])
def test_every_dashboard_query_evaluates_and_shows_data(stack, model):
    prom = stack["prom"]
    failed, empty = [], []
    exprs = dashboard_exprs()
    assert len(exprs) >= 20, exprs
    for where, expr in exprs:
        e = substitute(expr, model)
        r = prom.query(e)
        if r.get("status") != "success":
            failed.append(f"{where}: {e}\n    -> {r.get('errorType')}: {r.get('error')}")
        elif not r["data"]["result"] and not metric_names(expr) & GPU_ONLY:
            empty.append(f"{where}: {e}")
    assert not failed, "panel queries Prometheus rejected:\n" + "\n".join(failed)
    assert not empty, (
        "panel queries with no data after the traffic (traffic: "
        + json.dumps({k: v for k, v in stack["traffic"].items() if k != "infer"})[:2000]
        + "):\n" + "\n".join(empty)
    )


def test_alert_rules_load_and_evaluate(stack):
    prom = stack["prom"]
    names = rule_names_in_file()
    assert len(names) >= 5, names

    def evaluated():
        rules = loaded_rules(prom)
        return rules if rules and all(r.get("health") != "unknown" for r in rules) else None

    rules = wait_for("every rule to be evaluated", evaluated)
    assert {r["name"] for r in rules} == names
    bad = [f'{r["name"]}: health {r.get("health")} {r.get("lastError", "")}' for r in rules
           if r.get("health") != "ok" or r.get("lastError")]
    assert not bad, "\n".join(bad)
    failed = []
    for r in rules:
        q = prom.query(r["query"])
        if q.get("status") != "success":
            failed.append(f'{r["name"]}: {r["query"]} -> {q.get("error")}')
    assert not failed, "\n".join(failed)


def test_the_faults_and_errors_are_visible(stack):
    """What the traffic did shows in Prometheus: fallbacks, breakers opening,
    error codes, prediction log records, stale features."""
    prom = stack["prom"]

    def value(expr: str) -> float:
        res = prom.query(expr)["data"]["result"]
        return sum(float(x["value"][1]) for x in res)

    checks = {
        'sum(mesh_router_fallbacks_total{model="fraud_mlp"})': lambda v: v > 0,
        'sum(mesh_router_breaker_transitions_total{to="open"})': lambda v: v > 0,
        'sum(mesh_router_decisions_total{source="MODEL"})': lambda v: v > 0,
        'sum(mesh_router_requests_total{code="ok"})': lambda v: v > 0,
        'sum(mesh_router_requests_total{code="invalid_argument"})': lambda v: v >= 1,
        'sum(mesh_router_requests_total{code="not_found",model="unknown"})': lambda v: v >= 1,
        "sum(mesh_log_written_records_total)": lambda v: v > 0,
        "sum(mesh_log_dropped_records_total)": lambda v: v == 0,
        'sum(mesh_features_values_total{status="outside_max_age"})': lambda v: v > 0,
        "count(mesh_router_breaker_state)": lambda v: v == len(stack["traffic"]["replicas_at_end"]),
        'sum(mesh_router_decisions_total{source="PREVIOUS_VERSION"})': lambda v: v > 0,
        # Runners ran out of work between requests, each spell counted once.
        "sum(mesh_model_runner_idle_total)": lambda v: v > 0,
    }
    wrong = {e: value(e) for e, ok in checks.items() if not ok(value(e))}
    assert not wrong, f"unexpected values: {wrong}\ntraffic: {stack['traffic']['decide']}"
