"""`mesh bench --html` against a live mesh, and the report page rendered in headless Chromium."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, Mesh, mesh_binary

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOT_COPY = Path("/tmp/bench_report.png")


def chromium_or_skip() -> str:
    if Path(CHROMIUM).exists():
        return CHROMIUM
    if os.environ.get("MESH_REQUIRE_CHROMIUM"):
        pytest.fail(f"MESH_REQUIRE_CHROMIUM is set but {CHROMIUM} does not exist")
    pytest.skip(f"{CHROMIUM} not installed")


def run(cmd, timeout):
    """Runs `cmd` in its own process group; on timeout kills the whole group (Chromium forks helpers)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        # Anything the command left behind in its group (Chromium's zygote, GPU or utility processes).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def chromium(args, profile: Path, timeout=90):
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
    ]
    return run(cmd, timeout)


@pytest.fixture(scope="module")
def bench(mesh, tmp_path_factory):
    """One 3-second closed-loop bench of ModelInfer, with --json and --html."""
    out = tmp_path_factory.mktemp("bench")
    html = out / "report.html"
    rc, stdout, stderr = run(
        [
            mesh_binary(),
            "bench",
            "--addr",
            f"http://{mesh.grpc}",
            "--target",
            "infer",
            "--seconds",
            "3",
            "--concurrency",
            "4",
            "--html",
            str(html),
            "--json",
        ],
        timeout=120,
    )
    assert rc == 0, stderr
    assert f"wrote {html}" in stderr
    return json.loads(stdout), html, out


def test_bench_json_has_windows_and_histogram(bench):
    report, html, _ = bench
    assert report["target"] == "infer"
    assert report["requests"] > 0
    assert report["codes"].get("OK") == report["requests"], report["codes"]
    for key in ("throughput", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "sources", "stages_us"):
        assert key in report, key
    # Infer answers carry no stage times: no server latency distribution.
    assert "server" not in report, report["server"]
    assert not any("server_p99_us" in w for w in report["windows"]), report["windows"]
    windows = report["windows"]
    assert len(windows) >= 2, windows
    assert [w["t_s"] for w in windows] == [float(i) for i in range(len(windows))]
    assert sum(w["requests"] for w in windows) == report["requests"]
    for w in windows:
        assert w["requests"] > 0, w
        assert w["errors"] == 0, w
        assert 0 < w["p50_us"] <= w["p90_us"] <= w["p99_us"] <= w["p999_us"] <= w["max_us"], w
    buckets = report["histogram"]
    assert buckets and sum(b["count"] for b in buckets) == report["requests"]
    assert all(b["lower_us"] < b["upper_us"] for b in buckets)
    assert buckets[0]["lower_us"] <= report["p50_us"] <= buckets[-1]["upper_us"]
    page = html.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I), "page loads something external"


def rendered(html: Path, profile: Path) -> str:
    """The page's DOM after its script ran in headless Chromium; fails the test when
    the script did not finish drawing."""
    rc, dom, err = chromium(["--dump-dom", html.as_uri()], profile)
    assert rc == 0, err[-4000:]
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:2000]
    if 'data-rendered="ok"' not in body.group(0):
        msg = re.search(r'<div id="render-error"[^>]*>(.*?)</div>', dom, re.S)
        pytest.fail(f"page did not render: {body.group(0)} {msg.group(1) if msg else ''}")
    return dom


def container(dom: str, id_: str) -> dict:
    """The data- attributes of the chart container `id_`."""
    m = re.search(rf'<div id="{id_}"[^>]*>', dom)
    assert m, id_
    return dict(re.findall(r'(data-[\w-]+)="([^"]*)"', m.group(0)))


def test_bench_html_renders_in_chromium(bench):
    chromium_or_skip()
    report, html, out = bench
    profile = Path(tempfile.mkdtemp(prefix="mesh-chromium-"))
    try:
        dom = rendered(html, profile)
        hist, times, tput = (container(dom, c) for c in ("hist-chart", "time-chart", "tput-chart"))
        assert int(hist["data-bars"]) > 0, hist
        assert int(hist["data-bars"]) == sum(1 for b in report["histogram"] if b["count"] > 0)
        assert int(times["data-series"]) == 3, times
        assert int(tput["data-bars"]) == len(report["windows"]), tput
        assert dom.count("<svg") == 3
        assert dom.count("<path") >= 3
        assert dom.count("<rect") >= int(hist["data-bars"]) + int(tput["data-bars"])

        shot = out / "report.png"
        rc, _, err = chromium([f"--screenshot={shot}", "--window-size=1280,1600", html.as_uri()], profile)
        assert rc == 0, err[-4000:]
        assert shot.exists(), err[-4000:]
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 20_000, len(data)
        shutil.copy(shot, SCREENSHOT_COPY)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_bench_html_of_an_alternating_run_draws_each_servers_seconds(mesh, tmp_path):
    # Two real servers, one open loop alternating each second between them: the page
    # names both, and the time chart draws a p99 line per server through its seconds.
    chromium_or_skip()
    other = Mesh(ROOT / "examples" / "models")
    profile = Path(tempfile.mkdtemp(prefix="mesh-chromium-"))
    try:
        a, b = f"http://{mesh.grpc}", f"http://{other.grpc}"
        html = tmp_path / "alternate.html"
        rc, out, err = run(
            [mesh_binary(), "bench", "--addr", a, "--alternate-addr", b, "--target", "infer",
             "--rate", "300", "--seconds", "4", "--html", str(html), "--json"],
            timeout=120,
        )
        assert rc == 0, err
        report = json.loads(out)
        assert [w["sent_to"] for w in report["windows"]][:4] == [a, b, a, b], report["windows"]
        page = html.read_text()
        row = re.search(r"<tr><th>servers \(alternate seconds\)</th><td>(.*?)</td></tr>", page)
        assert row and row.group(1).startswith(f"{a}: 2 seconds") and f" · {b}: 2 seconds" in row.group(1), page
        dom = rendered(html, profile)
        times = container(dom, "time-chart")
        # Infer has no server clock: one p99 line per server, the second dashed.
        assert (times["data-series"], times["data-servers"]) == ("2", "2"), times
        names = re.findall(r'<g class="series" data-name="([^"]*)"', dom)
        assert names == [f"p99 {mesh.grpc}", f"p99 {other.grpc}"], names
        assert 'stroke-dasharray="6 4"' in dom
    finally:
        shutil.rmtree(profile, ignore_errors=True)
        other.stop()


def test_bench_stops_after_a_count_and_reports_the_server_breakdown(mesh):
    # Closed loop bounded by a request count; OIP statistics give the server's stages.
    rc, out, err = run(
        [mesh_binary(), "bench", "--addr", f"http://{mesh.grpc}", "--target", "infer",
         "--requests", "300", "--concurrency", "4", "--json"],
        timeout=120,
    )
    assert rc == 0, err
    r = json.loads(out)
    assert r["requests"] == 300 and r["codes"] == {"OK": 300}, r
    assert "300 requests" in r["mode"]
    assert sum(w["requests"] for w in r["windows"]) == 300
    stages = r["stages_us"]
    assert {"queue", "compute_input", "compute_infer", "compute_output"} <= stages.keys(), stages
    # The queue's share is 0 when every request was computed on its caller's thread
    # (the examples set [batching] inline_below_us), never negative.
    assert stages["compute_infer"] > 0 and stages["queue"] >= 0, stages

    # Open loop bounded by a count too.
    rc, out, err = run(
        [mesh_binary(), "bench", "--addr", f"http://{mesh.grpc}", "--target", "infer",
         "--rate", "400", "--requests", "100", "--json"],
        timeout=120,
    )
    assert rc == 0, err
    assert json.loads(out)["requests"] == 100
