#!/usr/bin/env python3
"""Pools the rounds of several `bench/plog_bench.sh` runs into one estimate per mode.

    python3 bench/plog_pool.py OUT_DIR [OUT_DIR ...] [--json]

Each OUT_DIR is the raw output of one plog_bench run (`OUT=...`, or the directory it
prints last). A round is one run of each mode next to each other in time; its ratio is
the mode's figure over the log-off run of the same round, so the machine's drift over
minutes cancels. This pools those ratios over every round of every directory and gives
their mean with a 90% interval from resampling the rounds, the same way the bench's own
summary does for one run (`interval`, which plog_bench.sh imports from here).

Figures, per run: the median over the run's seconds of each second's p99, on the
client's clock (from the intended send time: what a caller saw) and on the server's
own (arrival to answer). With AA=1 runs (a second log-off server, `off2`, in each round)
it also gives each mode against the mean of both log-off runs, and `off2` against `off`:
what two identical servers differ by, the noise the other figures sit in.
"""
import json
import os
import random
import statistics
import sys

TARGET = 1.05
RESAMPLES = 10_000


def interval_of(xs, seed=13):
    """(mean, low, high): the mean of the ratios and a 90% interval of it from
    resampling them with replacement (a fixed seed: the same ratios give the same
    interval)."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(RESAMPLES))
    return statistics.fmean(xs), means[RESAMPLES // 20], means[RESAMPLES - RESAMPLES // 20 - 1]


def verdict(lo, hi, target=TARGET):
    """What an interval says of a figure asked to stay under `target`."""
    if hi < target:
        return f"under {target}"
    if lo > target:
        return f"over {target}"
    return f"cannot tell against {target}"


def interval(xs):
    """The text the bench prints for a list of ratios: mean, 90% interval, verdict."""
    mean, lo, hi = interval_of(xs)
    return f"mean {mean:.3f}, 90% interval {lo:.3f}-{hi:.3f} ({verdict(lo, hi)})"


def load_dir(out):
    """{round: {mode: (client, server, dropped)}} of one plog_bench output directory:
    each run's median per-second p99 on both clocks and its dropped records (None with
    the log off)."""
    rounds = {}
    for name in sorted(os.listdir(out)):
        if not name.endswith(".server.json"):
            continue
        run = name[: -len(".server.json")]
        bench = os.path.join(out, run + ".json")
        if not os.path.exists(bench):
            continue
        with open(os.path.join(out, name)) as f:
            server = json.load(f)
        with open(bench) as f:
            r = json.load(f)
        windows = r.get("windows") or []
        if not windows:
            raise ValueError(f"{bench}: no per-second windows (a bench run without --json windows?)")
        client = statistics.median(w["p99_us"] for w in windows)
        srv = statistics.median(w.get("server_p99_us") or 0 for w in windows)
        rnd = run.rsplit("-", 1)[1]
        mode = server["mode"]
        dropped = None if mode in ("off", "off2") else server.get("dropped")
        rounds.setdefault(rnd, {})[mode] = (client, srv, dropped)
    return rounds


def pool(dirs):
    """The pooled comparison of every mode against log off, over the rounds of `dirs`."""
    rounds = []
    for d in dirs:
        got = load_dir(d)
        if not got:
            raise ValueError(f"{d}: no plog_bench runs (no <run>.server.json with its <run>.json)")
        rounds.extend(got.values())
    modes = sorted({m for r in rounds for m in r} - {"off"})
    result = {"dirs": list(dirs), "rounds": len(rounds), "modes": {}}
    for m in modes:
        entry = {"rounds": 0}
        for k, clock in ((0, "client"), (1, "server")):
            vs_off = [r[m][k] / max(r["off"][k], 1) for r in rounds if m in r and "off" in r]
            if not vs_off:
                continue
            mean, lo, hi = interval_of(vs_off)
            entry["rounds"] = len(vs_off)
            entry[clock] = {"mean": mean, "low": lo, "high": hi, "verdict": verdict(lo, hi)}
            if m != "off2":
                both = [r[m][k] / max((r["off"][k] + r["off2"][k]) / 2, 1)
                        for r in rounds if m in r and "off" in r and "off2" in r]
                if both:
                    mean, lo, hi = interval_of(both)
                    entry[clock + "_vs_both"] = {"mean": mean, "low": lo, "high": hi,
                                                 "verdict": verdict(lo, hi), "rounds": len(both)}
        dropped = [r[m][2] for r in rounds if m in r and r[m][2] is not None]
        if dropped:
            entry["dropped"] = sum(dropped)
        if entry["rounds"]:
            result["modes"][m] = entry
    return result


def show(result):
    lines = [f"{result['rounds']} rounds from {len(result['dirs'])} runs; each mode's per-second p99 "
             "medians over its round's log-off run: mean (90% interval)"]
    for m, e in result["modes"].items():
        name = "log off again (the noise)" if m == "off2" else f"log {m}"
        lines.append(f"  {name}, {e['rounds']} rounds" + (f", dropped records: {e['dropped']:.0f}" if "dropped" in e else ""))
        for clock, label in (("client", "client's clock"), ("server", "server's clock")):
            for key, against in ((clock, "log off"), (clock + "_vs_both", "both log-off runs")):
                if key in e:
                    x = e[key]
                    lines.append(f"    {label:<15} vs {against:<18} {x['mean']:.3f} ({x['low']:.3f}-{x['high']:.3f}) {x['verdict']}")
    return "\n".join(lines)


def main(argv):
    as_json = "--json" in argv
    dirs = [a for a in argv if a != "--json"]
    if not dirs:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        result = pool(dirs)
    except (OSError, ValueError, KeyError) as e:
        print(f"plog_pool: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if as_json else show(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
