"""The Helm chart and the rendered manifests, checked offline: helm lint, kubernetes-validate --strict,
the CRD file in sync with crd.py, values.schema.json enforcement, Grafana dashboard ConfigMaps."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_cluster import REPO, tool_path
from ninfer_operator import crd, resources, routing

CHART = REPO / "charts" / "ninfer-operator"
K8S_SCHEMA_VERSION = "1.35.0"  # kubernetes-validate's bundled schemas; the chart also installs on 1.20 (e2e)


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(args[0], path=tool_path())
    if tool is None:
        pytest.fail(f"{args[0]} not found (run scripts/setup/20-k8s.sh)", pytrace=False)
    proc = subprocess.run([tool, *args[1:]], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def validate_strict(path: Path) -> subprocess.CompletedProcess[str]:
    validator = Path(sys.executable).with_name("kubernetes-validate")
    return subprocess.run(
        [str(validator), "-k", K8S_SCHEMA_VERSION, "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def template(*sets: str, chart: Path = CHART) -> list[dict[str, Any]]:
    args = ["helm", "template", "rel", str(chart), "--namespace", "ninfer-system", "--include-crds"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(run(*args).stdout) if d]


def test_helm_lint_passes() -> None:
    out = run("helm", "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out.stdout


def test_rendered_chart_passes_kubernetes_validate_strict(tmp_path: Path) -> None:
    docs = template()
    kinds = sorted(d["kind"] for d in docs)
    for kind in (
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "ServiceAccount",
    ):
        assert kind in kinds
    path = tmp_path / "chart.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    proc = validate_strict(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed for resource deployment/rel-ninfer-operator" in proc.stdout


def test_operator_rendered_children_pass_kubernetes_validate_strict(
    tmp_path: Path, sample_spec: dict[str, Any]
) -> None:
    labels, sel = resources.labels("m"), resources.selector("m")
    legacy = {
        **sample_spec,
        "routing": {"ingress": {"sessionHeader": "X-Session-Id", "tlsSecret": "t", "host": "h"}},
    }
    docs = [
        resources.render_verify_job(sample_spec, "img"),
        resources.render_deployment("m", sample_spec, "img"),
        routing.render_service("m", sample_spec, labels, sel),
        resources.render_config_map("m", sample_spec),
        routing.render_ingress("m", legacy, labels),
    ]
    path = tmp_path / "children.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    proc = validate_strict(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("passed for resource") == len(docs)


def test_chart_crd_matches_crd_py() -> None:
    shipped = (CHART / "crds" / "ninferdeployments.ninfer.io.yaml").read_text()
    assert shipped == crd.render_crd_yaml(), "regenerate with scripts/k8s/gen-crd.sh"


def test_crd_has_status_scale_and_printer_columns() -> None:
    version = crd.render_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    # Serving is the digest the pods run (status.servingDigest), not the one the spec asks for
    assert columns[:6] == ["Model", "Serving", "Wanted", "Ready", "Verified", "Phase"]
    name = version["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"]["name"]
    assert name["maxLength"] == 63
    artifact = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]["properties"]
    assert artifact["artifact"]["required"] == ["uri", "sha256"]


def test_values_schema_rejects_bad_values() -> None:
    proc = run("helm", "template", "rel", str(CHART), "--set", "operator.logLevel=loud", check=False)
    assert proc.returncode != 0 and "logLevel" in proc.stderr
    proc = run("helm", "template", "rel", str(CHART), "--set", "unknownKey=1", check=False)
    assert proc.returncode != 0


def test_operator_deployment_is_least_privilege_and_non_root() -> None:
    docs = template("operator.watchNamespaces={a,b}")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    args = pod["containers"][0]["args"]
    assert "--namespace=a" in args and "--namespace=b" in args and "--all-namespaces" not in args
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        if rule["resources"] == ["deployments"]:
            assert "delete" not in rule["verbs"]  # children are deleted by the garbage collector


def test_dashboards_become_configmaps_labelled_for_grafana(tmp_path: Path) -> None:
    chart = tmp_path / "ninfer-operator"
    shutil.copytree(CHART, chart, symlinks=False)
    dash = chart / "dashboards"
    if dash.is_symlink():
        dash.unlink()
    shutil.rmtree(dash, ignore_errors=True)  # replace the repo's dashboards with two known files
    dash.mkdir()
    (dash / "ninfer_overview.json").write_text('{"title": "NInfer overview", "panels": []}')
    (dash / "kv_cache.json").write_text('{"title": "KV cache", "panels": []}')
    maps = [d for d in template(chart=chart) if d["kind"] == "ConfigMap"]
    assert sorted(m["metadata"]["name"] for m in maps) == [
        "rel-ninfer-operator-dashboard-kv-cache",
        "rel-ninfer-operator-dashboard-ninfer-overview",
    ]
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert (
        '"title": "KV cache"'
        in next(m for m in maps if "kv-cache" in m["metadata"]["name"])["data"]["kv_cache.json"]
    )
    assert not [
        d for d in template("grafanaDashboards.enabled=false", chart=chart) if d["kind"] == "ConfigMap"
    ]


def test_repo_dashboards_are_all_shipped() -> None:
    shipped = [d for d in template() if d["kind"] == "ConfigMap"]
    assert len(shipped) == len(list((REPO / "dashboards").glob("*.json")))


def test_service_monitor_and_prometheus_rule_are_optional() -> None:
    kinds = {d["kind"] for d in template()}
    assert "ServiceMonitor" not in kinds and "PrometheusRule" not in kinds
    docs = template("serviceMonitor.enabled=true", "prometheusRule.enabled=true")
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "ninfer-operator"
    assert {e["port"] for e in sm["spec"]["endpoints"]} == {"http", "monitor"}
    assert any(d["kind"] == "PrometheusRule" for d in docs)


EPP_VALUES = ("endpointPicker.enabled=true", "endpointPicker.image.tag=v0.7.0", "endpointPicker.pools[0].name=m",
              "endpointPicker.pools[0].namespace=models")  # fmt: skip


def test_chart_lints_and_validates_with_the_endpoint_picker(tmp_path: Path) -> None:
    out = run("helm", "lint", str(CHART), "--strict", *[a for v in EPP_VALUES for a in ("--set", v)])
    assert "0 chart(s) failed" in out.stdout
    docs = template(*EPP_VALUES)
    epp = [d for d in docs if d["metadata"]["name"] == "m-epp"]
    assert sorted(d["kind"] for d in epp) == [
        "ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"
    ]  # fmt: skip
    assert {d["metadata"]["namespace"] for d in epp} == {"models"}
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump_all(epp))
    proc = validate_strict(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_endpoint_picker_is_what_the_operators_inference_pool_references(sample_spec: dict[str, Any]) -> None:
    docs = template(*EPP_VALUES)
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "m-epp")
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "m-epp")
    pool = routing.render_inference_pool("m", sample_spec, resources.labels("m"), resources.selector("m"))
    assert pool is not None
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--pool-name={pool['metadata']['name']}" in args and "--pool-namespace=models" in args
    assert service["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_endpoint_picker_reads_metrics_the_server_exports_under_an_inference_pool() -> None:
    """The picker's metric names are ones ninfer-serve's /metrics has with --metrics-vllm-aliases (which
    the operator sets for every pod in an InferencePool), and the plugins are prefix-aware."""
    from monitor.metrics import ServerMetrics, exposed_names

    docs = template(*EPP_VALUES)
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "m-epp")
    config = yaml.safe_load(config_map["data"]["ninfer-plugins.yaml"])
    plugins = {p["type"]: p.get("parameters") or {} for p in config["plugins"]}
    (engine,) = plugins["core-metrics-extractor"]["engineConfigs"]
    wanted = {engine[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")}
    exported = exposed_names(ServerMetrics(vllm_aliases=True).registry)
    assert wanted <= exported, (
        f"the picker reads {sorted(wanted - exported)}, which ninfer-serve does not export"
    )
    assert not wanted & exposed_names(ServerMetrics().registry), (
        "the aliases are what --metrics-vllm-aliases adds"
    )
    profile = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert profile["prefix-cache-scorer"] >= max(
        profile["queue-scorer"], profile["kv-cache-utilization-scorer"]
    )
    assert plugins["approx-prefix-cache-producer"]["lruCapacityPerServer"] > 0


def test_endpoint_picker_needs_a_pinned_image() -> None:
    proc = run("helm", "template", "rel", str(CHART), "--set", "endpointPicker.enabled=true", check=False)
    assert proc.returncode != 0 and "pin an llm-d-router-endpoint-picker release" in proc.stderr
