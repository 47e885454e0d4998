#!/usr/bin/env python3
"""Writes `heavy_fraud` into a model repository: the fraud model's 32 inputs,
input spec and thresholds (examples/models/fraud_mlp/model.toml), but a
compute-heavy MLP (32-H-H-1, random weights; H = 3072 by default) so that the
model, not the transport, is what saturates: the overload benchmark's model.
One runner thread, batches of up to 8 rows (a batch is a few milliseconds, so a
50 ms deadline leaves room for several batches ahead). Needs only numpy.

    python3 bench/make_heavy_fraud.py <repo> [hidden]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_heavy_mlp import random_mlp, write_safetensors  # noqa: E402


def main(repo: Path, hidden: int) -> None:
    tensors = random_mlp(13, [32, hidden, hidden, 1])
    d = repo / "heavy_fraud"
    (d / "1").mkdir(parents=True, exist_ok=True)
    write_safetensors(d / "1" / "model.safetensors", tensors)
    example = (Path(__file__).resolve().parent.parent / "examples/models/fraud_mlp/model.toml").read_text()
    spec = example[example.index("[input_spec]"):]
    (d / "model.toml").write_text(
        f"""# bench/make_heavy_fraud.py: 32-{hidden}-{hidden}-1, random weights.
kind = "mlp"
[[inputs]]
name = "input"
datatype = "FP32"
dims = [32]
[[outputs]]
name = "probability"
datatype = "FP32"
dims = [1]
[mlp]
activations = ["relu", "relu"]
output_activation = "sigmoid"
[batching]
max_batch_size = 8
max_queue_delay_us = 0
queue_capacity = 4096
runner_instances = 1
default_timeout_ms = 1000
[warmup]
batches = 4
batch_size = 8

{spec}"""
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3072)
