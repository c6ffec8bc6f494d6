"""Reads what guidellm and inference-perf wrote (run.sh) and writes OUT/README.md and
OUT/summary.json: requests, errors, and every request's prompt and answer length by the
client's own count, by the words actually sent and received (the simulator's and the
tokenizer's rule), and by the usage the gateway relayed (inference-perf keeps it per request;
guidellm reports the usage where the server sends it and its own count otherwise, as one
figure). Exact means every request had the lengths asked for in every count. The clients'
files are first rewritten without this machine's folders and kernel name (`scrub`).

    python summarize.py OUT HEADER WORK   (WORK: the run's temporary folder)"""

from __future__ import annotations

import json
import platform
import sys
from collections import Counter
from pathlib import Path
from typing import Any

PROMPT, OUTPUT = 50, 32


def _lengths(rows: list[tuple[int | None, ...]]) -> dict[str, int]:
    return {"/".join(map(str, k)): v for k, v in sorted(Counter(rows).items(), key=str)}


def guidellm(out: Path) -> dict[str, Any]:
    bench = json.loads((out / "guidellm" / "benchmarks.json").read_text())["benchmarks"][0]
    reqs = bench["requests"]
    rows = []
    for r in reqs["successful"]:
        body = json.loads(r["request_args"])["body"]
        rows.append((r["prompt_tokens"], len(body["prompt"].split()),
                     r["output_tokens"], len((r["output"] or "").split())))  # fmt: skip
    return {
        "client": "guidellm",
        "counts": "prompt: guidellm's / words sent; answer: guidellm's / words received",
        "ok": len(reqs["successful"]),
        "errors": len(reqs["errored"]) + len(reqs["incomplete"]),
        "lengths": _lengths(rows),
        "exact": bool(rows) and all(r == (PROMPT, PROMPT, OUTPUT, OUTPUT) for r in rows),
    }


def inference_perf(out: Path) -> dict[str, Any]:
    per = json.loads((out / "inference-perf" / "per_request_lifecycle_metrics.json").read_text())
    rows, errors = [], 0
    for r in per:
        if r.get("error"):
            errors += 1
            continue
        info, usage = r["info"], r["info"]["response_metrics"]["server_usage"] or {}
        rows.append((info["request_metrics"]["text"]["input_tokens"],
                     len(json.loads(r["request"])["prompt"].split()),
                     usage.get("prompt_tokens"), info["response_metrics"]["output_tokens"],
                     usage.get("completion_tokens")))  # fmt: skip
    return {
        "client": "inference-perf",
        "counts": "prompt: inference-perf's / words sent / usage; answer: inference-perf's / usage",
        "ok": len(rows),
        "errors": errors,
        "lengths": _lengths(rows),
        "exact": bool(rows) and all(r == (PROMPT,) * 3 + (OUTPUT,) * 2 for r in rows),
    }


def scrub(out: Path, work: str) -> None:
    """The clients' files name this machine (its folders, its kernel): written without them,
    so that the results say nothing of where they ran beyond what the header says."""
    names = {work: "TMP", str(out.resolve()): "docs/results/field-clients",
             platform.platform(): f"{platform.system()} {platform.machine()}"}  # fmt: skip
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in {".json", ".yaml", ".txt"}:
            text = original = path.read_text()
            for name, put in names.items():
                text = text.replace(name, put)
            if text != original:
                path.write_text(text)


def main(out: Path, header: str, work: str) -> None:
    scrub(out, work)
    results = [guidellm(out), inference_perf(out)]
    (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# guidellm and inference-perf against `tiergate up`",
        "",
        header,
        "",
        f"Each client asked for prompts of {PROMPT} tokens and answers of {OUTPUT} "
        "(`ignore_eos`), streamed `/v1/completions`, counted by a tokenizer of one token per "
        "whitespace-separated word (scripts/field-clients/tokenizer.py: the simulator's rule, "
        "nothing from a model hub).",
        "",
        "| client | requests ok | errors | lengths (count: requests) | what the lengths are "
        "| exact |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lengths = ", ".join(f"{k}: {v}" for k, v in r["lengths"].items())
        lines.append(f"| {r['client']} | {r['ok']} | {r['errors']} | {lengths} | {r['counts']} | "
                     f"{'yes' if r['exact'] else 'NO'} |")  # fmt: skip
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not all(r["exact"] and not r["errors"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
