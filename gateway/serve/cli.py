"""The gateway's own command, `tiergate serve`, and the foreground runner it shares with
`tiergate up` (the `tiergate` command itself is composed in the tiergate package)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from gateway.config.settings import Settings


def run(settings: Settings, banner: Callable[[], None] | None = None) -> None:
    """Run the gateway in the foreground; call `banner` once it answers /ready. SIGTERM and
    SIGINT drain it (gateway.serve.server), and it returns once drained. With `settings.workers`
    above 1, as that many processes on the one port (gateway.serve.workers)."""
    if settings.workers > 1:
        from gateway.serve.workers import supervise

        def ready(port: int) -> None:
            _wait_ready(port)
            if banner is not None:
                banner()

        if supervise(settings, ready if banner is not None else None):
            raise typer.Exit(1)
        return

    import asyncio

    import uvloop

    from gateway.serve.app import create_app
    from gateway.serve.server import build_server, run_server

    server = build_server(settings, create_app(settings))

    async def announce() -> None:
        await asyncio.to_thread(_wait_ready, settings.port)
        if banner is not None:
            banner()

    async def main() -> None:
        server.listen()
        await run_server(server, started=announce if banner is not None else None)

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
    workers: Annotated[
        int | None,
        typer.Option(
            help="Gateway processes serving the port, sharing their in-flight counts "
            "(TIERGATE_WORKERS; default 1)."
        ),
    ] = None,
) -> None:
    """Run the gateway alone, in front of the engines a config file names (real vLLM, Triton
    or simulators). Environment variables TIERGATE_* override the file."""
    from gateway.config.settings import ConfigError, load_settings
    from gateway.observe.telemetry import setup_logging

    overrides: dict[str, Any] = {
        k: v
        for k, v in {"host": host, "port": port, "log_level": log_level, "workers": workers}.items()
        if v is not None
    }
    try:
        settings = load_settings(config, **overrides)
    except ConfigError as e:
        typer.echo(f"tiergate: invalid configuration: {e}", err=True)
        raise typer.Exit(2) from None
    setup_logging(settings.log_level, settings.log_json)
    run(settings)


keys = typer.Typer(help="API keys of named tenants.", no_args_is_help=True)


@keys.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="The tenant's name (in metrics and logs).")],
    priority: Annotated[
        str, typer.Option(help="interactive, standard or batch (or a number: higher first).")
    ] = "standard",
    requests_per_minute: Annotated[
        int | None, typer.Option(min=1, help="Requests in any 60 s window.")
    ] = None,
    tokens_per_minute: Annotated[
        int | None, typer.Option(min=1, help="Prompt + completion tokens per minute.")
    ] = None,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="Requests in flight.")] = None,
) -> None:
    """Make a new random key and print it once, with the tenant entry for the config, which
    holds only the key's SHA-256."""
    import yaml
    from pydantic import ValidationError

    from gateway.config.settings import TenantConfig
    from gateway.pipeline.tenants import hash_key, new_key

    key = new_key()
    limits = {k: v for k, v in (("requests_per_minute", requests_per_minute),
              ("tokens_per_minute", tokens_per_minute), ("max_concurrent", max_concurrent))
              if v is not None}  # fmt: skip
    try:
        rank: str | int = int(priority)
    except ValueError:
        rank = priority
    try:
        tenant = TenantConfig(name=name, key_sha256=hash_key(key), priority=rank, limits=limits)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"][:1])
        raise typer.BadParameter(f"{where}: {first['msg']}") from None
    entry = tenant.model_dump(mode="json", exclude_defaults=True)
    entry["key_sha256"] = tenant.key_sha256
    typer.echo(f"# key (shown once; give it to the tenant): {key}")
    typer.echo("# under `tenants:` in the config or the tenants file:")
    typer.echo(yaml.safe_dump([entry], sort_keys=False).rstrip())


@keys.command("hash")
def keys_hash(
    key: Annotated[str, typer.Argument(help="An existing key, e.g. sk-...")],
) -> None:
    """Print a key's SHA-256: the `key_sha256` of its tenant entry."""
    from gateway.pipeline.tenants import hash_key

    typer.echo(hash_key(key))
