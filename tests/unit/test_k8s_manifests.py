"""deploy/k8s: valid Kubernetes objects that fit together, and an HPA whose metrics exist.

Every manifest is validated offline against the Kubernetes JSON schemas bundled by the
kubernetes-validate package (strict: unknown fields are errors). The rest is what the API
server would accept but the deployment would still get wrong: selectors that match no pod,
Service ports no container listens on, an HPA metric that prometheus-adapter does not serve or
that no recording rule produces, an adapter query that is not PromQL (checked by promtool on
the queries with the adapter's template variables filled in), a gateway config that names
Services that do not exist or a Triton model the repository does not have.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml

from gateway.config.settings import Settings, load_settings
from tests.unit.deployfiles import ROOT, flag_value, yaml_documents

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"
NAMESPACE = "tiergate"
ADAPTER_VALUES = K8S / "prometheus-adapter-values.yaml"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
MODEL_REPOSITORY = ROOT / "engines" / "triton" / "model_repository"
# The tutorial's thresholds: 70% of the measured per-instance ceiling (20 req/s), 60% of the
# 5 s SLA.
QPS_CEILING = 20
SLA_MS = 5000
HPA_TARGETS = {
    "vllm_requests_per_second": round(0.7 * QPS_CEILING),
    "vllm_p99_latency_ms": round(0.6 * SLA_MS),
}
TRITON_IMAGE = re.compile(r"^nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-vllm-python-py3$")


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name not in
                  ("kustomization.yaml", ADAPTER_VALUES.name))  # fmt: skip


def objects() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in yaml_documents(path)]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    out: list[dict[str, Any]] = spec["containers"]
    return out


def container_ports(workload: dict[str, Any]) -> dict[str, int]:
    """Named container ports of a workload, plus each number mapped to itself."""
    ports: dict[str, int] = {}
    for c in containers(workload):
        for p in c.get("ports", []):
            ports[str(p["containerPort"])] = p["containerPort"]
            if "name" in p:
                ports[p["name"]] = p["containerPort"]
    return ports


def selected(selector: dict[str, str]) -> list[dict[str, Any]]:
    """Deployments whose pod template the label selector matches."""
    return [
        d for d in of_kind("Deployment").values()
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]  # fmt: skip


def adapter_rules() -> list[dict[str, Any]]:
    values = yaml.safe_load(ADAPTER_VALUES.read_text())
    rules: list[dict[str, Any]] = values["rules"]["custom"]
    return rules


def recording_rules() -> dict[str, str]:
    recorded: dict[str, str] = {}
    for path in sorted(RULES_DIR.glob("*.y*ml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                if "record" in rule:
                    recorded[rule["record"]] = rule["expr"]
    return recorded


@pytest.fixture(scope="module")
def gateway_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    config = of_kind("ConfigMap")["gateway-config"]["data"]["tiergate.yaml"]
    path = tmp_path_factory.mktemp("gateway") / "tiergate.yaml"
    path.write_text(config)
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("TIERGATE_")]:
            mp.delenv(key)
        yield load_settings(path)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_matches_the_kubernetes_schema(path: Path) -> None:
    docs = yaml_documents(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            pytest.fail(
                f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}"
            )


def test_schema_validation_catches_mistakes() -> None:
    hpa = dict(of_kind("HorizontalPodAutoscaler")["triton"])
    broken = json.loads(json.dumps(hpa))
    broken["spec"]["metrics"][0]["pods"]["target"]["averageValu"] = "14"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in manifest_files())
    assert all(o["metadata"].get("namespace") == NAMESPACE
               for o in objects() if o["kind"] != "Namespace")  # fmt: skip
    assert list(of_kind("Namespace")) == [NAMESPACE]


def test_selectors_match_pod_templates() -> None:
    for name, deployment in of_kind("Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    for name, service in of_kind("Service").items():
        assert len(selected(service["spec"]["selector"])) == 1, f"Service {name}"
    for name, pdb in of_kind("PodDisruptionBudget").items():
        assert len(selected(pdb["spec"]["selector"]["matchLabels"])) == 1, f"PDB {name}"


def test_service_ports_reach_container_ports() -> None:
    for name, service in of_kind("Service").items():
        (workload,) = selected(service["spec"]["selector"])
        ports = container_ports(workload)
        for port in service["spec"]["ports"]:
            target = str(port.get("targetPort", port["port"]))
            assert target in ports, f"Service {name}: no container port {target}"
            assert ports[target] == port["port"], f"Service {name}: {port}"
    triton = {p["port"] for p in of_kind("Service")["triton"]["spec"]["ports"]}
    assert triton == {8000, 8001, 8002}


def test_probes_and_scrape_annotations_use_container_ports() -> None:
    for name, deployment in of_kind("Deployment").items():
        ports = container_ports(deployment)
        for c in containers(deployment):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = c.get(probe)
                if spec is None:
                    continue
                for action in ("httpGet", "tcpSocket"):
                    if action in spec:
                        assert str(spec[action]["port"]) in ports, f"{name} {probe}"
            assert c.get("readinessProbe"), f"{name}/{c['name']} has no readiness probe"
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            assert annotations["prometheus.io/port"] in ports, name
    triton = of_kind("Deployment")["triton"]["spec"]["template"]["metadata"]["annotations"]
    assert triton["prometheus.io/port"] == "8002"


def test_hpa_scales_triton_on_the_tutorial_thresholds() -> None:
    (hpa,) = of_kind("HorizontalPodAutoscaler").values()
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": "triton"}  # fmt: skip
    assert "triton" in of_kind("Deployment")
    assert "replicas" not in of_kind("Deployment")["triton"]["spec"], "the HPA owns replicas"
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 10)
    targets = {}
    for metric in spec["metrics"]:
        assert metric["type"] == "Pods"
        assert metric["pods"]["target"]["type"] == "AverageValue"
        targets[metric["pods"]["metric"]["name"]] = int(metric["pods"]["target"]["averageValue"])
    assert targets == HPA_TARGETS == {"vllm_requests_per_second": 14, "vllm_p99_latency_ms": 3000}
    window = spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    assert 60 <= window <= 120


def test_hpa_metrics_are_served_by_the_adapter_and_recorded_by_prometheus() -> None:
    (hpa,) = of_kind("HorizontalPodAutoscaler").values()
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    served = {rule["name"]["as"]: rule for rule in adapter_rules()}
    assert wanted <= set(served), f"adapter serves {sorted(served)}"
    recorded = recording_rules()
    for name in wanted:
        rule = served[name]
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"])
        assert series is not None
        assert series.group(0) == name
        assert re.fullmatch(rule["name"]["matches"], name)
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        for var in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert var in rule["metricsQuery"], f"{name}: {var}"
        assert name in recorded, f"no recording rule for {name} in {RULES_DIR}"
        grouping = re.findall(r"by\s*\(([^)]*)\)", recorded[name])
        assert grouping, f"{name}: the recording rule aggregates away namespace/pod"
        for labels in grouping:
            assert {"namespace", "pod"} <= {x.strip() for x in labels.split(",")}, name


def test_adapter_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    assert Path(promtool).exists(), "promtool missing (apt-get install prometheus)"
    rules = []
    for i, rule in enumerate(adapter_rules()):
        series = rule["name"]["as"]
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"triton-.*"')
            .replace("<<.GroupBy>>", "pod")
        )
        assert "<<" not in query, query
        rules.append({"record": f"adapter:check_{i}", "expr": query})
        # The seriesQuery is a PromQL selector too.
        rules.append({"record": f"adapter:series_{i}", "expr": rule["seriesQuery"]})
    path = tmp_path / "adapter.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    bad = tmp_path / "bad.yml"
    broken = {"record": "x:y", "expr": "sum by (pod) (vllm_requests_per_second{pod=})"}
    bad.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [broken]}]}))
    assert subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True,
                          check=False).returncode != 0  # fmt: skip


def test_gateway_config_discovers_the_pods_of_services_that_exist(
    gateway_settings: Settings,
) -> None:
    services = of_kind("Service")
    v4_args = containers(of_kind("Deployment")["vllm-v4"])[0]["args"]
    served = flag_value(v4_args, "--served-model-name")
    roles = {t.role for t in gateway_settings.tiers}
    assert roles == {"latency", "throughput"}
    for tier in gateway_settings.tiers:
        assert not tier.backends  # every engine a pod found while the gateway runs
        d = tier.discovery
        assert d is not None
        if d.dns is not None:
            # <service>.<namespace>.svc.cluster.local of a headless Service with that port.
            name, namespace = d.dns.name.split(".")[:2]
            assert namespace == "tiergate"
            svc = services[name]
            assert svc["spec"].get("clusterIP") == "None", f"{name} is not headless"
            ports = {p["port"] for p in svc["spec"]["ports"]}
            assert d.dns.port in ports
        else:
            assert d.kubernetes is not None
            svc = services[d.kubernetes.service]
            ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
            assert d.kubernetes.port in ports
            # The pods' metrics port, when apart, is one of the Service's too.
            if d.backend.metrics_port:
                assert d.backend.metrics_port in ports.values()
        # The Service's pods are those of the Deployment whose model the tier serves.
        assert selected(svc["spec"]["selector"])
        assert d.backend.models == [served]
        if d.backend.kind == "triton":
            for model in d.backend.models:
                name = (d.backend.model_extra or {}).get("triton_models", {}).get(model, model)
                assert (MODEL_REPOSITORY / name / "config.pbtxt").is_file(), name
    (gateway,) = containers(of_kind("Deployment")["gateway"])
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["TIERGATE_REDIS_URL"] == "redis://redis:6379/0"


def test_the_gateway_may_watch_endpointslices_and_nothing_more() -> None:
    spec = of_kind("Deployment")["gateway"]["spec"]["template"]["spec"]
    account = spec["serviceAccountName"]
    assert account in of_kind("ServiceAccount")
    (binding,) = [b for b in of_kind("RoleBinding").values()
                  if any(s["name"] == account for s in b["subjects"])]  # fmt: skip
    role = of_kind("Role")[binding["roleRef"]["name"]]
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]  # fmt: skip
    for engine in ("vllm-v4", "triton"):  # each engine Deployment has a headless Service
        headless = [s for s in of_kind("Service").values()
                    if s["spec"].get("clusterIP") == "None"
                    and s["spec"]["selector"].get("app.kubernetes.io/name") == engine]  # fmt: skip
        assert headless, engine


def test_both_tiers_serve_the_same_checkpoint() -> None:
    v4_args = containers(of_kind("Deployment")["vllm-v4"])[0]["args"]
    (model_dir,) = [p for p in MODEL_REPOSITORY.iterdir() if p.is_dir()]
    engine = json.loads((model_dir / "1" / "model.json").read_text())
    assert v4_args[0] == engine["model"], "the latency tier and Triton serve different models"
    spec = json.loads(flag_value(v4_args, "--speculative-config") or "")
    assert set(spec) == {"method", "model", "num_speculative_tokens"}
    assert spec["method"] in ("eagle", "eagle3")
    assert spec["num_speculative_tokens"] == 5
    assert flag_value(v4_args, "--max-num-seqs") == "16"
    assert flag_value(v4_args, "--quantization") in ("awq", "awq_marlin")


def test_triton_gets_the_model_repository_from_the_tiergate_image() -> None:
    triton = of_kind("Deployment")["triton"]
    (container,) = containers(triton)
    assert TRITON_IMAGE.match(container["image"]), container["image"]
    assert "--model-repository=/models" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    (init,) = triton["spec"]["template"]["spec"]["initContainers"]
    gateway_image = containers(of_kind("Deployment")["gateway"])[0]["image"]
    assert init["image"] == gateway_image
    source = re.search(r"(/app/\S+?)/\.", " ".join(init["command"]))
    assert source is not None
    assert source.group(1) == "/app/engines/triton/model_repository"
    assert "COPY engines ./engines" in (ROOT / "Dockerfile").read_text()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "engines" not in ignored
    assert "engines/triton" not in ignored
    assert any(MODEL_REPOSITORY.glob("*/config.pbtxt")), "empty model repository"
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert (
        {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["model-repository"]
        == mounts["model-repository"]
        == "/models"
    )


def test_gateway_runs_as_the_image_user() -> None:
    pod = of_kind("Deployment")["gateway"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    user = re.search(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert user is not None
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    (c,) = pod["containers"]
    assert c["args"][:3] == ["serve", "--config", "/etc/tiergate/tiergate.yaml"]
    assert {"name": "config", "mountPath": "/etc/tiergate", "readOnly": True} in c["volumeMounts"]
