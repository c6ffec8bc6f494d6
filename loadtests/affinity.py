"""`tiergate bench affinity`: multi-turn chat with a shared system prompt, routed with and
without prefix-cache affinity, and by the peers' cache-aware policies.

The scenario: `users` concurrent users, each holding conversations of `turns` turns on
`/v1/chat/completions` (streamed, with `stream_options.include_usage`). Every conversation opens
with the same long system prompt (the simulator counts one token per word) and a first user
message of its own; each later turn sends the whole history (system, user messages, the
assistant's replies as returned, the new user message), so each turn's prompt extends the
previous one. Each user is a closed loop with a short think time; a new conversation starts as
the previous one ends, until the arm's time is up.

The deployment, fresh for every arm of every round (no arm's prefix cache helps the next): `sims`
v3 throughput simulators with prefix caching on, and one router in front of them: tiergate with
its defaults (prefix affinity on), tiergate with `policy.prefix_affinity: false`, vLLM's router
and SGLang's model gateway with `--policy cache_aware`. The arms' order rotates each round.

Each arm's load runs `warmup_s` before its measured `seconds`: a router that spreads the first
conversations over the pool has each engine prefill the shared system prompt once, a miss that a
router holding every conversation on one engine pays once in all. Those first misses are part of
a cold start, not of what a router does on a deployment that has run for a while; both are
reported: the hit rate over the measured window (the steady state) and from cold. And the
share cached at a common mix of turns: each turn's own share, weighed alike for every arm (a
router that serves faster has its users further into their conversations within the window,
where each turn resends more history, so the window's hit rate differs with the speed alone).

Per arm: TTFT p50/p99 (first content chunk), the engines' prefix-cache hit rate (hits/queries
from `vllm:prefix_cache_*_total` summed over the pool, the delta over the measured window, and
from cold) and, as a cross-check, usage's `cached_tokens / prompt_tokens`, requests and errors
(those started in the measured window), the most requests any one simulator generated at once
(`GET /sim/concurrency`, warm-up included), against the affinity bound; each the median of the
rounds, with ratios against tiergate without affinity, and the goals: tiergate's defaults at
least as good as the better peer on hit rate (steady and from cold), TTFT p50 and p99, with no
engine holding more than affinity's bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import shlex
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
import yaml
from rich.console import Console
from rich.progress import Progress

from gateway.routing import DEFAULT_POLICY, POLICY_NAMES, PolicyParams
from loadtests.common.options import PEERS_VENV_HELP, known, setup_logging, without
from loadtests.common.report import (
    JsonReport,
    OutputPaths,
    bars,
    finish_markdown,
    print_tables,
    run_header,
    save,
)
from loadtests.common.stats import json_safe, median, percentile, rotation
from loadtests.harness.peerenv import PEERS, Installed, PeerProcess, default_venv, ensure, scrub
from loadtests.harness.procs import GatewayProcess, SimProcess, start_all
from loadtests.harness.stack import MODEL

BASE = "tiergate-no-affinity"
AFFINITY = "tiergate"  # its defaults
PEER_ARMS = ("vllm-router:cache_aware", "smg:cache_aware")
ARMS = (BASE, AFFINITY, *PEER_ARMS)
PROFILE = "v3"

DESCRIPTIONS = {
    BASE: "`tiergate serve`, `policy.prefix_affinity: false`",
    AFFINITY: "`tiergate serve` with its defaults (`policy.prefix_affinity: true`)",
    "vllm-router:cache_aware": "vLLM's router (`vllm-router --policy cache_aware`)",
    "smg:cache_aware": "SGLang's model gateway (`smg launch --policy cache_aware`)",
}

# Words the prompts are made of (the simulator counts one token per word).
_WORDS = (
    "request", "router", "engine", "cache", "block", "prefix", "token", "batch", "queue",
    "latency", "stream", "reply", "policy", "session", "tier", "model", "answer", "prompt",
    "user", "system", "memory", "turn", "history", "context", "window", "reuse", "hit", "miss",
    "budget", "schedule", "decode", "prefill", "kernel", "weight", "layer", "head", "vector",
)  # fmt: skip


@dataclass(frozen=True)
class Options(OutputPaths):
    sims: int = 4
    users: int = 16
    turns: int = 6
    seconds: float = 20.0  # measured, per arm per round
    warmup_s: float = 5.0  # of load before it, per arm per round
    rounds: int = 3
    speedup: float = 4.0
    system_words: int = 600
    user_words: int = 24
    reply_tokens: int = 32
    think_s: float = 0.1
    policy: str = DEFAULT_POLICY  # tiergate's, in both of its arms
    arms: tuple[str, ...] = ARMS
    venv: Path | None = None  # default: peerenv.default_venv()
    install: bool = True
    out: Path = Path("docs/results/affinity.json")
    chart: bool = True
    command: str | None = None

    def bound(self) -> float:
        """The most requests affinity lets a keyed backend hold with every user in flight."""
        p = PolicyParams()
        return (1 + p.affinity_balance) * self.users / self.sims + p.affinity_slack


# --- the scenario -----------------------------------------------------------------------------


def system_prompt(words: int) -> str:
    rng = random.Random(0)
    return "You are a helpful assistant. " + " ".join(rng.choice(_WORDS) for _ in range(words))


def question(user: int, conversation: int, turn: int, words: int) -> str:
    """A user message of its own: the first names its conversation, so no two open alike."""
    rng = random.Random(f"{user}-{conversation}-{turn}")
    tag = f"conversation {user}-{conversation} turn {turn}:"
    return " ".join([tag, *(rng.choice(_WORDS) for _ in range(words))])


@dataclass(slots=True)
class Record:
    turn: int
    start_s: float  # when it was sent, from the start of the arm's load
    status: int  # HTTP status; 0: no answer
    ok: bool
    ttft_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0


async def chat(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], opts: Options,
    start_s: float,
) -> tuple[Record, str | None]:  # fmt: skip
    """One streamed turn, sent `start_s` into the load: its record and the assistant's reply
    (None when it failed)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": opts.reply_tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    turn = sum(m["role"] == "user" for m in messages) - 1
    t0 = time.perf_counter()
    rec = Record(turn, start_s, 0, False)
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            rec.status = resp.status
            if resp.status != 200:
                await resp.read()
                return rec, None
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = json.loads(line[5:])
                for choice in event.get("choices") or ():
                    if text := (choice.get("delta") or {}).get("content"):
                        if not parts:
                            rec.ttft_s = time.perf_counter() - t0
                        parts.append(text)
                usage = event.get("usage") or usage
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
        return rec, None
    if usage is not None:
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                                or 0)  # fmt: skip
    rec.ok = bool(parts)
    return rec, "".join(parts) if rec.ok else None


async def user_loop(
    session: aiohttp.ClientSession, url: str, opts: Options, user: int, span: tuple[float, float],
    records: list[Record],
) -> None:  # fmt: skip
    """Conversations one after another until the deadline (`span`: the load's start and end,
    monotonic); a failed turn ends its conversation."""
    began, deadline = span
    system = system_prompt(opts.system_words)
    await asyncio.sleep(random.Random(user).uniform(0, opts.think_s * 2))  # no lockstep
    conversation = 0
    while time.monotonic() < deadline:
        messages = [{"role": "system", "content": system}]
        for turn in range(opts.turns):
            if time.monotonic() >= deadline:
                return
            messages.append(
                {"role": "user", "content": question(user, conversation, turn, opts.user_words)}
            )
            sent = time.monotonic() - began
            rec, reply = await chat(session, url, messages, opts, sent)
            records.append(rec)
            if reply is None:
                break
            messages.append({"role": "assistant", "content": reply})
            await asyncio.sleep(opts.think_s)
        conversation += 1


Counters = tuple[float, float]  # an engine pool's prefix-cache (queries, hits), in tokens


async def drive(
    url: str, sims: Sequence[str], opts: Options, progress: Progress, task: Any
) -> tuple[list[Record], tuple[Counters, Counters, Counters]]:
    """The users' load for the warm-up and the measured seconds: every request's record, and
    the engines' cache counters before the load, as the warm-up ended, and after the load
    (read on the load's own event loop: a blocking read would stall its users)."""
    records: list[Record] = []
    total = opts.warmup_s + opts.seconds
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=opts.users)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def after_warmup() -> Counters:
            await asyncio.sleep(opts.warmup_s)
            return await _counters(session, sims)

        cold = await _counters(session, sims)
        began = time.monotonic()
        warm = asyncio.create_task(after_warmup())
        users = [asyncio.create_task(user_loop(session, url, opts, u, (began, began + total),
                                               records))
                 for u in range(opts.users)]  # fmt: skip
        try:
            while not all(u.done() for u in users):
                stage = "measured" if warm.done() else "warm-up"
                progress.update(task, completed=min(total, time.monotonic() - began),
                                description=f"  {stage}: {len(records)} requests")  # fmt: skip
                await asyncio.wait(users, timeout=0.25)
        finally:
            for u in (*users, warm):
                if not u.done():
                    u.cancel()
            await asyncio.gather(*users, warm, return_exceptions=True)
        for u in users:  # a bug in the loop, not a failed request: say so
            if not u.cancelled() and u.exception() is not None:
                raise RuntimeError("a user loop failed") from u.exception()
        if warm.cancelled():
            raise RuntimeError("the load ended before its warm-up did")
        return records, (cold, warm.result(), await _counters(session, sims))


async def _counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> Counters:
    """(queries, hits) of the engines' prefix caches, in tokens, summed over `urls`."""
    texts = []
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            texts.append(await resp.text())
    return counted(texts)


# --- the deployment ---------------------------------------------------------------------------


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        text: str = r.read().decode()
        return text


def counted(texts: Sequence[str]) -> Counters:
    """(queries, hits) of prefix caches, in tokens, summed over the engines' metrics `texts`."""
    queries = hits = 0.0
    for text in texts:
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
    return queries, hits


def peaks(urls: Sequence[str]) -> list[int]:
    return [int(json.loads(_get(u + "/sim/concurrency"))["peak"]) for u in urls]


def start_sims(stack: contextlib.ExitStack, opts: Options, workdir: Path, tag: str) -> list[str]:
    """`opts.sims` fresh simulators started side by side (each stopped by `stack`)."""
    sims = [SimProcess(profile=PROFILE, log=workdir / f"{tag}-sim{i}.log",
                       args=["--speedup", f"{opts.speedup:g}", "--prefix-caching"])
            for i in range(opts.sims)]  # fmt: skip
    start_all(stack, *sims)
    return [s.url for s in sims]


def gateway_config(urls: Sequence[str], policy: str, affinity: bool) -> dict[str, Any]:
    """The gateway's settings: affinity as by default, or turned off."""
    return {
        "tiers": [{"name": "pool", "role": "throughput",
                   "backends": [{"url": u, "models": [MODEL]} for u in urls]}],
        "policy": {"name": policy} | ({} if affinity else {"prefix_affinity": False}),
        "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
        "log_level": "warning",
    }  # fmt: skip


@contextlib.contextmanager
def deployment(
    arm: str, opts: Options, workdir: Path, peers: dict[str, Installed], tag: str
) -> Iterator[tuple[str, list[str]]]:
    """Fresh simulators and the arm's router in front of them: (router URL, simulator URLs);
    all stopped on the way out, whatever happens (Ctrl-C included)."""
    with contextlib.ExitStack() as stack:
        urls = start_sims(stack, opts, workdir, tag)
        if arm in (BASE, AFFINITY):
            config = workdir / f"{tag}.yaml"
            config.write_text(yaml.safe_dump(gateway_config(urls, opts.policy, arm == AFFINITY)))
            gw = GatewayProcess(config=config, log=workdir / f"{tag}.log")
            yield stack.enter_context(gw).url, urls
            return
        router, _, policy = arm.partition(":")
        inst = peers[router]
        assert inst.binary is not None  # arms without one were left out
        peer = PeerProcess(inst.peer, inst.binary, urls, MODEL, workdir, policy, label=tag)
        yield stack.enter_context(peer).url, urls


# --- one run, its summary ---------------------------------------------------------------------


def measure(
    url: str, sims: Sequence[str], opts: Options, progress: Progress, task: Any
) -> dict[str, Any]:
    everything, ((q0, h0), (qw, hw), (q1, h1)) = asyncio.run(
        drive(url, sims, opts, progress, task)
    )
    records = [r for r in everything if r.start_s >= opts.warmup_s]
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s * 1000 for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    later = [r.ttft_s * 1000 for r in ok if r.turn > 0]
    per_sim = peaks(sims)
    return {
        "requests": len(records), "errors": len(records) - len(ok), "samples": len(ttfts),
        "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99),
        "ttft_p50_later_ms": percentile(later, 50),
        "hit_rate": (h1 - hw) / (q1 - qw) if q1 > qw else math.nan,
        "hit_rate_cold": (h1 - h0) / (q1 - q0) if q1 > q0 else math.nan,
        "usage_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else math.nan,
        "queries_tokens": q1 - qw, "prompt_tokens": prompt,
        "warmup_requests": len(everything) - len(records),
        "peak": max(per_sim), "peaks": per_sim,
        "conversations_done": sum(1 for r in ok if r.turn == opts.turns - 1),
        "by_turn": [[sum(r.prompt_tokens for r in ok if r.turn == t),
                     sum(r.cached_tokens for r in ok if r.turn == t)]
                    for t in range(opts.turns)],
    }  # fmt: skip


def at_common_mix(runs: dict[str, list[dict[str, Any]]]) -> list[float]:
    """Each turn's share of the prompt tokens, pooled over every arm and round: the mix at
    which `same_mix` compares arms. (The hit rate over a window weighs the turns as they fell
    in it: a router that serves faster has its users further into their conversations, and a
    turn's share cached grows with the history it resends.)"""
    totals = [0.0] * max((len(r["by_turn"]) for rs in runs.values() for r in rs), default=0)
    for rounds in runs.values():
        for r in rounds:
            for t, (prompt, _) in enumerate(r["by_turn"]):
                totals[t] += prompt
    whole = sum(totals)
    return [x / whole for x in totals] if whole else totals


def same_mix(by_turn: Sequence[Sequence[float]], weights: Sequence[float]) -> float:
    """The share of prompt tokens cached (usage) with each turn weighed by `weights`: each
    turn's own share, the same mix for every arm. NaN where no turn was seen."""
    seen = [(w, cached / prompt) for w, (prompt, cached) in zip(weights, by_turn, strict=False)
            if prompt > 0]  # fmt: skip
    total = sum(w for w, _ in seen)
    return sum(w * share for w, share in seen) / total if total else math.nan


FIGURES = (
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("ttft_p50_later_ms", "TTFT p50, turns 2+ (ms)"),
    ("hit_rate", "hit rate (engines)"),
    ("hit_rate_cold", "hit rate from cold (engines)"),
    ("hit_rate_mix", "cached, turns at a common mix (usage)"),
    ("usage_rate", "cached/prompt (usage)"),
    ("peak", "max concurrency, one engine"),
)
COUNTS = ("requests", "errors", "samples", "conversations_done", "warmup_requests")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm: each figure's median over the rounds and each round's value; counts summed."""
    out: dict[str, dict[str, Any]] = {}
    for arm, rounds in runs.items():
        figs: dict[str, Any] = {k: median([r[k] for r in rounds]) for k, _ in FIGURES}
        figs["rounds"] = {k: [r[k] for r in rounds] for k, _ in FIGURES}
        figs |= {k: sum(r[k] for r in rounds) for k in COUNTS}
        # Each turn's (prompt, cached) tokens, summed over the rounds.
        figs["by_turn"] = [[sum(x) for x in zip(*turn, strict=True)]
                           for turn in zip(*(r["by_turn"] for r in rounds), strict=True)]
        out[arm] = figs
    return out


def verdicts(arms: dict[str, dict[str, Any]], bound: float) -> list[dict[str, str]]:
    """tiergate's defaults against affinity off, against the better peer on each figure, and
    against affinity's bound."""
    if AFFINITY not in arms:
        return []
    a = arms[AFFINITY]
    out = []
    if BASE in arms:
        b = arms[BASE]
        out += [
            {"goal": "hit rate with affinity above without",
             "measured": f"{a['hit_rate']:.1%} vs {b['hit_rate']:.1%}",
             "result": _word(a["hit_rate"] > b["hit_rate"])},
            {"goal": "TTFT p50 with affinity below without",
             "measured": f"{a['ttft_p50_ms']:.1f} ms vs {b['ttft_p50_ms']:.1f} ms",
             "result": _word(a["ttft_p50_ms"] < b["ttft_p50_ms"])},
        ]  # fmt: skip
    peers = {k: f for k, f in arms.items() if k in PEER_ARMS}
    if peers:
        for key, label in (("hit_rate", "hit rate"), ("hit_rate_cold", "hit rate from cold"),
                           ("hit_rate_mix", "cached at a common turn mix")):  # fmt: skip
            best = max(peers, key=lambda k: peers[k][key])
            # (to the 0.01 points shown: a turn's share is the same whichever router holds
            # its history, up to the float sums' last digits)
            ok = round(a[key], 4) >= round(peers[best][key], 4)
            out.append({"goal": f"{label} at least the better peer's",
                        "measured": f"{a[key]:.2%} vs {peers[best][key]:.2%} ({best})",
                        "result": _word(ok)})  # fmt: skip
        for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99")):
            best = min(peers, key=lambda k: peers[k][key])
            out.append({"goal": f"{label} at most the better peer's",
                        "measured": f"{a[key]:.1f} ms vs {peers[best][key]:.1f} ms ({best})",
                        "result": _word(a[key] <= peers[best][key])})  # fmt: skip
    if not math.isnan(a["peak"]):
        out.append({"goal": "no engine above affinity's bound",
                    "measured": f"at most {a['peak']:g} on one engine, bound {bound:g}",
                    "result": _word(a["peak"] <= bound)})  # fmt: skip
    return out


def bound_notes(arms: dict[str, dict[str, Any]], bound: float) -> list[str]:
    """Where one engine held more than affinity's bound lets a keyed backend hold: say so
    (a router that follows the cache without such a bound queues there)."""
    return [
        f"{arm} had up to {f['peak']:g} requests on one engine, above the {bound:g} that "
        "tiergate's affinity bound allows with every user in flight"
        for arm, f in arms.items()
        if not math.isnan(f["peak"]) and f["peak"] > bound
    ]


def _word(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


# --- the whole bench --------------------------------------------------------------------------


def _peers(opts: Options, notes: list[str], versions: dict[str, str],
           console: Console) -> tuple[list[str], dict[str, Installed]]:  # fmt: skip
    """The arms that can run, and the installed peers they need."""
    wanted = sorted({a.partition(":")[0] for a in opts.arms if a not in (BASE, AFFINITY)})
    venv = opts.venv or default_venv()
    installed = ensure(wanted, venv, opts.install, console) if wanted else {}
    arms = []
    for arm in opts.arms:
        router = arm.partition(":")[0]
        if router in installed and installed[router].binary is None:
            notes.append(f"{arm} skipped: {router} {scrub(installed[router].note or '', venv)}")
            continue
        if router in installed:
            inst = installed[router]
            versions[router] = f"{inst.peer.distribution} {inst.version}"
        arms.append(arm)
    return arms, installed


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    """Every arm, fresh engines each time, rounds in rotating order; print the tables and write
    JSON, markdown and PNG."""
    console = console or Console()
    command = opts.command or shlex.join(["tiergate", *sys.argv[1:]])
    notes: list[str] = []
    versions: dict[str, str] = {}
    arms, installed = _peers(opts, notes, versions, console)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with (
        tempfile.TemporaryDirectory(prefix="tiergate-affinity-") as tmp,
        bars(console) as progress,
    ):
        overall = progress.add_task("arms", total=len(arms) * opts.rounds)
        for r in range(opts.rounds):
            for arm in rotation(arms, r):
                tag = f"{arm.replace(':', '-')}-r{r}"
                progress.update(overall, description=f"round {r + 1}/{opts.rounds}: {arm}")
                task = progress.add_task("  starting", total=opts.warmup_s + opts.seconds)
                try:
                    with deployment(arm, opts, Path(tmp), installed, tag) as (url, sims):
                        runs[arm].append(measure(url, sims, opts, progress, task))
                except RuntimeError as e:
                    if arm in (BASE, AFFINITY):
                        raise
                    notes.append(f"{arm} round {r + 1} left out: {scrub(str(e), default_venv())}")
                progress.remove_task(task)
                progress.advance(overall)
    report = build_report(opts, command, notes, versions, {a: v for a, v in runs.items() if v})
    print_report(report, console)
    save(JsonReport(report), opts, console, chart, markdown)
    return report


def build_report(opts: Options, command: str, notes: list[str], versions: dict[str, str],
                 runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:  # fmt: skip
    weights = at_common_mix(runs)
    for rounds in runs.values():
        for r in rounds:
            r["hit_rate_mix"] = same_mix(r["by_turn"], weights)
    arms = summarize(runs)
    report: dict[str, Any] = run_header(command, asdict(opts), ("venv", "command", "chart",
                                                                 "install"))  # fmt: skip
    report["settings"].update(profile=PROFILE, affinity_bound=opts.bound(), turn_mix=weights)
    report |= {
        "versions": versions,
        "arms": arms,
        "runs": runs,
        "verdicts": verdicts(arms, opts.bound()),
        "notes": notes + bound_notes(arms, opts.bound()),
    }
    clean: dict[str, Any] = json_safe(report)
    return clean


# --- output -----------------------------------------------------------------------------------


def _fmt(key: str, v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if "rate" in key:
        return f"{v:.2%}"
    if key == "peak":
        return f"{v:g}"
    return f"{v:.1f}"


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    arms = report["arms"]
    rounds = report["settings"]["rounds"]
    head = ["arm", *(label for _, label in FIGURES), "requests", "errors", "samples"]
    rows = [[a, *(_fmt(k, f[k]) for k, _ in FIGURES), str(f["requests"]), str(f["errors"]),
             str(f["samples"])] for a, f in arms.items()]  # fmt: skip
    goals = [[v["goal"], v["measured"], v["result"]] for v in report["verdicts"]]
    out = [("Goals", ["goal", "measured", "verdict"], goals)] if goals else []
    out.append((f"Per arm (median of {rounds} rounds; counts summed)", head, rows))
    if BASE in arms:
        keys = ("ttft_p50_ms", "ttft_p99_ms", "hit_rate", "hit_rate_cold", "peak")
        ratio_head = ["arm", *(dict(FIGURES)[k] for k in keys)]
        ratio_rows = [[a, *(_x(f[k], arms[BASE][k]) for k in keys)]
                      for a, f in arms.items() if a != BASE]  # fmt: skip
        out.append(("Against tiergate without affinity (arm / tiergate)", ratio_head, ratio_rows))
    turns = max((len(f["by_turn"]) for f in arms.values()), default=0)
    mix = report["settings"].get("turn_mix") or []
    by_turn = [[a, *(f"{c / p:.2%}" if p else "-" for p, c in f["by_turn"])]
               for a, f in arms.items()]  # fmt: skip
    if mix:
        by_turn.append(["(the common mix: the turn's share of prompt tokens)",
                        *(f"{w:.1%}" for w in mix)])  # fmt: skip
    out.append(("Cached share of prompt tokens by turn (usage, rounds pooled)",
                ["arm", *(f"turn {t + 1}" for t in range(turns))], by_turn))  # fmt: skip
    per_round = [[a, label, " / ".join(_fmt(k, v) for v in f["rounds"][k])]
                 for a, f in arms.items() for k, label in FIGURES]  # fmt: skip
    out.append(("Each round's value", ["arm", "figure", "per round"], per_round))
    return out


def print_report(report: dict[str, Any], console: Console) -> None:
    print_tables(tables(report), console, ("arm", "goal", "measured", "figure"))
    console.print(f"affinity bound at full load: {report['settings']['affinity_bound']:g} "
                  "requests per engine")  # fmt: skip
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def markdown(saved: JsonReport, chart_file: Path | None) -> str:
    report = saved.data
    s = report["settings"]
    versions = ", ".join(f"{k}: {v}" for k, v in report["versions"].items()) or "-"
    parts = [
        "# Prefix-cache affinity: multi-turn chat with a shared system prompt",
        "",
        f"- Command: `{report['command']}`",
        f"- Date: {report['date']}",
        f"- Machine: `nproc` = {report['nproc']} ({report['machine']}); the client, the "
        "simulators and the router share these CPUs.",
        f"- Peers: {versions}",
        f"- Scenario: {s['users']} users, each a closed loop (think time {s['think_s']:g} s) of "
        f"conversations of {s['turns']} streamed turns on `/v1/chat/completions`; a "
        f"{s['system_words']}-word system prompt shared by every conversation, "
        f"{s['user_words']}-word user messages (the first names its conversation), replies of up "
        f"to {s['reply_tokens']} tokens; each turn resends the whole history. Per arm per round "
        f"{s.get('warmup_s', 0):g} s of warm-up, then {s['seconds']:g} s measured.",
        f"- Deployment, fresh for every arm of every round: {s['sims']} `{s['profile']}` "
        f"simulators (`--speedup {s['speedup']:g} --prefix-caching`: 16-token blocks, chained "
        f"hashes, LRU) behind one router (tiergate's policy: `{s['policy']}`, the pool one "
        "throughput tier):",
        *(f"  - `{a}`: {DESCRIPTIONS.get(a, a)}" for a in report["arms"]),
        f"- Rounds: {s['rounds']}, the arms' order rotating. Hit rate: "
        "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, summed over the pool, "
        "delta over the measured window (the steady state); from cold: over warm-up and window "
        "(each engine's first prefill of the shared system prompt counted: a router that spreads "
        "the first conversations over the pool pays it once per engine, one that holds them all on "
        "one engine once); cached/prompt: the sum of usage's "
        "`prompt_tokens_details.cached_tokens` over the sum of `prompt_tokens`; at a common "
        "mix: each turn's cached share, the turns weighed alike for every arm (by their share of "
        "every arm's prompt tokens: a router that serves faster has its users further into "
        "their conversations in the window, where a turn resends more history). TTFT, requests, "
        "errors: the requests sent in the measured window; TTFT to the first "
        "content chunk. Max concurrency: the most requests one simulator generated at once "
        f"(`/sim/concurrency`, warm-up included); affinity's bound with every user in flight is "
        f"(1 + affinity_balance) x mean + affinity_slack = {s['affinity_bound']:g}.",
    ]
    chart = None if chart_file is None else (chart_file, "TTFT, hit rate and concurrency per arm")
    return finish_markdown(parts, report["notes"], tables(report), chart)


def chart(saved: JsonReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = saved.data
    arms = report["arms"]
    names = list(arms)
    xs = range(len(names))
    colors = ["tab:blue", "tab:orange", "tab:purple", "tab:brown"][: len(names)]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))

    def val(a: str, k: str) -> float:
        v = arms[a][k]
        return math.nan if v is None else float(v)

    ax = axes[0]
    ax.bar(xs, [val(a, "ttft_p99_ms") for a in names], 0.8, color=colors, alpha=0.35)
    ax.bar(xs, [val(a, "ttft_p50_ms") for a in names], 0.5, color=colors)
    ax.set_title("TTFT p50 (p99 pale), ms")
    ax = axes[1]
    ax.bar(xs, [val(a, "hit_rate") for a in names], 0.5, color=colors)
    ax.plot(xs, [val(a, "usage_rate") for a in names], "k_", markersize=20,
            label="cached/prompt (usage)")  # fmt: skip
    ax.plot(xs, [val(a, "hit_rate_cold") for a in names], "rx", markersize=8,
            label="from cold")  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_title("prefix-cache hit rate (engines)")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[2]
    ax.bar(xs, [val(a, "peak") for a in names], 0.5, color=colors)
    ax.axhline(report["settings"]["affinity_bound"], color="tab:red", ls="--",
               label="affinity bound")  # fmt: skip
    ax.set_title("max concurrency on one engine")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"multi-turn chat, shared system prompt ({report['date']}, "
                 f"nproc={report['nproc']})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["AFFINITY", "ARMS", "BASE", "PEERS", "Options", "run"]


# -- the command ------------------------------------------------------------------------------


def _affinity_arms(names: list[str] | None) -> list[str] | None:
    from loadtests.affinity import ARMS

    return known(names, ARMS)


def command(
    sims: Annotated[int, typer.Option(min=2, help="Throughput simulators (v3) in the pool.")] = 4,
    users: Annotated[int, typer.Option(min=1, help="Concurrent users (closed loops).")] = 16,
    turns: Annotated[int, typer.Option(min=2, help="Turns per conversation.")] = 6,
    seconds: Annotated[
        float, typer.Option(min=1, help="Seconds of load measured per arm per round.")
    ] = 20,
    warmup: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds of load before them, not measured (each engine's first prefill of the"
            " shared system prompt); the hit rate from cold is reported too.",
        ),
    ] = 5,
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
            help="tiergate's policy in both its arms (default: the default policy; one of "
            f"{', '.join(POLICY_NAMES)})."
        ),
    ] = DEFAULT_POLICY,
    arm: Annotated[
        list[str] | None,
        typer.Option(
            callback=_affinity_arms,
            help="Arms to run; repeat for several (default all: tiergate (its defaults), "
            "tiergate-no-affinity, vllm-router:cache_aware, smg:cache_aware).",
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
    the whole history (so every turn's prompt extends the last). Per arm, after WARMUP seconds of
    load, SECONDS measured; fresh simulators with
    prefix caching on (SIMS x v3) behind one router: tiergate with its defaults (prefix affinity
    on) and with policy.prefix_affinity false, vLLM's router and SGLang's model gateway with
    --policy cache_aware
    (a peer that is not installed or does not start is left out with a note). Prints TTFT
    p50/p99, the engines' prefix-cache hit rate (and usage's cached_tokens/prompt_tokens),
    requests, errors, the most requests one engine held against affinity's bound, medians over
    rounds, ratios against tiergate without affinity, and the goals (affinity: a higher hit rate
    and a lower TTFT p50 than without; at least the better peer's hit rate, TTFT p50 and p99;
    no engine above affinity's bound) as MET / NOT MET. Every process is stopped at the end, on
    failure and on Ctrl-C."""
    import sys

    from loadtests.common.report import command_line

    if policy not in POLICY_NAMES:
        raise typer.BadParameter(f"{policy}: choose from {', '.join(POLICY_NAMES)}")
    setup_logging("warning")
    opts = Options(
        sims=sims, users=users, turns=turns, seconds=seconds, warmup_s=warmup, rounds=rounds,
        speedup=speedup,
        system_words=system_words, user_words=user_words, reply_tokens=reply_tokens,
        think_s=think, policy=policy, arms=tuple(arm or ARMS), venv=peers_venv, install=install,
        out=out,
        command=command_line(without(sys.argv[1:], "--peers-venv")),
    )  # fmt: skip
    try:
        run(opts)
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None
