"""Gray releases over real sockets: a gateway splitting the model `llama` over two simulators
that serve it as `llama-v1` and `llama-v2` (each answers 404 to any other name, so a request
that reached one was rewritten right). The split's share over 2,000 requests, stickiness,
weight changes through the admin API under load and by reloading the config file (SIGHUP and
POST /admin/reload), shadow copies, per-variant metrics, and the same across two workers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import yaml

from loadtests.harness.procs import GatewayProcess, SimProcess

KEY = "admin-secret"
AUTH = {"authorization": f"Bearer {KEY}"}
N_SPLIT = 2000


class Release:
    def __init__(self, workdir: Path, sims: list[SimProcess]) -> None:
        self.workdir, self.sims = workdir, sims
        self.path = workdir / "gateway.yaml"
        self.gateways: list[GatewayProcess] = []

    def write(self, weights: tuple[float, float], path: Path | None = None, **extra: Any) -> None:
        v1, v2 = self.sims
        doc = {
            "tiers": [{"name": "awq", "role": "throughput", "backends": [
                {"url": v1.url, "models": ["llama-v1"]},
                {"url": v2.url, "models": ["llama-v2"]}]}],
            "releases": [{"model": "llama", "variants": [
                {"name": "v1", "model": "llama-v1", "weight": weights[0]},
                {"name": "v2", "model": "llama-v2", "weight": weights[1]}]}],
            "admin_key": KEY,
            "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
            **extra,
        }  # fmt: skip
        (path or self.path).write_text(yaml.safe_dump(doc))

    def gateway(self, name: str, **extra: Any) -> GatewayProcess:
        path = self.workdir / f"{name}.yaml"
        self.write((95, 5), path, **extra)
        gw = GatewayProcess(config=path, log=self.workdir / f"{name}.log").start()
        self.gateways.append(gw)
        return gw


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    workdir = tmp_path_factory.mktemp("releases")
    sims: list[SimProcess] = []
    r = Release(workdir, sims)
    try:
        for name in ("llama-v1", "llama-v2"):
            sims.append(SimProcess(profile="instant", args=["--model", name]).start())
        r.write((95, 5))
        r.gateways.append(GatewayProcess(config=r.path, log=workdir / "gateway.log").start())
        yield r
    finally:
        for p in [*r.gateways, *sims]:
            p.stop()


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "llama", "prompt": "hello", "max_tokens": 2, **extra}


@dataclass(frozen=True)
class Answer:
    status: int
    variant: str | None  # x-tiergate-variant
    model: str | None  # the body's: the model that answered
    sent_at: float = 0.0  # time.monotonic()


async def send(
    url: str, n: int, concurrency: int = 16, until: asyncio.Event | None = None
) -> list[Answer]:
    """`n` requests without a user or session key, `concurrency` at once (aiohttp: a client
    light enough for the gateway to be the busy one); with `until`, as many as fit until it
    is set."""
    async with aiohttp.ClientSession(url) as c:

        async def worker(count: int) -> list[Answer]:
            out = []
            while count > 0 if until is None else not until.is_set():
                count -= 1
                sent_at = time.monotonic()
                async with c.post("/v1/completions", json=body()) as r:
                    data = await r.json() if r.status == 200 else {}
                    out.append(Answer(r.status, r.headers.get("x-tiergate-variant"),
                                      data.get("model"), sent_at))  # fmt: skip
            return out

        shares = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
        done = await asyncio.gather(*(worker(k) for k in shares))
        return [a for part in done for a in part]


def variants(answers: list[Answer]) -> Counter[str]:
    assert all(a.status == 200 for a in answers), Counter(a.status for a in answers)
    for a in answers:  # the body says which model answered: the variant's
        assert a.model == f"llama-{a.variant}"
    return Counter(str(a.variant) for a in answers)


def put(url: str, weights: dict[str, float], **extra: Any) -> httpx.Response:
    return httpx.put(f"{url}/admin/releases/llama", json={"weights": weights, **extra},
                     headers=AUTH)  # fmt: skip


def test_a_95_5_split_lands_within_binomial_noise(release: Release) -> None:
    gw = release.gateways[0]
    put(gw.url, {"v1": 95, "v2": 5}).raise_for_status()
    counts = variants(asyncio.run(send(gw.url, N_SPLIT)))
    share = counts["v2"] / N_SPLIT
    print(f"split over {N_SPLIT} requests: {dict(counts)}, v2 share {share:.4f}")
    sigma = (0.05 * 0.95 / N_SPLIT) ** 0.5  # 0.49 points
    assert abs(share - 0.05) < 4 * sigma, (counts, share)
    assert counts["v1"] + counts["v2"] == N_SPLIT


def test_a_user_never_switches_variant(release: Release) -> None:
    gw = release.gateways[0]
    put(gw.url, {"v1": 50, "v2": 50}).raise_for_status()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    seen: dict[str, set[str]] = {}
    for rnd in range(3):
        for i in range(40):
            user = f"user-{i}"
            raw = client.completions.with_raw_response.create(
                model="llama", prompt=f"turn {rnd}", max_tokens=2, user=user
            )
            completion = raw.parse()
            variant = raw.headers["x-tiergate-variant"]
            assert completion.model == f"llama-{variant}"
            seen.setdefault(user, set()).add(variant)
    # And by session, whatever the user field says.
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        for s in range(20):
            got = {c.post("/v1/completions", json=body(user=f"x{j}"),
                          headers={"x-session-id": f"session-{s}"}).headers["x-tiergate-variant"]
                   for j in range(4)}  # fmt: skip
            assert len(got) == 1, (s, got)
    assert all(len(v) == 1 for v in seen.values()), seen
    assert {v for vs in seen.values() for v in vs} == {"v1", "v2"}  # both in use


def test_a_weight_change_takes_effect_under_load_without_a_restart(release: Release) -> None:
    gw = release.gateways[0]
    put(gw.url, {"v1": 100, "v2": 0}).raise_for_status()
    pid = httpx.get(gw.url + "/state").json()["pid"]

    async def run() -> tuple[list[Answer], float]:
        stop = asyncio.Event()
        during = asyncio.create_task(send(gw.url, 0, concurrency=16, until=stop))
        await asyncio.sleep(0.4)
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.put(f"{gw.url}/admin/releases/llama",
                            json={"weights": {"v1": 0, "v2": 1}}, headers=AUTH)  # fmt: skip
        changed = time.monotonic()
        assert r.status_code == 200, r.text
        assert [v["share"] for v in r.json()["variants"]] == [0.0, 1.0]
        await asyncio.sleep(0.4)
        stop.set()
        return await during, changed

    answers, changed = asyncio.run(run())
    variants(answers)  # every request answered, none dropped by the change
    before = variants([a for a in answers if a.sent_at < changed - 0.05])
    after = variants([a for a in answers if a.sent_at > changed])
    assert set(before) == {"v1"}, before
    assert set(after) == {"v2"}, after
    assert after["v2"] > 20, after
    assert httpx.get(gw.url + "/state").json()["pid"] == pid  # the same process


def test_reload_by_sighup_and_by_the_admin_api(release: Release) -> None:
    gw = release.gateways[0]
    release.write((0, 1))
    os.kill(gw.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while (got := httpx.get(gw.url + "/admin/releases", headers=AUTH).json()["data"][0])[
        "variants"][0]["weight"] != 0:  # fmt: skip
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    assert variants(asyncio.run(send(gw.url, 50))) == {"v2": 50}
    assert gw.alive

    # A file that is no longer valid changes nothing, and says why.
    good = release.path.read_text()
    release.path.write_text("releases: [unclosed\n")
    r = httpx.post(gw.url + "/admin/reload", headers=AUTH)
    assert r.status_code == 400, r.text
    assert "invalid YAML" in r.json()["error"]["message"]
    release.path.write_text(good.replace("llama-v2", "llama-v9"))
    r = httpx.post(gw.url + "/admin/reload", headers=AUTH)
    assert r.status_code == 400
    assert "no backend serves 'llama-v9'" in r.json()["error"]["message"]
    assert variants(asyncio.run(send(gw.url, 20))) == {"v2": 20}

    # The admin API's reload; what it cannot apply it names.
    release.write((1, 0), policy={"name": "least-loaded"})
    r = httpx.post(gw.url + "/admin/reload", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["releases_changed"] == ["llama"]
    assert r.json()["needs_restart"] == ["policy"]
    assert variants(asyncio.run(send(gw.url, 20))) == {"v1": 20}


@pytest.mark.parametrize(
    ("method", "path", "headers", "json", "status", "message"),
    [
        ("GET", "/admin/releases", {}, None, 401, "Missing or invalid admin key"),
        ("GET", "/admin/releases", {"authorization": "Bearer nope"}, None, 401, "admin key"),
        ("PUT", "/admin/releases/llama", {}, {"weights": {"v1": 1}}, 401, "admin key"),
        ("POST", "/admin/reload", {"authorization": KEY}, None, 401, "admin key"),
        ("PUT", "/admin/releases/mistral", AUTH, {"weights": {"v1": 1}}, 404, "No release"),
        ("PUT", "/admin/releases/llama", AUTH, {"weights": {"v7": 1}}, 400, "Unknown variants"),
        ("PUT", "/admin/releases/llama", AUTH, {"weights": {"v1": -1}}, 400, "weights.v1"),
        (
            "PUT",
            "/admin/releases/llama",
            AUTH,
            {"weights": {"v1": 0, "v2": 0}},
            400,
            "at least one variant",
        ),
        ("PUT", "/admin/releases/llama", AUTH, {"wieghts": {}}, 400, "wieghts"),
        (
            "PUT",
            "/admin/releases/llama",
            AUTH,
            {"shadow": {"variant": "v9", "share": 0.5}},
            400,
            "shadow",
        ),
    ],
)
def test_admin_errors_are_openai_errors(
    release: Release,
    method: str,
    path: str,
    headers: dict[str, str],
    json: Any,
    status: int,
    message: str,
) -> None:
    gw = release.gateways[0]
    before = httpx.get(gw.url + "/admin/releases", headers=AUTH).json()
    r = httpx.request(method, gw.url + path, headers=headers, json=json)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"], error
    assert error["code"] == status
    assert httpx.get(gw.url + "/admin/releases", headers=AUTH).json() == before


def test_shadow_copies_go_to_the_new_version_and_are_counted(release: Release) -> None:
    gw = release.gateways[0]
    put(gw.url, {"v1": 1, "v2": 0}, shadow={"variant": "v2", "share": 1.0}).raise_for_status()
    try:
        before = _sim_requests(release.sims[1])
        assert variants(asyncio.run(send(gw.url, 60, concurrency=8))) == {"v1": 60}
        deadline = time.monotonic() + 10
        while _sim_requests(release.sims[1]) < before + 60:
            assert time.monotonic() < deadline, _sim_requests(release.sims[1]) - before
            time.sleep(0.05)
        text = httpx.get(gw.url + "/metrics").text
        assert _sample(text, 'tiergate_release_requests_total{mode="shadow",outcome="ok",'
                       'release="llama",variant="v2"}') >= 60  # fmt: skip
        assert _sample(text, 'tiergate_release_requests_total{mode="live",outcome="ok",'
                       'release="llama",variant="v1"}') >= 60  # fmt: skip
        assert 'tiergate_release_duration_seconds_count{mode="shadow",release="llama"' in text
    finally:
        put(gw.url, {}, shadow=None).raise_for_status()


def test_models_lists_the_release(release: Release) -> None:
    names = {m["id"] for m in httpx.get(release.gateways[0].url + "/v1/models").json()["data"]}
    assert names == {"llama", "llama-v1", "llama-v2"}


def test_admin_off_without_a_key(release: Release, tmp_path: Path) -> None:
    gw = release.gateway("no-admin", admin_key=None)
    try:
        r = httpx.get(gw.url + "/admin/releases", headers=AUTH)
        assert r.status_code == 403
        assert "admin API is off" in r.json()["error"]["message"]
    finally:
        gw.stop()


def test_an_admin_change_and_a_sighup_reach_every_worker(release: Release) -> None:
    gw = release.gateway("workers", workers=2)
    pids: set[int] = set()

    async def check() -> Counter[str]:
        out = []
        for _ in range(20):  # new connections: the kernel spreads them over both workers
            async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
                pids.add((await c.get("/state")).json()["pid"])
                r = await c.post("/v1/completions", json=body())
                out.append(Answer(r.status_code, r.headers.get("x-tiergate-variant"),
                                  r.json().get("model")))  # fmt: skip
        return variants(out)

    def settles(want: dict[str, int]) -> None:
        # Relayed through the supervisor: at once, or nearly.
        deadline = time.monotonic() + 10
        while (got := asyncio.run(check())) != want:
            assert time.monotonic() < deadline, got

    try:
        put(gw.url, {"v1": 0, "v2": 1}).raise_for_status()
        settles({"v2": 20})
        release.write((1, 0), release.workdir / "workers.yaml", workers=2)
        os.kill(gw.pid, signal.SIGHUP)  # the supervisor's: it tells every worker
        settles({"v1": 20})
        assert len(pids) == 2, pids
        assert gw.alive
    finally:
        gw.stop()


def _sim_requests(sim: SimProcess) -> float:
    return _sample(httpx.get(sim.url + "/metrics").text, "vllm:request_success_total{")


def _sample(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))  # fmt: skip
