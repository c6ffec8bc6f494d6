"""An engine kind is one folder: the made-up `echo` kind (tests/integration/echo_kind: adapter,
options, metrics table, readiness; its engine speaks no OpenAI API) serves OpenAI clients through
a real gateway, handed to it by the assembly, while no module of the gateway names it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.config.settings import load_settings
from gateway.serve.app import create_app
from gateway.serve.assembly import Hosting
from gateway.serve.server import build_server
from gateway.wire.kinds import BUILTIN, table
from tests.conftest import free_port
from tests.integration import echo_kind
from tests.integration.stack import wait_until, wait_until_async

ROOT = Path(__file__).resolve().parents[2]
KINDS = table(*BUILTIN.values(), echo_kind.KIND)


@pytest.fixture
def engine() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.echo_kind.engine",
                             str(port), "m"], cwd=ROOT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def alive() -> bool:
        try:
            return httpx.get(url + "/alive", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(alive, "the echo engine answers /alive")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
async def gateway(engine: str) -> AsyncIterator[str]:
    backend = {"url": engine, "models": ["m"], "kind": "echo", "metrics_url": engine + "/stats",
               "echo_prefix": "say "}  # fmt: skip
    port = free_port()
    tier = {"name": "e", "role": "throughput", "backends": [backend]}
    settings = load_settings(None, kinds=KINDS, port=port, host="127.0.0.1", tiers=[tier])
    app = create_app(settings, Hosting(kinds=KINDS))
    server = build_server(settings, app)
    task = asyncio.create_task(server.serve())
    await wait_until_async(lambda: server.started or task.done(), "the gateway listens")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_openai_clients_are_served_by_an_engine_of_a_kind_of_ones_own(gateway: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="none", max_retries=0)
    raw = await client.completions.with_raw_response.create(
        model="m", prompt="one two three", max_tokens=8
    )
    done = raw.parse()
    # The prefix is the kind's own option; the echo engine says the words backwards.
    assert done.choices[0].text == "three two one say"
    assert done.usage is not None
    assert done.usage.completion_tokens == 4
    assert raw.headers["x-tiergate-backend"].startswith("http://127.0.0.1:")
    # What the kind cannot serve is refused by the gateway, with the kind's reason.
    with pytest.raises(openai.BadRequestError, match="whole completions only"):
        await client.completions.create(model="m", prompt="hi", stream=True)
    async with httpx.AsyncClient() as http:
        state = (await http.get(gateway + "/state")).json()
    (backend,) = state["backends"]
    assert (backend["kind"], backend["healthy"]) == ("echo", True)
    await client.close()


def test_no_module_of_the_gateway_names_the_kind() -> None:
    names = ("echo_kind", "echo_prefix", "EchoKind", "tests.integration")
    for path in (ROOT / "gateway").rglob("*.py"):
        text = path.read_text()
        assert not [n for n in names if n in text], path
    assert "echo" not in BUILTIN
