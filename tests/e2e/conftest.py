"""Fixtures for end-to-end tests: a real `mesh serve` process on free ports."""
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "tests" / "data" / "fraud-mlp"


def mesh_binary() -> str:
    path = os.environ.get("MESH_BIN") or str(ROOT / "target" / "debug" / "mesh")
    if not Path(path).exists():
        raise RuntimeError(f"mesh binary not found at {path}; build it or set MESH_BIN")
    return path


def keep_reading(stream, lines: list) -> threading.Thread:
    """Appends what a server prints on `stream` to `lines` until it closes, from a
    thread of its own: a full pipe would stop the server at its next log line."""
    reader = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
    reader.start()
    return reader


class Mesh:
    def __init__(self, models: Path, *extra: str):
        self.proc = subprocess.Popen(
            [mesh_binary(), "serve", "--models", str(models), "--grpc-port", "0", "--http-port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 60
        self.lines = []
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"mesh serving: grpc=(\S+) http=(\S+)", line)
            if m:
                self.grpc, self.http = m.group(1), m.group(2)
                # A failing test shows the lines.
                self._reader = keep_reading(self.proc.stdout, self.lines)
                return
        self.proc.kill()
        raise RuntimeError("mesh serve did not start:\n" + "".join(self.lines))

    def stop(self) -> int:
        """SIGTERM, then waits for the drain; returns the exit status. A server that
        does not exit in 20 s is killed, and the error shows what it printed."""
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=5)
            raise RuntimeError(
                "mesh serve did not stop within 20 s of SIGTERM; it printed:\n" + "".join(self.lines[-60:])
            ) from None
        self._reader.join(timeout=5)
        return code


def copy_repo(dst: Path) -> Path:
    """The example fraud_mlp with version 1 only and `latest = 1` (the example serves
    versions 1 and 2; these tests watch one version, and a hot load move past it)."""
    src = ROOT / "examples" / "models" / "fraud_mlp"
    (dst / "fraud_mlp" / "1").mkdir(parents=True)
    toml = (src / "model.toml").read_text()
    assert "latest = 2" in toml, "the example's version policy moved"
    (dst / "fraud_mlp" / "model.toml").write_text(toml.replace("latest = 2", "latest = 1", 1))
    shutil.copy(SHARED / "fraud_mlp.safetensors", dst / "fraud_mlp" / "1" / "model.safetensors")
    return dst


@pytest.fixture(scope="module")
def mesh():
    m = Mesh(ROOT / "examples" / "models", "--max-message-bytes", str(1 << 20))
    yield m
    m.stop()


@pytest.fixture(scope="module")
def samples():
    import numpy as np

    data = np.loadtxt(SHARED / "samples.csv", delimiter=",", skiprows=1, dtype=np.float64)
    x = data[:, 1:33].astype(np.float32)
    p = data[:, 34].astype(np.float32)
    return x, p
