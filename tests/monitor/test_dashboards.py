"""dashboards/: generated from monitor/dashboards.py, every metric defined in monitor/metrics.py, valid
against Grafana's own schema (@grafana/schema + tsc), every PromQL expression parses (promtool), and the
alert rules pass `promtool check rules` and their unit tests (`promtool test rules`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from monitor_helpers import DASHBOARDS, tool

from monitor.dashboards import BOARDS, dump, expressions, referenced_metrics
from monitor.metrics import EXTERNAL_METRICS, dashboard_metric_names, defined_metric_names

REQUIRED_BOARDS = {"Overview", "Latency", "Throughput", "KV, prefix and host cache", "MTP", "Scheduler", "GPU",
                   "Operator"}  # fmt: skip


def load_all() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def test_committed_dashboards_are_the_generators_output() -> None:
    files = {p.name for p in DASHBOARDS.glob("*.json")}
    assert files == {b.file for b in BOARDS}
    for board in BOARDS:
        assert (DASHBOARDS / board.file).read_text() == dump(board), (
            "regenerate: python -m monitor.dashboards"
        )
    titles = {b.title.split(" / ", 1)[1].replace(" speculative decoding", "") for b in BOARDS}
    assert {
        t.replace("KV, prefix and host cache", "KV, prefix and host cache") for t in titles
    } >= REQUIRED_BOARDS


def test_every_referenced_metric_is_defined_in_monitor_metrics() -> None:
    allowed = dashboard_metric_names()
    texts = [e for d in load_all().values() for _, e in expressions(d)]
    texts += [r["expr"] for g in _alert_groups() for r in g["rules"]]
    for expr in texts:
        used = referenced_metrics(expr)
        assert used, f"no metric found in {expr!r}"
        assert used <= allowed, f"{sorted(used - allowed)} in {expr!r} are not in monitor/metrics.py"


def test_the_name_check_catches_an_undefined_metric() -> None:
    used = referenced_metrics('sum(rate(ninfer_made_up_total{instance=~"$instance"}[1m]))')
    assert used == {"ninfer_made_up_total"} and not used <= dashboard_metric_names()
    assert "ninfer_requests_total" in defined_metric_names() and "DCGM_FI_DEV_GPU_UTIL" in EXTERNAL_METRICS


def test_dashboards_validate_against_grafanas_schema(tmp_path: Path) -> None:
    tsc = tool("tsc")
    modules = Path(os.path.realpath(tsc)).parents[2]  # <dir>/node_modules/typescript/bin/tsc
    assert (modules / "@grafana" / "schema").is_dir(), modules
    (tmp_path / "node_modules").symlink_to(modules)
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True, "module": "esnext",
                            "moduleResolution": "bundler", "target": "es2020"},
        "include": ["*.ts"],
    }))  # fmt: skip
    dashboards = load_all()
    for name, doc in dashboards.items():
        body = json.dumps(doc, indent=1)
        ts = f"import type {{ Dashboard }} from '@grafana/schema';\nexport const d: Dashboard = {body};\n"
        (tmp_path / (name.removesuffix(".json").replace("-", "_") + ".ts")).write_text(ts)
    # the check has teeth: a wrong type in a copy fails
    bad = json.loads(json.dumps(next(iter(dashboards.values()))))
    bad["panels"][0]["gridPos"]["h"] = "8"
    (tmp_path / "broken.ts").write_text(
        f"import type {{ Dashboard }} from '@grafana/schema';\nexport const d: Dashboard = {json.dumps(bad)};\n"
    )
    done = subprocess.run([tsc, "-p", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    errors = [line for line in done.stdout.splitlines() if "error TS" in line]
    assert errors and all(line.startswith("broken.ts") for line in errors), done.stdout
    (tmp_path / "broken.ts").unlink()
    done = subprocess.run([tsc, "-p", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_panel_expression_parses_in_promtool(tmp_path: Path) -> None:
    rules = [{"record": f"check:{i}", "expr": expr}
             for i, (_, expr) in enumerate(e for d in load_all().values() for e in expressions(d))]  # fmt: skip
    path = tmp_path / "panels.yml"
    path.write_text(json.dumps({"groups": [{"name": "panels", "rules": rules}]}))
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
    path.write_text(
        json.dumps({"groups": [{"name": "bad", "rules": [{"record": "x", "expr": "sum(rate(x[1m]) by"}]}]})
    )
    assert (
        subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True).returncode != 0
    )


def _alert_groups() -> list[dict]:
    import yaml

    return yaml.safe_load((DASHBOARDS / "alerts.yml").read_text())["groups"]


def test_alert_rules_check_and_unit_tests_pass() -> None:
    names = {r["alert"] for g in _alert_groups() for r in g["rules"]}
    assert {"NInferServerDown", "NInferTTFTP95High", "NInferQueueGrowing", "NInferKVCacheNearFull",
            "NInferHostCacheThrash"} <= names  # fmt: skip
    check = subprocess.run([tool("promtool"), "check", "rules", "alerts.yml"], cwd=DASHBOARDS,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=DASHBOARDS,
                          capture_output=True, text=True)  # fmt: skip
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
    tested = set(__import__("re").findall(r"alertname: (\w+)", (DASHBOARDS / "alerts_test.yml").read_text()))
    assert tested == names, f"alerts without a unit test: {names - tested}"
