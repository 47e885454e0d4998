"""bench/plog_pool.py, which pools the rounds of several `bench/plog_bench.sh` runs:
checked on hand-made output directories whose ratios are known (no server needed)."""
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "bench" / "plog_pool.py"

spec = importlib.util.spec_from_file_location("plog_pool", TOOL)
plog_pool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plog_pool)


def write_run(out, name, mode, client, server, dropped=0, seconds=5):
    """One run as plog_bench leaves it: <run>.json (the bench's answer, with a window a
    second) and <run>.server.json. Every second but one has the given p99s, so the
    median over the seconds is those (one outlier second must not move it)."""
    windows = [{"p99_us": client, "server_p99_us": server} for _ in range(seconds - 1)]
    windows.append({"p99_us": client * 20, "server_p99_us": server * 20})
    (out / f"{name}.json").write_text(json.dumps({"p99_us": client, "windows": windows}))
    (out / f"{name}.server.json").write_text(json.dumps({"mode": mode, "dropped": dropped}))
    # A warm-up's output is next to the runs and is not a run.
    (out / f"{name}-warmup.json").write_text(json.dumps({"p99_us": 1, "windows": []}))


def make_dir(tmp, label, rounds):
    """rounds: [(on_ratio, on_server_ratio, off2_ratio)] against an off run whose p99s
    drift from round to round (the pooled ratios must not see the drift)."""
    out = tmp / label
    out.mkdir()
    for i, (on, on_srv, off2) in enumerate(rounds, start=1):
        base, srv = 1000 + 100 * i, 250 + 10 * i
        write_run(out, f"log-off-{i}", "off", base, srv)
        write_run(out, f"log-on-{i}", "on", base * on, srv * on_srv, dropped=i - 1)
        write_run(out, f"log-off2-{i}", "off2", base * off2, srv)
    return out


def test_pools_the_rounds_of_every_directory(tmp_path):
    a = make_dir(tmp_path, "a", [(1.10, 1.02, 1.0), (1.00, 1.04, 0.9)])
    b = make_dir(tmp_path, "b", [(1.20, 1.00, 1.1), (1.30, 1.06, 1.0), (1.00, 1.03, 1.0)])
    got = plog_pool.pool([str(a), str(b)])
    # Round 1 of a and round 1 of b are two rounds, not one.
    assert got["rounds"] == 5
    on = got["modes"]["on"]
    assert on["rounds"] == 5
    client = [1.10, 1.00, 1.20, 1.30, 1.00]
    assert abs(on["client"]["mean"] - statistics.fmean(client)) < 1e-3
    assert on["client"]["low"] < on["client"]["mean"] < on["client"]["high"]
    assert on["client"]["low"] >= min(client) - 1e-9 and on["client"]["high"] <= max(client) + 1e-9
    assert abs(on["server"]["mean"] - statistics.fmean([1.02, 1.04, 1.00, 1.06, 1.03])) < 1e-3
    # Against the mean of both log-off runs of each round.
    both = [1.10 / 1.0, 1.00 / 0.95, 1.20 / 1.05, 1.30 / 1.0, 1.00 / 1.0]
    assert abs(on["client_vs_both"]["mean"] - statistics.fmean(both)) < 1e-3
    # Dropped records add up over the rounds (0 + 1 in a, 0 + 1 + 2 in b); log off has none.
    assert on["dropped"] == 4
    assert "dropped" not in got["modes"]["off2"]
    assert abs(got["modes"]["off2"]["client"]["mean"] - statistics.fmean([1.0, 0.9, 1.1, 1.0, 1.0])) < 1e-3
    assert "off" not in got["modes"]


def test_the_verdict_follows_the_interval():
    assert plog_pool.verdict(0.99, 1.04) == "under 1.05"
    assert plog_pool.verdict(1.06, 1.09) == "over 1.05"
    assert plog_pool.verdict(1.01, 1.07) == "cannot tell against 1.05"
    # All rounds alike: the interval is that one value.
    mean, lo, hi = plog_pool.interval_of([1.2] * 6)
    assert abs(mean - 1.2) < 1e-12 and abs(lo - 1.2) < 1e-12 and abs(hi - 1.2) < 1e-12
    assert plog_pool.interval([1.2] * 6).endswith("(over 1.05)")
    # The same ratios give the same interval (a fixed seed).
    xs = [0.95, 1.02, 1.10, 0.99, 1.04, 1.07]
    assert plog_pool.interval_of(xs) == plog_pool.interval_of(xs)


def test_command_line(tmp_path):
    a = make_dir(tmp_path, "a", [(1.10, 1.02, 1.0), (1.00, 1.04, 0.9)])
    text = subprocess.run([sys.executable, str(TOOL), str(a)], capture_output=True, text=True, check=True).stdout
    assert "2 rounds from 1 runs" in text
    assert "log on, 2 rounds, dropped records: 1" in text
    assert "server's clock  vs log off" in text
    got = json.loads(subprocess.run([sys.executable, str(TOOL), str(a), "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert abs(got["modes"]["on"]["client"]["mean"] - 1.05) < 1e-3
    # A directory with no runs is an error that names it, not an empty table.
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([sys.executable, str(TOOL), str(empty)], capture_output=True, text=True)
    assert r.returncode == 1
    assert str(empty) in r.stderr and "no plog_bench runs" in r.stderr
    r = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True)
    assert r.returncode == 2 and "plog_pool.py" in r.stderr
