#!/usr/bin/env python3
"""One line from a `mesh bench --json` report: a label, throughput, p50 / p99 / p99.9,
the server's queue and compute time per request, and the calls that did not answer OK
by code. The bench scripts that print one line per run call it:

    python3 bench/infer_line.py REPORT.json LABEL...
"""
import json
import sys


def line(report: dict, label: str) -> str:
    errors = {k: v for k, v in report["codes"].items() if k != "OK"}
    s = report.get("stages_us", {})
    return (f"{label}  {report['throughput']:8.0f} req/s  p50 {report['p50_us']:>6} us  "
            f"p99 {report['p99_us']:>6} us  p99.9 {report['p999_us']:>6} us  "
            f"server queue {s.get('queue', 0):.0f} us  compute {s.get('compute_infer', 0):.1f} us  "
            f"errors {errors or 0}")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(line(json.load(f), " ".join(sys.argv[2:])))
