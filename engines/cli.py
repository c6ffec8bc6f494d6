"""The engines' commands: `tiergate sim` (the simulator, vLLM's or Triton's API) and
`tiergate hf` (transformers `generate` behind vLLM's API). Imports stay inside the commands so
that starting one does not load the other's dependencies."""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from engines.sim.profile import Profile, Speculative

# The model name of engines/triton/model_repository (the tutorial's v5 step).
TRITON_MODEL = "llama31-8b-awq"


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


class SimApi(StrEnum):
    VLLM = "vllm"
    TRITON = "triton"


def sim(
    profile: Annotated[
        str,
        typer.Option(
            help="Profile name (v0..v4, v4-low, v4-high, instant) or path to a profile YAML."
        ),
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
    prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            help="Automatic prefix caching, as vLLM's (on unless the profile turns it off).",
            show_default=False,
        ),
    ] = None,
    speedup: Annotated[
        float, typer.Option(help="Run the same scheduler N times faster than real time.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the speculative-acceptance RNG.")] = 0,
    acceptance: Annotated[
        str | None,
        typer.Option(
            help="Speculative acceptance, one probability per draft token, comma-separated "
            "(e.g. 0.5,0.4,0.3,0.2,0.1): replaces the profile's (which must speculate)."
        ),
    ] = None,
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
    api: Annotated[
        SimApi,
        typer.Option(
            help="The API to serve: vLLM's OpenAI server, or Triton with the vLLM backend "
            "(/v2 generate; --model is then the Triton model name, default llama31-8b-awq).",
        ),
    ] = SimApi.VLLM,
    metrics_port: Annotated[
        int | None, typer.Option(help="Triton: serve /metrics on this port only (Triton's 8002).")
    ] = None,
    scheduling_policy: Annotated[
        str | None,
        typer.Option(
            help="vLLM's --scheduling-policy: fcfs, or priority (waiting requests by their "
            "`priority` field, lower first). Default: the profile's (fcfs)."
        ),
    ] = None,
    grpc_port: Annotated[
        int | None, typer.Option(help="Triton: also serve Triton's gRPC API here (its 8001).")
    ] = None,
    startup_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="Wall-clock seconds before the port opens, as vLLM loads its weights before "
            "it listens: a new replica's start-up, for autoscaling.",
        ),
    ] = 0,
) -> None:
    """Run a simulated vLLM engine: vLLM's OpenAI API and metrics, with a real-time
    continuous-batching scheduler calibrated to the tutorial's tables (no GPU needed)."""
    import uvicorn

    from engines.sim.faults import Faults
    from engines.sim.profile import load_profile
    from engines.sim.server import SimConfig, create_app

    _logging(log_level)
    if scheduling_policy not in (None, "fcfs", "priority"):
        raise typer.BadParameter("fcfs or priority", param_hint="--scheduling-policy")
    prof = load_profile(profile).with_overrides(
        max_num_seqs=max_num_seqs,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
        scheduling_policy=scheduling_policy,
    )
    if acceptance is not None:
        prof = prof.with_overrides(speculative=_acceptance(prof, acceptance))
    faults = Faults(
        error_rate=fault_error_rate,
        slow_first_token_s=fault_slow_first_token,
        hang=fault_hang,
        crash_after=fault_crash_after,
    )
    if startup_s:  # after the arguments are checked: a mistake is told at once
        import time

        time.sleep(startup_s)
    if api is SimApi.TRITON:
        from engines.sim import triton

        # Triton has no bearer-token auth: --api-key (or VLLM_API_KEY) does not apply.
        names = list(model or [TRITON_MODEL])
        if len(names) != 1 or "/" in names[0]:
            raise typer.BadParameter("one Triton model name, without '/'", param_hint="--model")
        tcfg = SimConfig(prof, names, None, speedup, seed, faults)
        face: triton.GrpcFace | None = None
        if grpc_port is not None:
            from engines.sim.triton_grpc import serve_grpc

            at = (host, grpc_port)

            async def serve(front: triton.TritonFront) -> Any:
                return await serve_grpc(front, *at)

            face = serve
        triton.run(tcfg, host=host, port=port, metrics_port=metrics_port, log_level=log_level,
                   grpc=face)  # fmt: skip
        return
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


def _acceptance(prof: Profile, text: str) -> Speculative:
    """The profile's drafter with the --acceptance vector (exactly k probabilities, each 0..1)."""
    from pydantic import ValidationError

    spec = prof.speculative
    if spec is None:
        raise typer.BadParameter(
            f"profile {prof.name!r} does not use speculative decoding", param_hint="--acceptance"
        )
    k = spec.num_speculative_tokens
    try:
        values = [float(v) for v in text.split(",")]
        if len(values) != k:
            raise ValueError(f"{k} comma-separated probabilities needed, got {len(values)}")
        return spec.with_acceptance(values)
    except ValueError as e:
        msg = str(e.errors()[0]["msg"]) if isinstance(e, ValidationError) else str(e)
        msg = msg.removeprefix("Value error, ")
        raise typer.BadParameter(f"{text!r}: {msg}", param_hint="--acceptance") from None


def hf(
    model: Annotated[
        str | None,
        typer.Option(help="Checkpoint (Hugging Face id or path); omit with --random-weights."),
    ] = None,
    random_weights: Annotated[
        bool, typer.Option(help="Llama-2-7B's architecture with random weights (no download).")
    ] = False,
    attn: Annotated[
        str,
        typer.Option(help="Attention: eager (the tutorial's v0), sdpa or flash_attention_2 (v1)."),
    ] = "sdpa",
    served_model_name: Annotated[
        str, typer.Option(help="The model name clients send.")
    ] = "meta-llama/Llama-2-7b-chat-hf",
    device: Annotated[str, typer.Option(help="torch device.")] = "cuda",
    max_model_len: Annotated[int, typer.Option(min=2, help="Context length.")] = 4096,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "warning",
) -> None:
    """Run the tutorial's v0/v1: transformers `generate`, one request at a time, behind vLLM's
    OpenAI API and metric names (needs the `hf` extra: torch and transformers)."""
    if (model is None) == (not random_weights):
        raise typer.BadParameter("give --model or --random-weights (one of them)")
    import uvicorn

    from engines.hf.model import TransformersGenerator
    from engines.hf.server import HFConfig, create_app

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        typer.echo(f"tiergate hf: {e.name} is not installed: it needs the `hf` extra "
                   "(.venv/bin/uv sync --inexact --extra hf, or pip install 'tiergate[hf]')",
                   err=True)  # fmt: skip
        raise typer.Exit(2) from None
    gen = TransformersGenerator(model, attn=attn, device=device, max_model_len=max_model_len)
    app_ = create_app(HFConfig(gen, served_model_name, attn))
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False)
