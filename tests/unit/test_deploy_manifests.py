"""deploy/ manifests: each validates offline against its schema, and they agree with each other and the server.

Kubernetes kinds validate against the Kubernetes API schemas of the `kubernetes-validate` package (strict:
unknown fields fail); KServe kinds against KServe's CRDs checked in under tests/data/crds (source named in each
file) plus stricter spec schemas written from KServe's API types; the PodMonitor against a minimal schema.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

from service.config.flags import parse_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = ROOT / "tests" / "data" / "crds"
K8S_VERSIONS = ["1.29", kubernetes_validate.utils.latest_version()]
CRD_FILES = {
    "ServingRuntime": "serving.kserve.io_servingruntimes.yaml",
    "ClusterServingRuntime": "serving.kserve.io_clusterservingruntimes.yaml",
    "InferenceService": "serving.kserve.io_inferenceservices.yaml",
}
SPEC_SCHEMAS = {
    "ServingRuntime": "servingruntime-spec.schema.json",
    "ClusterServingRuntime": "servingruntime-spec.schema.json",
    "InferenceService": "inferenceservice-predictor.schema.json",
}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, resource) for every YAML document under deploy/."""
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(ROOT)), doc))
    return out


def by_kind(kind: str) -> dict[str, Any]:
    """The one manifest of a kind."""
    found = [doc for _, doc in manifests() if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def k8s_registry() -> Any:
    """A referencing registry holding the Kubernetes definitions (for $refs to core types)."""
    version = kubernetes_validate.utils.latest_version()
    defs = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
    )
    return referencing.Resource.from_contents(defs) @ referencing.Registry()


def validate_with(schema: dict[str, Any], instance: Any) -> None:
    jsonschema.Draft202012Validator(schema, registry=k8s_registry()).validate(instance)


def test_there_are_manifests_of_every_kind() -> None:
    kinds = {doc["kind"] for _, doc in manifests()}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor", "ClusterServingRuntime"} <= kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_kinds_validate_strictly(version: str) -> None:
    checked = 0
    for name, doc in manifests():
        if doc["kind"] in CRD_FILES or doc["kind"] == "PodMonitor":
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        checked += 1
    assert checked >= 4


def test_kserve_kinds_validate_against_kserve_crds() -> None:
    checked = 0
    for name, doc in manifests():
        if doc["kind"] not in CRD_FILES:
            continue
        crd = yaml.safe_load((CRDS / CRD_FILES[doc["kind"]]).read_text())
        group, _, version = doc["apiVersion"].partition("/")
        assert group == crd["spec"]["group"], name
        served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
        assert version in served, f"{name}: {doc['apiVersion']} is not a served version of {doc['kind']}"
        jsonschema.Draft202012Validator(served[version]["schema"]["openAPIV3Schema"]).validate(doc)
        if crd["spec"]["scope"] == "Cluster":
            assert "namespace" not in doc["metadata"], name
        validate_with(json.loads((CRDS / SPEC_SCHEMAS[doc["kind"]]).read_text()), doc["spec"])
        checked += 1
    assert checked >= 2


def test_spec_schema_rejects_a_mistyped_runtime() -> None:
    """The stricter ServingRuntime schema catches what KServe's open minimal CRD would not."""
    schema = json.loads((CRDS / "servingruntime-spec.schema.json").read_text())
    spec = json.loads(json.dumps(by_kind("ClusterServingRuntime")["spec"]))
    spec["containers"][0]["ports"][0]["containerPort"] = "8080"
    with pytest.raises(jsonschema.ValidationError):
        validate_with(schema, spec)
    spec = json.loads(json.dumps(by_kind("ClusterServingRuntime")["spec"]))
    spec["protocolVersion"] = ["v2"]  # singular: a typo of protocolVersions
    with pytest.raises(jsonschema.ValidationError):
        validate_with(schema, spec)


def test_podmonitor_validates() -> None:
    validate_with(json.loads((CRDS / "podmonitor.schema.json").read_text()), by_kind("PodMonitor"))


# ---- the manifests agree with each other and with the server's flags -------------------------------------------
def container(kind: str) -> dict[str, Any]:
    doc = by_kind(kind)
    spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]
    return spec["containers"][0]


@pytest.mark.parametrize("kind", ["Deployment", "ClusterServingRuntime"])
def test_container_args_are_server_flags(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    args = [re.sub(r"\$\(\w+\)", "secret", a) for a in container(kind)["args"]]
    config = parse_args(args)
    assert config.exit_timeout_secs == 30
    assert config.arena_bytes == 64 << 20
    assert config.allow_client_shm is False
    # every flag is one the server implements (none is only accepted-and-ignored)
    unknown = [r.getMessage() for r in caplog.records if "ignoring unsupported option" in r.getMessage()]
    assert unknown == []


def test_server_listens_on_the_declared_container_ports() -> None:
    c = container("Deployment")
    config = parse_args([re.sub(r"\$\(\w+\)", "secret", a) for a in c["args"]])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (config.http_port, config.grpc_port, config.metrics_port) == (ports["http"], ports["grpc"], ports["metrics"])
    runtime = container("ClusterServingRuntime")
    assert parse_args(runtime["args"]).http_port == runtime["ports"][0]["containerPort"] == 8080


def test_deployment_termination_covers_prestop_and_drain() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    exit_timeout = parse_args(c["args"]).exit_timeout_secs
    prestop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= prestop + exit_timeout + 5


def test_probes_use_http_health_endpoints() -> None:
    c = container("Deployment")
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"


def test_dev_shm_is_a_memory_volume_big_enough_for_the_arenas() -> None:
    for kind in ("Deployment", "ClusterServingRuntime"):
        doc = by_kind(kind)
        spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm")
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"]["medium"] == "Memory"
        size = volume["emptyDir"]["sizeLimit"]
        assert size.endswith("Gi")
        arena = parse_args(spec["containers"][0]["args"]).arena_bytes
        # at least 7 single-instance workers (the example repository) with both arenas at the configured size
        assert int(size[:-2]) << 30 >= 7 * 2 * arena


def test_service_hpa_and_podmonitor_point_at_the_deployment() -> None:
    deployment = by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in container("Deployment")["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    service = by_kind("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    hpa = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    metric_names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert metric_names == ["nv_inference_pending_request_count"]
    monitor = by_kind("PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
