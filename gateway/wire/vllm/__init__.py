"""The vllm engine kind: vLLM's OpenAI-compatible server (and anything speaking its API: the
simulator's front, SGLang's, TGI's, llama.cpp's server, whose load the gateway then knows from
its own requests and stream timings alone, its metrics being read by vLLM's names only), reached
over the gateway's HTTP/1.1 pool and probed with GET /health."""

from __future__ import annotations

from gateway.wire import Kind
from gateway.wire.vllm.adapter import ADAPTER
from gateway.wire.vllm.options import VllmOptions

__all__ = ["KIND"]

KIND = Kind("vllm", ADAPTER, VllmOptions)
