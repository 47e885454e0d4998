#!/usr/bin/env python3
"""What the batches of each model did, from a server's Prometheus text (`/metrics`):
batches, rows per batch, a request's mean wait in the queue, and per batch the mean wait
for the GPU's turn (part of the queue's) and the pass; then the runners taking turns at
each device.
bench/gpu_share.sh prints it for each server it ran:

    python3 bench/device_waits.py METRICS.txt
"""
import re
import sys
from collections import defaultdict

SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')
FAMILIES = {
    "mesh_model_batch_size": "rows",
    "mesh_model_queue_wait_seconds": "queue",
    "mesh_model_device_wait_seconds": "device",
    "mesh_model_compute_seconds": "compute",
}


def read(text: str):
    """Sums and counts of each family by (model, version), replicas added up, and the
    runners gauge by device."""
    groups = defaultdict(lambda: defaultdict(float))
    runners = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(LABEL.findall(m.group(2))), float(m.group(3))
        if name == "mesh_device_runners":
            runners[labels.get("device", "")] = value
            continue
        for family, short in FAMILIES.items():
            for part in ("sum", "count"):
                if name == f"{family}_{part}":
                    groups[(labels.get("model", ""), labels.get("version", ""))][f"{short}_{part}"] += value
    return groups, runners


def table(text: str) -> list:
    groups, runners = read(text)
    lines = []
    for (model, version), g in sorted(groups.items()):
        batches = g["rows_count"]
        if not batches:
            continue
        per = lambda short: f"{g[short + '_sum'] / g[short + '_count'] * 1e6:8.1f} us" if g[short + "_count"] else "       -   "
        lines.append(f"{model:<16} v{version:<3} {batches:9.0f} batches  {g['rows_sum'] / batches:6.1f} rows  "
                     f"queue {per('queue')}  device wait {per('device')}  pass {per('compute')}")
    lines += [f"runners taking turns at {device}: {value:.0f}" for device, value in sorted(runners.items())]
    return lines


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print("\n".join(table(f.read())))
