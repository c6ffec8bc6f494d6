"""docker-compose.yml and .env: valid Compose, and a stack whose parts find each other.

The file is read as Docker Compose reads it (YAML anchors merged, `.env` interpolated, profiles
applied: `.env` sets COMPOSE_PROFILES=gpu, and a `--profile sim` flag replaces that list), then
validated against the Compose Specification's JSON schema (vendored in tests/schemas/, see the
README there), for the whole file and for the services each profile starts. The semantic checks
are what `docker compose config` cannot see: dependencies and health checks, mounted paths,
the names Prometheus scrapes and the gateway routes to, and the model/flags the engines share.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml

from gateway.config.settings import load_settings
from tests.unit.deployfiles import (
    COMPOSE_FILE,
    ROOT,
    active_profiles,
    dotenv_comments,
    enabled_services,
    flag_value,
    interpolate,
    load_compose,
    network_names,
    raw_compose,
    read_dotenv,
)

SCHEMA = ROOT / "tests" / "schemas" / "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# The scrape targets deploy/prometheus/prometheus.yml is written against.
REQUIRED_TARGETS = {"gateway:8000", "v4:8000", "v3-a:8000", "v3-b:8000"}
ENGINE_NAMES = ("v4", "v3-a", "v3-b")
VLLM_SERVICES = ("v4", "v3-a", "v3-b")
SIM_SERVICES = ("sim-v4", "sim-v3-a", "sim-v3-b")
# (label, --profile flags): what `docker compose up` and `docker compose --profile sim up` run.
PROFILE_CASES = [("default", ()), ("sim", ("sim",))]


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return read_dotenv()


@pytest.fixture(scope="module")
def model(env: dict[str, str]) -> dict[str, Any]:
    return load_compose(env)


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    raw = SCHEMA.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SCHEMA_SHA256, "update tests/schemas/README.md"
    schema = json.loads(raw)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def profile_sets(env: dict[str, str]) -> Iterator[tuple[str, set[str]]]:
    for label, flags in PROFILE_CASES:
        yield label, active_profiles(env, flags)


def _errors(validator: jsonschema.protocols.Validator, doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


def _healthcheck(service: dict[str, Any]) -> dict[str, Any] | None:
    """The service's health check; the tiergate image brings its own (Dockerfile HEALTHCHECK)."""
    check = service.get("healthcheck")
    if check is not None:
        return None if check.get("disable") else dict(check)
    if "build" in service:
        return {"test": "Dockerfile HEALTHCHECK"}
    return None


def _listen_port(name: str, service: dict[str, Any]) -> int:
    """The container port a service listens on, from its command (8000 for the gateway)."""
    command = [str(arg) for arg in service.get("command") or []]
    port = flag_value(command, "--port")
    if port is not None:
        return int(port)
    if command[:1] == ["serve"]:
        return int(service.get("environment", {}).get("TIERGATE_PORT", 8000))
    raise AssertionError(f"{name}: cannot tell its port from {command}")


def _resolve(services: dict[str, Any], host: str) -> list[str]:
    return [name for name, svc in services.items() if host in network_names(name, svc)]


def test_profile_flag_replaces_compose_profiles(env: dict[str, str]) -> None:
    assert env["COMPOSE_PROFILES"] == "gpu"
    assert active_profiles(env) == {"gpu"}
    assert active_profiles(env, ["sim"]) == {"sim"}


def test_whole_file_matches_the_compose_schema(
    validator: jsonschema.protocols.Validator, model: dict[str, Any]
) -> None:
    assert _errors(validator, model) == []


@pytest.mark.parametrize(("label", "flags"), PROFILE_CASES)
def test_each_profile_matches_the_compose_schema(
    validator: jsonschema.protocols.Validator,
    env: dict[str, str],
    model: dict[str, Any],
    label: str,
    flags: tuple[str, ...],
) -> None:
    services = enabled_services(model, active_profiles(env, flags))
    assert _errors(validator, {**model, "services": services}) == [], label


def test_schema_rejects_a_broken_file(validator: jsonschema.protocols.Validator) -> None:
    broken = {"services": {"gateway": {"image": "x", "depends_on": {"redis": {}}, "portz": []}}}
    assert len(_errors(validator, broken)) >= 2


def test_profiles_swap_the_engines_and_nothing_else(
    env: dict[str, str], model: dict[str, Any]
) -> None:
    gpu = enabled_services(model, active_profiles(env))
    sim = enabled_services(model, active_profiles(env, ["sim"]))
    assert set(VLLM_SERVICES) <= set(gpu)
    assert not set(SIM_SERVICES) & set(gpu)
    assert set(SIM_SERVICES) <= set(sim)
    assert not set(VLLM_SERVICES) & set(sim)
    always = {"gateway", "redis", "prometheus", "grafana", "locust-master", "locust-worker"}
    assert set(gpu) - set(VLLM_SERVICES) == always
    assert set(sim) - set(SIM_SERVICES) == always


@pytest.mark.parametrize(("label", "flags"), PROFILE_CASES)
def test_dependencies_exist_are_healthy_and_acyclic(
    env: dict[str, str], model: dict[str, Any], label: str, flags: tuple[str, ...]
) -> None:
    everything: dict[str, Any] = model["services"]
    services = enabled_services(model, active_profiles(env, flags))
    for name, svc in services.items():
        for dep, cfg in (svc.get("depends_on") or {}).items():
            assert dep in everything, f"{name} depends on undefined service {dep}"
            if dep not in services:
                # What Compose accepts for a dependency its profiles leave out.
                assert cfg.get("required") is False, f"{label}: {name} needs disabled {dep}"
                continue
            assert cfg["condition"] in ("service_healthy", "service_completed_successfully")
            if cfg["condition"] == "service_healthy":
                assert _healthcheck(services[dep]), f"{name} waits on {dep}, which has no check"
    seen: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"dependency cycle {' -> '.join((*path, node))}"
        if node in seen:
            return
        for dep in services[node].get("depends_on") or {}:
            if dep in services:
                visit(dep, (*path, node))
        seen.add(node)

    for name in services:
        visit(name, ())


@pytest.mark.parametrize(("label", "flags"), PROFILE_CASES)
def test_gateway_starts_after_the_engines_of_the_profile(
    env: dict[str, str], model: dict[str, Any], label: str, flags: tuple[str, ...]
) -> None:
    services = enabled_services(model, active_profiles(env, flags))
    waits = {
        dep
        for dep, cfg in services["gateway"]["depends_on"].items()
        if dep in services and cfg["condition"] == "service_healthy"
    }
    for engine in ENGINE_NAMES:
        assert [s for s in _resolve(services, engine) if s in waits], f"{label}: {engine}"
    assert "redis" in waits
    assert services["locust-master"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_every_service_has_a_health_check(model: dict[str, Any]) -> None:
    for name, svc in model["services"].items():
        if name == "locust-worker":  # nothing to probe: it serves no port
            assert svc["healthcheck"] == {"disable": True}
            continue
        check = _healthcheck(svc)
        assert check, f"{name} has no health check"
    for name in VLLM_SERVICES:
        check = model["services"][name]["healthcheck"]
        assert "/health" in " ".join(check["test"])
        minutes = check["start_period"]
        assert minutes.endswith("m"), minutes
        assert int(minutes[:-1]) >= 10, "vLLM needs a long start period"


def test_mounted_paths_exist_in_the_repository(model: dict[str, Any]) -> None:
    mounts = 0
    for name, svc in model["services"].items():
        for volume in svc.get("volumes") or []:
            source, target = volume.split(":")[:2]
            if not source.startswith("."):
                assert source in model["volumes"], f"{name}: undeclared volume {source}"
                continue
            mounts += 1
            path = ROOT / source
            assert path.exists(), f"{name} mounts {source}, which is missing"
            if Path(target).suffix in (".yml", ".yaml"):
                assert path.is_file(), f"{name}: {source} should be a file"
            else:
                assert path.is_dir(), f"{name}: {source} should be a folder"
    assert mounts >= 7
    prometheus = {v.split(":")[1] for v in model["services"]["prometheus"]["volumes"]}
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/rules"} <= prometheus
    grafana = {v.split(":")[1] for v in model["services"]["grafana"]["volumes"]}
    assert {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards"} <= grafana


def _prometheus_targets() -> set[str]:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets: set[str] = set()
    for job in config.get("scrape_configs", []):
        for static in job.get("static_configs", []):
            targets.update(static.get("targets", []))
    return targets


@pytest.mark.parametrize(("label", "flags"), PROFILE_CASES)
def test_prometheus_targets_answer_in_each_profile(
    env: dict[str, str], model: dict[str, Any], label: str, flags: tuple[str, ...]
) -> None:
    targets = _prometheus_targets()
    assert targets >= REQUIRED_TARGETS, "deploy/prometheus/prometheus.yml changed its targets"
    services = enabled_services(model, active_profiles(env, flags))
    for target in targets:
        host, _, port = target.rpartition(":")
        found = _resolve(services, host)
        assert len(found) == 1, f"{label}: {host} is answered by {found}"
        assert _listen_port(found[0], services[found[0]]) == int(port), f"{label}: {target}"


def test_gateway_config_parses_and_routes_to_compose_services(
    env: dict[str, str], model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = model["services"]["gateway"]
    command = [str(arg) for arg in gateway["command"]]
    target = flag_value(command, "--config")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in gateway["volumes"]}
    assert target in mounts, "the gateway's --config is not the mounted file"
    for key in list(os.environ):
        if key.startswith("TIERGATE_"):
            monkeypatch.delenv(key)
    for key, value in gateway.get("environment", {}).items():
        monkeypatch.setenv(key, str(value))
    settings = load_settings(ROOT / mounts[target])
    assert settings.redis_url == "redis://redis:6379/0"
    roles = {tier.role for tier in settings.tiers}
    assert roles == {"latency", "throughput"}
    for label, profiles in profile_sets(env):
        services = enabled_services(model, profiles)
        assert _resolve(services, "redis") == ["redis"]
        for tier in settings.tiers:
            for backend in tier.backends:
                host, port = backend.url.removeprefix("http://").split(":")
                found = _resolve(services, host)
                assert len(found) == 1, f"{label}: {backend.url} is answered by {found}"
                assert _listen_port(found[0], services[found[0]]) == int(port)
                assert backend.models == [env["SERVED_MODEL_NAME"]]
    latency = [b.url for t in settings.tiers if t.role == "latency" for b in t.backends]
    assert latency == ["http://v4:8000"]


def test_engines_serve_the_same_model_name(env: dict[str, str], model: dict[str, Any]) -> None:
    name = env["SERVED_MODEL_NAME"]
    for svc in VLLM_SERVICES:
        command = [str(arg) for arg in model["services"][svc]["command"]]
        assert flag_value(command, "--served-model-name") == name, svc
    for svc in SIM_SERVICES:
        command = [str(arg) for arg in model["services"][svc]["command"]]
        assert flag_value(command, "--model") == name, svc


def test_engine_flags(env: dict[str, str], model: dict[str, Any]) -> None:
    services = model["services"]
    v4 = [str(arg) for arg in services["v4"]["command"]]
    spec_text = flag_value(v4, "--speculative-config")
    assert spec_text is not None
    spec = json.loads(spec_text)
    assert spec == {
        "method": "eagle3",
        "model": env["DRAFT_MODEL"],
        "num_speculative_tokens": 5,
    }
    assert flag_value(v4, "--max-num-seqs") == "16"
    assert v4[0] == env["AWQ_MODEL"]
    for name in ("v3-a", "v3-b"):
        v3 = [str(arg) for arg in services[name]["command"]]
        assert v3[0] == env["AWQ_MODEL"]
        assert flag_value(v3, "--max-num-seqs") == "384"
        assert flag_value(v3, "--speculative-config") is None
    for name in VLLM_SERVICES:
        svc = services[name]
        command = [str(arg) for arg in svc["command"]]
        assert svc["entrypoint"] == ["vllm", "serve"]
        assert flag_value(command, "--quantization") in ("awq", "awq_marlin")
        assert float(flag_value(command, "--gpu-memory-utilization") or 0) == 0.9
        assert flag_value(command, "--port") == "8000"
        assert flag_value(command, "--host") == "0.0.0.0"
        # Old spellings that current vLLM rejects.
        assert not {"--speculative-model", "--num-speculative-tokens", "--model"} & set(command)
        assert svc["environment"]["HF_TOKEN"] == env["HF_TOKEN"]


def test_each_engine_reserves_its_own_gpu(env: dict[str, str], model: dict[str, Any]) -> None:
    ids = []
    for name in VLLM_SERVICES:
        devices = model["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1
        assert devices[0]["driver"] == "nvidia"
        assert devices[0]["capabilities"] == ["gpu"]
        ids += devices[0]["device_ids"]
    assert ids == [env["V4_GPU"], env["V3A_GPU"], env["V3B_GPU"]]
    assert len(set(ids)) == 3
    for name in SIM_SERVICES:
        assert "deploy" not in model["services"][name]


def test_settings_can_move_the_engines(env: dict[str, str]) -> None:
    moved = load_compose({**env, "V4_GPU": "5", "DRAFT_MODEL": "org/other-head",
                          "SPEC_METHOD": "eagle", "GATEWAY_PORT": "9000"})  # fmt: skip
    v4 = moved["services"]["v4"]
    assert v4["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["5"]
    spec = json.loads(flag_value([str(a) for a in v4["command"]], "--speculative-config") or "")
    assert (spec["method"], spec["model"]) == ("eagle", "org/other-head")
    assert moved["services"]["gateway"]["ports"] == ["9000:8000"]


def test_dotenv_is_documented_and_matches_the_compose_defaults(env: dict[str, str]) -> None:
    docs = dotenv_comments()
    for key in env:
        assert docs.get(key), f".env: {key} has no comment above it"
    assert env["HF_TOKEN"] == "", "never commit a token"
    used: set[str] = set()
    interpolate(raw_compose(), env, used)
    assert used <= set(env), f"variables missing from .env: {sorted(used - set(env))}"
    # Every inline ${VAR:-default} in the compose file says what .env says.
    defaults = interpolate(raw_compose(), {})
    assert defaults == load_compose(env), "compose defaults and .env disagree"


def test_tiergate_services_share_one_image(model: dict[str, Any]) -> None:
    built = {n: s for n, s in model["services"].items() if "build" in s}
    assert {"gateway", "locust-master", "locust-worker", *SIM_SERVICES} == set(built)
    assert len({s["image"] for s in built.values()}) == 1
    for svc in built.values():
        assert svc["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    assert (ROOT / "Dockerfile").is_file()


def test_locust_runs_the_repository_locustfile_against_the_gateway(
    model: dict[str, Any],
) -> None:
    master = model["services"]["locust-master"]
    worker = model["services"]["locust-worker"]
    for svc in (master, worker):
        assert svc["entrypoint"] == ["locust"]
        locustfile = flag_value([str(a) for a in svc["command"]], "-f")
        assert locustfile is not None
        assert (ROOT / locustfile).is_file()
        assert "./loadtests:/app/loadtests:ro" in svc["volumes"]
    assert flag_value(master["command"], "-H") == "http://gateway:8000"
    assert flag_value(worker["command"], "--master-host") == "locust-master"


def test_compose_file_is_where_compose_looks() -> None:
    assert COMPOSE_FILE.name == "docker-compose.yml"
    assert COMPOSE_FILE.parent == ROOT
    assert (ROOT / ".env").is_file()
