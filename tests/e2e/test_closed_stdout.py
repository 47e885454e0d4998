"""A command whose reader goes away (`mesh ... | head -1`, a caller that closed its end
of the pipe) stops quietly with exit status 0, as a Unix tool does, where it used to
end with Rust's broken-pipe panic (exit status 101 and a message on stderr). The work
done before the output (a store written, a load run) stands."""
import subprocess

from conftest import ROOT, mesh_binary


def run_unread(args: list) -> tuple:
    """Runs `mesh args` with its standard output closed on our side before it can
    print: (exit status, stderr)."""
    p = subprocess.Popen([mesh_binary(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    return p.wait(timeout=120), err


def test_bench_with_its_reader_gone_exits_0(mesh):
    code, err = run_unread(
        ["bench", "--addr", f"http://{mesh.grpc}", "--target", "infer", "--requests", "50", "--concurrency", "2"]
    )
    assert code == 0, err
    assert "panicked" not in err, err


def test_features_demo_with_its_reader_gone_exits_0_and_writes_the_store(tmp_path):
    store = tmp_path / "features"
    code, err = run_unread(
        ["features", "demo", "--store", str(store), "--views", str(ROOT / "examples" / "features" / "views.toml"),
         "--cards", "50", "--merchants", "5"]
    )
    assert code == 0, err
    assert "panicked" not in err, err
    assert store.is_dir() and any(store.iterdir()), "the store was not written"
