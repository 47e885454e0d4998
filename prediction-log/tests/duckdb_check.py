#!/usr/bin/env python3
"""Reads a prediction log with the `duckdb` package alone and checks that the per
(model, version, role, protocol) counts and ROC AUC equal those of `mesh logs join --json`.

    python3 prediction-log/tests/duckdb_check.py --logs DIR --labels FILE --join JOIN.json \
        [--key request_id] [--label label]

Exit status 0 when everything matches, 1 (with the differences) otherwise. The SQL is the
one shown in prediction-log/README.md.
"""
import argparse
import json
import sys

import duckdb

SQL = """
WITH logs AS (
    SELECT * FROM read_parquet($logs_glob, hive_partitioning = true, union_by_name = true)
),
raw_labels AS (
    SELECT trim(CAST({key} AS VARCHAR)) AS key,
           lower(trim(CAST({label} AS VARCHAR))) AS v,
           row_number() OVER () AS rn
    FROM {labels_source}
),
parsed AS (
    SELECT key, rn,
           CASE WHEN v IN ('1', 'true', 't', 'yes', 'y') THEN 1
                WHEN v IN ('0', 'false', 'f', 'no', 'n') THEN 0
                WHEN isfinite(TRY_CAST(v AS DOUBLE)) THEN CAST(TRY_CAST(v AS DOUBLE) > 0.5 AS INTEGER)
           END AS label
    FROM raw_labels
),
labels AS (              -- valid labels, first row per key wins
    SELECT key, label FROM parsed
    WHERE label IS NOT NULL AND key <> ''
    QUALIFY row_number() OVER (PARTITION BY key ORDER BY rn) = 1
),
joined AS (
    SELECT l.model, l.version, l.role, coalesce(l.protocol, 'unknown') AS protocol, l.score, lb.label
    FROM logs l LEFT JOIN labels lb ON lb.key = l.{log_key}
),
ranked AS (              -- average rank of tied scores, per group, labelled & scored rows
    SELECT model, version, role, protocol, label,
           rank() OVER (PARTITION BY model, version, role, protocol ORDER BY score)
             + (count(*) OVER (PARTITION BY model, version, role, protocol, score) - 1) / 2.0 AS r
    FROM joined
    WHERE label IS NOT NULL AND score IS NOT NULL AND isfinite(score)
),
auc AS (                 -- Mann-Whitney U / (pos * neg)
    SELECT model, version, role, protocol,
           (sum(r) FILTER (WHERE label = 1)
             - count(*) FILTER (WHERE label = 1) * (count(*) FILTER (WHERE label = 1) + 1) / 2.0)
           / nullif(count(*) FILTER (WHERE label = 1) * count(*) FILTER (WHERE label = 0), 0) AS roc_auc
    FROM ranked GROUP BY ALL
)
SELECT j.model, j.version, j.role, j.protocol,
       count(*) AS predictions,
       count(j.label) AS labelled,
       count(*) FILTER (WHERE j.label = 1) AS positives,
       any_value(a.roc_auc) AS roc_auc
FROM joined j LEFT JOIN auc a USING (model, version, role, protocol)
GROUP BY ALL
ORDER BY ALL
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True, help="prediction log directory")
    ap.add_argument("--labels", required=True, help="labels file (.csv or .parquet)")
    ap.add_argument("--join", required=True, help="output of `mesh logs join --json`")
    ap.add_argument("--key", default="request_id")
    ap.add_argument("--label", default="label")
    args = ap.parse_args()

    if args.labels.endswith(".parquet"):
        labels_source = "read_parquet($labels)"
    else:
        labels_source = "read_csv($labels, header = true, all_varchar = true)"
    if args.key != "request_id":
        print("duckdb_check: only --key request_id is checked", file=sys.stderr)
        return 2
    sql = SQL.format(key=args.key, label=args.label, labels_source=labels_source, log_key="request_id")
    con = duckdb.connect()
    rows = con.execute(sql, {"logs_glob": f"{args.logs}/**/*.parquet", "labels": args.labels}).fetchall()
    duck = {(m, v, r, pr): (p, l, pos, auc) for m, v, r, pr, p, l, pos, auc in rows}

    with open(args.join) as f:
        report = json.load(f)
    ours = {
        (g["model"], g["version"], g["role"], g["protocol"]): (g["predictions"], g["labelled"], g["positives"], g["roc_auc"])
        for g in report["groups"]
    }

    problems = []
    if set(duck) != set(ours):
        problems.append(f"groups differ: duckdb {sorted(duck)} vs join {sorted(ours)}")
    for k in sorted(set(duck) & set(ours)):
        d, o = duck[k], ours[k]
        if d[:3] != tuple(o[:3]):
            problems.append(f"{k}: counts (predictions, labelled, positives) duckdb {d[:3]} vs join {tuple(o[:3])}")
        if (d[3] is None) != (o[3] is None) or (d[3] is not None and abs(float(d[3]) - o[3]) > 1e-9):
            problems.append(f"{k}: roc_auc duckdb {d[3]} vs join {o[3]}")
    total = sum(v[0] for v in duck.values())
    if total != report["records"]:
        problems.append(f"records: duckdb {total} vs join {report['records']}")

    for k in sorted(duck):
        print(f"{k[0]} v{k[1]} {k[2]} {k[3]}: predictions={duck[k][0]} labelled={duck[k][1]} "
              f"positives={duck[k][2]} auc={duck[k][3]}")
    if problems:
        print("MISMATCH:\n  " + "\n  ".join(problems))
        return 1
    print(f"duckdb_check: {len(duck)} groups, {total} records: counts and AUC match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
