"""`tiergate bench conversations`: do multi-turn chats come back to the instance that served
their first turn, with the gateway's defaults, one chat at a time and many at once?

The deployment, fresh for every arm of every round, is `tiergate up`'s: one v4 simulator (the
latency tier) and two v3 (the throughput pool), prefix caching on, at `--speedup` (1: real
time, as `tiergate up` runs them), behind one gateway with its defaults. Each chat: a long
system prompt shared by every chat, then `turns` user turns, each resending the history with the
answers so far (non-streamed `/v1/chat/completions`, as the OpenAI SDK sends them). First
`solo` chats one after another, then `crowd` chats at once. With `warm`, first that many one-off
chats at once, each with a system prompt of its own (nothing of them repeats): every instance is
then known to the gateway's latency model before the chats begin, as after a mix of traffic,
where otherwise the solo chats (which stay where they began) leave the pool unseen.

Arms: `tiergate` (the defaults: prefix affinity on) and `no-affinity`
(`policy.prefix_affinity: false`: the policy alone). Per arm and phase: the later turns served
by the instance of their chat's first turn, the instances the first turns used, and the share
of the later turns' prompt tokens the engines found cached (usage's
`prompt_tokens_details.cached_tokens`); and, as the engines saw the phase, the requests they
finished, those within the gateway's TPOT SLO by their own per-request TPOT histograms, and
the phase's seconds (whether turns that moved served worse or better). The goal:
>= 95% of later turns at home in both phases with the defaults, the crowd on more than one
instance.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gateway.routing import Stay
from loadtests.common.options import setup_logging
from loadtests.common.report import (
    JsonReport,
    OutputPaths,
    bars,
    finish_markdown,
    print_tables,
    revision,
    run_header,
    save,
)
from loadtests.common.stats import json_safe, median, rotation
from loadtests.harness.stack import MODEL, start_stack

__all__ = ["ARMS", "Chat", "Options", "converse", "run", "tally"]

DEFAULTS, OFF = "tiergate", "no-affinity"
ARMS = (DEFAULTS, OFF)
PHASES = ("solo", "crowd")
GOAL = 0.95  # of later turns at home, with the defaults
SYSTEM = " ".join(f"rule-{i} of the assistant" for i in range(80))  # ~320 words
# The engines' own per-request TPOT histogram (vLLM's name, which the simulator exports too).
TPOT = "vllm:request_time_per_output_token_seconds"


@dataclass
class Options(OutputPaths):
    solo: int = 12
    crowd: int = 32
    warm: int = 0  # one-off chats at once before the phases (0: none)
    turns: int = 3
    max_tokens: int = 24
    rounds: int = 3
    speedup: float = 1.0
    out: Path = Path("docs/results/conversations/conversations.json")
    chart: bool = True
    command: str = ""


@dataclass
class Chat:
    backends: list[str] = field(default_factory=list)  # per turn, x-tiergate-backend
    cached: list[int] = field(default_factory=list)  # per turn, usage's cached tokens
    prompt: list[int] = field(default_factory=list)  # per turn, usage's prompt tokens

    @property
    def at_home(self) -> int:
        return sum(b == self.backends[0] for b in self.backends[1:])


async def converse(session: aiohttp.ClientSession, url: str, name: str, opts: Options,
                   system: str = SYSTEM) -> Chat:  # fmt: skip
    """One chat of `opts.turns` turns, each resending the history."""
    chat = Chat()
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn in range(opts.turns):
        messages.append({"role": "user", "content": f"{name} asks question {turn} " * 6})
        body = {"model": MODEL, "messages": messages, "max_tokens": opts.max_tokens}
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            reply = await resp.json()
            chat.backends.append(resp.headers["x-tiergate-backend"])
        usage = reply.get("usage") or {}
        chat.prompt.append(usage.get("prompt_tokens", 0))
        chat.cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    return chat


def measure(chats: Sequence[Chat]) -> dict[str, Any]:
    """A phase's figures: later turns at home, instances of the first turns, cached share."""
    later = sum(len(c.backends) - 1 for c in chats)
    home = sum(c.at_home for c in chats)
    prompt = sum(sum(c.prompt[1:]) for c in chats)
    # First turns per instance, most first: where the chats began.
    firsts = sorted(Counter(c.backends[0] for c in chats).values(), reverse=True)
    return {
        "later_turns": later,
        "at_home": home,
        "share": home / later if later else float("nan"),
        "instances": len(firsts),
        "first_turns": firsts,
        "cached_share": sum(sum(c.cached[1:]) for c in chats) / prompt if prompt else float("nan"),
    }


def tally(text: str, slo_s: float) -> tuple[float, float, float]:
    """From an engine's metrics page: (requests it finished, those whose TPOT was within
    `slo_s`, the sum of their TPOTs) so far, by its own per-request TPOT histogram. Within:
    the count at the largest bucket bound not above `slo_s` (exact where a bound is the SLO,
    as 0.025 is for the default 25 ms; a lower bound otherwise)."""
    served = total = 0.0
    below: dict[float, float] = {}  # bucket bound -> count, summed over the engine's models
    for family in text_string_to_metric_families(text):
        if family.name != TPOT:
            continue
        for sample in family.samples:
            if sample.name.endswith("_count"):
                served += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                if bound <= slo_s:
                    below[bound] = below.get(bound, 0.0) + sample.value
    return served, below[max(below)] if below else 0.0, total


async def _tallies(session: aiohttp.ClientSession, engines: Sequence[str], slo_s: float
                   ) -> list[tuple[float, float, float]]:  # fmt: skip
    out = []
    for url in engines:
        async with session.get(f"{url}/metrics") as resp:
            out.append(tally(await resp.text(), slo_s))
    return out


async def _outcomes(session: aiohttp.ClientSession, gateway: str) -> Counter[tuple[str, str]]:
    """The gateway's count of what prefix affinity did, by (outcome, the tier each request was
    sent to first), from its /metrics."""
    async with session.get(f"{gateway}/metrics") as resp:
        text = await resp.text()
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "tiergate_affinity_decisions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["outcome"], sample.labels["tier"]] += int(sample.value)
    return out


def by_outcome(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    """`_outcomes`' counts summed over the tiers."""
    out: Counter[str] = Counter()
    for (outcome, _), n in counts.items():
        out[outcome] += n
    return dict(out)


def moves(counts: Counter[tuple[str, str]]) -> dict[str, int]:
    """`_outcomes`' counts of the requests sent elsewhere than their home or their session's
    backend, by check and by the tier they went to ("give_way -> latency")."""
    stayed = (Stay.HOME.value, Stay.SESSION.value)
    return {f"{outcome} -> {tier}": n for (outcome, tier), n in sorted(counts.items())
            if outcome not in stayed}  # fmt: skip


async def _phase(session: aiohttp.ClientSession, gateway: str, engines: Sequence[str],
                 slo_s: float, chats: Awaitable[Sequence[Chat]]) -> dict[str, Any]:  # fmt: skip
    """`chats` (the phase, awaited here) measured, with what the engines saw of it: the
    requests each finished meanwhile, those within the gateway's default TPOT SLO (every
    request here has it), their mean TPOT, and the phase's seconds (whether turns that left
    their first turn's instance served the phase worse or better); and what the gateway's
    prefix affinity did meanwhile with the requests that had a home (which check sent a turn
    elsewhere)."""
    before, stays = await _tallies(session, engines, slo_s), await _outcomes(session, gateway)
    started = time.perf_counter()
    done = await chats
    seconds = time.perf_counter() - started
    after = await _tallies(session, engines, slo_s)
    outcomes = await _outcomes(session, gateway) - stays
    diffs = [(s1 - s0, w1 - w0, t1 - t0)
             for (s0, w0, t0), (s1, w1, t1) in zip(before, after, strict=True)]  # fmt: skip
    return measure(done) | {
        "seconds": seconds,
        "engines": [{"served": n, "within_slo": w, "mean_tpot_ms": 1000 * t / n if n else None}
                    for n, w, t in diffs],
        "served": sum(n for n, _, _ in diffs),
        "within_slo": sum(w for _, w, _ in diffs),
        "affinity": by_outcome(outcomes),
        "moves": moves(outcomes),
    }  # fmt: skip


async def _phases(url: str, engines: Sequence[str], opts: Options) -> dict[str, dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=120)
    if opts.warm:  # (on connections of their own, closed before the chats' are opened: one
        # left idle past the server's keep-alive and then reused may be reset under a request)
        one_off = replace(opts, turns=1)  # each with a system prompt no other request shares
        async with aiohttp.ClientSession(timeout=timeout) as warm:
            await asyncio.gather(*(converse(warm, url, f"warm-{i}", one_off,
                                            f"warm-up {i}: {SYSTEM}")
                                   for i in range(opts.warm)))  # fmt: skip
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(f"{url}/state") as resp:
            slo_s = (await resp.json())["slo_tpot_ms"] / 1000

        async def solo() -> list[Chat]:
            return [await converse(session, url, f"solo-{i}", opts) for i in range(opts.solo)]

        async def crowd() -> list[Chat]:
            return await asyncio.gather(*(converse(session, url, f"crowd-{i}", opts)
                                          for i in range(opts.crowd)))  # fmt: skip

        return {"solo": await _phase(session, url, engines, slo_s, solo()),
                "crowd": await _phase(session, url, engines, slo_s, crowd())}  # fmt: skip


def one(arm: str, opts: Options, workdir: Path) -> dict[str, dict[str, Any]]:
    """Both phases on a fresh deployment."""
    # The gateway's own monitor intervals (the test stacks scrape faster).
    settings: dict[str, Any] = {"monitor": {"scrape_interval_s": 0.25, "probe_interval_s": 2.0}}
    if arm == OFF:
        settings["policy"] = {"prefix_affinity": False}
    stack = start_stack(workdir, speedup=opts.speedup, latency=1, throughput=2,
                        latency_args=("--prefix-caching",),
                        throughput_args=("--prefix-caching",), **settings)  # fmt: skip
    try:
        return asyncio.run(_phases(stack.gateway.url, [e.url for e in stack.sims], opts))
    finally:
        stack.stop()


def summarize(runs: dict[str, list[dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Per arm and phase: counts summed over rounds, the share's median and each round's."""
    out: dict[str, Any] = {}
    for arm, rounds in runs.items():
        for phase in PHASES:
            cells = [r[phase] for r in rounds]
            out.setdefault(arm, {})[phase] = {
                "at_home": sum(c["at_home"] for c in cells),
                "later_turns": sum(c["later_turns"] for c in cells),
                "share_median": median([c["share"] for c in cells]),
                "share_rounds": [c["share"] for c in cells],
                "worst_share": min(c["share"] for c in cells),
                "instances_rounds": [c["instances"] for c in cells],
                "first_turns_rounds": [c["first_turns"] for c in cells],
                "cached_share_median": median([c["cached_share"] for c in cells]),
                "within_slo_rounds": [c["within_slo"] for c in cells],
                "served_rounds": [c["served"] for c in cells],
                "seconds_rounds": [c["seconds"] for c in cells],
                "affinity": dict(sum((Counter(c["affinity"]) for c in cells), Counter())),
                "moves": dict(sum((Counter(c["moves"]) for c in cells), Counter())),
            }
    return out


def verdicts(arms: dict[str, Any]) -> list[dict[str, str]]:
    """The goal per phase, with the defaults: met only if every round met it."""
    out = []
    for phase in PHASES:
        f = arms[DEFAULTS][phase]
        rounds = " / ".join(f"{s:.3f}" for s in f["share_rounds"])
        out.append({"goal": f"{phase}: >= {GOAL:.0%} of later turns at home in every round",
                    "measured": f"{f['at_home']}/{f['later_turns']}, per round {rounds}",
                    "result": "MET" if f["worst_share"] >= GOAL else "NOT MET"})  # fmt: skip
    spread = arms[DEFAULTS]["crowd"]["instances_rounds"]
    out.append({"goal": "crowd: first turns on more than one instance in every round",
                "measured": "instances per round " + " / ".join(map(str, spread)),
                "result": "MET" if min(spread) > 1 else "NOT MET"})  # fmt: skip
    return out


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    """Every arm on fresh engines, rounds in rotating order; print the tables and write JSON,
    markdown and PNG."""
    console = console or Console()
    command = opts.command or shlex.join(["tiergate", *sys.argv[1:]])
    rev = revision(("gateway", "engines", "loadtests"))
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {a: [] for a in ARMS}
    with (
        tempfile.TemporaryDirectory(prefix="tiergate-conversations-") as tmp,
        bars(console) as progress,
    ):
        task = progress.add_task("arms", total=len(ARMS) * opts.rounds)
        for r in range(opts.rounds):
            for arm in rotation(list(ARMS), r):
                progress.update(task, description=f"round {r + 1}/{opts.rounds}: {arm}")
                workdir = Path(tmp) / f"{arm}-r{r}"
                workdir.mkdir()
                runs[arm].append(one(arm, opts, workdir))
                progress.advance(task)
    arms = summarize(runs)
    report: dict[str, Any] = json_safe({
        **run_header(command, asdict(opts), ("command", "chart")), "revision": rev,
        "arms": arms, "verdicts": verdicts(arms), "notes": [],
    })  # fmt: skip
    print_tables(tables(report), console, ("arm", "phase", "goal", "measured"))
    save(JsonReport(report), opts, console, chart, markdown)
    return report


# --- output -----------------------------------------------------------------------------------


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    arms = report["arms"]
    goals = [[v["goal"], v["measured"], v["result"]] for v in report["verdicts"]]
    head = ["arm", "phase", "later turns at home", "share (median of rounds)",
            "cached share of later prompts", "first turns per instance, per round",
            "samples"]  # fmt: skip
    rows = [[a, p, f"{f['at_home']}/{f['later_turns']}", _share(f["share_median"]),
             _share(f["cached_share_median"]),
             " / ".join("+".join(map(str, r)) for r in f["first_turns_rounds"]),
             str(f["later_turns"])]
            for a, by in arms.items() for p, f in by.items()]  # fmt: skip
    ratios = [[p, f"{arms[DEFAULTS][p]['share_median'] / arms[OFF][p]['share_median']:.2f}x"
               if arms[OFF][p]["share_median"] else "-"] for p in PHASES]  # fmt: skip
    per_round = [[a, p, " / ".join(_share(s) for s in f["share_rounds"])]
                 for a, by in arms.items() for p, f in by.items()]  # fmt: skip
    engines = [[a, p, " / ".join(_share(s) for s in f["share_rounds"]),
                " / ".join(f"{w:.0f}/{n:.0f}" for w, n in zip(f["within_slo_rounds"],
                                                           f["served_rounds"], strict=True)),
                " / ".join(f"{x:.2f}" for x in f["seconds_rounds"])]
               for a, by in arms.items() for p, f in by.items()]  # fmt: skip
    seen = {k for by in arms.values() for f in by.values() for k in f["affinity"]}
    # Every outcome any arm had, in Stay's order (home and session first).
    outcomes = [o.value for o in Stay if o.value in seen]
    stays = [[a, p, *(str(f["affinity"].get(o, 0)) for o in outcomes)]
             for a, by in arms.items() for p, f in by.items()]  # fmt: skip
    went = sorted({k for by in arms.values() for f in by.values() for k in f["moves"]})
    where = [[a, p, *(str(f["moves"].get(k, 0)) for k in went)]
             for a, by in arms.items() for p, f in by.items()]  # fmt: skip
    return [
        ("Goals", ["goal", "measured", "verdict"], goals),
        ("Later turns on their first turn's instance (rounds pooled)", head, rows),
        (f"Share at home, {DEFAULTS} / {OFF}", ["phase", "ratio"], ratios),
        ("Each round's share at home", ["arm", "phase", "per round"], per_round),
        ("Each round as the engines saw it",
         ["arm", "phase", "share at home", "requests within the TPOT SLO / finished",
          "seconds"], engines),
        *([("What prefix affinity did with the requests that had a home (rounds pooled)",
            ["arm", "phase", *outcomes], stays)] if outcomes else []),
        *([("The requests sent elsewhere than their home: by check, and the tier they went to",
            ["arm", "phase", *went], where)] if went else []),
    ]  # fmt: skip


def markdown(saved: JsonReport, chart_file: Path | None) -> str:
    report = saved.data
    s, rev = report["settings"], report["revision"]
    changed = ", ".join(rev["modified"])
    modified = f" with uncommitted changes to {changed}" if changed else ""
    parts = [
        "# Conversations: later turns on their first turn's instance",
        "",
        f"- Command: `{report['command']}`",
        f"- Date: {report['date']}. Code: commit {rev['commit']}{modified}.",
        f"- Machine: `nproc` = {report['nproc']} ({report['machine']}); the client, the "
        "simulators and the gateway share these CPUs.",
        "- Deployment, fresh for every arm of every round, as `tiergate up` starts it: one `v4` "
        f"simulator (latency tier) and two `v3` (pool), `--prefix-caching --speedup "
        f"{s['speedup']:g}`, behind one gateway with its defaults.",
        f"- Chats: a ~320-word system prompt shared by all, {s['turns']} user turns each "
        f"resending the history, replies of up to {s['max_tokens']} tokens, non-streamed "
        f"`/v1/chat/completions`. `solo`: {s['solo']} chats one after another; `crowd`: then "
        f"{s['crowd']} at once. {s['rounds']} rounds, the arms' order rotating."
        + (f" Before them, {s['warm']} one-off chats at once, each with a system prompt of its "
           "own (`--warm`)." if s.get("warm") else ""),
        f"- Arms: `{DEFAULTS}` (the gateway's defaults: prefix affinity on), `{OFF}` "
        "(`policy.prefix_affinity: false`).",
        "- As the engines saw each phase: the requests they finished meanwhile and those whose "
        "TPOT was within the gateway's default TPOT SLO, by each engine's own per-request TPOT "
        f"histogram (`{TPOT}`), and the phase's seconds: whether turns that left their first "
        "turn's instance served the phase worse or better.",
        "- What prefix affinity did: the gateway's `tiergate_affinity_decisions_total` over each "
        "phase, for every request that had a home (the instance that served its chat's last "
        "turn): `home` where it went back there, else the check that sent it elsewhere "
        "(docs/routing.md), and for the others the tier they went to first. A turn that moved "
        "makes the instance it went to the next turn's home.",
    ]
    chart = None if chart_file is None else (chart_file, "share of later turns at home")
    return finish_markdown(parts, report["notes"], tables(report), chart)


def chart(saved: JsonReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = saved.data["arms"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.35
    for i, arm in enumerate(arms):
        xs = [j + (i - 0.5) * width for j in range(len(PHASES))]
        ax.bar(xs, [arms[arm][p]["share_median"] for p in PHASES], width, label=arm)
        for x, p in zip(xs, PHASES, strict=True):  # each round, as dots
            rounds = arms[arm][p]["share_rounds"]
            ax.plot([x] * len(rounds), rounds, "k.", ms=4)
    ax.axhline(GOAL, color="k", ls="--", lw=1, label=f"goal {GOAL:.0%}")
    ax.set_xticks(range(len(PHASES)), PHASES)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("later turns on the first turn's instance")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"conversations (speedup {saved.data['settings']['speedup']:g}, "
                 f"{saved.data['date']})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ------------------------------------------------------------------------------


def command(
    solo: Annotated[int, typer.Option(min=1, help="Chats one after another.")] = 12,
    crowd: Annotated[int, typer.Option(min=2, help="Chats at once, after them.")] = 32,
    warm: Annotated[int, typer.Option(
        min=0, help="One-off chats sent at once before them, each with a system prompt of its "
        "own: every instance known to the gateway's latency model when the chats begin, as "
        "after a mix of traffic (0: none).")] = 0,
    turns: Annotated[int, typer.Option(min=2, help="User turns per chat.")] = 3,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (the arms' order rotates).")] = 3,
    speedup: Annotated[
        float, typer.Option(help="Run the engines N times faster (1: as `tiergate up`).")
    ] = 1.0,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/conversations/conversations.json"),
) -> None:
    """Multi-turn chats through `tiergate up`'s deployment: the share of later turns served by
    the instance of their chat's first turn (where its prefix cache holds the history), one
    chat at a time and many at once, with the gateway's defaults and with prefix affinity off.
    Goal: >= 95% in both phases with the defaults, the crowd on more than one instance."""
    setup_logging("warning")
    run(Options(solo=solo, crowd=crowd, warm=warm, turns=turns, rounds=rounds, speedup=speedup,
                out=out))
