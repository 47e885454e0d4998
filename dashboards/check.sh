#!/usr/bin/env bash
# Checks the dashboards offline: the Prometheus config and alert rules (promtool),
# the alert rules' unit tests, and the Grafana dashboard (JSON shape, every panel
# query names the datasource input, every query parses as PromQL).
# Exits non-zero on any failure. Needs promtool (Debian: apt-get install prometheus)
# and python3; a missing promtool is a failure, not a skip.
#
#   bash dashboards/check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

PROMTOOL=${PROMTOOL:-promtool}
PYTHON=${PYTHON:-python3}
. scripts/step.sh

if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
    echo "FAILED: promtool not found (install Debian's prometheus package, or set PROMTOOL)" >&2
    exit 1
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "FAILED: $PYTHON not found (set PYTHON)" >&2
    exit 1
fi
echo "promtool: $("$PROMTOOL" --version 2>&1 | head -n1)"

step "promtool check config dashboards/prometheus/prometheus.yml" \
    "$PROMTOOL" check config dashboards/prometheus/prometheus.yml
step "promtool check rules dashboards/prometheus/alerts.yml" \
    "$PROMTOOL" check rules dashboards/prometheus/alerts.yml
step "promtool test rules dashboards/prometheus/alerts_test.yml" \
    "$PROMTOOL" test rules dashboards/prometheus/alerts_test.yml

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check_grafana() {
    # Validates the dashboard and writes every panel query (Grafana variables
    # expanded) as a recording rule, for promtool to parse.
    PYTHONPATH=dashboards "$PYTHON" - dashboards/grafana/inference-mesh.json "$tmp/panel_queries.yml" <<'EOF'
import json
import sys

from queries import expand, panels

path, rules_out = sys.argv[1], sys.argv[2]
DS = "${DS_PROMETHEUS}"
errors = []
with open(path) as f:
    d = json.load(f)  # a JSON error fails here, with its position

inputs = d.get("__inputs", [])
if not any(i.get("name") == "DS_PROMETHEUS" and i.get("type") == "datasource" and i.get("pluginId") == "prometheus"
           for i in inputs):
    errors.append("__inputs has no DS_PROMETHEUS datasource input (pluginId prometheus)")
if not any(r.get("type") == "datasource" and r.get("id") == "prometheus" for r in d.get("__requires", [])):
    errors.append("__requires does not name the prometheus datasource")
if d.get("schemaVersion") != 39:
    errors.append(f"schemaVersion is {d.get('schemaVersion')!r}, expected 39")

def uid(ds):
    return ds.get("uid") if isinstance(ds, dict) else ds

variables = d.get("templating", {}).get("list", [])
names = {v.get("name") for v in variables}
if "model" not in names:
    errors.append("no 'model' template variable")
for v in variables:
    if v.get("type") == "query" and uid(v.get("datasource")) != DS:
        errors.append(f"variable {v.get('name')}: datasource is not {DS}")

ids, queries, npanels = set(), [], 0
for p in panels(d.get("panels", [])):
    title = p.get("title", "<untitled>")
    if p.get("id") in ids:
        errors.append(f"panel {title!r}: duplicate id {p.get('id')}")
    ids.add(p.get("id"))
    if "gridPos" not in p:
        errors.append(f"panel {title!r}: no gridPos")
    if p.get("type") == "row":
        continue  # rows group panels; they have no queries
    npanels += 1
    if uid(p.get("datasource")) != DS:
        errors.append(f"panel {title!r}: datasource is {p.get('datasource')!r}, not {DS}")
    targets = p.get("targets") or []
    if not targets:
        errors.append(f"panel {title!r}: no targets")
    for t in targets:
        ref = t.get("refId", "?")
        expr = (t.get("expr") or "").strip()
        if not expr:
            errors.append(f"panel {title!r} target {ref}: no expr")
            continue
        if uid(t.get("datasource", p.get("datasource"))) != DS:
            errors.append(f"panel {title!r} target {ref}: datasource is not {DS}")
        if "rate(" in expr and "[" in expr and "$__rate_interval" not in expr and p.get("type") != "stat":
            errors.append(f"panel {title!r} target {ref}: a rate without $__rate_interval")
        q = expand(expr, ".*")
        if "$" in q:
            errors.append(f"panel {title!r} target {ref}: unknown variable in {expr}")
        queries.append((title, ref, q))

with open(rules_out, "w") as f:
    f.write("groups:\n  - name: dashboard_panel_queries\n    rules:\n")
    for i, (title, ref, q) in enumerate(queries):
        f.write(f"      - record: dashboard:panel_query_{i}\n        expr: {json.dumps(q)}\n")

for e in errors:
    print("   " + e)
print(f"   {path}: {npanels} panels, {len(queries)} queries, {len(variables)} variables")
sys.exit(1 if errors else 0)
EOF
}

step "grafana dashboard dashboards/grafana/inference-mesh.json (shape, datasource, targets)" check_grafana
if [ -s "$tmp/panel_queries.yml" ]; then
    step "every dashboard panel query parses (promtool check rules)" \
        "$PROMTOOL" check rules "$tmp/panel_queries.yml"
else
    echo "== every dashboard panel query parses: not run (no queries extracted)"
    failed=1
fi

if [ "$failed" -ne 0 ]; then
    echo "dashboards/check.sh: FAILED"
    exit 1
fi
echo "dashboards/check.sh: all checks passed"
