"""The Triton readiness check (wire.triton.readiness) against a stand-in for tritonclient's client:
what it reports, what it logs (once per problem), and what it tells the gRPC transport."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from gateway.wire.triton.grpc_codec import INPUT_TYPES
from gateway.wire.triton.readiness import TritonReadiness

URL = "http://t:8000"


class FakeClient:
    def __init__(self, inputs: dict[str, str], ready: bool = True, models: tuple[str, ...] = ()):
        self.inputs, self.ready, self.models = inputs, ready, models
        self.error: InferenceServerException | None = None

    async def is_server_ready(self, headers: Any = None) -> bool:
        if self.error is not None:
            raise self.error
        return self.ready

    async def is_model_ready(self, model: str, headers: Any = None) -> bool:
        return model in self.models

    async def get_model_metadata(self, model: str, headers: Any = None, **kw: Any) -> Any:
        inputs = [{"name": n, "datatype": t, "shape": [1]} for n, t in self.inputs.items()]
        return {"name": model, "inputs": inputs}


def readiness(grpc: bool, client: FakeClient) -> TritonReadiness:
    backend = {"url": URL, "kind": "triton", "models": ["org/m"], "triton_models": {"org/m": "m"}}
    if grpc:
        backend["triton_grpc"] = "t:8001"
    settings = Settings(tiers=[{"name": "p", "role": "throughput", "backends": [backend]}])
    entry = Registry(settings, MemoryInflightStore(), Telemetry()).entries[URL]
    ready = entry.kind.readiness(entry, entry.own_transport, 1.0)
    assert isinstance(ready, TritonReadiness)
    ready._client = client  # no server: the client is the stand-in
    return ready


@pytest.mark.parametrize("grpc", [False, True])
async def test_ready_when_the_server_and_the_mapped_model_are(grpc: bool) -> None:
    ready = readiness(grpc, FakeClient(dict(INPUT_TYPES), models=("m",)))
    assert ready.models == ["m"]
    assert await ready.check() is None
    if grpc:  # the transport learns which optional inputs the model declares
        assert ready.grpc is not None
        assert ready.grpc.declared == {"m": frozenset(INPUT_TYPES)}


@pytest.mark.parametrize(
    ("client", "result", "logged"),
    [
        (FakeClient(dict(INPUT_TYPES), ready=False, models=("m",)),
         ("server not ready", True), None),
        (FakeClient(dict(INPUT_TYPES), models=("other",)),
         ("model m not ready", True), "model 'm' is not ready: is it in the model repository"),
        # Inputs unlike the vLLM backend's are an error in the log; the backend stays in.
        (FakeClient({"text_input": "BYTES", "stream": "BYTES"}, models=("m",)), None,
         "model 'm' does not take the vLLM backend's inputs: no input 'sampling_parameters'"),
    ],
)  # fmt: skip
async def test_what_is_reported_and_logged_once(
    client: FakeClient,
    result: tuple[str, bool] | None,
    logged: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ready = readiness(True, client)
    with caplog.at_level(logging.INFO, "gateway.wire.triton.readiness"):
        for _ in range(3):
            assert await ready.check() == result
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == (logged is not None)
    if logged is not None:
        assert logged in errors[0]
        assert URL in errors[0]
    # Fixed: said once.
    client.inputs, client.models, client.ready = dict(INPUT_TYPES), ("m",), True
    caplog.clear()
    with caplog.at_level(logging.INFO, "gateway.wire.triton.readiness"):
        assert await ready.check() is None
        assert await ready.check() is None
    fine = [r for r in caplog.records if "is fine now" in r.getMessage()]
    assert len(fine) == (logged is not None)


@pytest.mark.parametrize(
    ("grpc", "status", "result"),
    [
        (True, "StatusCode.UNAVAILABLE", ("unreachable", True)),  # gRPC: nothing else notices
        (False, "StatusCode.UNAVAILABLE", ("unreachable", False)),  # HTTP: metrics fail too
        (True, "StatusCode.INTERNAL", ("error boom", True)),
    ],
)
async def test_failures_of_the_check_itself(
    grpc: bool, status: str, result: tuple[str, bool]
) -> None:
    client = FakeClient(dict(INPUT_TYPES), models=("m",))
    client.error = InferenceServerException("boom", status=status)
    assert await readiness(grpc, client).check() == result
