"""The Grafana dashboards' PromQL, for tests that run it against a real Prometheus.

    from support.dashboards import dashboard_exprs
    for expr in dashboard_exprs():          # '$__rate_interval' etc. already '1m'
        prometheus.query(expr)

Dashboards are the JSON files under ``deploy/grafana/dashboards/``; panels
nested in collapsed rows count too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "deploy" / "grafana" / "dashboards"

# Grafana's built-in interval variables, as $name or ${name}.
GRAFANA_INTERVALS = re.compile(
    r"\$(?:__rate_interval|__interval|__range)\b"
    r"|\$\{(?:__rate_interval|__interval|__range)\}"
)


class Target(NamedTuple):
    file: str       # dashboard file name
    panel: str      # panel title
    ref_id: str
    expr: str       # as written in the dashboard, Grafana variables included


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARD_DIR.glob("*.json"))


def load_dashboard(path: Path) -> dict:
    return json.loads(path.read_text())


def iter_panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, including those inside (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from iter_panels(panel)


def dashboard_targets() -> list[Target]:
    """Every Prometheus query target of every dashboard, unsubstituted."""
    found = []
    for path in dashboard_files():
        for panel in iter_panels(load_dashboard(path)):
            for target in panel.get("targets", []):
                title, ref_id = panel.get("title", ""), target.get("refId", "")
                found.append(Target(path.name, title, ref_id, target.get("expr", "")))
    return found


def substitute(expr: str, interval: str = "1m") -> str:
    """Replace Grafana's $__rate_interval / $__interval / $__range with a fixed duration."""
    return GRAFANA_INTERVALS.sub(interval, expr)


def dashboard_exprs(interval: str = "1m") -> list[str]:
    """All PromQL expressions of all dashboards, ready for Prometheus (Grafana intervals -> ``interval``)."""
    return [substitute(t.expr, interval) for t in dashboard_targets() if t.expr.strip()]
