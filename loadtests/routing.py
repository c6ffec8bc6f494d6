"""`tiergate bench routing`: the routing policies compared on one simulated deployment.

One EAGLE-3 latency instance (`--deployment`: v4-low accepting little, the tutorial's v4, v4-high
accepting a lot, or `shift`: v4 whose acceptance drops to 55% of its vector halfway through) and
two v3 (AWQ) throughput instances; one gateway per policy in front of the same engines, and per
`--oracle-limit L` one more: golden-range with the latency tier capped at exactly L streams (the
best of them is the oracle, the best fixed limit for that deployment and shape). Every request
carries the run's SLO in x-tiergate-slo-* headers, which the learned policy routes by.

The step shape (1 -> 8 -> 16 -> 32 -> 64 -> 16 users) and the burst
shape (8 users with spikes to 64) run once per policy, the policies alternating (their order
rotates every round) and the engines drained between runs. Per phase: TTFT and TPOT p50/p99,
output tokens/s, and goodput: requests per second that met every SLO (default TTFT <= 1 s and
TPOT <= 25 ms). Goodput differences are judged against counting noise: two counts differ when they
are further apart than twice the square root of their sum.

With `peers` (`vllm-router:power_of_two`, `smg:cache_aware`, ...), those routers run too, in
front of the same engines, every engine of both tiers as their workers (they know no tiers), in
the same rotation as the policies; their latency:throughput split is counted at the engines
(requests each finished per phase), as they send no tier header.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from engines.sim.profile import load_profile
from gateway.routing import POLICY_NAMES, PolicyName
from loadtests.common.options import PEERS_VENV_HELP, known, setup_logging
from loadtests.common.stats import ms_of_s
from loadtests.harness.deployments import DEPLOYMENTS
from loadtests.harness.peerenv import PEERS, PeerProcess, default_venv, ensure, scrub
from loadtests.harness.phases import SHAPES, PhaseStats, Run, Slo, phase_stats, run_phases
from loadtests.harness.stack import MODEL, Stack, add_gateway, start_stack

POLICIES = POLICY_NAMES
GOLDEN: PolicyName = "golden-range"
LEARNED: PolicyName = "learned"
ORACLE_PREFIX = "limit-"
# The peer routers' policies compared by `--peers`: each router's load-aware one and its default.
PEER_POLICIES = ("vllm-router:power_of_two", "vllm-router:cache_aware", "smg:cache_aware",
                 "smg:power_of_two")  # fmt: skip
ROUTERS = ("vllm-router", "smg")


def peer_spec(spec: str) -> tuple[str, str]:
    """`ROUTER:POLICY` -> (router, policy); ValueError naming the choices otherwise."""
    router, _, policy = spec.partition(":")
    if router not in ROUTERS or policy not in PEERS[router].policies:
        raise ValueError(f"{spec!r}: ROUTER:POLICY with ROUTER one of {', '.join(ROUTERS)} and "
                         f"POLICY one of {', '.join(PEERS['vllm-router'].policies)}")  # fmt: skip
    return router, policy


def oracle_policy(limit: int) -> dict[str, Any]:
    """golden-range with the latency tier taking work below exactly `limit` streams."""
    return {"name": GOLDEN, "latency_max_concurrency": limit, "latency_hard_cap": limit,
            "hysteresis": 0}  # fmt: skip


def _acceptance(sim_url: str, vector: Sequence[float]) -> None:
    req = urllib.request.Request(
        sim_url + "/sim/speculative", data=json.dumps({"acceptance": list(vector)}).encode(),
        headers={"content-type": "application/json"}, method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def _wait_idle(stack: Stack, timeout: float = 120.0) -> None:
    """Let every engine drain, so one policy's tail does not load the next one's start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loads = []
        for sim in stack.sims:
            with urllib.request.urlopen(sim.url + "/load", timeout=5) as r:
                loads.append(json.loads(r.read())["server_load"])
        if not any(loads):
            return
        time.sleep(0.2)


def _served(urls: Sequence[str]) -> int:
    """Requests the engines at `urls` have finished so far (vllm:request_success_total)."""
    total = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:request_success_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return round(total)


def _split(stack: Stack) -> tuple[int, int]:
    return _served([s.url for s in stack.latency]), _served([s.url for s in stack.throughput])


def start_peers(
    specs: Sequence[str], stack: Stack, workdir: Path, notes: list[str],
    versions: dict[str, str], venv: Path, install: bool, console: Console,
) -> dict[str, PeerProcess]:  # fmt: skip
    """Each peer router in front of every engine, started side by side; one that is not
    installed or does not start is left out with a note. The caller stops those returned;
    `versions` receives each started one's package and version."""
    parsed = {spec: peer_spec(spec) for spec in specs}
    installed = ensure(sorted({r for r, _ in parsed.values()}), venv, install, console)
    urls = [s.url for s in stack.sims]
    spawned: dict[str, PeerProcess] = {}
    try:
        for spec, (router, policy) in parsed.items():
            inst = installed[router]
            if inst.binary is None:
                notes.append(f"{spec} skipped: {router} {inst.note}")
                continue
            spawned[spec] = PeerProcess(inst.peer, inst.binary, urls, MODEL, workdir, policy,
                                        label=spec).spawn()  # fmt: skip
        for spec, peer in list(spawned.items()):
            try:
                peer.wait_ready()
            except RuntimeError as e:
                notes.append(f"{spec} skipped: did not start: {scrub(str(e), venv)}")
                peer.stop()
                del spawned[spec]
    except BaseException:
        for peer in spawned.values():
            peer.stop()
        raise
    for spec in spawned:
        inst = installed[parsed[spec][0]]
        versions[spec] = f"{inst.peer.distribution} {inst.version}"
    return spawned


def compare(met: dict[str, int], golden: str = GOLDEN) -> tuple[str, int, int, float]:
    """Golden's SLO-met count vs the best other policy's, with the noise band (2 sqrt(sum))."""
    others = {p: n for p, n in met.items() if p != golden}
    best = max(others, key=lambda p: others[p])
    g, b = met[golden], others[best]
    return best, g, b, 2 * math.sqrt(g + b)


def run(
    *,
    shapes: tuple[str, ...] = ("step", "burst"),
    policies: tuple[str, ...] = POLICIES,
    phase_s: float = 15.0,
    rounds: int = 1,
    speedup: float = 1.0,
    slo: Slo | None = None,
    out_dir: Path | None = None,
    prompt_tokens: int = 50,
    output_tokens: int = 256,
    console: Console | None = None,
    deployment: str = "tutorial",
    oracle_limits: tuple[int, ...] = (),
    name: str = "routing",
    slo_class: str = "",  # the SLO's name, for the report's command line
    peers: tuple[str, ...] = (),  # ROUTER:POLICY, e.g. vllm-router:power_of_two
    peers_venv: Path | None = None,
    install: bool = True,
) -> dict[str, Any]:
    console = console or Console()
    notes: list[str] = []
    versions: dict[str, str] = {}
    venv = peers_venv or default_venv()
    slo = slo or Slo()
    dep = DEPLOYMENTS[deployment]
    # The gateway sees wall-clock time: an SLO in model time shrinks with the engines' speedup.
    wall = {"ttft_ms": slo.ttft_s * 1000 / speedup, "tpot_ms": slo.tpot_s * 1000 / speedup}
    headers = {f"x-tiergate-slo-{k.replace('_', '-')}": f"{v:g}" for k, v in wall.items()}
    settings = {p: {"name": p} for p in policies} | {
        f"{ORACLE_PREFIX}{n}": oracle_policy(n) for n in oracle_limits}  # fmt: skip
    runs: dict[tuple[str, str], list[Run]] = {}
    splits: dict[tuple[str, str], list[list[tuple[int, int]]]] = {}  # peers: per run, per phase
    started: dict[str, PeerProcess] = {}
    with tempfile.TemporaryDirectory(prefix="tiergate-routing-") as tmp:
        stack = start_stack(Path(tmp), speedup=speedup, gateways=0,
                            latency_profile=dep.latency, throughput_profile=dep.throughput)
        # The shift (the vector, and the phase it starts), and each engine's own vector back.
        shift = dep.shifts(1.0)
        own = [load_profile(p).speculative for p in dep.latency]

        def shifted(vector: Sequence[float] | None = None) -> None:
            for sim, spec in zip(stack.latency, own, strict=True):
                if spec is not None:
                    _acceptance(sim.url, vector or spec.acceptance)

        async def on_phase(phase: int, shape: str, counts: list[tuple[int, int]] | None) -> None:
            if counts is not None:
                counts.append(await asyncio.to_thread(_split, stack))
            for at, vector in shift:
                if phase == int(at * len(SHAPES[shape])):
                    await asyncio.to_thread(shifted, vector)

        try:
            gateways = {
                p: add_gateway(stack, Path(tmp), f"gw-{p}", log_level="warning",
                               policy=cfg, slo=wall).url
                for p, cfg in settings.items()
            }  # fmt: skip
            if peers:
                started = start_peers(peers, stack, Path(tmp), notes, versions, venv, install,
                                      console)  # fmt: skip
            gateways |= {spec: peer.url for spec, peer in started.items()}
            policies = (*settings, *started)
            total = rounds * sum(len(SHAPES[s]) for s in shapes) * len(policies) * phase_s
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("routing benchmark", total=total)
                for r in range(rounds):
                    order = policies[r % len(policies) :] + policies[: r % len(policies)]
                    for shape in shapes:
                        for policy in order:
                            progress.update(task, description=f"{shape} / {policy}")
                            _wait_idle(stack)
                            if shift:
                                shifted()
                            counts: list[tuple[int, int]] | None = (
                                [] if policy in started else None)  # fmt: skip
                            at_phase = functools.partial(on_phase, shape=shape, counts=counts)
                            results, starts = asyncio.run(run_phases(
                                gateways[policy] + "/v1/completions", SHAPES[shape], phase_s,
                                prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                model=MODEL, headers=headers, on_phase=at_phase,
                            ))  # fmt: skip
                            runs.setdefault((shape, policy), []).append((results, starts))
                            if counts is not None:
                                counts.append(_split(stack))
                                splits.setdefault((shape, policy), []).append(counts)
                            progress.advance(task, len(SHAPES[shape]) * phase_s)
        finally:
            for peer in started.values():
                peer.stop()
            stack.stop()
    report = _report(runs, shapes, policies, slo, speedup, splits)
    report["deployment"] = {"name": deployment, "latency": list(dep.latency),
                            "throughput": list(dep.throughput), "about": dep.about,
                            "shift": list(dep.shift) if dep.shift else None,
                            "slo_class": slo_class}  # fmt: skip
    if peers:
        report["peers"] = {"asked": list(peers), "ran": list(started), "versions": versions,
                           "notes": notes}  # fmt: skip
        for note in notes:
            console.print(f"[yellow]note:[/] {note}")
    _print(console, report, slo)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2))
        _plot(report, out_dir / f"{name}.png")
        (out_dir / f"{name}.md").write_text(
            _markdown(report, slo, (phase_s, rounds, speedup), name)
        )
    return report


def _engine_split(stats: list[PhaseStats], per_run: list[list[tuple[int, int]]]
                  ) -> list[PhaseStats]:  # fmt: skip
    """A peer's phases with the latency:throughput split the engines counted (summed over
    runs): snapshot i is taken as phase i starts, the last one after the run."""
    out = []
    for i, s in enumerate(stats):
        lat = sum(c[i + 1][0] - c[i][0] for c in per_run)
        thr = sum(c[i + 1][1] - c[i][1] for c in per_run)
        out.append(dataclasses.replace(s, by_tier={"latency": lat, "throughput": thr}))
    return out


def _report(
    runs: dict[tuple[str, str], list[Run]],
    shapes: tuple[str, ...],
    policies: tuple[str, ...],
    slo: Slo,
    speedup: float,
    splits: dict[tuple[str, str], list[list[tuple[int, int]]]] | None = None,
) -> dict[str, Any]:
    report: dict[str, Any] = {"slo": asdict(slo), "shapes": {}}
    for shape in shapes:
        per_policy: dict[str, list[PhaseStats]] = {
            p: phase_stats(runs[(shape, p)], SHAPES[shape], slo, speedup) for p in policies
        }
        for (sh, p), per_run in (splits or {}).items():
            if sh == shape:
                per_policy[p] = _engine_split(per_policy[p], per_run)
        verdicts = []
        for i in range(len(SHAPES[shape])):
            met = {p: round(s[i].goodput * s[i].seconds) for p, s in per_policy.items()}
            verdicts.append(_verdict(met) if GOLDEN in met and len(met) > 1 else None)
        whole = {p: sum(round(x.goodput * x.seconds) for x in s) for p, s in per_policy.items()}
        seconds = {p: sum(x.seconds for x in s) for p, s in per_policy.items()}
        # Each round's own count (rounds in the order run, the policies' order rotating): the
        # spread across rounds, beside the pooled count's counting noise.
        per_round = {p: [sum(round(x.goodput * x.seconds)
                             for x in phase_stats([one], SHAPES[shape], slo, speedup))
                         for one in runs[(shape, p)]]
                     for p in policies}  # fmt: skip
        report["shapes"][shape] = {
            "users": list(SHAPES[shape]),
            "policies": {p: [asdict(x) for x in s] for p, s in per_policy.items()},
            "phase_verdicts": verdicts,
            "whole": {
                p: {"slo_met": whole[p], "goodput": whole[p] / seconds[p],
                    "per_round": per_round[p]}
                for p in policies
            },
            "whole_verdict": _verdict(whole, strict=True)
            if GOLDEN in whole and len(whole) > 1
            else None,
            "learned_verdict": learned_verdict(whole),
            "peer_verdicts": peer_verdicts(whole),
        }
    return report


def peer_verdicts(met: dict[str, int]) -> list[dict[str, Any]]:
    """learned's and golden-range's SLO-met counts against each peer router's, with the
    counting noise band (2 sqrt(a + b)): higher, lower, or within noise."""
    out = []
    for ours in (LEARNED, GOLDEN):
        for peer in (p for p in met if ":" in p):
            if ours not in met:
                continue
            a, b = met[ours], met[peer]
            noise = 2 * math.sqrt(a + b)
            text = "higher" if a - b > noise else "LOWER" if b - a > noise else "within noise"
            out.append({"policy": ours, "peer": peer, "ours": a, "theirs": b,
                        "noise": round(noise, 1), "text": text})  # fmt: skip
    return out


def learned_verdict(met: dict[str, int]) -> dict[str, Any] | None:
    """The learned policy's SLO-met count against the oracle (the best fixed latency-tier
    limit, >= 95% of it wanted) and against golden-range (>= wanted), each with its counting
    noise band (2 sqrt(a + b)); None without the learned policy."""
    if LEARNED not in met:
        return None
    out: dict[str, Any] = {"learned": met[LEARNED]}
    limits = {p: n for p, n in met.items() if p.startswith(ORACLE_PREFIX)}
    if limits:
        best = max(limits, key=lambda p: limits[p])
        o, n = limits[best], met[LEARNED]
        noise = 2 * math.sqrt(n + o)
        out["oracle"] = {"policy": best, "slo_met": o, "ratio": n / o if o else math.inf,
                         "noise": round(noise, 1), "ok": n >= 0.95 * o - noise,
                         "met": n >= 0.95 * o}  # fmt: skip
    if GOLDEN in met:
        g, n = met[GOLDEN], met[LEARNED]
        noise = 2 * math.sqrt(n + g)
        out["golden"] = {"slo_met": g, "noise": round(noise, 1), "ok": n >= g - noise,
                         "met": n >= g}  # fmt: skip
    return out


def _verdict(met: dict[str, int], strict: bool = False) -> dict[str, Any]:
    best, g, b, noise = compare(met)
    if strict:
        ok = g - b > noise
        text = "higher" if ok else ("higher, within noise" if g > b else "NOT higher")
    else:
        ok = g >= b - noise
        text = "at least as high" if g >= b else (
            "lower, within noise" if ok else "LOWER")  # fmt: skip
    return {"best_other": best, "golden": g, "other": b, "noise": round(noise, 1), "ok": ok,
            "text": text}  # fmt: skip


def _print(console: Console, report: dict[str, Any], slo: Slo) -> None:
    for shape, data in report["shapes"].items():
        t = Table(title=f"{shape} shape: per phase (SLO TTFT <= {slo.ttft_s:g} s, "
                        f"TPOT <= {slo.tpot_s * 1000:g} ms)")  # fmt: skip
        for col in ("phase", "users", "policy", "n", "err", "TTFT p50", "TTFT p99", "TPOT p50",
                    "TPOT p99", "tok/s", "goodput/s", "latency:throughput"):  # fmt: skip
            t.add_column(col, justify="left" if col == "policy" else "right")
        for i, users in enumerate(data["users"]):
            for p, stats in data["policies"].items():
                s = stats[i]
                tiers = _tiers(s["by_tier"])
                times = [ms_of_s(s[k], 0, " ms") for k in ("ttft_p50", "ttft_p99", "tpot_p50",
                                                             "tpot_p99")]  # fmt: skip
                t.add_row(str(i + 1), str(users), p, str(s["requests"]), str(s["errors"]),
                          *times, f"{s['tok_s']:.0f}", f"{s['goodput']:.2f}",
                          tiers, end_section=p == list(data["policies"])[-1])  # fmt: skip
        console.print(t)
        for line in _verdict_lines(data):
            console.print(f"  {line}")


def _tiers(by_tier: dict[str, int]) -> str:
    if not {"latency", "throughput"} & set(by_tier):
        return "-"
    return f"{by_tier.get('latency', 0)}:{by_tier.get('throughput', 0)}"


def _verdict_lines(data: dict[str, Any], bold: bool = False) -> list[str]:
    """One line per phase and one for the whole run: golden-range vs the best other policy."""
    b = "**" if bold else ""
    lines = []
    for i, v in enumerate(data["phase_verdicts"]):
        if v:
            lines.append(f"phase {i + 1} ({data['users'][i]} users): golden-range {v['golden']} "
                         f"SLO-met vs {v['best_other']} {v['other']} (noise ±{v['noise']}): "
                         f"{b}{v['text']}{b}")  # fmt: skip
    if w := data["whole_verdict"]:
        lines.append(f"whole run: golden-range {w['golden']} vs {w['best_other']} {w['other']} "
                     f"(noise ±{w['noise']}): {b}{w['text']}{b}")  # fmt: skip
    if lv := data.get("learned_verdict"):
        n = lv["learned"]
        if o := lv.get("oracle"):
            text = "MET" if o["met"] else ("met within noise" if o["ok"] else "NOT MET")
            lines.append(f"learned {n} vs oracle ({o['policy']}) {o['slo_met']} = "
                         f"{o['ratio']:.2f}x (noise ±{o['noise']}), "
                         f">= 0.95x: {b}{text}{b}")  # fmt: skip
        if g := lv.get("golden"):
            text = "MET" if g["met"] else ("met within noise" if g["ok"] else "NOT MET")
            lines.append(f"learned {n} vs golden-range {g['slo_met']} (noise ±{g['noise']}), "
                         f">=: {b}{text}{b}")  # fmt: skip
    for v in data.get("peer_verdicts") or ():
        lines.append(f"whole run: {v['policy']} {v['ours']} SLO-met vs {v['peer']} "
                     f"{v['theirs']} (noise ±{v['noise']}): {b}{v['text']}{b}")  # fmt: skip
    return lines + _round_lines(data["whole"]) + _error_lines(data)


def _error_lines(data: dict[str, Any]) -> list[str]:
    """One line per policy whose requests ended in errors: how many of each kind, by phase."""
    lines = []
    for p, stats in data["policies"].items():
        parts = [f"phase {s['phase'] + 1} {kind} x {n}" for s in stats
                 for kind, n in sorted(s["errors_by_kind"].items())]  # fmt: skip
        if parts:
            lines.append(f"errors, {p}: {', '.join(parts)}")
    return lines


def _round_lines(whole: dict[str, Any]) -> list[str]:
    """Each policy's SLO-met count per round, and learned's (else golden-range's) ratio to each
    other policy round by round; nothing with one round. Every policy ran every round."""
    rounds = {p: w["per_round"] for p, w in whole.items()}
    if len(next(iter(rounds.values()))) < 2:
        return []
    lines = ["SLO-met per round (in the order run, the policies' order rotating): "
             + "; ".join(f"{p} {' / '.join(map(str, r))}" for p, r in rounds.items())]  # fmt: skip
    ours = next((p for p in (LEARNED, GOLDEN) if p in rounds), None)
    if ours is None:
        return lines
    for p, r in rounds.items():
        if p != ours:
            ratios = [f"{a / b:.2f}x" if b else "inf" for a, b in zip(rounds[ours], r, strict=True)]
            lines.append(f"{ours} / {p} per round: {', '.join(ratios)}")
    return lines


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(report["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        data = report["shapes"][shape]
        policies = list(data["policies"])
        width = 0.8 / len(policies)
        for k, p in enumerate(policies):
            xs = [i + k * width for i in range(len(data["users"]))]
            ax.bar(xs, [s["goodput"] for s in data["policies"][p]], width, label=p)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(data["users"]))])
        ax.set_xticklabels([f"{u} users" for u in data["users"]])
        ax.set_ylabel("goodput (SLO-met requests/s)")
        ax.set_title(f"{shape} shape")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _markdown(report: dict[str, Any], slo: Slo, how: tuple[float, int, float], name: str
              ) -> str:  # fmt: skip
    phase_s, rounds, speedup = how
    dep = report["deployment"]
    shift = (f"; their acceptance becomes {dep['shift'][1]}'s at {dep['shift'][0]:.0%} of a run"
             if dep["shift"] else "")  # fmt: skip
    ran = list(report["shapes"][next(iter(report["shapes"]))]["policies"])
    oracle = [p for p in ran if p.startswith(ORACLE_PREFIX)]
    ours = [p for p in ran if p in POLICIES]
    peers = report.get("peers")
    asked = peers["asked"] if peers else []
    flags = "".join(f" --shape {sh}" for sh in report["shapes"]) if len(
        report["shapes"]) != len(SHAPES) else ""  # fmt: skip
    flags += "".join(f" --policy {p}" for p in ours) if set(ours) != set(POLICIES) else ""
    flags += " --peers" if list(asked) == list(PEER_POLICIES) else "".join(
        f" --peer {p}" for p in asked)  # fmt: skip
    spread = ("; with one round there is no spread across rounds to show" if rounds == 1 else
              f"; the counts pool {rounds} rounds, the order rotating, each round's own count "
              "under each table")  # fmt: skip
    lines = [
        f"# Routing policies compared: {dep['name']} deployment",
        "",
        f"Command: `tiergate bench routing --deployment {dep['name']}"
        f"{f' --slo-class {cls}' if (cls := dep.get('slo_class')) else ''}"
        f" --phase-seconds {phase_s:g}"
        f" --rounds {rounds}{f' --speedup {speedup:g}' if speedup != 1 else ''}"
        f"{''.join(f' --oracle-limit {p[len(ORACLE_PREFIX) :]}' for p in oracle)}{flags}`  ",
        f"Date: {time.strftime('%Y-%m-%d')}. Deployment ({dep['about']}): "
        f"{' + '.join(dep['latency'])} (EAGLE-3) latency simulators{shift}, "
        f"{' + '.join(dep['throughput'])} throughput, one gateway per policy, policies"
        " alternating; `limit-L`: golden-range with the latency tier capped at L streams.  ",
        f"SLO: TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s * 1000:g} ms. Goodput = SLO-met "
        "requests per second; `n` = requests finished in the phase (the sample count); "
        "latency:throughput = how many of them each tier served.  ",
        "Noise: two SLO-met counts differ when they are further apart than twice the square root "
        f"of their sum (counting noise: the ± in the lines under each table){spread}.",
    ]
    if peers:
        versions = ", ".join(sorted(set(peers["versions"].values())))
        lines += [
            "",
            f"Peers: {', '.join(f'`{p}`' for p in peers['ran']) or 'none ran'}"
            f"{f' ({versions})' if versions else ''}, each in front of all three simulators "
            "(they know no tiers: every engine is a worker), in the same rotation as the "
            "policies. Their latency:throughput split is counted at the engines "
            "(vllm:request_success_total at each phase's start; a request finishing at a phase's "
            "edge may land in the next one). Every request carries the same prompt: a "
            "`cache_aware` policy sees one shared prefix, and the latency:throughput column "
            "shows where its requests went.",
            *(f"- Note: {n}" for n in peers["notes"]),
        ]
    lines += ["", f"![goodput per phase]({name}.png)", ""]
    for shape, data in report["shapes"].items():
        lines += [f"## {shape}", "", "| phase | users | policy | n | TTFT p50 | TTFT p99 | "
                  "TPOT p50 | TPOT p99 | tok/s | goodput/s | latency:throughput |",
                  "|" + "---|" * 11]  # fmt: skip
        for i, users in enumerate(data["users"]):
            for p, stats in data["policies"].items():
                s = stats[i]
                lines.append(
                    f"| {i + 1} | {users} | {p} | {s['requests']} "
                    f"| {ms_of_s(s['ttft_p50'], 0, ' ms')} "
                    f"| {ms_of_s(s['ttft_p99'], 0, ' ms')} | {ms_of_s(s['tpot_p50'], 0, ' ms')} | "
                    f"{ms_of_s(s['tpot_p99'], 0, ' ms')} | {s['tok_s']:.0f} | {s['goodput']:.2f} | "
                    f"{_tiers(s['by_tier'])} |"
                )
        lines.append("")
        lines += [f"- {line}" for line in _verdict_lines(data, bold=True)]
        lines.append("")
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------------


def _policies(names: list[str] | None) -> list[str] | None:
    return known(names, POLICY_NAMES)


def _peer_specs(specs: list[str] | None) -> list[str] | None:
    from loadtests.routing import peer_spec

    for spec in specs or ():
        try:
            peer_spec(spec)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return specs


def _deployments(values: list[str] | None) -> list[str] | None:
    from loadtests.harness.deployments import DEPLOYMENTS

    return known(values, tuple(DEPLOYMENTS))


def _slo_classes(values: list[str] | None) -> list[str] | None:
    from loadtests.harness.deployments import SLO_CLASSES

    return known(values, tuple(SLO_CLASSES))


def command(
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
            help="Deployments (loadtests/harness/deployments.py): little, tutorial, a-lot, shift "
            "(the "
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
    from loadtests.harness.deployments import SLO_CLASSES
    from loadtests.harness.phases import Slo

    specs = tuple(dict.fromkeys([*(PEER_POLICIES if peers else ()), *(peer or ())]))
    setup_logging("warning")
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
