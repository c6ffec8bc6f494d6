"""Summarize per-request JSONL records (from loadtests/locustfile.py) into a percentile table.

The JSONL files, not Locust's own statistics, are the source of truth: Locust buckets response
times (whole ms below 100 ms, 10 ms steps up to 1 s, 100 ms steps above), which is too coarse for
TPOT. Percentiles here use linear interpolation between order statistics (numpy's default).

    python -m loadtests.summarize runs/locust-*.jsonl [--slo-ttft 1.0] [--slo-tpot 0.025]
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

Record = Mapping[str, Any]
ALL = "all"  # the tier of a label's aggregate row


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    tier: str
    users: int | None  # only when grouping by active users
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


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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
    by_users: bool = False,
    warmup_s: float = 0.0,
) -> list[Row]:
    """One row per (label, tier[, active users]), plus an `all` row per label with several tiers.

    `warmup_s` drops the requests sent in the first seconds of each label's run (ramp-up)."""
    recs = list(records)
    first: dict[str, float] = {}
    for r in recs:
        label = str(r.get("label") or "-")
        first[label] = min(first.get(label, math.inf), float(r.get("ts") or 0.0))
    groups: dict[tuple[str, str, int | None], list[Record]] = {}
    for r in recs:
        label = str(r.get("label") or "-")
        if warmup_s and float(r.get("ts") or 0.0) < first[label] + warmup_s:
            continue
        users = int(r["users"]) if by_users and r.get("users") is not None else None
        tier = str(r.get("tier") or "-")
        groups.setdefault((label, tier, users), []).append(r)
        groups.setdefault((label, ALL, users), []).append(r)
    rows: list[Row] = []
    for (label, tier, users), group in sorted(groups.items(), key=_order):
        tiers = {k[1] for k in groups if k[0] == label and k[2] == users and k[1] != ALL}
        if tier == ALL and len(tiers) < 2:
            continue  # same as the single tier's row
        rows.append(summarize_group(label, tier, users, group, slo_ttft, slo_tpot))
    return rows


def _order(item: tuple[tuple[str, str, int | None], list[Record]]) -> tuple[str, int, int, str]:
    label, tier, users = item[0]
    return (label, -1 if users is None else users, tier == ALL, tier)


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.1f}"


def _num(x: float, fmt: str = ".1f") -> str:
    return "-" if math.isnan(x) else format(x, fmt)


def format_table(rows: Sequence[Row], slo_ttft: float = 1.0, slo_tpot: float = 0.025) -> str:
    """A fixed-width table; times in ms."""
    has_users = any(r.users is not None for r in rows)
    head = ["label", "tier", *(["users"] if has_users else []), "n", "fail",
            "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99",
            "tok/s", "req/s", "good %", "good/s"]  # fmt: skip
    body = [
        [
            r.label,
            r.tier,
            *([str(r.users or "-")] if has_users else []),
            str(r.n),
            str(r.failed),
            _ms(r.ttft_p50),
            _ms(r.ttft_p99),
            _ms(r.tpot_p50),
            _ms(r.tpot_p99),
            _ms(r.e2e_p50),
            _ms(r.e2e_p99),
            _num(r.tok_s),
            _num(r.req_s, ".2f"),
            _num(r.goodput_share * 100, ".0f"),
            _num(r.goodput_rate, ".2f"),
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    text_cols = 3 if has_users else 2

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
        prog="python -m loadtests.summarize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="+", help="JSONL files written by loadtests/locustfile.py")
    ap.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT SLO in seconds (1.0)")
    ap.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT SLO in seconds (0.025)")
    ap.add_argument(
        "--by-users",
        action="store_true",
        help="also group by the number of users active when each request was sent "
        "(per load-generator process), e.g. per phase of the step scenario",
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
        by_users=args.by_users,
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
