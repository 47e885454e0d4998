"""SIGTERM sent the moment `mesh serve` says it is serving drains and exits 0, every
time: the server listens for its stop signals before it prints that line (a listener
made after it raced the signal: the process either died by the default action,
without draining, or dropped the signal and never stopped)."""
import re
import signal
import socket
import subprocess
import time
import urllib.request

import tritonclient.grpc as grpcclient

from conftest import ROOT, Mesh, copy_repo, keep_reading, mesh_binary


def until_printed(lines: list, text: str):
    """Waits (10 s at most) until a line the server printed holds `text`."""
    deadline = time.time() + 10
    while text not in "".join(lines) and time.time() < deadline:
        time.sleep(0.02)
    assert text in "".join(lines), "".join(lines)


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
        until_printed(m.lines, "SIGHUP received")
        assert m.proc.poll() is None, "".join(m.lines)
        assert (infer() == before).all()
    finally:
        code = m.stop()
    assert code == 0, "".join(m.lines)


def test_a_closed_stdout_does_not_stop_the_server(tmp_path):
    """A supervisor that stops reading (its end of the pipe closed) must not stop a
    mesh: the serving line's write fails with EPIPE, which is logged, and the mesh
    serves on (the addresses are in its log on stderr too)."""
    repo = copy_repo(tmp_path / "models")
    p = subprocess.Popen(
        [mesh_binary(), "serve", "--models", str(repo), "--grpc-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    p.stdout.close()
    lines, http = [], None
    try:
        deadline = time.time() + 60
        while http is None and time.time() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"mesh serving grpc_addr=\S+ http_addr=(\S+)", line)
            if m:
                http = m.group(1)
        assert http, "".join(lines)
        keep_reading(p.stderr, lines)
        until_printed(lines, "serving line could not be written")
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        assert p.poll() is None, "".join(lines)
    finally:
        p.terminate()
        code = p.wait(timeout=20)
    assert code == 0, "".join(lines)


def test_sigterm_while_starting_ends_the_start(tmp_path):
    """A stop signal while the mesh starts (here: waiting on a Redis that accepts and
    never answers, for up to `redis_connect_timeout`) ends the start at once: exit 0,
    nothing served."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    cfg = tmp_path / "mesh.toml"
    cfg.write_text(
        "[features]\n"
        'backend = "redis"\n'
        f'redis_url = "redis://127.0.0.1:{silent.getsockname()[1]}"\n'
        'redis_connect_timeout = "30s"\n'
        f'views = "{ROOT / "examples" / "features" / "views.toml"}"\n'
    )
    p = subprocess.Popen(
        [mesh_binary(), "serve", "--models", str(copy_repo(tmp_path / "models")), "--config", str(cfg),
         "--grpc-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    try:
        # The line `serve` logs once it listens for the stop signals.
        while not any("CPU target" in line for line in lines):
            line = p.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        keep_reading(p.stdout, lines)
        time.sleep(0.3)  # into the wait for Redis
        assert p.poll() is None, "".join(lines)
        sent = time.monotonic()
        p.terminate()
        code = p.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
        silent.close()
    out = "".join(lines)
    assert code == 0, out
    assert took < 5, (took, out)
    assert "stop signal while starting" in out, out
    assert "mesh serving" not in out, out
