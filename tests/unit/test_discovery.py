"""Discovery, pure parts: the settings, a source's answers applied to the registry (join, leave,
forget, the last good set kept), the learner and the monitor following the membership, a new
backend's prior, and the Kubernetes endpoint rules, on a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.backends.discovery import Discovery
from gateway.backends.discovery.kubernetes import endpoint_urls
from gateway.backends.discovery.source import Found
from gateway.backends.learner import Learner
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import ConfigError, DiscoveryConfig, Settings, load_settings
from gateway.observe.telemetry import Telemetry
from tests.unit.test_registry import Clock

STATIC = "http://static:1"


class Quiet:
    """A source that never answers (the tests apply answers themselves)."""

    async def answers(self) -> AsyncIterator[Found]:
        await asyncio.Event().wait()
        yield Found()

    async def aclose(self) -> None:
        return None


def settings(**dns: Any) -> Settings:
    discovery = {"dns": {"name": "pool.local", "port": 8000, **dns},
                 "backend": {"models": ["m"], "metrics_port": 9090}}  # fmt: skip
    return Settings(tiers=[{"name": "pool", "role": "throughput",
                            "backends": [{"url": STATIC, "models": ["m"]}],
                            "discovery": discovery}])  # fmt: skip


def build(clock: Clock | None = None) -> tuple[Settings, Registry, Discovery, Telemetry]:
    s, t = settings(), Telemetry()
    reg = Registry(s, MemoryInflightStore(), t, clock or Clock())
    return s, reg, Discovery(s, reg, t, lambda cfg: Quiet()), t


def urls(*hosts: str) -> frozenset[str]:
    return frozenset(f"http://{h}:8000" for h in hosts)


def apply(d: Discovery, s: Settings, found: Found) -> None:
    tier = s.tiers[0]
    assert tier.discovery is not None
    d.apply(tier, tier.discovery, found)


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tier", "problem"),
    [
        ({"discovery": {"dns": {"name": "n"}, "backend": {"models": ["m"]}}},
         "tiers.0.discovery.dns.port: A records carry no port: set the engines' port"),
        ({"discovery": {"dns": {"name": "n", "record": "SRV", "port": 1},
                        "backend": {"models": ["m"]}}},
         "tiers.0.discovery.dns.port: SRV records carry their own ports; leave port out"),
        ({"discovery": {"backend": {"models": ["m"]}}},
         "tiers.0.discovery.dns: set exactly one source: dns, kubernetes or file"),
        ({"discovery": {"dns": {"name": "n", "port": 1}, "file": {"path": "pool.yaml"},
                        "backend": {"models": ["m"]}}},
         "tiers.0.discovery.dns: set exactly one source: dns, kubernetes or file"),
        ({},
         "tiers.0.backends: list at least one backend, or set discovery"),
        ({"discovery": {"kubernetes": {"service": "s", "port": "http"},
                        "backend": {"models": ["m"], "triton_grpc": "t:1"}}},
         "tiers.0.discovery.backend.triton_grpc: only applies to backends of kind triton"),
    ],
)  # fmt: skip
def test_what_a_discovery_configuration_may_not_be(tier: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, tiers=[{"name": "p", "role": "throughput", **tier}])
    assert problem in err.value.problems


def test_discovery_with_several_workers_needs_redis() -> None:
    discovery = {"dns": {"name": "n", "port": 1}, "backend": {"models": ["m"]}}
    tier = {"name": "p", "role": "throughput", "discovery": discovery}
    with pytest.raises(ConfigError, match="with workers > 1 it needs redis_url"):
        load_settings(None, tiers=[tier], workers=2)
    assert load_settings(None, tiers=[tier], workers=2, redis_url="redis://r:6379").workers == 2


def test_a_discovered_backend_is_made_from_the_template() -> None:
    cfg = DiscoveryConfig.model_validate(
        {"dns": {"name": "n", "port": 1},
         "backend": {"models": ["m"], "kind": "triton", "metrics_port": 8002,
                     "triton_models": {"m": "mm"}}})  # fmt: skip
    b = cfg.backend.at("http://10.0.0.7:8000")
    assert (b.url, b.kind, b.models) == ("http://10.0.0.7:8000", "triton", ["m"])
    assert b.scrape_url == "http://10.0.0.7:8002/metrics"
    assert b.kind_options == {"triton_models": {"m": "mm"}}
    v6 = DiscoveryConfig.model_validate({
        "dns": {"name": "n", "port": 1, "record": "AAAA"},
        "backend": {"models": ["m"], "metrics_port": 9}})  # fmt: skip
    assert v6.backend.at("http://[fd00::7]:8000").scrape_url == "http://[fd00::7]:9/metrics"
    assert b.health_path is None  # the kind's
    own = DiscoveryConfig.model_validate(
        {"dns": {"name": "n", "port": 1}, "backend": {"models": ["m"], "health_path": "/"}})
    assert own.backend.at("http://10.0.0.7:8000").health_path == "/"


# -- the registry follows the answers -------------------------------------------------------


def test_found_backends_join_probed_first_and_lost_ones_leave() -> None:
    s, reg, d, t = build()
    apply(d, s, Found(urls("a", "b")))
    a, b = reg.entries["http://a:8000"], reg.entries["http://b:8000"]
    assert a.discovered
    assert not reg.entries[STATIC].discovered
    # Joining: out of rotation until the monitor's first good probe.
    assert (a.live.down, a.live.eject_reason) == (True, "joining")
    assert reg.joining("m")
    assert not reg.joining("other")
    assert {x.url for x in reg.backends} == {STATIC, a.url, b.url}
    reg.readmit(a)
    apply(d, s, Found(urls("b", "c")))
    # a had nothing in flight: forgotten at once, its series gone.
    assert "http://a:8000" not in reg.entries
    assert {x.url for x in reg.backends} == {STATIC, b.url, "http://c:8000"}
    assert t.child(t.discovered, "pool")._value.get() == 2


def test_an_error_or_an_empty_answer_keeps_the_last_set() -> None:
    s, reg, d, _ = build()
    apply(d, s, Found(urls("a", "b")))
    before = set(reg.entries)
    apply(d, s, Found(error="Timeout: no answer"))
    apply(d, s, Found(frozenset()))
    assert set(reg.entries) == before
    assert d.found["pool"] == urls("a", "b")


def test_a_listed_backend_found_again_is_left_alone() -> None:
    s, reg, d, _ = build()
    apply(d, s, Found(urls("a") | {STATIC}))
    apply(d, s, Found(urls("a")))
    assert reg.entries[STATIC].left_at is None
    reg.leave(STATIC)  # not even when asked directly: only what discovery found leaves
    assert reg.entries[STATIC].left_at is None


async def test_a_backend_that_left_finishes_its_streams_then_is_forgotten() -> None:
    clock = Clock()
    s, reg, d, t = build(clock)
    apply(d, s, Found(urls("a", "b")))
    a = reg.entries["http://a:8000"]
    reg.readmit(a)
    t.inflight.labels("throughput", a.url).inc(0)  # a series of its own
    with reg.lease(a, 0.05) as lease:
        lease.first_byte(clock(), lambda: None)
        apply(d, s, Found(urls("b")))
        assert a.left_at == clock.now
        assert a.url in reg.entries
        assert a.url not in {b.url for b in reg.backends}  # no new request
        assert a.url not in {b.url for b in reg.snapshot().backends}
        clock.now += 10
        assert reg.cut_left(30) == 0
        clock.now += 25
        cut: list[str] = []
        lease.on_cut = lambda: cut.append("cut")
        assert reg.cut_left(30) == 1
        assert lease.cut == "left"
    assert a.url not in reg.entries  # the last lease ended: forgotten
    assert 'backend="http://a:8000"' not in t.exposition().decode()


async def test_a_backend_found_again_while_it_drains_comes_back() -> None:
    clock = Clock()
    s, reg, d, _ = build(clock)
    apply(d, s, Found(urls("a")))
    a = reg.entries["http://a:8000"]
    reg.readmit(a)
    with reg.lease(a, 0.05):
        apply(d, s, Found(urls("b")))
        assert a.left_at is not None
        apply(d, s, Found(urls("a", "b")))
        assert a.left_at is None
        assert reg.entries[a.url] is a
    assert a.url in {b.url for b in reg.backends}


# -- the learner and the monitor follow ----------------------------------------------------


def test_the_learner_follows_and_a_joined_backend_starts_from_its_mate() -> None:
    s, reg, d, t = build()
    learner = Learner(reg, s, t, reg.clock)
    assert set(learner.models) == {STATIC}
    # The listed backend has learned something: a known curve.
    mate = learner.models[STATIC]
    for n in (1, 2, 4, 8):
        for _ in range(20):
            mate.observe_request(reg.clock(), (float(n), 0.02 + 0.001 * n), (n, 0.1))
    learner._dirty.add(STATIC)
    learner.refresh()
    known = reg.curves[STATIC]
    assert known.known
    apply(d, s, Found(urls("a")))
    learner.refresh()
    told = reg.curves["http://a:8000"]
    assert told.known
    assert told.frontier == 1
    assert told.observed_at is None
    assert told.tpot.table == known.tpot.table
    assert all(x >= y for x, y in zip(told.doubt, known.doubt or (0.0,) * len(told.doubt),
                                      strict=True))  # fmt: skip
    apply(d, s, Found(urls("b")))
    learner.refresh()
    assert "http://a:8000" not in learner.models
    assert "http://a:8000" not in reg.curves


# -- Kubernetes' endpoints --------------------------------------------------------------------


def ep(addresses: list[str], **conditions: Any) -> Any:
    return SimpleNamespace(addresses=addresses, conditions=SimpleNamespace(
        ready=conditions.get("ready"), serving=conditions.get("serving"),
        terminating=conditions.get("terminating")) if conditions else None)  # fmt: skip


def slice_of(*endpoints: Any, ports: tuple[tuple[str | None, int], ...] = (("http", 8000),)) -> Any:
    return SimpleNamespace(endpoints=list(endpoints),
                           ports=[SimpleNamespace(name=n, port=p) for n, p in ports])  # fmt: skip


@pytest.mark.parametrize(
    ("endpoints", "port", "expected"),
    [
        ([ep(["10.0.0.1"], ready=True)], "http", {"http://10.0.0.1:8000"}),
        # No conditions, or ready unset: ready, as the API documents.
        ([ep(["10.0.0.1"]), ep(["10.0.0.2"], terminating=False)], "http",
         {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}),
        ([ep(["10.0.0.1"], ready=False)], "http", set()),
        ([ep(["10.0.0.1"], ready=True, terminating=True)], "http", set()),
        ([ep(["fd00::1"], ready=True)], "http", {"http://[fd00::1]:8000"}),
        ([ep(["10.0.0.1"], ready=True)], 8000, {"http://10.0.0.1:8000"}),
        ([ep(["10.0.0.1"], ready=True)], "metrics", set()),
    ],
)  # fmt: skip
def test_which_endpoints_are_backends(
    endpoints: list[Any], port: str | int, expected: set[str]
) -> None:
    assert endpoint_urls(slice_of(*endpoints), port, "http") == expected


def test_every_reason_a_stream_is_cut_for_has_its_message_for_the_client() -> None:
    import re
    from pathlib import Path

    from gateway.pipeline import upstream

    root = Path(upstream.__file__).parents[1]
    reasons = {m for path in root.rglob("*.py")
               for m in re.findall(r'cut_stream\("(\w+)"\)', path.read_text())}  # fmt: skip
    assert reasons == {"ejected", "idle", "left"}
    assert reasons <= set(upstream._CUT_MESSAGES)
