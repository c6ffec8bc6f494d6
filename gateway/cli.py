"""The `tiergate` command line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="tiergate: an OpenAI-compatible gateway that puts each request on the LLM serving tier "
    "that answers it best right now.",
    no_args_is_help=True,
    add_completion=False,
)
bench = typer.Typer(help="Benchmarks (each prints its measurements and their sample counts).")
app.add_typer(bench, name="bench")


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@app.command()
def sim(
    profile: Annotated[
        str, typer.Option(help="Profile name (v0..v4, instant) or path to a profile YAML.")
    ] = "v3",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8201,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    model: Annotated[
        list[str] | None,
        typer.Option(help="Served model name (repeat for aliases). Default: the profile's."),
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Override the profile's running-batch limit.")
    ] = None,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="Override the KV-cache capacity, in blocks of 16 tokens.")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Override the context length.")] = None,
    speedup: Annotated[
        float, typer.Option(help="Run the same scheduler N times faster than real time.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the speculative-acceptance RNG.")] = 0,
    api_key: Annotated[
        str | None, typer.Option(envvar="VLLM_API_KEY", help="Require this bearer token on /v1.")
    ] = None,
    fault_error_rate: Annotated[
        float, typer.Option(help="Share of requests failing with 500.")
    ] = 0,
    fault_slow_first_token: Annotated[
        float, typer.Option(help="Extra seconds before every first token.")
    ] = 0,
    fault_hang: Annotated[bool, typer.Option(help="Accept requests but never answer.")] = False,
    fault_crash_after: Annotated[
        int | None, typer.Option(help="Exit the process after this many requests.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "warning",
) -> None:
    """Run a simulated vLLM engine: vLLM's OpenAI API and metrics, with a real-time
    continuous-batching scheduler calibrated to the tutorial's tables (no GPU needed)."""
    import uvicorn

    from engines.sim.faults import Faults
    from engines.sim.profile import load_profile
    from engines.sim.server import SimConfig, create_app

    _logging(log_level)
    prof = load_profile(profile).with_overrides(
        max_num_seqs=max_num_seqs, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len
    )
    faults = Faults(
        error_rate=fault_error_rate,
        slow_first_token_s=fault_slow_first_token,
        hang=fault_hang,
        crash_after=fault_crash_after,
    )
    cfg = SimConfig(prof, list(model or []), api_key, speedup, seed, faults)
    uvicorn.run(
        create_app(cfg),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=1,
    )


@bench.command("calibrate")
def bench_calibrate(
    profiles: Annotated[
        list[str] | None, typer.Option("--profile", help="Profiles to run (default: all).")
    ] = None,
    requests_per_user: Annotated[
        int | None,
        typer.Option(
            help="Closed-loop requests per user, the first being warm-up (default: targets.yaml)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the table as JSON here.")] = None,
) -> None:
    """Drive each simulator profile at the tutorial's concurrencies over HTTP and compare every
    cell with the table: target, measured, ratio."""
    from loadtests.calibrate import run

    _logging("warning")
    run(profiles or None, requests_per_user=requests_per_user, out=out)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
