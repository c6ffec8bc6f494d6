"""`tiergate bench`: the benchmarks, each a command that imports its module when it runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from gateway.routing import POLICY_NAMES

bench = typer.Typer(help="Benchmarks (each prints its measurements and their sample counts).")


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _known(names: list[str] | None, allowed: Sequence[str]) -> list[str] | None:
    """`names` if each is one of `allowed`; a usage error naming the others otherwise."""
    unknown = [n for n in names or () if n not in allowed]
    if unknown:
        choices = ", ".join(allowed)
        raise typer.BadParameter(f"unknown {', '.join(unknown)}; choose from {choices}")
    return names


def _policies(names: list[str] | None) -> list[str] | None:
    return _known(names, POLICY_NAMES)


def _peer_specs(specs: list[str] | None) -> list[str] | None:
    from loadtests.routing import peer_spec

    for spec in specs or ():
        try:
            peer_spec(spec)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return specs


PEERS_VENV_HELP = (
    "The peers' virtual environment (default: $TIERGATE_PEERS_VENV, else "
    "~/.cache/tiergate/peers-venv); created and filled on first use unless --no-install."
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
    out: Annotated[Path | None, typer.Option(help="Also write the cells as JSON here.")] = None,
    report: Annotated[
        Path | None, typer.Option(help="Also write the printed tables as markdown here.")
    ] = None,
) -> None:
    """Drive each simulator profile at the tutorial's concurrencies over HTTP and compare every
    cell with the table: target, measured, ratio."""
    from loadtests.calibrate import run

    _logging("warning")
    run(profiles or None, requests_per_user=requests_per_user, out=out, report=report)


def _deployments(values: list[str] | None) -> list[str] | None:
    from loadtests.deployments import DEPLOYMENTS

    return _known(values, tuple(DEPLOYMENTS))


def _slo_classes(values: list[str] | None) -> list[str] | None:
    from loadtests.deployments import SLO_CLASSES

    return _known(values, tuple(SLO_CLASSES))


@bench.command("routing")
def bench_routing(
    phase_seconds: Annotated[float, typer.Option(help="Seconds per phase of each shape.")] = 15,
    rounds: Annotated[int, typer.Option(help="Rounds (the policy order rotates each round).")] = 1,
    shape: Annotated[
        list[str] | None, typer.Option(help="Shapes to run: step, burst (default both).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            callback=_policies,
            help=f"Policies to compare (default all: {', '.join(POLICY_NAMES)}).",
        ),
    ] = None,
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            callback=_deployments,
            help="Deployments (loadtests/deployments.py): little, tutorial, a-lot, shift (the "
            "tutorial's A100 engines: EAGLE accepting little, as the tutorial, a lot, dropping "
            "halfway), knee-32, knee-48, knee-64, knee-96, eagle-worse, two-latency, "
            "unlike-pool (H200-like: EAGLE crossing AWQ at about that many streams, or never "
            "helping, two EAGLE instances, an AWQ and a bf16 instance in the pool). Repeat for "
            "several, each a report of its own (default: tutorial).",
        ),
    ] = None,
    slo_class: Annotated[
        list[str] | None,
        typer.Option(
            callback=_slo_classes,
            help="Run with every request in this SLO class: tight (TTFT <= 1 s, TPOT <= 4 ms), "
            "interactive (<= 12 ms) or standard (<= 25 ms); repeat for several. Default: "
            "--slo-ttft/--slo-tpot.",
        ),
    ] = None,
    oracle_limit: Annotated[
        list[int] | None,
        typer.Option(
            min=1,
            help="Also run golden-range with the latency tier capped at exactly this many "
            "streams (repeat to sweep: the best is the oracle the learned policy is judged by).",
        ),
    ] = None,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    slo_ttft: Annotated[float, typer.Option(help="TTFT SLO, seconds.")] = 1.0,
    slo_tpot: Annotated[float, typer.Option(help="TPOT SLO, seconds.")] = 0.025,
    out: Annotated[Path, typer.Option(help="Folder for routing*.md/.json/.png.")] = Path(
        "docs/results"
    ),
    peer: Annotated[
        list[str] | None,
        typer.Option(
            callback=_peer_specs,
            metavar="ROUTER:POLICY",
            help="Also run a peer router in front of the same engines (all of them as its "
            "workers: it knows no tiers), e.g. vllm-router:power_of_two, smg:cache_aware; repeat "
            "for several. The report is then routing-...-peers.*.",
        ),
    ] = None,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers",
            help="All four: vllm-router:power_of_two, vllm-router:cache_aware, smg:cache_aware, "
            "smg:power_of_two.",
        ),
    ] = False,
    peers_venv: Annotated[Path | None, typer.Option(help=PEERS_VENV_HELP)] = None,
    install: Annotated[
        bool, typer.Option(help="Install a missing peer router (--no-install: skip it).")
    ] = True,
) -> None:
    """Compare the routing policies on simulated deployments (EAGLE-3 latency instances and
    an AWQ pool, over HTTP): step and burst shapes, per phase TTFT/TPOT p50/p99, tok/s and
    goodput; the learned policy against golden-range and the oracle (best fixed limit), and
    optionally against peer routers (vLLM's router, SGLang's model gateway) and their
    policies."""
    from loadtests.deployments import SLO_CLASSES
    from loadtests.phases import Slo
    from loadtests.routing import PEER_POLICIES, POLICIES, run

    specs = tuple(dict.fromkeys([*(PEER_POLICIES if peers else ()), *(peer or ())]))
    _logging("warning")
    classes = {c: SLO_CLASSES[c] for c in slo_class or ()}
    combos = [(d, c, s) for d in deployment or ["tutorial"]
              for c, s in (classes or {"": Slo(slo_ttft, slo_tpot)}).items()]  # fmt: skip
    for dep, cls, slo in combos:
        # Only the default deployment and SLO write routing.*: a single other one must not
        # overwrite it.
        plain = dep == "tutorial" and not cls
        name = "routing" if plain else "-".join(x for x in ("routing", dep, cls) if x)
        name += "-peers" if specs else ""  # nor a run with peers
        run(
            shapes=tuple(shape or ("step", "burst")),
            policies=tuple(policy or POLICIES),
            phase_s=phase_seconds,
            rounds=rounds,
            speedup=speedup,
            slo=slo,
            out_dir=out,
            deployment=dep,
            oracle_limits=tuple(oracle_limit or ()),
            name=name,
            slo_class=cls,
            peers=specs,
            peers_venv=peers_venv,
            install=install,
        )


def _levels(text: str) -> str:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: comma-separated whole numbers") from None
    if not levels or min(levels) < 1:
        raise typer.BadParameter(f"{text!r}: concurrencies of 1 or more")
    return text


@bench.command("crossover")
def bench_crossover(
    latency: Annotated[
        str,
        typer.Option(
            "--latency",
            metavar="URL",
            help="The latency engine (EAGLE), e.g. "
            "http://gpu-a:8000: called directly, not through the gateway.",
        ),
    ],
    throughput: Annotated[
        str, typer.Option("--throughput", metavar="URL", help="The throughput engine (AWQ).")
    ],
    levels: Annotated[
        str, typer.Option(callback=_levels, help="Concurrencies, comma-separated.")
    ] = "1,2,4,8,16,24,32,48,64",
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt length (words).")] = 50,
    output_tokens: Annotated[
        int, typer.Option(min=2, help="max_tokens, with ignore_eos: every request's length.")
    ] = 256,
    seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Per level and engine: users keep sending for this long (each "
            "at least 2 requests, the first warm-up). Default 30.",
        ),
    ] = None,
    requests_per_user: Annotated[
        int | None,
        typer.Option(
            min=2, help="Instead of --seconds: this many requests per user, the first warm-up."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: each engine's first in /v1/models).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Bearer token for both engines (masked in the report).")
    ] = None,
    slo_tpot_ms: Annotated[
        list[float] | None,
        typer.Option(help="TPOT SLOs (ms) for the per-engine limits; repeat. Default 12 and 25."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for crossover.json, .md and .png.")
    ] = None,
    note: Annotated[
        str | None, typer.Option(help="A line for the report: what the engines are.")
    ] = None,
) -> None:
    """Each engine alone at increasing concurrency (closed loop, streamed completions): TTFT,
    TPOT, tok/s per level; where the latency engine stops being faster per token, and the
    golden-range limits that follow."""
    import sys

    from loadtests.crossover import DEFAULT_SECONDS, DEFAULT_SLO_TPOT_MS, Options, command_line, run

    if seconds is not None and requests_per_user is not None:
        raise typer.BadParameter("give --seconds or --requests-per-user, not both")
    _logging("warning")
    opts = Options(
        latency=latency, throughput=throughput,
        levels=tuple(sorted({int(x) for x in levels.split(",") if x.strip()})),
        prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        seconds=DEFAULT_SECONDS if seconds is None else seconds,
        requests_per_user=requests_per_user, model=model, api_key=api_key,
        slo_tpot_ms=tuple(slo_tpot_ms or DEFAULT_SLO_TPOT_MS), out=out, note=note,
        command=command_line(sys.argv[1:]),
    )  # fmt: skip
    try:
        run(opts)
    except (RuntimeError, OSError) as e:  # an engine that does not answer as asked
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@bench.command("overhead")
def bench_overhead(
    duration: Annotated[
        float, typer.Option(help="Seconds per target per round, for each latency/TTFT cell.")
    ] = 3.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced load at 64/256 conns.")
    ] = 400.0,
    wrk_seconds: Annotated[
        int, typer.Option(min=0, help="wrk run length per target per round (0 skips wrk).")
    ] = 5,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/overhead.json"),
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="REF",
            help="Git ref (commit, tag, HEAD~3) whose gateway runs side by side with the working "
            "tree's, as target gateway@<sha>; adds a gateway-vs-baseline section (CPU/request and "
            "added p50, criterion: no worse than 5% above).",
        ),
    ] = None,
) -> None:
    """The gateway's own cost: added latency, added TTFT and throughput of one gateway worker,
    against the same instant simulator called directly and through nginx (the floor), and
    optionally against the gateway of another commit."""
    from loadtests.overhead import Options, run

    _logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, wrk_seconds=wrk_seconds, out=out,
                baseline=baseline))  # fmt: skip


def _peer_targets(names: list[str] | None) -> list[str] | None:
    from loadtests.peers import TARGETS

    return _known(names, TARGETS)


def _without(argv: list[str], option: str) -> list[str]:
    """`argv` without `option` and its value: a folder of this machine says nothing in a report."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith(f"{option}="):
            skip = False
        elif arg == option:
            skip = True
        else:
            out.append(arg)
    return out


@bench.command("peers")
def bench_peers(
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    duration: Annotated[
        float, typer.Option(min=0.1, help="Seconds per latency cell per target per round.")
    ] = 3.0,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced load at 64 connections.")
    ] = 400.0,
    wrk_seconds: Annotated[
        int, typer.Option(min=0, help="Each wrk run (small, SSE) per target per round; 0 skips.")
    ] = 5,
    target: Annotated[
        list[str] | None,
        typer.Option(
            callback=_peer_targets,
            help="Targets to run; repeat for several (default all: direct, nginx, tiergate, "
            "tiergate-2w, vllm-router, smg, litellm). direct always runs: it is the reference.",
        ),
    ] = None,
    peers_venv: Annotated[Path | None, typer.Option(help=PEERS_VENV_HELP)] = None,
    install: Annotated[
        bool,
        typer.Option(
            help="Install missing peers (pip, into the peers' venv, one package at a time); "
            "--no-install skips them with a note instead."
        ),
    ] = True,
    peer_policy: Annotated[
        str,
        typer.Option(
            help="vllm-router's and smg's --policy (one worker: it only costs; round_robin "
            "costs least)."
        ),
    ] = "round_robin",
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/peers.json"),
) -> None:
    """tiergate against its peers as a proxy hop, in one run: vLLM's router (vllm-router),
    SGLang's model gateway (smg), LiteLLM's proxy, nginx (the floor) and tiergate with one
    worker and with --workers 2 (when `serve` has it), each in front of the same instant
    simulator, called also directly. Per target, the median of the rounds: added latency p50/p99
    at 1 and 64 connections, req/s at 64 connections (wrk), the proxy's CPU per request (all its
    processes, over the wrk run), SSE tokens/s, errors and sample counts; ratios against
    tiergate, and the goals (tiergate CPU/request <= 0.30 ms, added p50 at 1 connection <= 0.5
    ms, ahead of LiteLLM on every figure) as MET / NOT MET. The peers live in a virtual
    environment of their own, installed on first use; one that cannot be installed or started
    is left out with a note. Every process is stopped at the end, on failure and on Ctrl-C."""
    import sys

    from loadtests.crossover import command_line
    from loadtests.peerenv import PEERS
    from loadtests.peers import TARGETS, Options, run

    choices = PEERS["vllm-router"].policies
    if peer_policy not in choices:
        raise typer.BadParameter(f"{peer_policy}: choose from {', '.join(choices)}")
    _logging("warning")
    opts = Options(
        rounds=rounds, duration_s=duration, rate=rate, wrk_seconds=wrk_seconds,
        targets=tuple(target or TARGETS), venv=peers_venv, install=install,
        peer_policy=peer_policy, out=out,
        command=command_line(_without(sys.argv[1:], "--peers-venv")),
    )  # fmt: skip
    try:
        run(opts)
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None


def _affinity_arms(names: list[str] | None) -> list[str] | None:
    from loadtests.multiturn import ARMS

    return _known(names, ARMS)


@bench.command("tenants")
def bench_tenants(
    interactive_users: Annotated[
        int, typer.Option(min=1, help="Interactive users (closed loops, with a think time).")
    ] = 3,
    batch_users: Annotated[int, typer.Option(min=1, help="Batch users (closed loops).")] = 32,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of load per arm per round.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (the arms' order rotates).")] = 3,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/tenants.json"),
) -> None:
    """Two tenants on one deployment (a v4 latency tier, two v3 in the pool, priority
    scheduling on the engines): an interactive tenant at a steady low load beside a batch
    tenant flooding, with the gateway's priorities on and off, against the interactive tenant
    alone. Reports the interactive tenant's TTFT and TPOT p50/p99 and the batch tenant's
    throughput per arm, ratios against solo, and the goal: p99s within 1.2x of solo with
    priorities on."""
    from loadtests.tenantsbench import Options, run

    _logging("warning")
    run(Options(interactive_users=interactive_users, batch_users=batch_users, seconds=seconds,
                rounds=rounds, speedup=speedup, out=out))  # fmt: skip


@bench.command("affinity")
def bench_affinity(
    sims: Annotated[int, typer.Option(min=2, help="Throughput simulators (v3) in the pool.")] = 4,
    users: Annotated[int, typer.Option(min=1, help="Concurrent users (closed loops).")] = 16,
    turns: Annotated[int, typer.Option(min=2, help="Turns per conversation.")] = 6,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of load per arm per round.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (the arms' order rotates).")] = 3,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 4.0,
    system_words: Annotated[
        int, typer.Option(min=1, help="Words (= tokens) of the system prompt all share.")
    ] = 600,
    user_words: Annotated[int, typer.Option(min=1, help="Words per user message.")] = 24,
    reply_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of each reply.")] = 32,
    think: Annotated[float, typer.Option(min=0, help="Think time between turns, seconds.")] = 0.1,
    policy: Annotated[
        str,
        typer.Option(
            help="tiergate's policy in both its arms (least-loaded: the pool ordered by load, "
            f"ties at random; one of {', '.join(POLICY_NAMES)})."
        ),
    ] = "least-loaded",
    arm: Annotated[
        list[str] | None,
        typer.Option(
            callback=_affinity_arms,
            help="Arms to run; repeat for several (default all: tiergate, tiergate-affinity, "
            "vllm-router:cache_aware, smg:cache_aware).",
        ),
    ] = None,
    peers_venv: Annotated[Path | None, typer.Option(help=PEERS_VENV_HELP)] = None,
    install: Annotated[
        bool, typer.Option(help="Install a missing peer router (--no-install: skip it).")
    ] = True,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/affinity.json"),
) -> None:
    """Prefix-cache affinity on multi-turn chat: USERS closed-loop users hold conversations of
    TURNS streamed turns, each opening with one long system prompt shared by all and resending
    the whole history (so every turn's prompt extends the last). Per arm, fresh simulators with
    prefix caching on (SIMS x v3) behind one router: tiergate without and with
    policy.prefix_affinity, vLLM's router and SGLang's model gateway with --policy cache_aware
    (a peer that is not installed or does not start is left out with a note). Prints TTFT
    p50/p99, the engines' prefix-cache hit rate (and usage's cached_tokens/prompt_tokens),
    requests, errors, the most requests one engine held against affinity's bound, medians over
    rounds, ratios against tiergate without affinity, and the goals (affinity: a higher hit rate
    and a lower TTFT p50) as MET / NOT MET. Every process is stopped at the end, on failure and
    on Ctrl-C."""
    import sys

    from loadtests.crossover import command_line
    from loadtests.multiturn import ARMS, Options, run

    if policy not in POLICY_NAMES:
        raise typer.BadParameter(f"{policy}: choose from {', '.join(POLICY_NAMES)}")
    _logging("warning")
    opts = Options(
        sims=sims, users=users, turns=turns, seconds=seconds, rounds=rounds, speedup=speedup,
        system_words=system_words, user_words=user_words, reply_tokens=reply_tokens,
        think_s=think, policy=policy, arms=tuple(arm or ARMS), venv=peers_venv, install=install,
        out=out,
        command=command_line(_without(sys.argv[1:], "--peers-venv")),
    )  # fmt: skip
    try:
        run(opts)
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None


@bench.command("instructions")
def bench_instructions(
    baseline: Annotated[
        str, typer.Option("--baseline", metavar="REF", help="Git ref whose gateway is compared.")
    ] = "HEAD",
    requests: Annotated[
        int, typer.Option(min=1, help="Counted requests per kind and round.")
    ] = 400,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (a fresh process each).")] = 2,
    out: Annotated[Path, typer.Option(help="JSON results; the .md is written next to it.")] = Path(
        "docs/results/instructions.json"
    ),
) -> None:
    """The gateway's CPU per request as instructions counted by valgrind's callgrind (exact
    where timings drift), against the gateway of another commit: small requests and streams."""
    from loadtests.instructions import Options, run

    _logging("warning")
    run(Options(baseline=baseline, requests=requests, rounds=rounds, out=out))


@bench.command("triton")
def bench_triton(
    duration: Annotated[float, typer.Option(help="Seconds per target per round, per cell.")] = 3.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced small-request load.")
    ] = 300.0,
    stream_tokens: Annotated[int, typer.Option(min=1, help="Tokens per timed stream.")] = 128,
    out: Annotated[Path, typer.Option(help="JSON results; the .md is written next to it.")] = Path(
        "docs/results/triton.json"
    ),
) -> None:
    """What the Triton translation costs: the gateway in front of a Triton-API simulator vs the
    same gateway in front of the same engine behind vLLM's API, each against its direct target."""
    from loadtests.tritonbench import Options, run

    _logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, stream_tokens=stream_tokens,
                out=out))  # fmt: skip


def _scenarios(names: list[str] | None) -> list[str] | None:
    from loadtests.chaos import SCENARIO_NAMES

    return _known(names, SCENARIO_NAMES)


@bench.command("chaos")
def bench_chaos(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            callback=_scenarios,
            help="Scenario to run; repeat for several (default all, in this order): healthy "
            "(no fault: the TTFT reference), crash (SIGKILL of a throughput engine, restarted "
            "later on its port), freeze (SIGSTOP, later SIGCONT), stalled (hang fault: /health "
            "and /metrics still answer), errors-500 (500 on half its requests), wrong-key (an "
            "engine wanting an API key the gateway lacks), refusing-503 (503 on every request, "
            "/health 200), slow-first-token (5 s before every first token), gateway-restart (20 "
            "streams, SIGTERM to the gateway, a new one on its port), redis-loss (the gateway's "
            "Redis killed, restarted later), all-failing (every engine answers 500).",
        ),
    ] = None,
    seconds: Annotated[
        float,
        typer.Option(
            min=5,
            help="Seconds of load per scenario: the fault at 20%, cleared at 60%; longer while "
            "the faulty engine is not yet back in full rotation.",
        ),
    ] = 30.0,
    users: Annotated[
        int, typer.Option(min=1, help="Closed-loop streaming users (gateway-restart: 20).")
    ] = 48,
    out: Annotated[Path, typer.Option(help="Folder for chaos.md, chaos.json, chaos.png.")] = Path(
        "docs/results"
    ),
    logs: Annotated[
        Path | None,
        typer.Option(
            help="Keep every process's log here, a folder per scenario (default: a new "
            "temporary folder, printed at the end and kept)."
        ),
    ] = None,
) -> None:
    """Faults injected into a simulated deployment under streaming load: per
    scenario a fresh deployment (1 v4 latency + 2 v3 throughput simulators at speedup 4, one
    gateway at its default settings) and closed-loop users streaming completions of exactly
    1024 tokens. Prints per scenario: requests sent, OK (complete: all tokens, one id, a right
    usage, [DONE]), failed before the first byte, streams cut, streams continued, the longest
    silence within a stream, time to eject and to re-admit the faulty engine (from /state at
    20 Hz), TTFT p50/p99 while the fault lasts, upstream attempts per client request; then a
    MET / NOT MET line per reliability goal (README, Reliability) the run judges. Every process is
    stopped at the end, on failure and on Ctrl-C."""
    import sys

    from loadtests.chaos import SCENARIO_NAMES, Options, run
    from loadtests.crossover import command_line

    # The report shows the command without --logs: a folder on this machine says nothing there.
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--logs="):
            skip = False
        elif arg == "--logs":
            skip = True
        else:
            argv.append(arg)
    _logging("warning")
    try:
        run(Options(scenarios=tuple(scenario or SCENARIO_NAMES), seconds=seconds, users=users,
                    out=out, logs=logs, command=command_line(argv)))  # fmt: skip
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None


@bench.command("clients")
def bench_clients(
    requests: Annotated[int, typer.Option(min=1, help="Requests per library per round.")] = 3000,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent requests.")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (libraries alternating).")] = 3,
    out: Annotated[Path, typer.Option(help="Markdown summary.")] = Path("docs/results/clients.md"),
) -> None:
    """httpx against aiohttp as the upstream client: requests/s and client CPU per request, on
    the same small requests to an instant simulator (why the gateway uses aiohttp)."""
    from loadtests.clients import run

    _logging("warning")
    run(requests=requests, concurrency=concurrency, rounds=rounds, out=out)


@bench.command("tables")
def bench_tables(
    version: Annotated[
        list[str] | None, typer.Option(help="Versions to run (v0..v4; default all).")
    ] = None,
    v5: Annotated[bool, typer.Option(help="Also run the v5 cluster rows.")] = True,
    v5_instances: Annotated[
        list[int] | None, typer.Option(help="Cluster sizes for v5 (default 1, 3, 6).")
    ] = None,
    v5_seconds: Annotated[float, typer.Option(help="Seconds per v5 run.")] = 20.0,
    requests_per_user: Annotated[
        int | None, typer.Option(help="Closed-loop requests per user (first is warm-up).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for tables.md/.json and the plots.")] = Path(
        "docs/results"
    ),
) -> None:
    """Reproduce the tutorial's tables (v0..v4, and v5's cluster rows) through the gateway
    against the simulator profiles; report tutorial vs measured cell by cell, with plots."""
    from rich.console import Console

    from loadtests.tables import print_summary, run

    _logging("warning")
    console = Console()
    report = run(
        version or None,
        out_dir=out,
        v5=v5,
        v5_instances=tuple(v5_instances or (1, 3, 6)),
        v5_seconds=v5_seconds,
        requests_per_user=requests_per_user,
        console=console,
    )
    if report["v5"]:
        print_summary(report, console)


@bench.command("dashboards")
def bench_dashboards(
    out: Annotated[Path, typer.Option(help="Folder for the PNGs and their README.")] = Path(
        "docs/dashboards"
    ),
    seconds: Annotated[
        float, typer.Option(min=4, help="Length of the step load (four equal phases).")
    ] = 120.0,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    output_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 128,
    step: Annotated[float, typer.Option(help="query_range step, seconds.")] = 1.0,
    rate_interval: Annotated[
        str, typer.Option(help="What $__rate_interval stands for in the panel queries.")
    ] = "10s",
) -> None:
    """Render the Grafana dashboards to PNG without Grafana: a simulated deployment scraped by
    a real Prometheus (the deployed config and rules) under a step load with injected faults,
    every panel queried with query_range and plotted in the dashboard's grid."""
    from rich.console import Console

    from loadtests.dashboards import run

    _logging("warning")
    run(out, seconds=seconds, speedup=speedup, output_tokens=output_tokens, step=step,
        rate_interval=rate_interval, console=Console())  # fmt: skip
