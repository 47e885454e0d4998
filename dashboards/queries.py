"""The Grafana dashboard's panels and queries, and a Prometheus configured to run them
against one mesh: what dashboards/check.sh, tests/e2e/test_prometheus.py and
bench/gpu_panel.sh share (each puts this directory on its import path)."""
import json
import re
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "grafana" / "inference-mesh.json"
PROM_DIR = HERE / "prometheus"

# Grafana's variables as Grafana expands them for one range query; `model` is given.
VARIABLES = [("$__rate_interval", "1m"), ("${__rate_interval}", "1m"), ("$__interval", "15s"),
             ("${__interval}", "15s"), ("$__range", "1h"), ("${__range}", "1h")]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(ps):
    """Every panel of `ps`, and the panels of rows (collapsed ones hold their panels)."""
    for p in ps:
        yield p
        yield from panels(p.get("panels", []))


def expand(expr: str, model: str) -> str:
    """`expr` with Grafana's variables expanded, `$model` to `model`; a `$` left in it
    is a variable Grafana would not know."""
    for var, value in VARIABLES + [("${model}", model), ("$model", model)]:
        expr = expr.replace(var, value)
    return expr


def prometheus_config(work: Path, target: str) -> Path:
    """dashboards/prometheus/ copied into `work`, prometheus.yml scraping `target`
    every second (rule_files resolve against the copy, as against the original)."""
    conf = work / "prometheus"
    shutil.copytree(PROM_DIR, conf)
    text = (PROM_DIR / "prometheus.yml").read_text()
    for old, new in [("127.0.0.1:8000", target)]:
        assert old in text, f"prometheus.yml no longer names {old}"
        text = text.replace(old, new)
    for key in ("scrape_interval", "evaluation_interval"):
        text, n = re.subn(rf"^(\s*{key}:)\s*\S+", r"\1 1s", text, flags=re.M)
        assert n >= 1, f"prometheus.yml has no {key}"
    (conf / "prometheus.yml").write_text(text)
    return conf / "prometheus.yml"
