"""The gateway's own command, `tiergate serve`, and the foreground runner it shares with
`tiergate up` (the `tiergate` command itself is composed in the tiergate package)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gateway.settings import Settings


def run(settings: Settings, banner: Callable[[], None] | None = None) -> None:
    """Run the gateway in the foreground; call `banner` once it answers /ready. SIGTERM and
    SIGINT drain it (gateway.server), and it returns once drained."""
    import asyncio
    import gc

    import uvloop

    from gateway.app import create_app
    from gateway.server import CUT_GRACE_S, GatewayConfig, GatewayServer, Guard, raise_fd_limit

    app = create_app(settings)
    config = GatewayConfig(
        app,
        Guard(settings.server),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # uvicorn's few lines go through the gateway's own (structured) logging.
        log_config=None,
        access_log=False,
        # The app reads no client address; X-Forwarded-For rewriting costs every request.
        proxy_headers=False,
        loop="uvloop",
        timeout_keep_alive=settings.server.keepalive_timeout_s,
        # A last resort only: the drain ends every request at its own deadline.
        timeout_graceful_shutdown=settings.shutdown.drain_timeout_s + CUT_GRACE_S,
    )
    server = GatewayServer(config, app.drain, settings.shutdown)
    # Each client connection may hold an engine connection too.
    raise_fd_limit(2 * settings.server.max_connections + 256)

    async def main() -> None:
        server.listen()
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.05)
        if server.started:
            # Objects alive after start-up (the app's lifespan built the gateway) live for the
            # whole process: keep them out of the collector's full passes, which otherwise
            # showed up as 30-90 ms stalls in the latency tail.
            gc.collect()
            gc.freeze()
        if banner is not None and server.started:
            await asyncio.to_thread(_wait_ready, settings.port)
            banner()
        await task

    uvloop.run(main())
    if not server.started:
        raise typer.Exit(1)


def _wait_ready(port: int, timeout: float = 10.0) -> None:
    """Poll /ready until it answers 200 (blocking: run it in a thread)."""
    import time
    import urllib.request

    url = f"http://127.0.0.1:{port}/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:  # refused, or an HTTP error status (503 while not ready)
            pass
        time.sleep(0.05)
    logging.getLogger("tiergate").warning("gateway not ready yet: see /ready")


def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file with tiers and policy (TIERGATE_CONFIG).",
            envvar="TIERGATE_CONFIG",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 0.0.0.0).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
    log_level: Annotated[str | None, typer.Option(help="Logging level.")] = None,
) -> None:
    """Run the gateway alone, in front of the engines a config file names (real vLLM, Triton
    or simulators). Environment variables TIERGATE_* override the file."""
    from gateway.settings import ConfigError, load_settings
    from gateway.telemetry import setup_logging

    overrides = {
        k: v
        for k, v in {"host": host, "port": port, "log_level": log_level}.items()
        if v is not None
    }
    try:
        settings = load_settings(config, **overrides)
    except ConfigError as e:
        typer.echo(f"tiergate: invalid configuration: {e}", err=True)
        raise typer.Exit(2) from None
    setup_logging(settings.log_level, settings.log_json)
    run(settings)
