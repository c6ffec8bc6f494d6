"""Per run and round: tiergate's and vLLM's router's CPU per paced small request, per
small request under wrk and per 64-token stream, and tiergate's ratio to the router."""

import json
import statistics
import sys
from pathlib import Path

FIGS = (("cpu_paced_ms", "paced small"), ("cpu_ms", "small, wrk"), ("sse_cpu_ms", "stream, wrk"))
for run in sys.argv[1:]:
    figs = json.loads((Path(run) / "peers.json").read_text())["figures"]
    print(f"## {Path(run).name}")
    for key, label in FIGS:
        tg, vr = figs["tiergate"][key]["rounds"], figs["vllm-router"][key]["rounds"]
        ratios = [a / b for a, b in zip(tg, vr, strict=True)]
        print(
            f"{label:12s} tiergate {' / '.join(f'{x:.3f}' for x in tg)} ms;"
            f" router {' / '.join(f'{x:.3f}' for x in vr)} ms;"
            f" ratio per round {' / '.join(f'{r:.2f}' for r in ratios)},"
            f" of medians {statistics.median(tg) / statistics.median(vr):.2f}x"
        )
