"""Summarize per-request JSONL records (from loadtests/locust/locustfile.py) into a percentile
table.

The JSONL files, not Locust's own statistics, are the source of truth: Locust buckets response
times (whole ms below 100 ms, 10 ms steps up to 1 s, 100 ms steps above), which is too coarse for
TPOT. Percentiles here use linear interpolation between order statistics (numpy's default).

    python -m loadtests.locust.summarize runs/locust-*.jsonl [--slo-ttft 1.0] [--slo-tpot 0.025]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests.common.stats import ms_of_s, percentile

Record = Mapping[str, Any]
ALL = "all"  # the tier of a label's aggregate row


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    tier: str
    phase: int | None  # only with by_phase: index of the run of records with the same users
    users: int | None
    n: int  # requests, failed included
    failed: int
    window_s: float  # first request sent -> last request done
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    e2e_p50: float
    e2e_p99: float
    tok_s: float  # output tokens / window
    req_s: float  # completed requests / window
    good: int  # requests meeting both SLOs
    goodput_share: float  # good / n
    goodput_rate: float  # good / window (req/s)






def load(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of the given JSONL files; blank or truncated lines (a killed writer) skipped."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    return out


def meets_slo(rec: Record, slo_ttft: float, slo_tpot: float) -> bool:
    """Both SLOs met; a request with no TPOT (one token, or non-streaming) passes on TTFT alone."""
    if not rec.get("ok"):
        return False
    ttft, tpot = rec.get("ttft_s"), rec.get("tpot_s")
    return ttft is not None and ttft <= slo_ttft and (tpot is None or tpot <= slo_tpot)


def _values(recs: Sequence[Record], key: str) -> list[float]:
    return [float(v) for r in recs if r.get("ok") and (v := r.get(key)) is not None]


def summarize_group(
    label: str,
    tier: str,
    phase: int | None,
    users: int | None,
    recs: Sequence[Record],
    slo_ttft: float,
    slo_tpot: float,
) -> Row:
    starts = [float(r["ts"]) for r in recs if r.get("ts") is not None]
    ends = [float(r["ts"]) + float(r["e2e_s"]) for r in recs if r.get("ok") and r.get("e2e_s")]
    window = (max(ends) - min(starts)) if starts and ends else 0.0
    done = [r for r in recs if r.get("ok")]
    tokens = sum(int(r.get("output_tokens") or 0) for r in done)
    good = sum(meets_slo(r, slo_ttft, slo_tpot) for r in recs)
    ttft, tpot, e2e = (_values(recs, k) for k in ("ttft_s", "tpot_s", "e2e_s"))

    def rate(x: float) -> float:
        return x / window if window > 0 else math.nan

    return Row(
        label=label,
        tier=tier,
        phase=phase,
        users=users,
        n=len(recs),
        failed=len(recs) - len(done),
        window_s=window,
        ttft_p50=percentile(ttft, 50),
        ttft_p99=percentile(ttft, 99),
        tpot_p50=percentile(tpot, 50),
        tpot_p99=percentile(tpot, 99),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        tok_s=rate(tokens),
        req_s=rate(len(done)),
        good=good,
        goodput_share=good / len(recs) if recs else math.nan,
        goodput_rate=rate(good),
    )


def summarize(
    records: Iterable[Record],
    *,
    slo_ttft: float = 1.0,
    slo_tpot: float = 0.025,
    by_phase: bool = False,
    warmup_s: float = 0.0,
) -> list[Row]:
    """One row per (label, tier), plus an `all` row per label with several tiers.

    `by_phase` splits each label into phases, the runs of consecutive requests (by send time)
    sent with the same target number of users (the `users` field): the steps of a load shape.
    `warmup_s` drops the requests sent in the first seconds of each label's run (ramp-up)."""
    by_label: dict[str, list[Record]] = {}
    for r in records:
        by_label.setdefault(str(r.get("label") or "-"), []).append(r)
    groups: dict[tuple[str, int | None, int | None, str], list[Record]] = {}
    for label, recs in by_label.items():
        recs.sort(key=lambda r: float(r.get("ts") or 0.0))
        start = float(recs[0].get("ts") or 0.0)
        phase, prev = -1, object()
        for r in recs:
            users = r.get("users")
            if users != prev:
                phase, prev = phase + 1, users
            if warmup_s and float(r.get("ts") or 0.0) < start + warmup_s:
                continue
            key_phase, key_users = (phase, users) if by_phase else (None, None)
            tier = str(r.get("tier") or "-")
            groups.setdefault((label, key_phase, key_users, tier), []).append(r)
            groups.setdefault((label, key_phase, key_users, ALL), []).append(r)
    rows: list[Row] = []
    for (label, p, u, tier), group in sorted(groups.items(), key=_order):
        tiers = {k[3] for k in groups if k[:3] == (label, p, u) and k[3] != ALL}
        if tier == ALL and len(tiers) < 2:
            continue  # same as the single tier's row
        rows.append(summarize_group(label, tier, p, u, group, slo_ttft, slo_tpot))
    return rows


def _order(
    item: tuple[tuple[str, int | None, int | None, str], list[Record]],
) -> tuple[str, int, bool, str]:
    label, phase, _, tier = item[0]
    return (label, -1 if phase is None else phase, tier == ALL, tier)


def _num(x: float, fmt: str = ".1f") -> str:
    return "-" if math.isnan(x) else format(x, fmt)


def format_table(rows: Sequence[Row], slo_ttft: float = 1.0, slo_tpot: float = 0.025) -> str:
    """A fixed-width table; times in ms."""
    phased = any(r.phase is not None for r in rows)
    head = ["label", *(["phase", "users"] if phased else []), "tier", "n", "fail",
            "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99",
            "tok/s", "req/s", "good %", "good/s"]  # fmt: skip
    body = [
        [
            r.label,
            *([str(r.phase), str(r.users)] if phased else []),
            r.tier,
            str(r.n),
            str(r.failed),
            ms_of_s(r.ttft_p50),
            ms_of_s(r.ttft_p99),
            ms_of_s(r.tpot_p50),
            ms_of_s(r.tpot_p99),
            ms_of_s(r.e2e_p50),
            ms_of_s(r.e2e_p99),
            _num(r.tok_s),
            _num(r.req_s, ".2f"),
            _num(r.goodput_share * 100, ".0f"),
            _num(r.goodput_rate, ".2f"),
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    text_cols = 4 if phased else 2

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < text_cols else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    lines = [fmt(head), *(fmt(b) for b in body)]
    lines.append(
        f"times in ms; goodput: TTFT <= {slo_ttft * 1000:g} ms and TPOT <= {slo_tpot * 1000:g} ms"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtests.locust.summarize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="+",
                    help="JSONL files written by loadtests/locust/locustfile.py")  # fmt: skip
    ap.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT SLO in seconds (1.0)")
    ap.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT SLO in seconds (0.025)")
    ap.add_argument(
        "--by-phase",
        action="store_true",
        help="one row per phase: run of requests sent with the same target number of users "
        "(the steps of a load shape)",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        metavar="S",
        help="drop requests sent in the first S seconds of each label",
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = ap.parse_args(argv)
    records = load(args.files)
    if not records:
        print("no records", file=sys.stderr)
        return 1
    rows = summarize(
        records,
        slo_ttft=args.slo_ttft,
        slo_tpot=args.slo_tpot,
        by_phase=args.by_phase,
        warmup_s=args.warmup,
    )
    if args.json:
        for row in rows:
            clean = {k: None if isinstance(v, float) and math.isnan(v) else v
                     for k, v in asdict(row).items()}  # fmt: skip
            print(json.dumps(clean))
    else:
        print(format_table(rows, args.slo_ttft, args.slo_tpot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
