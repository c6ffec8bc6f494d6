"""A wave of new chats on `tiergate up`'s latency engine, as the latency model reads it.

One `v4` simulator with prefix caching, as `tiergate up` starts it: 12 chats of 3 turns one
after another (`bench conversations`' solo phase), then the first turns of 30 chats at once (the
share of the crowd phase the gateway gave it). Every 0.25 s the engine's metrics page is read as
the gateway's monitor reads it; each interval is printed (running counts at its ends,
inter-token samples, mean step, prompt tokens computed) and fed to the latency model as it is
now and as it was at a3e5cac (its source from git), whose curves are printed after the first
turns and a second later.

Where the scrapes fall against the wave decides what an interval holds: each trial starts a
fresh engine and the chats a little further into a scrape interval. Usage, from the repository root:
python docs/results/routing-sim-prefill-wave/wave.py [TRIALS (8)]
"""

import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp

from gateway.backends import latency_model as now_model
from gateway.backends.learner import engine_sample
from gateway.wire.vllm.metrics import parse_vllm_metrics
from loadtests.conversations import MODEL, SYSTEM
from loadtests.harness.procs import SimProcess

SHOWN = (1, 8, 16, 24, 32)


def old_model() -> ModuleType:
    source = subprocess.run(["git", "show", "a3e5cac:gateway/backends/latency_model.py"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "latency_model_a3e5cac.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("latency_model_a3e5cac", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def curve(m: Any) -> str:
    p = m.prediction()
    if not p.known:
        return "nothing known"
    shown = "  ".join(f"{n}: {1000 * p.tpot.at(n):6.1f}" for n in SHOWN)
    return f"{shown}  (frontier {p.frontier})"


async def chat(s: aiohttp.ClientSession, url: str, name: str, turns: int) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{name} asks question {turn} " * 6})
        body = {"model": MODEL, "messages": messages, "max_tokens": 24}
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            reply = await r.json()
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


async def trial(offset: float) -> None:
    sim = SimProcess(profile="v4", args=("--prefix-caching",)).start()
    models = {"now": now_model.BackendModel(16.0, 3.0, 0.1, 2048.0),
              "a3e5cac": old_model().BackendModel(16.0, 3.0, 0.1, 2048.0)}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(12):
                await chat(s, sim.url, f"solo-{i}", 3)
            t0, last = time.monotonic(), None
            stop = asyncio.Event()

            async def scrape() -> None:
                nonlocal last
                while not stop.is_set():
                    async with s.get(f"{sim.url}/metrics") as r:
                        sample = engine_sample(parse_vllm_metrics(await r.text()))
                    t = time.monotonic() - t0
                    if last is not None and last.itl_count is not None:
                        assert sample.itl_count is not None
                        assert sample.itl_sum is not None
                        assert last.itl_sum is not None
                        samples = sample.itl_count - last.itl_count
                        spent = sample.itl_sum - last.itl_sum
                        step = spent / samples if samples else float("nan")
                        prompt = (sample.prefilled or 0.0) - (last.prefilled or 0.0)
                        n = (last.running + sample.running) / 2
                        odd = ("  <- no sample: nothing learned" if samples < 1 and n else
                               "  <- fewer samples than streams" if prompt and samples < n
                               else "")  # fmt: skip
                        print(f"{t:6.2f} s  running {last.running:4.0f} -> {sample.running:4.0f}"
                              f"  samples {samples:5.0f}  step {1000 * step:7.1f} ms"
                              f"  prompt tokens computed {prompt:7.0f}{odd}")  # fmt: skip
                    for m in models.values():
                        m.observe_engine(sample, t)
                    last = sample
                    await asyncio.sleep(0.25)

            scraper = asyncio.create_task(scrape())
            await asyncio.sleep(0.6 + offset)  # two quiet intervals first
            print(f"-- 30 chats start, {offset:.3f} s into a scrape interval")
            await asyncio.gather(*(chat(s, sim.url, f"crowd-{i}", 1) for i in range(30)))
            print("-- their first turns are answered; the latency model's TPOT (ms) at", SHOWN)
            for name, m in models.items():
                print(f"   {name:8s} {curve(m)}")
            await asyncio.sleep(1.0)
            stop.set()
            await scraper
            print("-- a second later")
            for name, m in models.items():
                print(f"   {name:8s} {curve(m)}")
    finally:
        sim.stop()


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    for i in range(trials):
        print(f"== trial {i + 1} of {trials}, a fresh engine")
        asyncio.run(trial(0.25 * i / trials))


if __name__ == "__main__":
    main()
