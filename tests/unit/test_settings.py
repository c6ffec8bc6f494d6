from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.settings import (
    ConfigError,
    MonitorConfig,
    PolicyConfig,
    RetryConfig,
    Settings,
    load_settings,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiers.yaml"
MODEL = "meta-llama/Llama-2-7b-chat-hf"

BASE: dict[str, Any] = {
    "tiers": [
        {
            "name": "lat",
            "role": "latency",
            "backends": [{"url": "http://127.0.0.1:8201", "models": [MODEL]}],
        },
        {
            "name": "tp",
            "role": "throughput",
            "backends": [
                {"url": "http://127.0.0.1:8202", "models": [MODEL]},
                {"url": "http://127.0.0.1:8203", "models": [MODEL]},
            ],
        },
    ]
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests must not see the developer's own TIERGATE_* variables."""
    for name in list(os.environ):
        if name.upper().startswith("TIERGATE_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, doc: Any, name: str = "tiers.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _release(*variants: tuple[str, str, float]) -> dict[str, Any]:
    return {"model": "llama", "variants": [
        {"name": n, "model": m, "weight": w} for n, m, w in variants]}  # fmt: skip


def doc_with(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path changes applied, e.g. ``{"tiers.0.role": "x"}``."""
    doc = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        keys: list[Any] = [int(k) if k.isdigit() else k for k in dotted.split(".")]
        node: Any = doc
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        node[keys[-1]] = value
    return doc


# --- defaults --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "field", "expected"),
    [
        (Settings, "host", "0.0.0.0"),
        (Settings, "port", 8000),
        (Settings, "config", None),
        (Settings, "tiers", []),
        (Settings, "redis_url", None),
        (Settings, "max_body_bytes", 1_048_576),
        (Settings, "api_keys", []),
        (Settings, "log_level", "info"),
        (Settings, "log_json", False),
        (Settings, "request_timeout_s", 600),
        (Settings, "connect_timeout_s", 2.0),
        (PolicyConfig, "name", "learned"),
        (PolicyConfig, "latency_max_concurrency", 16),
        (PolicyConfig, "hysteresis", 2),
        (PolicyConfig, "latency_hard_cap", 24),
        (PolicyConfig, "max_waiting", 8),
        (PolicyConfig, "p2c_min_pool", 4),
        (PolicyConfig, "queue_deadline_s", 5.0),
        (PolicyConfig, "seed", None),
        (RetryConfig, "max_attempts", 3),
        (RetryConfig, "backoff_initial_s", 0.05),
        (RetryConfig, "backoff_max_s", 1.0),
        (RetryConfig, "deadline_s", 30.0),
        (RetryConfig, "budget_ratio", 0.2),
        (RetryConfig, "budget_min_per_s", 10),
        (MonitorConfig, "scrape_interval_s", 0.25),
        (MonitorConfig, "scrape_timeout_s", 1.0),
        (MonitorConfig, "eject_after_failures", 3),
        (MonitorConfig, "probe_interval_s", 2.0),
    ],
)
def test_defaults(model: type[Any], field: str, expected: Any) -> None:
    assert getattr(model(), field) == expected


def test_nested_defaults_present_on_settings() -> None:
    settings = Settings()
    assert settings.policy == PolicyConfig()
    assert settings.retry == RetryConfig()
    assert settings.monitor == MonitorConfig()


# --- loading and precedence ------------------------------------------------------------------


def test_yaml_loading(tmp_path: Path) -> None:
    path = write(tmp_path, doc_with(**{"tiers.0.backends.0.url": "http://127.0.0.1:8201/"}))
    settings = load_settings(path)
    assert settings.config == path
    assert [t.name for t in settings.tiers] == ["lat", "tp"]
    assert settings.tiers[0].backends[0].url == "http://127.0.0.1:8201"  # slash stripped
    assert settings.tiers[0].backends[0].kind == "vllm"
    assert [b.url for b in settings.tiers[1].backends] == [
        "http://127.0.0.1:8202",
        "http://127.0.0.1:8203",
    ]


def test_config_path_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, doc_with(port=9100))
    monkeypatch.setenv("TIERGATE_CONFIG", str(path))
    assert load_settings().port == 9100
    assert Settings().port == 9100  # the plain class honours TIERGATE_CONFIG too


def test_config_argument_beats_env_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_CONFIG", str(write(tmp_path, doc_with(port=1), "env.yaml")))
    assert load_settings(write(tmp_path, doc_with(port=2), "arg.yaml")).port == 2


@pytest.mark.parametrize(
    ("file_values", "env", "overrides", "check"),
    [
        pytest.param({"port": 9000}, {}, {}, lambda s: s.port == 9000, id="file"),
        pytest.param(
            {"port": 9000}, {"TIERGATE_PORT": "9001"}, {}, lambda s: s.port == 9001, id="env>file"
        ),
        pytest.param(
            {"port": 9000},
            {"TIERGATE_PORT": "9001"},
            {"port": 9002},
            lambda s: s.port == 9002,
            id="override>env",
        ),
        pytest.param(
            {"policy.latency_max_concurrency": 12, "policy.max_waiting": 3},
            {"TIERGATE_POLICY__LATENCY_MAX_CONCURRENCY": "8"},
            {},
            # nested env replaces one field and keeps the file's siblings
            lambda s: s.policy.latency_max_concurrency == 8 and s.policy.max_waiting == 3,
            id="nested-env",
        ),
        pytest.param(
            {"policy.name": "round-robin"},
            {"TIERGATE_POLICY__SEED": "7"},
            {"policy": {"hysteresis": 1}},
            lambda s: (s.policy.name, s.policy.seed, s.policy.hysteresis) == ("round-robin", 7, 1),
            id="nested-merge-all-three",
        ),
        pytest.param(
            {},
            {"TIERGATE_REDIS_URL": "redis://127.0.0.1:6379/0"},
            {},
            lambda s: s.redis_url == "redis://127.0.0.1:6379/0",
            id="redis-url",
        ),
        pytest.param(
            {},
            {"TIERGATE_API_KEYS": "k1, k2"},
            {},
            lambda s: [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"],
            id="api-keys-comma",
        ),
        pytest.param(
            {},
            {"TIERGATE_API_KEYS": '["k1","k2"]'},
            {},
            lambda s: [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"],
            id="api-keys-json",
        ),
        pytest.param(
            {},
            {"TIERGATE_LOG_LEVEL": "DEBUG", "TIERGATE_LOG_JSON": "true"},
            {},
            lambda s: s.log_level == "debug" and s.log_json is True,
            id="log",
        ),
        pytest.param(
            {},
            {"TIERGATE_RETRY__MAX_ATTEMPTS": "5", "TIERGATE_MONITOR__SCRAPE_INTERVAL_S": "0.5"},
            {},
            lambda s: s.retry.max_attempts == 5 and s.monitor.scrape_interval_s == 0.5,
            id="other-nested",
        ),
        pytest.param(
            {},
            {"TIERGATE_UNRELATED_THING": "x"},
            {},
            lambda s: s.port == 8000,
            id="unknown-env-ignored",
        ),
    ],
)
def test_precedence(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file_values: dict[str, Any],
    env: dict[str, str],
    overrides: dict[str, Any],
    check: Any,
) -> None:
    path = write(tmp_path, doc_with(**file_values))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(path, **overrides)
    assert check(settings), settings


def test_tiers_from_env_without_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_TIERS", json.dumps(BASE["tiers"]))
    settings = load_settings()
    assert settings.config is None
    assert len(settings.tiers) == 2


def test_example_file_loads() -> None:
    settings = load_settings(EXAMPLE)
    assert [(t.name, t.role) for t in settings.tiers] == [
        ("latency", "latency"),
        ("throughput", "throughput"),
    ]
    assert [b.url for t in settings.tiers for b in t.backends] == [
        "http://127.0.0.1:8201",
        "http://127.0.0.1:8202",
        "http://127.0.0.1:8203",
    ]
    assert all(b.models == [MODEL] for t in settings.tiers for b in t.backends)
    assert settings.policy == PolicyConfig()
    assert settings.retry == RetryConfig()
    assert settings.monitor == MonitorConfig()


def test_settings_are_immutable(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, BASE))
    with pytest.raises(Exception, match="frozen"):
        settings.port = 1  # type: ignore[misc]


# --- invalid configuration -------------------------------------------------------------------

_URL = "tiers.0.backends.0.url"


def bad(name: str, field: str, doc: Any = None, env: Any = None, **overrides: Any) -> Any:
    """One invalid case: ``doc`` is written to the YAML file (BASE when None)."""
    return pytest.param(BASE if doc is None else doc, env or {}, overrides, field, id=name)


def bad_file(name: str, field: str, **changes: Any) -> Any:
    """One invalid case: BASE with dotted-path ``changes`` in the YAML file."""
    return bad(name, field, doc_with(**changes))


INVALID: list[Any] = [
    bad_file("url-scheme", _URL, **{_URL: "ftp://h:1"}),
    bad_file("url-no-host", _URL, **{_URL: "http://"}),
    bad_file("url-bad-port", _URL, **{_URL: "http://h:99999"}),
    bad_file("url-credentials", _URL, **{_URL: "http://u:p@h:1"}),
    bad_file("url-query", _URL, **{_URL: "http://h:1/?a=b"}),
    bad_file("models-empty", "tiers.0.backends.0.models", **{"tiers.0.backends.0.models": []}),
    bad_file("models-blank", "tiers.0.backends.0.models.0", **{"tiers.0.backends.0.models": [" "]}),
    bad_file("kind", "tiers.0.backends.0.kind", **{"tiers.0.backends.0.kind": "tgi"}),
    bad_file("backends-empty", "tiers.1.backends", **{"tiers.1.backends": []}),
    bad_file("role", "tiers.0.role", **{"tiers.0.role": "fast"}),
    bad_file("tier-name", "tiers.0.name", **{"tiers.0.name": "has space"}),
    bad_file("backend-typo", "tiers.0.backends.0.modles", **{"tiers.0.backends.0.modles": ["x"]}),
    bad_file("top-level-typo", "polciy", polciy={"name": "round-robin"}),
    bad_file("dup-tier-name", "tiers", **{"tiers.1.name": "lat"}),
    bad_file("dup-url", "tiers", **{"tiers.1.backends.0.url": "http://127.0.0.1:8201/"}),
    bad("no-tiers", "tiers", doc={"port": 8000}),
    bad("empty-file", "tiers", doc=""),
    bad(
        "latency-only-without-latency-tier",
        "policy.name",
        doc={"tiers": BASE["tiers"][1:], "policy": {"name": "latency-only"}},
    ),
    bad(
        "throughput-only-without-throughput-tier",
        "policy.name",
        doc={"tiers": BASE["tiers"][:1], "policy": {"name": "throughput-only"}},
    ),
    bad_file("policy-name", "policy.name", **{"policy.name": "random"}),
    bad_file("hard-cap-below-max", "policy.latency_hard_cap", **{"policy.latency_hard_cap": 10}),
    bad_file("hysteresis-too-big", "policy.hysteresis", **{"policy.hysteresis": 16}),
    bad_file("hysteresis-negative", "policy.hysteresis", **{"policy.hysteresis": -1}),
    bad_file(
        "max-concurrency-zero",
        "policy.latency_max_concurrency",
        **{"policy.latency_max_concurrency": 0},
    ),
    bad_file("max-waiting-negative", "policy.max_waiting", **{"policy.max_waiting": -1}),
    bad_file("p2c-too-small", "policy.p2c_min_pool", **{"policy.p2c_min_pool": 1}),
    bad_file("queue-deadline", "policy.queue_deadline_s", **{"policy.queue_deadline_s": -1}),
    bad_file("retry-attempts", "retry.max_attempts", **{"retry.max_attempts": 0}),
    bad_file("retry-backoff", "retry.backoff_max_s", **{"retry.backoff_max_s": 0.01}),
    bad_file("retry-deadline", "retry.deadline_s", **{"retry.deadline_s": 0}),
    bad_file("retry-budget", "retry.budget_ratio", **{"retry.budget_ratio": -0.1}),
    bad_file("monitor-interval", "monitor.scrape_interval_s", **{"monitor.scrape_interval_s": 0}),
    bad_file(
        "monitor-eject", "monitor.eject_after_failures", **{"monitor.eject_after_failures": 0}
    ),
    bad_file(
        "release-dup-variant",
        "releases.0.variants",
        releases=[_release(("a", MODEL, 1), ("a", MODEL, 1))],
    ),
    bad_file(
        "release-zero-weights",
        "releases.0.variants",
        releases=[_release(("a", MODEL, 0), ("b", MODEL, 0))],
    ),
    bad_file(
        "release-negative-weight",
        "releases.0.variants.0.weight",
        releases=[_release(("a", MODEL, -1))],
    ),
    bad_file(
        "release-shadow-unknown",
        "releases.0.shadow",
        releases=[{**_release(("a", MODEL, 1)), "shadow": {"variant": "z", "share": 0.1}}],
    ),
    bad_file(
        "release-shadow-share",
        "releases.0.shadow.share",
        releases=[{**_release(("a", MODEL, 1)), "shadow": {"variant": "a", "share": 2}}],
    ),
    bad_file(
        "release-dup-model",
        "releases",
        releases=[_release(("a", MODEL, 1)), _release(("b", MODEL, 1))],
    ),
    bad_file(
        "release-unserved",
        "releases.0.variants.1.model",
        releases=[_release(("a", MODEL, 1), ("b", "nobody-serves-this", 1))],
    ),
    bad_file("port", "port", port=70000),
    bad_file("max-body", "max_body_bytes", max_body_bytes=0),
    bad_file("log-level", "log_level", log_level="loud"),
    bad_file("redis-url", "redis_url", redis_url="http://x"),
    bad_file("timeout", "request_timeout_s", request_timeout_s=0),
    bad("env-type", "port", env={"TIERGATE_PORT": "eighty"}),
    bad("env-nested", "policy.hysteresis", env={"TIERGATE_POLICY__HYSTERESIS": "99"}),
    bad("env-bad-json", "tiers", env={"TIERGATE_TIERS": "[not json"}),
    bad("override", "policy.latency_hard_cap", policy={"latency_hard_cap": 1}),
    bad("yaml-syntax", "config", doc="tiers: [unclosed\n"),
    bad("yaml-not-mapping", "config", doc="- a\n- b\n"),
]


@pytest.mark.parametrize(
    ("doc", "env", "overrides", "field"),
    INVALID,
)
def test_invalid_config_names_field_and_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    doc: Any,
    env: dict[str, str],
    overrides: dict[str, Any],
    field: str,
) -> None:
    path = write(tmp_path, doc)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings(path, **overrides)
    message = str(info.value)
    assert any(p.startswith(f"{field}: ") for p in info.value.problems), message
    assert f"\n  {field}: " in message
    assert str(path) in message
    assert info.value.file == path
    # A clean error, not a chained pydantic traceback.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config: file not found") as info:
        load_settings(missing)
    assert str(missing) in str(info.value)


def test_error_without_file_says_so() -> None:
    with pytest.raises(ConfigError, match="no config file") as info:
        load_settings()
    assert info.value.problems[0].startswith("tiers: ")


def test_direct_construction_allows_no_tiers() -> None:
    # Only load_settings (the serving entry point) insists on tiers; the model itself does not,
    # so callers such as `tiergate up` can build the tiers list programmatically.
    assert Settings().tiers == []


# --- secrets ---------------------------------------------------------------------------------


def test_secrets_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_with(**{"tiers.0.backends.0.api_key": "upstream-secret-1"})
    monkeypatch.setenv("TIERGATE_API_KEYS", "client-secret-2,client-secret-3")
    monkeypatch.setenv("TIERGATE_REDIS_URL", "redis://:redis-secret-4@127.0.0.1:6379/0")
    settings = load_settings(write(tmp_path, doc))
    shown = repr(settings) + str(settings) + repr(settings.tiers) + str(settings.model_dump())
    for secret in ("upstream-secret-1", "client-secret-2", "client-secret-3"):
        assert secret not in shown
    assert "redis-secret-4" not in repr(settings) + str(settings)
    key = settings.tiers[0].backends[0].api_key
    assert key is not None
    assert key.get_secret_value() == "upstream-secret-1"
    assert [k.get_secret_value() for k in settings.api_keys] == [
        "client-secret-2",
        "client-secret-3",
    ]


def test_secrets_not_echoed_in_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_API_KEYS", '["client-secret-5", 3')  # broken JSON
    doc = doc_with(**{"tiers.0.backends.0.api_key": ["upstream-secret-6"]})  # wrong type
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, doc))
    message = str(info.value)
    assert "api_keys" in message
    assert "tiers.0.backends.0.api_key" in message
    assert "client-secret-5" not in message
    assert "upstream-secret-6" not in message
