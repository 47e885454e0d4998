"""README.md's "Day one, by hand", exactly as written: every fenced block marked
`<!-- day-one: NAME -->` (in document order, wherever it is in the file) runs against
a real `mesh serve` started by the README's own `serve` block, and its output is
checked here, so the docs cannot drift from the code.

What the test changes, and only that: the ports (8001 and 8000 become free ones, in
the commands, in the copy of examples/day-one.toml, and in MESH_ADDR, which moves the
`mesh` commands' default address with them), the working directory (a
temporary copy of the files the walk reads: examples/ and proto/proto/, with data/
made there by the walk itself), and `mesh` and `python` on the PATH (the binary under
test, the venv's Python). A block marked `(after NAME)` continues a Python block: it
runs with that block's code before it, as it would in one interpreter session.
"""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, mesh_binary

MARK = re.compile(r"<!-- day-one: ([\w-]+)(?: \(after ([\w-]+)\))? -->")


@dataclass
class Block:
    name: str
    after: str | None
    lang: str
    code: str
    line: int


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARK.fullmatch(line.strip())
        if not m:
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        assert fence.startswith("```"), f"README.md:{i + 1}: a day-one mark must sit right above a fenced block"
        body = []
        for j in range(i + 2, len(lines)):
            if lines[j].startswith("```"):
                break
            body.append(lines[j])
        else:
            raise AssertionError(f"README.md:{i + 2}: block not closed")
        out.append(Block(m.group(1), m.group(2), fence[3:].strip(), "\n".join(body) + "\n", i + 1))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_values(text: str) -> list:
    """Every JSON value printed one after another (curl adds no newlines)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        try:
            v, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("\n", i) + 1 or len(text)
            continue
        out.append(v)
    return out


# What each block must print (its stdout and stderr together), given the work dir.
def check_setup(out, work):
    assert "demo features written to data/features" in out, out
    for t in ("admin.token", "writer.token"):
        p = work / "data" / t
        assert len(p.read_text().strip()) == 64 and stat.S_IMODE(p.stat().st_mode) == 0o600, t
    assert (work / "data/models/fraud_mlp/2/model.safetensors").exists()


def check_oip_curl(out, work):
    assert out.splitlines()[0] == "200", out
    meta, infer = [v for v in json_values(out) if isinstance(v, dict)]
    assert meta["name"] == "fraud_mlp" and meta["versions"] == ["1", "2"], meta
    assert infer["model_version"] == "2", infer
    p = infer["outputs"][0]["data"][0]
    assert infer["outputs"][0]["name"] == "probability" and 0.0 <= p <= 1.0, infer


def check_features(out, work):
    for view in ("card", "merchant", "fraud_scores"):
        assert re.search(rf"\b{view}\b", out), out
    assert "txn_count_1h" in out and "PRESENT" in out, out
    j = [v for v in json_values(out) if isinstance(v, (dict, list))]
    assert j and "risk_tier" in json.dumps(j[-1]), out


def check_ingest(out, work):
    assert re.search(r"ingested 1 rows into 'card' through http://127\.0\.0\.1:\d+ \(1 written", out), out
    line = [l for l in out.splitlines() if "txn_count_1h" in l][-1]
    assert re.search(r"\b9\b", line) and "PRESENT" in line, out


def check_load(out, work):
    index = [v for v in json_values(out) if isinstance(v, list)][-1]
    states = {(e["name"], e.get("version")): e.get("state") for e in index}
    assert states[("fraud_mlp", "3")] == "READY", index
    assert states[("fraud_mlp", "2")] == "READY", index


def check_decide(out, work):
    answer = [v for v in json_values(out) if isinstance(v, dict)][-1]
    assert answer["request_id"] == "day1-b" and answer["model_version"] == "3", answer
    assert answer["source"] == "MODEL" and answer["decision"] in ("APPROVE", "REVIEW", "DECLINE"), answer
    assert "day1-a" in out and re.search(r"\b(APPROVE|REVIEW|DECLINE)\b", out.split("{")[0], re.I), out


def check_python_stubs(out, work):
    for f in ("common_pb2.py", "decision_pb2.py", "decision_pb2_grpc.py", "feature_store_pb2_grpc.py"):
        assert (work / "data/py/mesh/v1" / f).exists(), f


def check_python_decide(out, work):
    first, *cols = out.strip().splitlines()
    # Enum value names as the proto spells them; the version loaded in step 6.
    assert re.match(r"DECISION_(APPROVE|REVIEW|DECLINE) \S+ ANSWER_SOURCE_MODEL v3 \[", first), out
    assert "card:txn_count_1h FEATURE_STATUS_PRESENT [9]" in cols, out
    assert any(c.startswith("merchant:risk_tier FEATURE_STATUS_PRESENT [") for c in cols), out


def check_logs(out, work):
    tail = [l for l in out.splitlines() if re.match(r"\d{4}-\d\d-\d\dT", l)]
    # At most the 5 newest: the OIP call of step 3, then the three decisions.
    assert len(tail) == 4 and "day1-c fraud_mlp v3 primary" in tail[-1], out
    assert [l.split()[1] for l in tail[1:]] == ["day1-a", "day1-b", "day1-c"], out
    # The join: the three decisions of steps 7 and 8, all labelled, by version 3.
    row = [l for l in out.splitlines() if l.startswith("fraud_mlp") and " decide " in l]
    assert row and row[0].split()[1:6] == ["3", "primary", "decide", "3", "3"], out


def check_probability(out, work):
    # A continued block prints what the block it continues printed, then its own.
    m = re.fullmatch(r"\[\[(\S+)\]\]", out.strip().splitlines()[-1])
    assert m and 0.0 <= float(m.group(1)) <= 1.0, out


CHECKS = {
    "setup": check_setup,
    "serve": None,
    "oip-curl": check_oip_curl,
    "features": check_features,
    "ingest": check_ingest,
    "load": check_load,
    "decide": check_decide,
    "python-stubs": check_python_stubs,
    "python-decide": check_python_decide,
    "logs": check_logs,
    "oip-python": check_probability,
    "oip-trees": check_probability,
}


def test_the_marked_blocks_are_the_checked_ones():
    blocks = readme_blocks((ROOT / "README.md").read_text())
    names = [b.name for b in blocks]
    assert sorted(names) == sorted(CHECKS), names
    assert len(set(names)) == len(names), names
    assert names.index("setup") < names.index("serve") < names.index("oip-curl"), names


@pytest.fixture
def work(tmp_path):
    """A working directory holding what the walk reads, `mesh` on the PATH."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "proto" / "proto", tmp_path / "proto" / "proto")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mesh").symlink_to(Path(mesh_binary()).resolve())
    return tmp_path


def test_day_one_as_written(work):
    grpc_port, http_port = free_port(), free_port()

    def ports(text: str) -> str:
        return re.sub(r"\b8000\b", str(http_port), re.sub(r"\b8001\b", str(grpc_port), text))

    cfg = work / "examples" / "day-one.toml"
    cfg.write_text(ports(cfg.read_text()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_") and k not in ("RUST_LOG", "PYTHONPATH")}
    env["PATH"] = f"{work / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RUST_BACKTRACE"] = "1"  # as a Rust developer's shell often has it
    # The mesh commands' default --addr (http://127.0.0.1:8001), moved with the port.
    env["MESH_ADDR"] = f"http://127.0.0.1:{grpc_port}"

    blocks = readme_blocks((ROOT / "README.md").read_text())
    code_of = {b.name: b.code for b in blocks}
    server, server_out = None, []
    try:
        for b in blocks:
            code = ports(b.code)
            where = f"README.md:{b.line} ({b.name})"
            if b.name == "serve":
                server = subprocess.Popen(
                    ["bash", "-c", code], cwd=work, env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True, start_new_session=True,
                )
                deadline = time.time() + 60
                while time.time() < deadline:
                    line = server.stdout.readline()
                    if not line:
                        break
                    server_out.append(line)
                    if "mesh serving:" in line:
                        break
                else:
                    pass
                assert server_out and "mesh serving:" in server_out[-1], "".join(server_out)
                threading.Thread(target=lambda: server_out.extend(server.stdout), daemon=True).start()
                continue
            if b.name == "logs":
                # A person types this later than the log's flush interval (200 ms in
                # examples/day-one.toml) after the last decision; so does the test.
                time.sleep(1.0)
            if b.lang == "python":
                prefix = ports(code_of[b.after]) if b.after else ""
                cmd = [sys.executable, "-c", prefix + code]
            else:
                assert b.lang == "sh", where
                cmd = ["bash", "-euo", "pipefail", "-c", code]
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=180)
            out = r.stdout + r.stderr
            assert r.returncode == 0, f"{where} failed ({r.returncode}):\n{code}\n{out}"
            assert "panicked" not in out and "stack backtrace" not in out, f"{where}:\n{out}"
            CHECKS[b.name](out, work)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGINT)  # Ctrl-C, as the README says
            server.wait(timeout=30)
    assert server.returncode == 0, "".join(server_out)
    assert "mesh serving:" in "".join(server_out)
