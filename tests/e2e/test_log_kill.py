"""A mesh under load is killed with SIGKILL: after the next start recovers its
write-ahead files, every record it reported as flushed (mesh_log_flushed_records on
/metrics) is read back, none twice, and every Parquet file opens."""
import re
import signal
import threading
import time
import urllib.request

import duckdb
import tritonclient.grpc as grpcclient

from conftest import Mesh, copy_repo


def flushed(mesh) -> float:
    text = urllib.request.urlopen(f"http://{mesh.http}/metrics", timeout=5).read().decode()
    m = re.search(r"^mesh_log_flushed_records (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_sigkill_loses_nothing_reported_flushed(tmp_path, samples):
    x, _ = samples
    repo = copy_repo(tmp_path / "models")
    logs = tmp_path / "predictions"
    cfg = tmp_path / "mesh.toml"
    cfg.write_text(f'[prediction_log]\ndir = "{logs}"\nflush_interval = "50ms"\n')
    m = Mesh(repo, "--config", str(cfg))
    stop = threading.Event()

    def load(k):
        c = grpcclient.InferenceServerClient(m.grpc)
        i = 0
        while not stop.is_set():
            inp = grpcclient.InferInput("input", [1, 32], "FP32")
            inp.set_data_from_numpy(x[i % len(x) : i % len(x) + 1])
            try:
                c.infer("fraud_mlp", [inp], request_id=f"k{k}-{i}")
            except Exception:  # noqa: BLE001 - the server is killed under this load
                return
            i += 1

    threads = [threading.Thread(target=load, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    reported = flushed(m)
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(timeout=10)
    stop.set()
    for t in threads:
        t.join()
    assert reported > 100, reported

    # The next start recovers the write-ahead files into Parquet; stop it cleanly.
    Mesh(repo, "--config", str(cfg)).stop()
    files = sorted(logs.rglob("*.parquet"))
    assert files
    for f in files:
        duckdb.sql(f"SELECT count(*) FROM read_parquet('{f}')").fetchall()
    [(total, unique)] = duckdb.sql(
        f"SELECT count(*), count(DISTINCT request_id) FROM read_parquet('{logs}/**/*.parquet', hive_partitioning = true)"
    ).fetchall()
    print(f"reported flushed {reported:.0f}, read back {total} records from {len(files)} files")
    assert total >= reported, (total, reported)
    assert unique == total
