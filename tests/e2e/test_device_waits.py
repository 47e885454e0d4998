"""bench/device_waits.py, which sums a server's /metrics up by model for
bench/gpu_share.sh: checked on hand-made Prometheus text whose means are known."""
import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "bench" / "device_waits.py"

spec = importlib.util.spec_from_file_location("device_waits", TOOL)
device_waits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_waits)


def family(name, model, version, replica, total, count):
    labels = f'model="{model}",version="{version}",replica="{replica}"'
    return [f'{name}_bucket{{{labels},le="+Inf"}} {count}', f"{name}_sum{{{labels}}} {total}",
            f"{name}_count{{{labels}}} {count}"]


# (model, version): {family: [(sum, count) of each replica]}.
SERIES = {
    # Two replicas of gpu v2: 30 batches of 150 rows in all (5 a batch); 150 requests
    # waited 0.03 s in the queue (200 us each); 30 batches waited 0.0015 s for the
    # device (50 us each) and passed in 0.0036 s (120 us each).
    ("gpu", 2): {
        "mesh_model_batch_size": [(100, 20), (50, 10)],
        "mesh_model_queue_wait_seconds": [(0.02, 100), (0.01, 50)],
        "mesh_model_device_wait_seconds": [(0.001, 20), (0.0005, 10)],
        "mesh_model_compute_seconds": [(0.0024, 20), (0.0012, 10)],
    },
    # A CPU model has no device wait.
    ("cpu", 1): {
        "mesh_model_batch_size": [(8, 4)],
        "mesh_model_queue_wait_seconds": [(0.0008, 8)],
        "mesh_model_compute_seconds": [(0.0004, 4)],
    },
    # A loaded version that served nothing is left out.
    ("gpu", 1): {"mesh_model_batch_size": [(0, 0)]},
}

TEXT = "\n".join(
    ["# TYPE mesh_model_batch_size histogram"]
    + [line
       for (model, version), families in SERIES.items()
       for name, replicas in families.items()
       for replica, (total, count) in enumerate(replicas)
       for line in family(name, model, version, replica, total, count)]
    + ['mesh_device_runners{device="cuda:0"} 3', "mesh_model_ready 1"]
)


def test_means_are_per_request_for_the_queue_and_per_batch_for_the_device_and_pass():
    cpu, gpu, runners = device_waits.table(TEXT)
    assert gpu.split()[:4] == ["gpu", "v2", "30", "batches"]
    assert "5.0 rows" in gpu
    assert "queue    200.0 us" in gpu
    assert "device wait     50.0 us" in gpu
    assert "pass    120.0 us" in gpu
    assert cpu.split()[:3] == ["cpu", "v1", "4"] and "2.0 rows" in cpu
    assert "queue    100.0 us" in cpu and "device wait        -" in cpu and "pass    100.0 us" in cpu
    assert runners == "runners taking turns at cuda:0: 3"


def test_the_command_prints_the_table(tmp_path):
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(TEXT)
    out = subprocess.run([sys.executable, str(TOOL), str(metrics)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == device_waits.table(TEXT)
