"""Fit a profile's cost parameters to measured cells (profiles/targets.yaml).

    python -m engines.sim.fit v3            # print the fit and the residuals
    python -m engines.sim.fit v3 --write    # also rewrite profiles/v3.yaml
    python -m engines.sim.fit all --write

The model is the real scheduler driven by the virtual-clock closed loop (engines.sim.virtual), so a
fitted profile reproduces the cells through the same code that serves requests. The parameters named
under `fit:` are optimised in log space by least squares on the log-ratios measured/target of the
`match:` cells; the rest of the profile stays as written. To refit from new measurements, edit the
`match:` cells (or point --targets at another file) and run it again.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engines.sim.profile import PROFILE_DIR, Profile, load_profile
from engines.sim.virtual import LoopResult, closed_loop

TARGETS = PROFILE_DIR / "targets.yaml"
METRICS = ("ttft_ms", "tpot_ms", "e2e_s", "tok_s")


@dataclass(frozen=True, slots=True)
class Cell:
    concurrency: int
    metric: str
    value: float


def measured(result: LoopResult, metric: str) -> float:
    if metric == "tok_s":
        return result.tok_s
    scale = 1000.0 if metric.endswith("_ms") else 1.0
    return result.median(metric.split("_")[0]) * scale


def cells(rows: Sequence[dict[str, Any]]) -> Iterator[Cell]:
    for row in rows:
        for m in METRICS:
            if m in row:
                yield Cell(int(row["concurrency"]), m, float(row[m]))


def load_targets(path: Path = TARGETS) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def evaluate(
    profile: Profile, targets: Sequence[Cell], workload: dict[str, int], requests_per_user: int = 5
) -> list[tuple[Cell, float]]:
    runs = {
        c: closed_loop(
            profile,
            c,
            prompt_tokens=workload["prompt_tokens"],
            output_tokens=workload["output_tokens"],
            requests_per_user=requests_per_user,
        )
        for c in sorted({t.concurrency for t in targets})
    }
    return [(t, measured(runs[t.concurrency], t.metric)) for t in targets]


def with_cost(profile: Profile, names: Sequence[str], values: Sequence[float]) -> Profile:
    cost = profile.cost.model_copy(update=dict(zip(names, values, strict=True)))
    return profile.model_copy(update={"cost": cost})


def fit(
    profile: Profile, spec: dict[str, Any], workload: dict[str, int], requests_per_user: int
) -> Profile:
    from scipy.optimize import least_squares  # optional dependency (the dev extra)

    names: list[str] = list(spec["fit"])
    targets = list(cells(spec["match"]))
    # Zero-valued starting points have no log: start them small instead.
    x0 = [math.log(max(getattr(profile.cost, n), 1e-5)) for n in names]

    def residuals(x: Sequence[float]) -> list[float]:
        p = with_cost(profile, names, [math.exp(v) for v in x])
        return [math.log(m / t.value) for t, m in evaluate(p, targets, workload, requests_per_user)]

    res = least_squares(residuals, x0, diff_step=0.02, xtol=1e-6, ftol=1e-6, max_nfev=300)
    values = [float(f"{math.exp(v):.4g}") for v in res.x]
    return with_cost(profile, names, values)


def report(
    name: str,
    profile: Profile,
    spec: dict[str, Any],
    workload: dict[str, int],
    requests_per_user: int,
) -> None:
    print(f"profile {name}: " + ", ".join(f"{k}={v:.4g}" for k, v in profile.cost))
    for cell, m in evaluate(profile, list(cells(spec["match"])), workload, requests_per_user):
        print(
            f"  c={cell.concurrency:<3} {cell.metric:8} target {cell.value:>8g}  "
            f"model {m:>9.4g}  ratio {m / cell.value:.3f}"
        )


def write_profile(profile: Profile) -> Path:
    path = PROFILE_DIR / f"{profile.name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["cost"] = {
        k: v
        for k, v in profile.cost.model_dump().items()
        if v != 0.0 or k in ("base_s", "per_token_s")
    }
    if data["cost"].get("ridge_tokens", 0) >= 1e9:
        data["cost"].pop("ridge_tokens")
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    return path


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("profile", help="profile name, or 'all' for every profile in targets.yaml")
    ap.add_argument("--targets", type=Path, default=TARGETS)
    ap.add_argument("--write", action="store_true", help="write the fitted costs to the profile")
    args = ap.parse_args(argv)
    data = load_targets(args.targets)
    names = list(data["profiles"]) if args.profile == "all" else [args.profile]
    for name in names:
        spec = data["profiles"][name]
        rpu = int(data["requests_per_user"])
        fitted = fit(load_profile(name), spec, data["workload"], rpu)
        report(name, fitted, spec, data["workload"], rpu)
        if args.write:
            print(f"  wrote {write_profile(fitted)}")


if __name__ == "__main__":
    main()
