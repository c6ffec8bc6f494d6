"""The Kubernetes source with its real client (kubernetes_asyncio) against a stand-in for the API
server on loopback that serves recorded EndpointSlice objects (k8s/endpointslices.json): the
list it starts from, then a watch replaying a pod added, turning ready, terminating, a second
slice and a deletion; a watch the server ends is taken up again from the last version seen.
No cluster ran here: the API's wire format is what is exercised."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from gateway.backends.discovery.kubernetes import KubernetesSource
from gateway.backends.discovery.source import Found
from gateway.config.settings import KubernetesDiscovery
from tests.conftest import free_port

RECORDED = json.loads((Path(__file__).parent / "k8s" / "endpointslices.json").read_text())
PATH = "/apis/discovery.k8s.io/v1/namespaces/tiergate/endpointslices"


class ApiServer:
    """The EndpointSlice list and watch of one namespace; the test pushes watch events."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.asked: list[dict[str, str]] = []

    async def slices(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(dict(request.query))
        if request.query.get("watch") not in ("true", "True", "1"):
            return web.json_response(RECORDED["list"])
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        while (event := await self.events.get()) is not None:
            await resp.write(json.dumps(event).encode() + b"\n")
        return resp  # the server ends the watch


def event(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded step as the watch sends it: the whole object, its changes applied."""
    obj = copy.deepcopy(RECORDED["list"]["items"][0])
    obj["metadata"]["resourceVersion"] = recorded["object"]["resourceVersion"]
    if "name" in recorded:
        obj["metadata"]["name"] = recorded["name"]
    if "endpoints" in recorded["object"]:
        obj["endpoints"] = recorded["object"]["endpoints"]
    return {"type": recorded["type"], "object": obj}


def kubeconfig_for(folder: Path, port: int) -> Path:
    """A kubeconfig whose cluster is the API server on loopback `port`."""
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "test", "user": {"token": "a-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))  # fmt: skip
    return path


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, Path]]:
    server = ApiServer()
    app = web.Application()
    app.router.add_get(PATH, server.slices)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    kubeconfig = kubeconfig_for(tmp_path, port)
    try:
        yield server, kubeconfig
    finally:
        await server.events.put(None)
        await runner.cleanup()


def hosts(found: Found) -> list[str]:
    return sorted(u.removeprefix("http://").rsplit(":", 1)[0] for u in found.urls)


async def test_endpoints_are_followed_through_list_and_watch(
    api: tuple[ApiServer, Path],
) -> None:
    server, kubeconfig = api
    source = KubernetesSource(KubernetesDiscovery(
        service="vllm-v3", namespace="tiergate", port="http", kubeconfig=kubeconfig,
        retry_s=0.05))  # fmt: skip
    answers = source.answers()
    try:
        first = await asyncio.wait_for(anext(answers), 10)
        assert first.error is None
        assert hosts(first) == ["10.244.1.17", "10.244.2.23"]
        assert all(u.endswith(":8000") for u in first.urls)
        for step in RECORDED["events"]:
            await server.events.put(event(step))
            found = await asyncio.wait_for(anext(answers), 10)
            assert hosts(found) == step["expect"], step["step"]
        # The API server ends the watch: the client watches again from the last version it
        # saw, and what changes then is followed as before.
        await server.events.put(None)
        following = asyncio.ensure_future(anext(answers))  # the source reads on, meanwhile
        last = RECORDED["events"][-1]
        again = dict(last, type="MODIFIED", object={**last["object"], "resourceVersion": "5007"})
        deadline = asyncio.get_running_loop().time() + 10
        while not any(q.get("resourceVersion") == "5006" for q in server.asked):
            assert asyncio.get_running_loop().time() < deadline, server.asked
            await asyncio.sleep(0.02)
        await server.events.put(event(again))
        found = await asyncio.wait_for(following, 10)
        assert hosts(found) == ["10.244.1.17", "10.244.2.23", "10.244.4.40"]
    finally:
        await answers.aclose()
        await source.aclose()
    selectors = {q.get("labelSelector") for q in server.asked}
    assert selectors == {"kubernetes.io/service-name=vllm-v3"}
    watches = [q for q in server.asked if q.get("watch") in ("true", "True", "1")]
    assert watches
    assert watches[0]["resourceVersion"] == "5001"  # the watch starts from the list


async def test_an_api_server_that_cannot_be_reached_is_an_error_answer(tmp_path: Path) -> None:
    kubeconfig = kubeconfig_for(tmp_path, free_port())  # nobody listens there
    source = KubernetesSource(KubernetesDiscovery(service="s", namespace="n", port=8000,
                                                  kubeconfig=kubeconfig, retry_s=0.05))  # fmt: skip
    answers = source.answers()
    try:
        found = await asyncio.wait_for(anext(answers), 10)
        assert found.error is not None
        assert found.urls == frozenset()
    finally:
        await answers.aclose()
        await source.aclose()
