"""A stream is counted in tokens even where its client asks for no usage: in front of a
speculative engine (several tokens per SSE event), the gateway's token count and TPOT are the
engine's, and the client's stream is the one it asked for (no usage event)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.stack import MODEL, Stack, start_stack

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 48,
                        "ignore_eos": True, "stream": True}  # fmt: skip
N = 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("tokens"), latency=1, throughput=0, speedup=10)
    yield s
    s.stop()


def tokens_counted(gw: str) -> float:
    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(gw + "/metrics").text)}
    return sum(s.value for s in fams["tiergate_output_tokens"].samples
               if s.name == "tiergate_output_tokens_total")  # fmt: skip


def test_a_stream_without_usage_is_counted_in_tokens(stack: Stack) -> None:
    gw = stack.gateway.url
    before = tokens_counted(gw)
    events = 0
    for _ in range(N):
        r = httpx.post(gw + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200
        assert r.text.endswith("data: [DONE]\n\n")
        assert '"usage"' not in r.text or '"usage":null' in r.text  # none asked, none given
        assert '"choices":[]' not in r.text
        events += sum(1 for line in r.text.split("\n\n")
                      if line.startswith("data: {") and '"text":"' in line)  # fmt: skip
    # The speculative engine sends fewer events than tokens; the gateway counts the tokens.
    assert events < N * 48
    assert tokens_counted(gw) - before == N * 48
