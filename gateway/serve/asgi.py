"""The gateway as an ASGI app factory, for serving it with another ASGI server:

    TIERGATE_CONFIG=gateway.yaml granian --interface asgi --factory gateway.serve.asgi:app
    TIERGATE_CONFIG=gateway.yaml uvicorn --factory gateway.serve.asgi:app

The settings come as for `tiergate serve` (the file named by TIERGATE_CONFIG, then TIERGATE_*
variables). What only `tiergate serve` adds (gateway.serve.server) is lost: the deadlines on a
request's head and body, the limits on its head's size and on connections (with OpenAI-style
refusals), the writes that bypass ASGI's `send` for a stream's chunks, and the drain on SIGTERM
(the other server's own shutdown applies). The gateway's behaviour behind its front is the same.
`tiergate bench peers` measures this factory under granian against `tiergate serve`.
"""

from __future__ import annotations

from gateway.config.settings import load_settings
from gateway.observe.telemetry import setup_logging
from gateway.serve.app import GatewayApp, create_app

__all__ = ["app"]


def app() -> GatewayApp:
    """A new gateway app from the environment's settings (raises ConfigError on a bad one)."""
    settings = load_settings()
    setup_logging(settings.log_level, settings.log_json)
    return create_app(settings)
