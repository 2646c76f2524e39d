"""Render unit tests for routing.py and names.py: the Service, the Gateway API Inference Extension objects
(InferencePool + HTTPRoute), the legacy Ingress, and child names that are always valid."""

from __future__ import annotations

import re
from typing import Any

import pytest
from ninfer_operator import names, resources, routing


def _render(spec: dict[str, Any], name: str = "m") -> dict[str, Any]:
    labels, sel = resources.labels(name), resources.selector(name)
    return {
        "pool": routing.render_inference_pool(name, spec, labels, sel),
        "route": routing.render_http_route(name, spec, labels),
        "ingress": routing.render_ingress(name, spec, labels),
        "service": routing.render_service(name, spec, labels, sel),
        "deployment": resources.render_deployment(name, spec, "img"),
    }


def test_gateway_routing_renders_a_pool_over_the_server_pods_and_a_route_to_it(
    sample_spec: dict[str, Any],
) -> None:
    sample_spec["routing"]["gateway"].update(namespace="gw-ns", hostnames=["llm.example.com"])
    out = _render(sample_spec)
    pool, route, dep = out["pool"], out["route"], out["deployment"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    # the pool selects exactly the Deployment's pods, on the server's port
    assert pool["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "m-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gateway",
            "namespace": "gw-ns",
            "sectionName": "http",
        }
    ]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "m"}
    ]
    assert rule["timeouts"] == {"request": "3600s"}
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    assert out["ingress"] is None
    assert out["service"]["spec"]["selector"] == pool["spec"]["selector"]["matchLabels"]


def test_endpoint_picker_reference_follows_the_spec(sample_spec: dict[str, Any]) -> None:
    sample_spec["routing"]["gateway"]["endpointPicker"] = {
        "service": "shared-epp",
        "port": 9102,
        "failureMode": "FailOpen",
    }
    ref = _render(sample_spec)["pool"]["spec"]["endpointPickerRef"]
    assert ref == {
        "kind": "Service",
        "name": "shared-epp",
        "port": {"number": 9102},
        "failureMode": "FailOpen",
    }


def test_without_routing_only_the_plain_service_remains(sample_spec: dict[str, Any]) -> None:
    del sample_spec["routing"]
    out = _render(sample_spec)
    assert out["pool"] is None and out["route"] is None and out["ingress"] is None
    assert out["service"]["spec"]["ports"][0] == {
        "name": "http",
        "port": 8080,
        "targetPort": "http",
        "protocol": "TCP",
    }
    assert "--metrics-vllm-aliases" not in resources.server_args(sample_spec, "/a")


def test_legacy_ingress_hashes_the_session_header_and_can_terminate_tls(sample_spec: dict[str, Any]) -> None:
    sample_spec["routing"] = {
        "ingress": {"sessionHeader": "X-Session-Id", "host": "llm.example.com", "tlsSecret": "llm-tls"}
    }
    ing = _render(sample_spec)["ingress"]
    assert (
        ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_session_id"
    )
    assert ing["spec"]["rules"][0]["http"]["paths"][0]["backend"] == {
        "service": {"name": "m", "port": {"name": "http"}}
    }
    assert ing["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    sample_spec["routing"]["gateway"] = {"name": "gw"}
    assert "alternatives" in resources.validate_spec("m", sample_spec)[0]


@pytest.mark.parametrize(
    "name",
    ["m", "qwen3.6-27b", "9b-model", "a" * 63, "x." * 31 + "y", "Qwen_Big", "a" * 200],
)
def test_child_names_are_always_dns_1035_labels(name: str) -> None:
    for suffix in ("", "model", "epp"):
        child = names.child_name(name, suffix)
        assert re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", child) and len(child) <= 63, child
    assert len(resources.labels(name)[resources.INSTANCE_LABEL]) <= 63


def test_child_names_keep_simple_names_and_never_collide() -> None:
    assert names.child_name("qwen27b") == "qwen27b"
    assert names.child_name("qwen27b", "model") == "qwen27b-model"
    dotted, dashed = names.child_name("qwen3.6-27b"), names.child_name("qwen3-6-27b")
    assert dotted != dashed and dotted.startswith("qwen3-6-27b-")
    long_a, long_b = names.child_name("a" * 60 + "x"), names.child_name("a" * 60 + "y")
    assert long_a != long_b


def test_name_rules_match_the_crd() -> None:
    assert names.name_errors("qwen3.6-27b") == []
    assert "63" in names.name_errors("a" * 69)[0]
    assert names.name_errors("Bad_Name")


def test_the_operator_watches_only_its_children_server_side() -> None:
    import kopf
    from ninfer_operator.handlers import watch_selectors

    settings = kopf.OperatorSettings()
    watch_selectors(settings)
    collect = settings.watching.label_selectors.collect
    for group, plural in (("apps", "deployments"), ("batch", "jobs"), ("", "services"), ("", "configmaps")):
        assert collect(kopf.Resource(group, "v1", plural)) == ["app.kubernetes.io/managed-by=ninfer-operator"]
    assert collect(kopf.Resource("", "v1", "nodes")) == ["nvidia.com/gpu.product"]
    assert collect(kopf.Resource("ninfer.io", "v1alpha1", "ninferdeployments")) == []
