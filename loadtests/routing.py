"""`tiergate bench routing`: the routing policies compared on one simulated deployment.

One v4 (EAGLE-3) latency instance and two v3 (AWQ) throughput instances; one gateway per policy
in front of the same engines. The step shape (1 -> 16 -> 32 -> 64 -> 16 -> 1 users) and the burst
shape (8 users with spikes to 64) run once per policy, the policies alternating (their order
rotates every round) and the engines drained between runs. Per phase: TTFT and TPOT p50/p99,
output tokens/s, and goodput: requests per second that met every SLO (default TTFT <= 1 s and
TPOT <= 25 ms). Goodput differences are judged against counting noise: two counts differ when they
are further apart than twice the square root of their sum.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gateway.routing import POLICY_NAMES, PolicyName
from loadtests.phases import SHAPES, PhaseStats, Run, Slo, phase_stats, run_phases
from loadtests.stack import MODEL, Stack, add_gateway, start_stack

POLICIES = POLICY_NAMES
GOLDEN: PolicyName = "golden-range"


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
) -> dict[str, Any]:
    console = console or Console()
    slo = slo or Slo()
    runs: dict[tuple[str, str], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="tiergate-routing-") as tmp:
        stack = start_stack(Path(tmp), latency=1, throughput=2, speedup=speedup, gateways=0)
        try:
            gateways = {
                p: add_gateway(stack, Path(tmp), f"gw-{p}", log_level="warning",
                               policy={"name": p}).url
                for p in policies
            }  # fmt: skip
            total = rounds * sum(len(SHAPES[s]) for s in shapes) * len(policies) * phase_s
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("routing benchmark", total=total)
                for r in range(rounds):
                    order = policies[r % len(policies) :] + policies[: r % len(policies)]
                    for shape in shapes:
                        for policy in order:
                            progress.update(task, description=f"{shape} / {policy}")
                            _wait_idle(stack)
                            results, starts = asyncio.run(run_phases(
                                gateways[policy] + "/v1/completions", SHAPES[shape], phase_s,
                                prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                model=MODEL,
                            ))  # fmt: skip
                            runs.setdefault((shape, policy), []).append((results, starts))
                            progress.advance(task, len(SHAPES[shape]) * phase_s)
        finally:
            stack.stop()
    report = _report(runs, shapes, policies, slo, speedup)
    _print(console, report, slo)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "routing.json").write_text(json.dumps(report, indent=2))
        _plot(report, out_dir / "routing.png")
        (out_dir / "routing.md").write_text(_markdown(report, slo, phase_s, rounds, speedup))
    return report


def _report(
    runs: dict[tuple[str, str], list[Run]],
    shapes: tuple[str, ...],
    policies: tuple[str, ...],
    slo: Slo,
    speedup: float,
) -> dict[str, Any]:
    report: dict[str, Any] = {"slo": asdict(slo), "shapes": {}}
    for shape in shapes:
        per_policy: dict[str, list[PhaseStats]] = {
            p: phase_stats(runs[(shape, p)], SHAPES[shape], slo, speedup) for p in policies
        }
        verdicts = []
        for i in range(len(SHAPES[shape])):
            met = {p: round(s[i].goodput * s[i].seconds) for p, s in per_policy.items()}
            verdicts.append(_verdict(met) if GOLDEN in met and len(met) > 1 else None)
        whole = {p: sum(round(x.goodput * x.seconds) for x in s) for p, s in per_policy.items()}
        seconds = {p: sum(x.seconds for x in s) for p, s in per_policy.items()}
        report["shapes"][shape] = {
            "users": list(SHAPES[shape]),
            "policies": {p: [asdict(x) for x in s] for p, s in per_policy.items()},
            "phase_verdicts": verdicts,
            "whole": {p: {"slo_met": whole[p], "goodput": whole[p] / seconds[p]} for p in policies},
            "whole_verdict": _verdict(whole, strict=True)
            if GOLDEN in whole and len(whole) > 1
            else None,
        }
    return report


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
                tiers = f"{s['by_tier'].get('latency', 0)}:{s['by_tier'].get('throughput', 0)}"
                t.add_row(str(i + 1), str(users), p, str(s["requests"]), str(s["errors"]),
                          _ms(s["ttft_p50"]), _ms(s["ttft_p99"]), _ms(s["tpot_p50"]),
                          _ms(s["tpot_p99"]), f"{s['tok_s']:.0f}", f"{s['goodput']:.2f}",
                          tiers, end_section=p == list(data["policies"])[-1])  # fmt: skip
        console.print(t)
        for line in _verdict_lines(data):
            console.print(f"  {line}")


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
    return lines


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


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


def _markdown(report: dict[str, Any], slo: Slo, phase_s: float, rounds: int,
              speedup: float) -> str:  # fmt: skip
    lines = [
        "# Routing policies compared",
        "",
        f"Command: `tiergate bench routing --phase-seconds {phase_s:g} --rounds {rounds}"
        f"{f' --speedup {speedup:g}' if speedup != 1 else ''}`  ",
        f"Date: {time.strftime('%Y-%m-%d')}. Deployment: 1 x v4 (EAGLE-3) latency + 2 x v3 (AWQ) "
        "throughput simulators, one gateway per policy, policies alternating.  ",
        f"SLO: TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s * 1000:g} ms. Goodput = SLO-met "
        "requests per second; `n` = requests finished in the phase (the sample count).",
        "",
        "![goodput per phase](routing.png)",
        "",
    ]
    for shape, data in report["shapes"].items():
        lines += [f"## {shape}", "", "| phase | users | policy | n | TTFT p50 | TTFT p99 | "
                  "TPOT p50 | TPOT p99 | tok/s | goodput/s |", "|" + "---|" * 10]  # fmt: skip
        for i, users in enumerate(data["users"]):
            for p, stats in data["policies"].items():
                s = stats[i]
                lines.append(
                    f"| {i + 1} | {users} | {p} | {s['requests']} | {_ms(s['ttft_p50'])} "
                    f"| {_ms(s['ttft_p99'])} | {_ms(s['tpot_p50'])} | "
                    f"{_ms(s['tpot_p99'])} | {s['tok_s']:.0f} | {s['goodput']:.2f} |"
                )
        lines.append("")
        lines += [f"- {line}" for line in _verdict_lines(data, bold=True)]
        lines.append("")
    return "\n".join(lines)
