"""deploy/k8s/planner: the HPAs (and KEDA's alternative) that follow the gateway's planner fit the
rest of the deployment: valid objects, Deployments that exist, a metric prometheus-adapter
serves from a series the gateway exports, tiers the gateway's config names, the same bounds as
the planner's, and queries that are PromQL."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped, unused-ignore]
import yaml

from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from loadtests.autoscale import arms
from loadtests.autoscale.hpa import DEFAULT_DOWN, DEFAULT_UP, Policy, Rules
from tests.unit.deployfiles import yaml_documents
from tests.unit.test_k8s_manifests import (
    ADAPTER_VALUES,
    K8S,
    KUBERNETES_VERSION,
    NAMESPACE,
    gateway_settings,
    of_kind,
)

__all__ = ["gateway_settings"]  # the fixture, shared

PLANNER = K8S / "planner"
METRIC = "tiergate_tier_planned_load_replicas"


def planner_objects(name: str) -> list[dict[str, Any]]:
    return yaml_documents(PLANNER / name)


def external_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["external"]
    return rules


def bounds(settings: Settings) -> dict[str, tuple[int, int]]:
    return {t.name: (t.replicas.minimum, t.replicas.maximum) for t in settings.tiers}


def test_the_hpas_are_valid_and_scale_deployments_that_exist() -> None:
    deployments = of_kind("Deployment")
    for hpa in planner_objects("hpa.yaml"):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
        assert hpa["metadata"]["namespace"] == NAMESPACE
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments


def test_each_tier_follows_the_planned_load_within_the_planners_bounds(
    gateway_settings: Settings,
) -> None:
    deployments = of_kind("Deployment")
    tier_of_deployment = {"triton": "throughput", "vllm-v4": "latency"}
    planned = bounds(gateway_settings)
    seen = set()
    for hpa in planner_objects("hpa.yaml"):
        spec = hpa["spec"]
        (metric,) = spec["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] == METRIC
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
        tier = metric["external"]["metric"]["selector"]["matchLabels"]["tier"]
        target = spec["scaleTargetRef"]["name"]
        assert tier_of_deployment[target] == tier
        assert target in deployments
        assert (spec["minReplicas"], spec["maxReplicas"]) == planned[tier], target
        seen.add(tier)
    assert seen == set(planned)
    for scaled in planner_objects("keda.yaml"):
        spec = scaled["spec"]
        assert scaled["kind"] == "ScaledObject"
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        target = spec["scaleTargetRef"]["name"]
        tier = tier_of_deployment[target]
        (trigger,) = spec["triggers"]
        assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
        assert trigger["metadata"]["threshold"] == "1"
        assert trigger["metadata"]["query"] == (
            f'sum({METRIC}{{namespace="{NAMESPACE}",tier="{tier}"}})'
        )
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == planned[tier], target


def test_the_adapter_serves_the_metric_the_gateway_exports() -> None:
    (rule,) = external_rules()
    assert rule["name"]["as"] == METRIC
    assert rule["seriesQuery"].startswith(METRIC + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}}
    assert "<<.Series>>" in rule["metricsQuery"]
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]
    exported = {m.name for m in Telemetry().registry.collect()}
    assert METRIC in exported


def test_the_queries_are_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    (rule,) = external_rules()
    matchers = f'namespace="{NAMESPACE}",tier="throughput"'
    query = rule["metricsQuery"].replace("<<.Series>>", METRIC)
    exprs = [rule["seriesQuery"], query.replace("<<.LabelMatchers>>", matchers)]
    exprs += [o["spec"]["triggers"][0]["metadata"]["query"] for o in planner_objects("keda.yaml")]
    rules = [{"record": f"planner:check_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "planner.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "planner", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_planner_manifests_are_not_in_the_default_kustomization() -> None:
    """They replace the tutorial's HPA, which `kubectl apply -k deploy/k8s` installs."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert not [r for r in kustomization["resources"] if r.startswith("planner")]
    assert "hpa.yaml" in kustomization["resources"]


def _rules(given: dict[str, Any] | None, default: Rules) -> Rules:
    """One direction of an HPA's `behavior` as Kubernetes reads it: what is left out defaults."""
    if given is None:
        return default
    policies = tuple(Policy(p["type"], p["value"], float(p["periodSeconds"]))
                     for p in given.get("policies", ())) or default.policies  # fmt: skip
    window = float(given.get("stabilizationWindowSeconds", default.stabilization_s))
    return Rules(window, policies, given.get("selectPolicy", "Max"))


def _behaviour(behavior: dict[str, Any]) -> tuple[Rules, Rules]:
    return (_rules(behavior.get("scaleUp"), DEFAULT_UP),
            _rules(behavior.get("scaleDown"), DEFAULT_DOWN))  # fmt: skip


def test_bench_autoscale_scales_as_the_manifests_say() -> None:
    """`tiergate bench autoscale` runs each arm with its manifest's behaviour: the tutorial's HPA
    (deploy/k8s/hpa.yaml) and the planner's, HPA and KEDA alike."""
    (tutorial,) = [o for o in yaml_documents(K8S / "hpa.yaml")
                   if o["kind"] == "HorizontalPodAutoscaler"]  # fmt: skip
    assert _behaviour(tutorial["spec"]["behavior"]) == (arms.TUTORIAL_UP, arms.TUTORIAL_DOWN)
    planner = [_behaviour(o["spec"]["behavior"]) for o in planner_objects("hpa.yaml")]
    planner += [_behaviour(o["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"])
                for o in planner_objects("keda.yaml")]  # fmt: skip
    assert len(planner) == 4
    assert set(planner) == {(arms.PLANNER_UP, arms.PLANNER_DOWN)}
