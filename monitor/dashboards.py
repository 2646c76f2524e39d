"""The Grafana dashboards in `dashboards/`, generated from one table so every query uses the same names.

The boards are declared in `monitor.dashboard_boards` with the blocks of `monitor.dashboard_kit`; this
module renders them to Grafana JSON.

`python -m monitor.dashboards [DIR]` writes `DIR/ninfer-*.json` (default: the repository's `dashboards/`);
tests check that the committed files equal this output, that every metric they reference is defined in
`monitor.metrics` (or listed there as external), and that Grafana's schema accepts them.

Queries filter NInfer series by `instance=~"$instance"` and rate over `$__rate_interval`; `expressions()`
lists every panel query with the variables substituted, for Prometheus checks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from monitor.dashboard_boards import BOARDS
from monitor.dashboard_kit import DS, Board, P

__all__ = ["BOARDS", "dump", "expressions", "referenced_metrics", "render"]


def _panel(p: P, panel_id: int, x: int, y: int) -> dict[str, Any]:
    width = 8 if p.kind == "stat" else 12
    targets: list[dict[str, Any]] = [
        {"datasource": DS, "expr": q.expr, "legendFormat": q.legend or "__auto", "refId": chr(ord("A") + i)}
        for i, q in enumerate(p.queries)
    ]
    if p.kind == "table":
        for t in targets:
            t["format"] = "table"
            t["instant"] = True
    panel: dict[str, Any] = {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "datasource": DS,
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        if p.kind == "timeseries"
        else {},
        "targets": targets,
    }
    if p.description:
        panel["description"] = p.description
    return panel


def _variables() -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "hide": 0,
        },
        {
            "name": "instance",
            "label": "Instance",
            "type": "query",
            "datasource": DS,
            "query": {"query": "label_values(ninfer_build_info, instance)", "refId": "instance"},
            "includeAll": True,
            "allValue": ".+",
            "multi": True,
            "refresh": 2,
            "sort": 1,
            "hide": 0,
            "current": {"text": "All", "value": "$__all"},
        },
    ]


def render(board: Board) -> dict[str, Any]:
    panels, x, y = [], 0, 0
    for i, p in enumerate(board.panels, start=1):
        panel = _panel(p, i, x, y)
        w = panel["gridPos"]["w"]
        if x + w > 24:
            x, y = 0, y + 8
            panel["gridPos"].update(x=x, y=y)
        panels.append(panel)
        x += w
    return {
        "uid": board.uid,
        "title": board.title,
        "description": board.description,
        "tags": list(board.tags),
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 41,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": _variables()},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def dump(board: Board) -> str:
    return json.dumps(render(board), indent=2, ensure_ascii=False) + "\n"


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables replaced by concrete values."""
    out = []
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            expr = str(target["expr"]).replace("$__rate_interval", "1m").replace("$instance", ".+")
            out.append((str(panel.get("title")), expr))
    return out


METRIC_NAME = re.compile(r"\b(ninfer_[a-z0-9_]+|DCGM_[A-Z0-9_]+|kube_[a-z0-9_]+|up)\b(?!\s*\()")


def referenced_metrics(expr: str) -> set[str]:
    """Metric names an expression uses (ours, DCGM's, kube-state-metrics', `up`); strings are ignored."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(METRIC_NAME.findall(without_strings))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "dashboards"
    out.mkdir(parents=True, exist_ok=True)
    for board in BOARDS:
        (out / board.file).write_text(dump(board), encoding="utf-8")
        print(out / board.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
