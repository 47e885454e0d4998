"""The prediction log of a running `mesh serve`: every OIP prediction is logged,
the Parquet files are read by DuckDB alone, and DuckDB's per-version counts and ROC
AUC equal those of `mesh logs join`. Every record carries the protocol it came in
by (`oip_grpc` here), which DuckDB sees as a column and the join groups by."""
import json
import os
import subprocess
import sys

import duckdb
import numpy as np
import tritonclient.grpc as grpcclient

from conftest import ROOT, Mesh, copy_repo, mesh_binary


def logged_mesh(tmp_path, extra=""):
    """A mesh serving a copy of the example models with its prediction log in
    tmp_path/predictions (`extra`: more [prediction_log] lines): (mesh, log dir)."""
    repo = copy_repo(tmp_path / "models")
    logs = tmp_path / "predictions"
    cfg = tmp_path / "mesh.toml"
    cfg.write_text(f'[prediction_log]\ndir = "{logs}"\nflush_interval = "50ms"\n{extra}')
    return Mesh(repo, "--config", str(cfg)), logs


def infer_rows(m, x, n):
    """One OIP gRPC call per row of x[:n], with request ids txn-0, txn-1, ..."""
    c = grpcclient.InferenceServerClient(m.grpc)
    for i in range(n):
        inp = grpcclient.InferInput("input", [1, 32], "FP32")
        inp.set_data_from_numpy(x[i : i + 1])
        c.infer("fraud_mlp", [inp], request_id=f"txn-{i}")


def parquet_count(logs) -> int:
    """Records in the log's Parquet files, as DuckDB reads them."""
    return duckdb.connect().execute(
        "SELECT count(*) FROM read_parquet($g, hive_partitioning = true)", {"g": f"{logs}/**/*.parquet"}
    ).fetchone()[0]


def assert_all_converted(logs, out: str, n: int):
    """`mesh logs convert` printed that it converted one segment of `n` records, no
    wal is left, and DuckDB reads `n` records from the Parquet files."""
    assert out.splitlines()[-1].startswith(f"1 segment, {n} records converted"), out
    assert not list((logs / "_wal").glob("**/*.wal"))
    assert parquet_count(logs) == n


def test_log_join_matches_duckdb(tmp_path, samples):
    x, _ = samples
    labels = np.loadtxt(ROOT / "tests/data/fraud-mlp/samples.csv", delimiter=",", skiprows=1, usecols=33)
    m, logs = logged_mesh(tmp_path)
    try:
        infer_rows(m, x, len(x))
    finally:
        m.stop()  # SIGTERM: drains the log and closes the open segment
    # Outcomes arrive later: labels for 900 of the 1000, plus one unknown id and a duplicate.
    lab = tmp_path / "labels.csv"
    rows = [f"txn-{i},{int(labels[i])}" for i in range(900)] + ["txn-unknown,1", "txn-3,1"]
    lab.write_text("request_id,label\n" + "\n".join(rows) + "\n")
    out = subprocess.run(
        [mesh_binary(), "logs", "join", "--logs", str(logs), "--labels", str(lab), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    report = json.loads(out)
    (tmp_path / "join.json").write_text(out)
    assert [g["version"] for g in report["groups"]] == ["1"], report
    group = report["groups"][0]
    assert group["protocol"] == "oip_grpc"
    assert {g["protocol"] for g in report["groups"]} == {"oip_grpc"}
    assert group["predictions"] == 1000
    assert group["labelled"] == 900
    assert group["roc_auc"] > 0.98
    human = subprocess.run(
        [mesh_binary(), "logs", "join", "--logs", str(logs), "--labels", str(lab)], check=True, capture_output=True, text=True
    ).stdout
    assert "fraud_mlp" in human
    assert "oip_grpc" in human
    # DuckDB sees the protocol column: all 1000 rows came in over OIP gRPC.
    protocols = duckdb.connect().execute(
        "SELECT protocol, count(*) FROM read_parquet($g, hive_partitioning = true) GROUP BY ALL",
        {"g": f"{logs}/**/*.parquet"},
    ).fetchall()
    assert protocols == [("oip_grpc", 1000)], protocols
    only = json.loads(subprocess.run(
        [mesh_binary(), "logs", "join", "--logs", str(logs), "--labels", str(lab), "--json", "--protocol", "decide"],
        check=True, capture_output=True, text=True,
    ).stdout)
    assert only["protocol"] == "decide" and only["records"] == 0 and only["groups"] == []
    check = subprocess.run(
        [sys.executable, str(ROOT / "prediction-log/tests/duckdb_check.py"), "--logs", str(logs), "--labels", str(lab),
         "--join", str(tmp_path / "join.json")],
        capture_output=True, text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_deferred_parquet_waits_for_mesh_logs_convert(tmp_path, samples):
    """With `parquet = "deferred"` the serving process builds no Parquet file: what it
    logged waits in `_wal/closed/` (a join with --include-wal already counts it), until
    `mesh logs convert` (another process) builds the files DuckDB reads."""
    x, _ = samples
    m, logs = logged_mesh(tmp_path, 'parquet = "deferred"\n')
    try:
        infer_rows(m, x, 200)
    finally:
        m.stop()  # SIGTERM: drains the log; the open segment rolls into _wal/closed/
    assert not list(logs.glob("**/*.parquet"))
    closed = list((logs / "_wal" / "closed").glob("seg-*.wal"))
    assert len(closed) == 1, closed
    lab = tmp_path / "labels.csv"
    lab.write_text("request_id,label\n" + "\n".join(f"txn-{i},{i % 2}" for i in range(200)) + "\n")

    def join(*extra):
        out = subprocess.run(
            [mesh_binary(), "logs", "join", "--logs", str(logs), "--labels", str(lab), "--json", *extra],
            check=True, capture_output=True, text=True,
        ).stdout
        return sum(g["predictions"] for g in json.loads(out)["groups"])

    assert join() == 0
    assert join("--include-wal") == 200
    out = subprocess.run(
        [mesh_binary(), "logs", "convert", "--logs", str(logs)], check=True, capture_output=True, text=True
    ).stdout
    assert_all_converted(logs, out, 200)
    assert join() == 200


def test_convert_watch_follows_a_serving_log_and_stops_on_sigterm(tmp_path, samples):
    """`mesh logs convert --watch` beside a serving mesh: the segment the server closes
    at shutdown becomes a Parquet file without another command, and SIGTERM ends the
    converter cleanly with its summary."""
    import signal
    import time

    x, _ = samples
    m, logs = logged_mesh(tmp_path, 'parquet = "deferred"\n')
    watcher = None
    try:
        watcher = subprocess.Popen(
            [mesh_binary(), "logs", "convert", "--logs", str(logs), "--watch", "--interval-ms", "50"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        infer_rows(m, x, 50)
        time.sleep(0.3)
        assert not list(logs.glob("**/*.parquet")), "the open segment is never converted"
    finally:
        m.stop()
    deadline = time.time() + 20
    while not list(logs.glob("**/*.parquet")) and time.time() < deadline:
        time.sleep(0.05)
    assert list(logs.glob("**/*.parquet"))
    watcher.send_signal(signal.SIGTERM)
    out, err = watcher.communicate(timeout=20)
    assert watcher.returncode == 0, err
    assert out.splitlines()[-1].startswith("1 segment, 50 records converted"), out
    assert not list((logs / "_wal").glob("**/*.wal"))


def test_convert_watch_as_a_sidecar_converts_the_last_segment_after_the_server_stops(tmp_path, samples):
    """The chart's converter container (predictionLog.converter): started on the empty
    log directory before the mesh, stopped with SIGTERM after it. It converts once more
    on the stop, so the segment the mesh closed as it stopped becomes a Parquet file
    even when the converter was waiting out its interval (a minute here)."""
    import signal

    x, _ = samples
    logs = tmp_path / "predictions"
    logs.mkdir()
    watcher = subprocess.Popen(
        [mesh_binary(), "logs", "convert", "--logs", str(logs), "--watch", "--interval-ms", "60000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    m, logs = logged_mesh(tmp_path, 'parquet = "deferred"\n')
    try:
        infer_rows(m, x, 40)
    finally:
        assert m.stop() == 0
    assert list((logs / "_wal" / "closed").glob("*.wal")), "the stopped mesh left no closed segment"
    watcher.send_signal(signal.SIGTERM)
    out, err = watcher.communicate(timeout=20)
    assert watcher.returncode == 0, err
    assert_all_converted(logs, out, 40)


def test_convert_logs_a_segment_it_cannot_convert_as_json(tmp_path):
    """The converter sidecar logs in JSON (`MESH_LOG_FORMAT=json`, as the chart sets
    it): a closed segment it cannot read is a warning naming the wal, on stderr, and
    the run ends in an error naming it; the wal stays for the next pass."""
    logs = tmp_path / "predictions"
    closed = logs / "_wal" / "closed"
    closed.mkdir(parents=True)
    bad = closed / "seg-0000000000000000-1-000000.wal"
    bad.write_bytes(b"not a wal at all")
    p = subprocess.run(
        [mesh_binary(), "logs", "convert", "--logs", str(logs)],
        capture_output=True, text=True, env={**os.environ, "MESH_LOG_FORMAT": "json"},
    )
    assert p.returncode == 1, p.stderr
    warnings = [json.loads(line) for line in p.stderr.splitlines() if line.startswith("{")]
    assert len(warnings) == 1, p.stderr
    w = warnings[0]
    assert w["level"] == "WARN", w
    # One object per event, its fields at the top level (flatten_event).
    assert "could not convert a closed segment" in w["message"], w
    assert w["wal"] == str(bad), w
    assert "seg-0000000000000000-1-000000.wal" in p.stderr.splitlines()[-1], p.stderr
    assert bad.exists()


def test_segment_max_age_puts_records_in_parquet_while_the_mesh_serves(tmp_path, samples):
    """`[prediction_log] segment_max_age` (5 minutes by default): a segment older than
    it rolls into its Parquet file at the next flush tick, also with no new records, so
    readers of the Parquet files alone see what was served within about that time."""
    import time

    x, _ = samples
    m, logs = logged_mesh(tmp_path, 'segment_max_age = "1s"\n')
    try:
        infer_rows(m, x, 20)
        deadline = time.time() + 15
        while not list(logs.glob("**/*.parquet")) and time.time() < deadline:
            time.sleep(0.1)
        files = list(logs.glob("**/*.parquet"))
        assert files, "no segment rolled by age"
        assert parquet_count(logs) == 20
        assert m.proc.poll() is None
    finally:
        assert m.stop() == 0
