"""SIGTERM sent the moment `mesh serve` says it is serving drains and exits 0, every
time: the server listens for its stop signals before it prints that line (a listener
made after it raced the signal: the process either died by the default action,
without draining, or dropped the signal and never stopped)."""
from conftest import Mesh, copy_repo


def test_sigterm_on_the_serving_line_drains(tmp_path):
    repo = copy_repo(tmp_path / "models")
    logs = tmp_path / "predictions"
    cfg = tmp_path / "mesh.toml"
    cfg.write_text(f'[prediction_log]\ndir = "{logs}"\n')
    for attempt in range(20):
        m = Mesh(repo, "--config", str(cfg))  # returns on reading the serving line
        code = m.stop()
        out = "".join(m.lines)
        assert code == 0, f"attempt {attempt}: exit status {code}\n{out}"
        assert "shutdown signal received" in out, f"attempt {attempt}:\n{out}"
        assert "prediction log closed" in out, f"attempt {attempt}:\n{out}"


def test_sighup_without_tls_stops_nothing(tmp_path, samples):
    """SIGHUP's default action ends a process; a mesh without TLS (nothing to
    reload) logs it and keeps serving."""
    import signal
    import time

    import tritonclient.grpc as grpcclient

    x, _ = samples
    m = Mesh(copy_repo(tmp_path / "models"))
    try:
        c = grpcclient.InferenceServerClient(m.grpc)

        def infer():
            inp = grpcclient.InferInput("input", [1, 32], "FP32")
            inp.set_data_from_numpy(x[:1])
            return c.infer("fraud_mlp", [inp]).as_numpy("probability")

        before = infer()
        m.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while "SIGHUP received" not in "".join(m.lines) and time.time() < deadline:
            time.sleep(0.02)
        assert "SIGHUP received" in "".join(m.lines), "".join(m.lines)
        assert m.proc.poll() is None, "".join(m.lines)
        assert (infer() == before).all()
    finally:
        code = m.stop()
    assert code == 0, "".join(m.lines)
