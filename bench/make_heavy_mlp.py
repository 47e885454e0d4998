#!/usr/bin/env python3
"""Writes a compute-heavy MLP (256-1024-1024-1, random weights) into a model
repository twice: `heavy_batched` (dynamic batching) and `heavy_unbatched`
(max_batch_size 1), for the batching on/off benchmark. Needs only numpy."""
import json
import struct
import sys
from pathlib import Path

import numpy as np


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def random_mlp(seed: int, sizes: list) -> dict:
    """Dense layers of the given widths (torch Linear layout), weights scaled by
    1/sqrt(fan-in), zero biases."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        tensors[f"l{i}.weight"] = rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)
        tensors[f"l{i}.bias"] = np.zeros(n_out, dtype=np.float32)
    return tensors


def main(repo: Path) -> None:
    tensors = random_mlp(11, [256, 1024, 1024, 1])
    for name, max_batch, delay in [("heavy_batched", 32, 500), ("heavy_unbatched", 1, 0)]:
        d = repo / name
        (d / "1").mkdir(parents=True, exist_ok=True)
        write_safetensors(d / "1" / "model.safetensors", tensors)
        (d / "model.toml").write_text(
            f"""kind = "mlp"
[[inputs]]
name = "input"
datatype = "FP32"
dims = [256]
[[outputs]]
name = "score"
datatype = "FP32"
dims = [1]
[mlp]
activations = ["relu", "relu"]
output_activation = "sigmoid"
[batching]
max_batch_size = {max_batch}
max_queue_delay_us = {delay}
queue_capacity = 4096
runner_instances = 2
[warmup]
batches = 2
batch_size = 1
"""
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
