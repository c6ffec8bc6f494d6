"""`tiergate bench chaos`: faults injected into a simulated deployment under streaming load, and
what the clients and the operators see: the faults the README's Reliability section promises
to absorb, judged against its goals.

Every scenario starts a fresh deployment: one latency `v4` (EAGLE-3) and two throughput `v3`
simulators (`--speedup 4`) behind one gateway at its default settings, except what the scenario
needs (a Redis state store for `redis-loss`, a 1 s pre-stop delay for `gateway-restart`). Closed-
loop users stream completions through the gateway (`ignore_eos` with a fixed `max_tokens`, and
`stream_options.include_usage`), so that every stream's completeness is checkable: a stream is OK
when it carries exactly `max_tokens` tokens of text (one word per token in the simulator), one
`id`, a final usage of `max_tokens`, no error event, and ends with `[DONE]`. A request answered
with another status (or whose connection failed) *failed before the first byte*; a 200 that is not
complete is a *cut stream*. A user pauses 0.25 s after a request that was not OK, so that a
failing deployment is not driven in a tight loop.

The timeline of a scenario of `--seconds S`: load from 0; the fault at 0.2 S on the first
throughput instance (the victim; `wrong-key` is faulty from the start, `all-failing` faults every
engine); the fault cleared at 0.6 S; the load goes on to S, or, where the victim was ejected, until
it has been back in full rotation for 3 s (not ejected, not on probation; at most `readmit_wait_s`
after the clear). Then the users finish the streams they have open (nothing is cut by the bench;
a stream silent for 30 s is given up and counted as cut).

Measured per scenario: requests sent, OK, failed, cut; streams continued
(`tiergate_continuations_total{outcome="continued"}`); the longest silence any client saw
between two events of a stream; time to eject (fault -> /state shows the victim ejected, polled
at 20 Hz) and to re-admit (clear -> back in full rotation for good); TTFT p50/p99 of the OK
streams sent between the fault and its clear (the same window in `healthy`, the reference); and
upstream attempts per client request in that window (`tiergate_attempts_total`, every outcome).
Each stack's process logs are kept (`--logs`), and the gateway's are summarised in the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
import typer
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from loadtests.common.options import known, setup_logging
from loadtests.common.report import bars, revision
from loadtests.common.stats import json_safe, ms_of_s, percentile
from loadtests.harness.client import prompt_of
from loadtests.harness.procs import GatewayProcess, SimProcess, free_port
from loadtests.harness.stack import MODEL

REPO = Path(__file__).resolve().parents[1]

SPEEDUP = 4.0
MAX_TOKENS = 1024  # ~1.5-2 s a stream at speedup 4: a fault always finds streams in flight
PROMPT_TOKENS = 50
RESTART_STREAMS = 20  # gateway-restart: streams in flight at SIGTERM
PRE_STOP_S = 1.0  # gateway-restart's shutdown.pre_stop_delay_s (default 5), to keep the run short
ENGINE_KEY = "chaos-engine-key"  # wrong-key: what the engine wants; the gateway sends nothing
POLL_S = 0.05  # /state at 20 Hz
FAIL_PAUSE_S = 0.25
CLIENT_SILENCE_S = 30.0  # a client gives up on a stream silent this long
SETTLE_S = 3.0  # back in rotation this long before a scenario may end
FAULT_AT, CLEAR_AT = 0.2, 0.6  # of --seconds

# The reliability goals' thresholds.
SILENCE_LIMIT_S = 5.0
TTFT_RATIO_LIMIT = 2.0
AMPLIFICATION_LIMIT = 1.2

Outcome = Literal["ok", "failed", "cut"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fault: str  # what is done, for --help and the report
    clear: str | None  # what ends it (at 0.6 S); None: it lasts the whole run


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy", "no fault: the reference for TTFT", "nothing (the same window)"),
    Scenario("crash", "SIGKILL of a throughput simulator", "a new simulator on the same port"),
    Scenario("freeze", "SIGSTOP of a throughput simulator", "SIGCONT"),
    Scenario(
        "stalled",
        "hang fault on a throughput simulator: it stops generating, /health and /metrics still "
        "answer",
        "the simulator restarted on its port (its hang fault is for good)",
    ),
    Scenario(
        "errors-500", "a throughput simulator answers 500 to half its requests", "error_rate 0"
    ),
    Scenario(
        "wrong-key",
        "a throughput simulator started with --api-key the gateway does not know, from the start",
        None,
    ),
    Scenario(
        "refusing-503",
        "a throughput simulator answers 503 to every request, /health 200",
        "error_rate 0",
    ),
    Scenario(
        "slow-first-token",
        "a throughput simulator waits 5 s before every first token",
        "slow_first_token_s 0",
    ),
    Scenario(
        "gateway-restart",
        f"{RESTART_STREAMS} users; SIGTERM to the gateway (pre-stop delay {PRE_STOP_S:g} s); "
        "once it exits, a new gateway on the same port",
        None,
    ),
    Scenario(
        "redis-loss",
        "the gateway's Redis state store SIGKILLed",
        "a new redis-server on the same port",
    ),
    Scenario("all-failing", "every engine answers 500 to every request", "error_rate 0"),
)
SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)


def scenario(name: str) -> Scenario:
    (found,) = [s for s in SCENARIOS if s.name == name]
    return found


@dataclass(frozen=True)
class Options:
    scenarios: tuple[str, ...] = SCENARIO_NAMES
    seconds: float = 30.0
    users: int = 48
    out: Path | None = Path("docs/results")
    logs: Path | None = None  # where the processes' logs stay (default: a new temporary folder)
    speedup: float = SPEEDUP
    max_tokens: int = MAX_TOKENS
    readmit_wait_s: float = 45.0
    chart: bool = True
    command: str | None = None  # as shown in the report; default: the options spelled out


# --- processes ------------------------------------------------------------------------------


@dataclass
class RedisServer:
    """A redis-server on loopback, persistence off, that can be killed and started again on its
    port (a crash of the shared state store)."""

    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.port = self.port or free_port()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir),
                "--logfile", str(self.workdir / "redis.log")]  # fmt: skip
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _stop_gateway(gw: GatewayProcess) -> None:
    """SIGTERM twice (the second skips the pre-stop delay and the drain: nothing is left to
    drain here), then SIGKILL if it still runs."""
    proc = gw.proc
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Deployment:
    """One scenario's processes: 1 latency + 2 throughput simulators, a gateway, maybe Redis."""

    workdir: Path
    latency: SimProcess
    throughput: list[SimProcess]
    config: Path
    gateway: GatewayProcess | None = None
    redis: RedisServer | None = None
    gateways: list[GatewayProcess] = field(default_factory=list)  # every one started

    @property
    def sims(self) -> list[SimProcess]:
        return [self.latency, *self.throughput]

    @property
    def victim(self) -> SimProcess:
        return self.throughput[0]

    def start_gateway(self, port: int = 0) -> GatewayProcess:
        n = len(self.gateways)
        gw = GatewayProcess(config=self.config, port=port, log=self.workdir / f"gateway-{n}.log")
        self.gateways.append(gw)
        self.gateway = gw.start(timeout=30)
        return gw

    def stop(self) -> None:
        for sim in self.sims:  # a stopped process would sit on SIGTERM until the grace ran out
            if sim.alive():
                with contextlib.suppress(OSError):
                    os.kill(sim.pid, signal.SIGCONT)
        for gw in self.gateways:
            _stop_gateway(gw)
        for sim in self.sims:
            sim.stop()
        if self.redis is not None:
            self.redis.kill()


def deploy(workdir: Path, name: str, opts: Options) -> Deployment:
    """Start the scenario's processes; the gateway at its defaults but for what `name` needs."""
    workdir.mkdir(parents=True, exist_ok=True)
    speed = ["--speedup", f"{opts.speedup:g}"]
    sims = [SimProcess(profile="v4", args=speed, log=workdir / "sim-latency.log")]
    for i in range(2):
        key = ["--api-key", ENGINE_KEY] if name == "wrong-key" and i == 0 else []
        sims.append(SimProcess(profile="v3", args=[*speed, *key],
                               log=workdir / f"sim-throughput-{i}.log"))  # fmt: skip
    dep = Deployment(workdir, sims[0], sims[1:], workdir / "gateway.yaml")
    try:
        for sim in sims:
            sim.start()
        settings: dict[str, Any] = {}
        if name == "redis-loss":
            dep.redis = RedisServer(workdir).start()
            settings["redis_url"] = dep.redis.url
        if name == "gateway-restart":
            settings["shutdown"] = {"pre_stop_delay_s": PRE_STOP_S}
        tiers = [{"name": tier, "role": role,
                  "backends": [{"url": s.url, "models": [MODEL]} for s in group]}
                 for tier, role, group in (("eagle", "latency", [dep.latency]),
                                           ("awq", "throughput", dep.throughput))]  # fmt: skip
        dep.config.write_text(yaml.safe_dump({"tiers": tiers, **settings}))
        dep.start_gateway()
    except BaseException:
        dep.stop()
        raise
    return dep


# --- the clients ----------------------------------------------------------------------------


@dataclass(slots=True)
class Stream:
    """One client request and what came back."""

    user: int
    sent: float
    status: int = 0  # 0: no answer (the connection failed)
    ended: float = 0.0
    ttft: float | None = None
    words: int = 0
    usage: int | None = None
    ids: set[str] = field(default_factory=set)
    done: bool = False  # [DONE] came
    error: str | None = None  # an error event, the answer of a non-200, or the client's error
    silence: float = 0.0  # the longest gap between two events (or the last one and the end)

    def outcome(self, max_tokens: int) -> Outcome:
        if self.status != 200:
            return "failed"
        whole = (self.done and self.error is None and len(self.ids) == 1
                 and self.words == max_tokens and self.usage == max_tokens)  # fmt: skip
        return "ok" if whole else "cut"

    def why(self, max_tokens: int) -> str:
        """What was wrong with it, as a short category."""
        if self.status != 200:
            if self.status:
                return f"HTTP {self.status}"
            return (self.error or "no answer").split(":")[0]
        if self.error is not None:
            if self.error.startswith("{"):  # an SSE error event
                return "error event before any text" if not self.words else "error event mid-stream"
            return self.error.split(":")[0]
        if not self.done:
            return "no [DONE]"
        if len(self.ids) != 1:
            return f"{len(self.ids)} ids"
        if self.words != max_tokens:
            return "wrong token count"
        return "wrong usage"


def _event(s: Stream, event: dict[str, Any], now: float) -> None:
    if "error" in event:
        s.error = json.dumps(event["error"])[:300]
        return
    if "id" in event:
        s.ids.add(str(event["id"]))
    if event.get("usage"):
        s.usage = int(event["usage"].get("completion_tokens", -1))
    for choice in event.get("choices") or ():
        text = choice.get("text")
        if text:
            s.words += len(text.split())
            if s.ttft is None:
                s.ttft = now - s.sent


async def stream_once(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], s: Stream
) -> None:
    last = s.sent
    try:
        async with session.post(url, json=body) as resp:
            s.status = resp.status
            if resp.status != 200:
                s.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            last = time.perf_counter()
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                now = time.perf_counter()
                s.silence, last = max(s.silence, now - last), now
                data = line[5:].strip()
                if data == b"[DONE]":
                    s.done = True
                    break
                _event(s, json.loads(data), now)
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        s.error = s.error or f"{type(e).__name__}: {e}"[:300]
    finally:
        s.ended = time.perf_counter()
        if s.status == 200 and not s.done:  # the silence until it broke counts too
            s.silence = max(s.silence, s.ended - last)


# --- what the gateway shows -----------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and all((k, x) in ls for k, x in labels.items()))  # fmt: skip


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """`name`'s non-zero sums per value of `label`."""
    out: dict[str, float] = {}
    for (n, ls), v in samples.items():
        if n == name and v:
            key = dict(ls).get(label, "?")
            out[key] = out.get(key, 0.0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def minus(a: Samples, b: Samples) -> Samples:
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


def plus(a: Samples, b: Samples) -> Samples:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


Rotation = Literal["in", "probation", "out"]


@dataclass(frozen=True, slots=True)
class Poll:
    at: float
    backends: dict[str, Rotation]
    store_healthy: bool


def rotation(view: dict[str, Any]) -> Rotation:
    if view.get("ejected_reason") is not None:
        return "out"
    if view.get("probation"):
        return "probation"
    # Not healthy though neither ejected nor on probation: out all the same (say, not scraped).
    return "in" if view.get("healthy", True) else "out"


def in_rotation(poll: Poll, watched: Sequence[str]) -> bool:
    return all(poll.backends.get(u) == "in" for u in watched)


def eject_and_readmit(
    polls: Sequence[Poll], watched: Sequence[str], fault: float, clear: float | None
) -> tuple[float | None, float | None, int]:
    """Seconds from the fault to the first poll showing a watched backend out; from the clear
    to the poll from which every watched backend stayed in full rotation to the end (0 when
    they were already back; None when they never left or never came back); and how many times
    a watched backend went from in (or probation) to out."""
    if not watched:
        return None, None, 0
    eject = next((p.at - fault for p in polls
                  if p.at >= fault and any(p.backends.get(u) == "out" for u in watched)),
                 None)  # fmt: skip
    outs = 0
    before: dict[str, Rotation] = {}
    for p in polls:
        for u in watched:
            now = p.backends.get(u)
            if now == "out" and before.get(u, "in") != "out":
                outs += 1
            if now is not None:
                before[u] = now
    readmit: float | None = None
    if clear is not None and eject is not None and polls:
        last_bad = max((i for i, p in enumerate(polls) if not in_rotation(p, watched)),
                       default=None)  # fmt: skip
        if last_bad is None or polls[last_bad].at < clear:
            readmit = 0.0
        elif last_bad + 1 < len(polls):
            readmit = polls[last_bad + 1].at - clear
    return eject, readmit, outs


def store_times(polls: Sequence[Poll], fault: float, clear: float | None
                ) -> tuple[float | None, float | None]:  # fmt: skip
    """redis-loss: seconds until /state shows the store down, and until it is up again."""
    down = next((p.at - fault for p in polls if p.at >= fault and not p.store_healthy), None)
    up = None
    if clear is not None and down is not None:
        up = next((p.at - clear for p in polls if p.at >= clear and p.store_healthy), None)
    return down, up


LOG_LINE = re.compile(
    r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<msg>.*?)(?= [a-z_]+=|$)(?P<fields>.*)$"
)


def summarize_log(paths: Iterable[Path]) -> dict[str, Any]:
    """The gateway logs of a scenario: lines per level and message (the request log line by
    status), tracebacks, and the first line of each warning or error message."""
    by_message: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    examples: dict[str, str] = {}
    tracebacks = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("Traceback"):
                tracebacks += 1
            m = LOG_LINE.match(line)
            if m is None:
                continue
            level, msg = m["level"], m["msg"]
            if msg == "request" and (st := re.search(r" status=(\d+)", m["fields"])):
                statuses[st[1]] += 1
                continue
            key = f"{level} {msg}"
            by_message[key] += 1
            if level in ("WARNING", "ERROR", "CRITICAL") and key not in examples:
                examples[key] = line.split(" ", 2)[2][:400]  # without the date and time
    return {"messages": dict(by_message.most_common()), "request_status": dict(statuses),
            "tracebacks": tracebacks, "examples": examples}  # fmt: skip


# --- one scenario ---------------------------------------------------------------------------


@dataclass
class Run:
    """A scenario while it runs: the load's controls and everything observed."""

    dep: Deployment
    scenario: Scenario
    opts: Options
    url: str
    t0: float = 0.0
    fault_at: float = 0.0
    clear_at: float | None = None
    window_end: float = 0.0
    streams: list[Stream] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    snap_fault: Samples = field(default_factory=dict)
    snap_window_end: Samples | None = None
    retired: Samples = field(default_factory=dict)  # counts of gateways already stopped
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # users send while it is set
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def watched(self) -> list[str]:
        name = self.scenario.name
        if name == "all-failing":
            return [s.url for s in self.dep.sims]
        if name in ("healthy", "gateway-restart", "redis-loss"):
            return []
        return [self.dep.victim.url]

    def recovered(self) -> bool:
        if not self.polls:
            return False
        last = self.polls[-1]
        if self.scenario.name == "redis-loss":
            return last.store_healthy
        return in_rotation(last, self.watched)

    def since(self, t: float) -> float:
        return t - self.t0


async def _get_metrics(session: aiohttp.ClientSession, url: str) -> Samples:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return parse_metrics(await r.text())
    except (TimeoutError, aiohttp.ClientError):
        return {}


async def _poll(run: Run, session: aiohttp.ClientSession, done: asyncio.Event) -> None:
    timeout = aiohttp.ClientTimeout(total=1)
    while not done.is_set():
        t = time.perf_counter()
        try:
            async with session.get(run.url + "/state", timeout=timeout) as r:
                state = await r.json()
            run.polls.append(Poll(t, {b["url"]: rotation(b) for b in state["backends"]},
                                  bool(state["state_store"]["healthy"])))  # fmt: skip
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
            pass  # a gateway restarting, or too busy to answer in time: no sample
        await asyncio.sleep(max(0.0, POLL_S - (time.perf_counter() - t)))


async def _user(run: Run, session: aiohttp.ClientSession, u: int, users: int) -> None:
    body: dict[str, Any] = {
        "model": MODEL, "prompt": prompt_of(PROMPT_TOKENS), "max_tokens": run.opts.max_tokens,
        "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    await asyncio.sleep(u / users)  # the first requests spread over a second
    while not run.stop.is_set():
        await run.gate.wait()
        if run.stop.is_set():
            break
        s = Stream(u, time.perf_counter())
        run.streams.append(s)
        await stream_once(session, run.url + "/v1/completions", body, s)
        if s.outcome(run.opts.max_tokens) != "ok":
            await asyncio.sleep(FAIL_PAUSE_S)


def _faults(sim: SimProcess, **faults: Any) -> None:
    req = urllib.request.Request(
        sim.url + "/sim/faults", data=json.dumps(faults).encode(),
        headers={"content-type": "application/json"}, method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def _restart_sim(sim: SimProcess) -> float:
    """Kill it (if alive) and start a new one on the same port; seconds until it is ready."""
    sim.kill()
    t = time.perf_counter()
    sim.start()
    return time.perf_counter() - t


# The scenarios that are a simulator fault on the victim: (injected, cleared).
_SIM_FAULTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "errors-500": ({"error_rate": 0.5}, {"error_rate": 0.0}),
    "refusing-503": ({"error_rate": 1.0, "error_status": 503},
                     {"error_rate": 0.0, "error_status": 500}),
    "slow-first-token": ({"slow_first_token_s": 5.0}, {"slow_first_token_s": 0.0}),
}  # fmt: skip


def inject(run: Run) -> None:
    dep, name = run.dep, run.scenario.name
    if name in _SIM_FAULTS:
        _faults(dep.victim, **_SIM_FAULTS[name][0])
    elif name == "crash":
        dep.victim.kill()
    elif name == "freeze":
        os.kill(dep.victim.pid, signal.SIGSTOP)
    elif name == "stalled":
        _faults(dep.victim, hang=True)
    elif name == "redis-loss":
        assert dep.redis is not None
        dep.redis.kill()
    elif name == "all-failing":
        for sim in dep.sims:
            _faults(sim, error_rate=1.0)


def clear(run: Run) -> None:
    dep, name = run.dep, run.scenario.name
    if name in _SIM_FAULTS:
        _faults(dep.victim, **_SIM_FAULTS[name][1])
    elif name in ("crash", "stalled"):
        try:
            run.extra["restart_ready_s"] = _restart_sim(dep.victim)
        except RuntimeError as e:  # the port was taken meanwhile: say so, go on without it
            run.notes.append(f"the victim could not be restarted on its port: {e}")
    elif name == "freeze":
        os.kill(dep.victim.pid, signal.SIGCONT)
    elif name == "redis-loss":
        assert dep.redis is not None
        dep.redis.start()
    elif name == "all-failing":
        for sim in dep.sims:
            _faults(sim, error_rate=0.0)


async def _restart_gateway(run: Run, session: aiohttp.ClientSession) -> None:
    """SIGTERM with streams in flight; the users stop sending half-way through the pre-stop
    delay (a load balancer that saw /ready turn 503) and resume once a new gateway is ready."""
    dep = run.dep
    old = dep.gateway
    assert old is not None
    assert old.proc is not None
    run.retired = await _get_metrics(session, run.url)  # its counts die with it
    signalled = time.perf_counter()
    run.extra["signal_at"] = signalled
    old.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(PRE_STOP_S / 2)
    run.gate.clear()
    proc = old.proc
    try:
        code: int | None = await asyncio.to_thread(proc.wait, 300)
    except subprocess.TimeoutExpired:
        code = None
    exited = time.perf_counter()
    run.extra |= {"exit_status": code, "signal_to_exit_s": exited - signalled}
    old.proc = None  # it is gone (or stopped with the deployment)
    if code is None:
        proc.kill()
        run.notes.append("the gateway had not exited 300 s after SIGTERM: killed")
    await asyncio.to_thread(dep.start_gateway, old.port)
    run.extra["signal_to_ready_s"] = time.perf_counter() - signalled
    run.gate.set()


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


async def _control(run: Run, session: aiohttp.ClientSession) -> None:
    opts, sc = run.opts, run.scenario
    start_fault = sc.name == "wrong-key"
    await _sleep_until(run.t0 + (0.0 if start_fault else FAULT_AT * opts.seconds))
    run.snap_fault = {} if start_fault else await _get_metrics(session, run.url)
    run.fault_at = time.perf_counter()
    if sc.name == "gateway-restart":
        await _restart_gateway(run, session)
    else:
        await asyncio.to_thread(inject, run)
    end = run.t0 + opts.seconds
    if sc.clear is None:
        await _sleep_until(end)
        run.window_end = time.perf_counter()
        if sc.name != "gateway-restart":
            run.snap_window_end = await _get_metrics(session, run.url)
    else:
        await _sleep_until(run.t0 + CLEAR_AT * opts.seconds)
        run.snap_window_end = await _get_metrics(session, run.url)
        run.clear_at = run.window_end = time.perf_counter()
        await asyncio.to_thread(clear, run)
        deadline = max(end, run.clear_at + opts.readmit_wait_s)
        back: float | None = None
        while (now := time.perf_counter()) < deadline:
            if not run.recovered():
                back = None
            elif back is None:
                back = now
            if now >= end and back is not None and now - back >= SETTLE_S:
                break
            await asyncio.sleep(0.1)
    run.stop.set()
    run.gate.set()  # users waiting for the gate see the stop


async def drive(run: Run) -> None:
    users = RESTART_STREAMS if run.scenario.name == "gateway-restart" else run.opts.users
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=CLIENT_SILENCE_S)
    polled = asyncio.Event()
    async with (
        aiohttp.ClientSession(connector=conn, timeout=timeout) as session,
        aiohttp.ClientSession() as control,
    ):
        run.gate.set()
        run.t0 = time.perf_counter()
        poller = asyncio.create_task(_poll(run, control, polled))
        clients = [asyncio.create_task(_user(run, session, u, users)) for u in range(users)]
        try:
            await _control(run, control)
            # Open streams finish; one silent past the client's patience ends on its own.
            await asyncio.wait(clients, timeout=CLIENT_SILENCE_S + 30)
        finally:
            polled.set()
            for task in clients:
                task.cancel()
            await asyncio.gather(poller, *clients, return_exceptions=True)
        final = await _get_metrics(control, run.url)
    run.extra["final_metrics"] = plus(run.retired, final)


# --- results --------------------------------------------------------------------------------


@dataclass
class Result:
    scenario: str
    fault: str
    clear: str | None
    users: int
    sent: int
    ok: int
    failed: int
    cut: int
    continued: int
    max_silence_s: float | None
    silent_over_limit: int  # streams silent longer than SILENCE_LIMIT_S
    eject_s: float | None
    readmit_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_n: int
    attempts_per_request: float | None
    ejections: int  # of the watched backends, from tiergate_backend_ejections_total
    flaps: int  # times /state showed a watched backend go out
    why: dict[str, int]  # failed and cut requests by cause
    extra: dict[str, Any]
    notes: list[str]
    log: dict[str, Any]


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


def summarize(run: Run) -> Result:
    opts, mt = run.opts, run.opts.max_tokens
    streams = [s for s in run.streams if s.ended]
    outcomes = Counter(s.outcome(mt) for s in streams)
    why = Counter(f"{o}: {s.why(mt)}" for s in streams if (o := s.outcome(mt)) != "ok")
    examples: dict[str, str] = {}
    for s in streams:
        if (o := s.outcome(mt)) != "ok":
            examples.setdefault(
                f"{o}: {s.why(mt)}", s.error or f"{s.words} tokens, usage {s.usage}"
            )
    run.extra["examples"] = examples
    window = [s for s in streams
              if run.fault_at <= s.sent < run.window_end and s.outcome(mt) == "ok"]  # fmt: skip
    ttfts = [s.ttft for s in window if s.ttft is not None]
    run.extra["window_ok"] = len(window)
    silences = [s.silence for s in streams if s.status == 200]
    final: Samples = run.extra.pop("final_metrics")
    attempts = None
    if run.snap_window_end is not None:
        sent = sum(run.fault_at <= s.sent < run.window_end for s in streams)
        delta = minus(run.snap_window_end, run.snap_fault)
        run.extra["window_attempts"] = by_label(delta, "tiergate_attempts_total", "outcome")
        run.extra["window_requests"] = sent
        if sent:
            attempts = metric(delta, "tiergate_attempts_total") / sent
    watched = run.watched
    eject, readmit, flaps = eject_and_readmit(run.polls, watched, run.fault_at, run.clear_at)
    if run.scenario.name == "redis-loss":
        down, up = store_times(run.polls, run.fault_at, run.clear_at)
        run.extra |= {"store_down_s": down, "store_up_s": up}
    if run.scenario.name == "gateway-restart" and "signal_at" in run.extra:
        at = run.extra.pop("signal_at")
        live = [s for s in streams if s.sent < at < s.ended]
        run.extra |= {"in_flight_at_signal": len(live),
                      "cut_in_flight": sum(s.outcome(mt) != "ok" for s in live)}  # fmt: skip
    run.extra["continuations"] = by_label(final, "tiergate_continuations_total", "outcome")
    run.extra["hedges"] = by_label(final, "tiergate_hedges_total", "outcome")
    run.extra["retries"] = metric(final, "tiergate_retries_total")
    run.extra["rejected"] = by_label(final, "tiergate_rejected_total", "reason")
    run.extra["polls"] = len(run.polls)
    run.extra["fault_at_s"] = round(run.since(run.fault_at), 2)
    if run.clear_at is not None:
        run.extra["clear_at_s"] = round(run.since(run.clear_at), 2)
    run.extra["last_request_s"] = round(run.since(max((s.sent for s in streams),
                                                      default=run.t0)), 2)  # fmt: skip
    return Result(
        scenario=run.scenario.name, fault=run.scenario.fault, clear=run.scenario.clear,
        users=RESTART_STREAMS if run.scenario.name == "gateway-restart" else opts.users,
        sent=len(streams), ok=outcomes["ok"], failed=outcomes["failed"], cut=outcomes["cut"],
        continued=round(metric(final, "tiergate_continuations_total", outcome="continued")),
        max_silence_s=max(silences, default=None),
        silent_over_limit=sum(x > SILENCE_LIMIT_S for x in silences),
        eject_s=eject, readmit_s=readmit,
        ttft_p50_s=_opt(percentile(ttfts, 50)), ttft_p99_s=_opt(percentile(ttfts, 99)),
        ttft_n=len(ttfts), attempts_per_request=attempts,
        ejections=round(sum(metric(final, "tiergate_backend_ejections_total", backend=u)
                            for u in watched)),
        flaps=flaps, why=dict(why.most_common()), extra=run.extra, notes=run.notes,
        log=summarize_log(sorted(run.dep.workdir.glob("gateway-*.log"))),
    )  # fmt: skip


def run_scenario(name: str, opts: Options, workdir: Path) -> Result:
    dep = deploy(workdir, name, opts)
    try:
        assert dep.gateway is not None
        run = Run(dep, scenario(name), opts, dep.gateway.url)
        asyncio.run(drive(run))
    finally:
        dep.stop()
    return summarize(run)


# --- verdicts -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    line: str  # the goal, as stated
    met: bool
    detail: str
    caveat: str = ""  # why the verdict may not mean what it says


def verdicts(results: dict[str, Result]) -> list[Verdict]:
    """One per reliability goal that the scenarios run can judge."""
    out: list[Verdict] = []

    def visible(names: Sequence[str]) -> list[Result]:
        return [results[n] for n in names if n in results]

    if rs := visible(("errors-500", "wrong-key", "refusing-503")):
        flaps = [f"{r.scenario}'s engine ejected {r.ejections}x" for r in rs
                 if r.scenario in ("errors-500", "refusing-503")]  # fmt: skip
        out.append(Verdict(
            "0 client-visible failures in the 500s, wrong-key and 503-flapping scenarios",
            all(r.failed + r.cut == 0 for r in rs),
            "; ".join([f"{r.scenario}: {r.failed} failed + {r.cut} cut of {r.sent}"
                       + (f" ({_causes(r)})" if r.why else "") for r in rs] + flaps),
        ))  # fmt: skip
    if rs := visible(("crash", "freeze", "stalled")):
        out.append(Verdict(
            "0 streams cut in the crash and freeze scenarios (all continued, with exactly "
            "max_tokens tokens and a correct usage); freeze judged as both kinds of freeze: "
            "SIGSTOP (freeze) and hung with /health answering (stalled)",
            all(r.cut == 0 and r.failed == 0 for r in rs),
            "; ".join(f"{r.scenario}: {r.cut} cut, {r.failed} failed, {r.continued} continued "
                      f"of {r.sent}" + (f" ({_causes(r)})" if r.why else "") for r in rs),
        ))  # fmt: skip
    silent = [(r.scenario, r.max_silence_s) for r in results.values()
              if r.max_silence_s is not None]  # fmt: skip
    if silent:
        worst = max(silent, key=lambda x: x[1])
        over = {r.scenario: r.silent_over_limit for r in results.values() if r.silent_over_limit}
        out.append(Verdict(
            f"no stream silent for more than {SILENCE_LIMIT_S:g} s in any scenario",
            worst[1] <= SILENCE_LIMIT_S,
            f"longest {worst[1]:.2f} s ({worst[0]}); streams over {SILENCE_LIMIT_S:g} s: "
            + (", ".join(f"{k} {v}" for k, v in over.items()) or "none"),
        ))  # fmt: skip
    if "healthy" in results and "slow-first-token" in results:
        h, s = results["healthy"].ttft_p99_s, results["slow-first-token"].ttft_p99_s
        ratio = s / h if h and s is not None else math.nan
        out.append(Verdict(
            f"TTFT p99 in the slow-instance scenario within {TTFT_RATIO_LIMIT:g}x of the healthy "
            "run", ratio <= TTFT_RATIO_LIMIT,
            f"{ms_of_s(s, 0, ' ms')} vs {ms_of_s(h, 0, ' ms')} = {ratio:.2f}x",
        ))  # fmt: skip
    if r := results.get("gateway-restart"):
        live, cut = r.extra.get("in_flight_at_signal"), r.extra.get("cut_in_flight")
        code = r.extra.get("exit_status")
        out.append(Verdict(
            f"gateway restart with {RESTART_STREAMS} streams in flight: 0 cut, exit 0",
            cut == 0 and code == 0 and r.cut == 0 and r.failed == 0,
            f"{live} streams in flight at SIGTERM, {cut} of them cut; exit status {code}; over "
            f"the whole run {r.failed} failed + {r.cut} cut of {r.sent}",
        ))  # fmt: skip
    if (r := results.get("all-failing")) and r.attempts_per_request is not None:
        attempts: dict[str, float] = r.extra.get("window_attempts", {})
        seen_ok, whole = attempts.get("ok", 0.0), r.extra.get("window_ok", 0)
        caveat = ""
        if seen_ok > 1.5 * whole + 5:
            how = (
                "the engines' errors reached it as 200 streams whose first event is an error, "
                "which it neither retried nor counted as failures"
                if "cut: error event before any text" in r.why
                else "it saw no failure"
            )
            caveat = (f"the gateway counted {seen_ok:.0f} of these attempts ok (a first byte "
                      f"came) while {whole} client requests were whole: {how}; the amplification "
                      "of failures it recognises is not measured by this run")  # fmt: skip
        out.append(Verdict(
            f"retry amplification (all engines failing) <= {AMPLIFICATION_LIMIT:g} upstream "
            "attempts per client request",
            r.attempts_per_request <= AMPLIFICATION_LIMIT,
            f"{r.attempts_per_request:.2f} ({sum(attempts.values()):.0f} attempts: "
            + ", ".join(f"{k} {v:.0f}" for k, v in attempts.items())
            + f"; for {r.extra.get('window_requests')} requests while failing)",
            caveat,
        ))  # fmt: skip
    return out


def _causes(r: Result) -> str:
    return ", ".join(f"{k} x{v}" for k, v in r.why.items())


# --- output ---------------------------------------------------------------------------------


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


COLUMNS = ("scenario", "sent", "OK", "failed", "cut", "continued", "max silence", "eject",
           "re-admit", "TTFT p50", "TTFT p99", "attempts/req", "ejections")  # fmt: skip


def row(r: Result) -> list[str]:
    att = "-" if r.attempts_per_request is None else f"{r.attempts_per_request:.2f}"
    return [r.scenario, str(r.sent), str(r.ok), str(r.failed), str(r.cut), str(r.continued),
            _s(r.max_silence_s), _s(r.eject_s), _s(r.readmit_s), ms_of_s(r.ttft_p50_s, 0, ' ms'),
            ms_of_s(r.ttft_p99_s, 0, ' ms'), att, str(r.ejections)]  # fmt: skip


def print_report(console: Console, results: Sequence[Result], vs: Sequence[Verdict]) -> None:
    t = Table(title="tiergate bench chaos")
    for col in COLUMNS:
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for r in results:
        t.add_row(*row(r))
    console.print(t)
    for v in vs:
        console.print(f"  [{'green' if v.met else 'red'}]{'MET' if v.met else 'NOT MET'}[/] "
                      f"{v.line}: {v.detail}" + (f" [yellow]But: {v.caveat}[/]" if v.caveat
                                                  else ""))  # fmt: skip


def scenario_notes(r: Result) -> list[str]:
    """What the table does not show, in sentences."""
    x = r.extra
    lines = [f"fault at {x.get('fault_at_s')} s: {r.fault}"
             + (f"; cleared at {x['clear_at_s']} s: {r.clear}" if r.clear else "")
             + f"; last request sent at {x.get('last_request_s')} s."]  # fmt: skip
    if "restart_ready_s" in x:
        lines.append(f"The new simulator on the victim's port was ready {x['restart_ready_s']:.1f}"
                     " s after it was started.")  # fmt: skip
    if r.scenario == "gateway-restart":
        lines.append(
            f"In flight at SIGTERM: {x.get('in_flight_at_signal')}, cut: "
            f"{x.get('cut_in_flight')}; exit status {x.get('exit_status')} after "
            f"{_s(x.get('signal_to_exit_s'))}; a new gateway on the same port ready "
            f"{_s(x.get('signal_to_ready_s'))} after the signal. shutdown.pre_stop_delay_s = "
            f"{PRE_STOP_S:g} s for this run (the default is 0: a deployment behind a load "
            "balancer sets one); the users stopped sending half-way through it, as a load "
            "balancer that saw /ready turn 503 would, and resumed on the new gateway. "
            "The counts the old gateway made after the signal are not in the metrics."
        )
    if r.scenario == "redis-loss":
        lines.append(f"/state showed the store down {_s(x.get('store_down_s'))} after the kill "
                     f"and up again {_s(x.get('store_up_s'))} after the restart.")  # fmt: skip
    if r.scenario == "refusing-503":
        lines.append(f"The victim was ejected {r.ejections} times (metric); /state showed it "
                     f"going out {r.flaps} times.")  # fmt: skip
    if wa := x.get("window_attempts"):
        lines.append(f"Attempts between fault and clear by outcome: "
                     f"{', '.join(f'{k} {v:.0f}' for k, v in wa.items())} for "
                     f"{x.get('window_requests')} client requests.")  # fmt: skip
    counts = [f"{what} {k} {v:.0f}" for what in ("continuations", "hedges", "rejected")
              for k, v in (x.get(what) or {}).items()]  # fmt: skip
    if x.get("retries"):
        counts.append(f"retries {x['retries']:.0f}")
    if counts:
        lines.append("Gateway counts over the run: " + ", ".join(counts) + ".")
    if r.why:
        lines.append("Not OK: " + "; ".join(f"{k} x{v}" for k, v in r.why.items()) + ".")
        lines += [f"First {k}: `{v}`" for k, v in x.get("examples", {}).items()][:3]
    if any(k.startswith("cut: error event before any text") for k in r.why):
        lines.append("Those streams were answered 200 and their first event was the engine's "
                     "error: the simulator answers its error fault on a stream that way (the 200 "
                     "goes out with the stream's headers), and the gateway took that event for "
                     "the stream's first byte and passed it on.")  # fmt: skip
    if r.silent_over_limit:
        lines.append(f"{r.silent_over_limit} streams were silent for more than "
                     f"{SILENCE_LIMIT_S:g} s.")  # fmt: skip
    log = r.log
    bad = {k: v for k, v in log["messages"].items() if not k.startswith(("INFO", "DEBUG"))}
    statuses = {k: v for k, v in log["request_status"].items() if k != "200"}
    lines.append(
        "Gateway log: "
        + (", ".join(f"{k} x{v}" for k, v in bad.items()) or "no warnings or errors")
        + (f"; requests answered {', '.join(f'{k} x{v}' for k, v in statuses.items())}"
           if statuses else "")
        + (f"; {log['tracebacks']} tracebacks" if log["tracebacks"] else "") + ".")  # fmt: skip
    lines += [f"`{line}`" for line in log["examples"].values()][:4]
    lines += r.notes
    return lines


def markdown(report: dict[str, Any], results: Sequence[Result], vs: Sequence[Verdict]) -> str:
    o = report["options"]
    rev = report["revision"]
    modified = (f" (with uncommitted changes to {', '.join(rev['modified'])})"
                if rev["modified"] else "")  # fmt: skip
    lines = [
        "# Chaos: faults under streaming load",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}. Code: commit {rev['commit']}{modified}.  ",
        f"Per scenario a fresh deployment: 1 x v4 (EAGLE-3) latency + 2 x v3 (AWQ) throughput "
        f"simulators at --speedup {o['speedup']:g}, one gateway at its default settings (but "
        "what the scenario needs); "
        f"{o['users']} closed-loop users ({RESTART_STREAMS} in gateway-restart) streaming "
        f"completions of exactly {o['max_tokens']} tokens (`ignore_eos`, usage included), "
        f"{o['seconds']:g} s a scenario: the fault at {FAULT_AT * o['seconds']:g} s on the first "
        f"throughput instance, cleared at {CLEAR_AT * o['seconds']:g} s, the load going on until "
        f"the victim has been back in full rotation for {SETTLE_S:g} s (at most "
        f"{o['readmit_wait_s']:g} s after the clear).",
        "",
        "- **OK**: 200, exactly max_tokens tokens of text, one `id`, a final usage saying so, "
        "no error event, `[DONE]`. **failed**: not 200 (or no answer). **cut**: 200 but not OK.",
        '- **continued**: `tiergate_continuations_total{outcome="continued"}`. **max silence**: '
        "the longest gap any client saw between two events of a stream (from its first byte).",
        "- **eject**: fault -> /state shows the victim ejected (polled at 20 Hz); **re-admit**: "
        "clear -> the victim in full rotation (not ejected, not on probation) and staying there "
        "(0: it was already back). `all-failing` watches every engine.",
        "- **TTFT**: OK streams sent between the fault and its clear (the same window in "
        "`healthy`). **attempts/req**: `tiergate_attempts_total` (every outcome) over client "
        "requests sent in that window. **ejections**: `tiergate_backend_ejections_total` of "
        "the victim over the run.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    lines += ["", "![OK, failed and cut per scenario; TTFT p99 against healthy](chaos.png)", ""]
    lines += ["## Goals", ""]
    lines += [f"- **{'MET' if v.met else 'NOT MET'}**: {v.line}: {v.detail}."
              + (f" **But** {v.caveat}." if v.caveat else "") for v in vs]  # fmt: skip
    lines += ["- Not measured here: the schemathesis and slowloris items, the integration tests "
              "and the README's Reliability section.", ""]  # fmt: skip
    lines += ["## Scenarios", ""]
    for r in results:
        lines += [f"### {r.scenario}", ""]
        lines += [f"- {line}" for line in scenario_notes(r)]
        lines.append("")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.scenario for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5))
    xs = range(len(results))
    bottom = [0.0] * len(results)
    for what, color in (("ok", "tab:green"), ("failed", "tab:red"), ("cut", "tab:orange")):
        share = [getattr(r, what) / r.sent * 100 if r.sent else 0.0 for r in results]
        a.bar(xs, share, bottom=bottom, color=color, label=what)
        bottom = [x + y for x, y in zip(bottom, share, strict=True)]
    for i, r in enumerate(results):
        a.text(i, 101, f"{r.failed + r.cut}/{r.sent}", ha="center", fontsize=7)
    a.set_xticks(list(xs), names, rotation=40, ha="right")
    a.set_ylabel("% of client requests")
    a.set_ylim(0, 110)
    a.set_title("client requests: OK / failed before first byte / cut (label: not OK / sent)")
    a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8)
    p99 = [(r.ttft_p99_s or 0.0) * 1000 for r in results]
    b.bar(xs, p99, color="tab:blue")
    healthy = next((r.ttft_p99_s for r in results if r.scenario == "healthy"), None)
    if healthy:
        b.axhline(healthy * 1000, color="k", ls="--", lw=1, label="healthy")
        b.axhline(healthy * 1000 * TTFT_RATIO_LIMIT, color="r", ls=":", lw=1,
                  label=f"{TTFT_RATIO_LIMIT:g}x healthy")  # fmt: skip
        b.legend(fontsize=8)
    b.set_yscale("log")
    b.set_xticks(list(xs), names, rotation=40, ha="right")
    b.set_ylabel("TTFT p99 (ms, log), fault window")
    b.set_title("TTFT p99 of OK streams while the fault lasted")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_command(opts: Options) -> str:
    args = [f"--scenario {s}" for s in opts.scenarios] if opts.scenarios != SCENARIO_NAMES else []
    args += [f"--seconds {opts.seconds:g}", f"--users {opts.users}"]
    return shlex.join(["tiergate", "bench", "chaos"]) + " " + " ".join(args)


def run(opts: Options, console: Console | None = None) -> list[Result]:
    """Every scenario of `opts` in turn; the table, the verdicts, and the files in `opts.out`."""
    console = console or Console()
    unknown = [s for s in opts.scenarios if s not in SCENARIO_NAMES]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIO_NAMES)}")
    rev = revision(("gateway", "engines", "loadtests"))
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    logs = opts.logs or Path(tempfile.mkdtemp(prefix="tiergate-chaos-"))
    results: list[Result] = []
    with bars(console) as progress:
        task = progress.add_task("chaos", total=len(opts.scenarios))
        for name in opts.scenarios:
            progress.update(task, description=f"chaos: {name}")
            if name == "redis-loss" and shutil.which("redis-server") is None:
                console.print("redis-loss skipped: redis-server is not installed")
                progress.advance(task)
                continue
            results.append(run_scenario(name, opts, logs / name))
            progress.advance(task)
    by_name = {r.scenario: r for r in results}
    vs = verdicts(by_name)
    print_report(console, results, vs)
    console.print(f"process logs: {logs}")
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        report = {
            "command": opts.command or default_command(opts),
            "date": date,
            "revision": rev,
            "options": {"scenarios": list(opts.scenarios), "seconds": opts.seconds,
                        "users": opts.users, "speedup": opts.speedup,
                        "max_tokens": opts.max_tokens, "readmit_wait_s": opts.readmit_wait_s,
                        "restart_streams": RESTART_STREAMS, "pre_stop_delay_s": PRE_STOP_S},
            "results": [asdict(r) for r in results],
            "verdicts": [asdict(v) for v in vs],
        }  # fmt: skip
        (opts.out / "chaos.json").write_text(json.dumps(json_safe(report, 4), indent=2) + "\n")
        (opts.out / "chaos.md").write_text(markdown(report, results, vs))
        if opts.chart:
            plot(results, opts.out / "chaos.png")
    return results


__all__ = ["SCENARIOS", "SCENARIO_NAMES", "Options", "Result", "Stream", "Verdict", "run"]


# -- the command ------------------------------------------------------------------------------


def _scenarios(names: list[str] | None) -> list[str] | None:
    from loadtests.chaos import SCENARIO_NAMES

    return known(names, SCENARIO_NAMES)


def command(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            callback=_scenarios,
            help="Scenario to run; repeat for several (default all, in this order): healthy "
            "(no fault: the TTFT reference), crash (SIGKILL of a throughput engine, restarted "
            "later on its port), freeze (SIGSTOP, later SIGCONT), stalled (hang fault: /health "
            "and /metrics still answer), errors-500 (500 on half its requests), wrong-key (an "
            "engine wanting an API key the gateway lacks), refusing-503 (503 on every request, "
            "/health 200), slow-first-token (5 s before every first token), gateway-restart (20 "
            "streams, SIGTERM to the gateway, a new one on its port), redis-loss (the gateway's "
            "Redis killed, restarted later), all-failing (every engine answers 500).",
        ),
    ] = None,
    seconds: Annotated[
        float,
        typer.Option(
            min=5,
            help="Seconds of load per scenario: the fault at 20%, cleared at 60%; longer while "
            "the faulty engine is not yet back in full rotation.",
        ),
    ] = 30.0,
    users: Annotated[
        int, typer.Option(min=1, help="Closed-loop streaming users (gateway-restart: 20).")
    ] = 48,
    out: Annotated[Path, typer.Option(help="Folder for chaos.md, chaos.json, chaos.png.")] = Path(
        "docs/results"
    ),
    logs: Annotated[
        Path | None,
        typer.Option(
            help="Keep every process's log here, a folder per scenario (default: a new "
            "temporary folder, printed at the end and kept)."
        ),
    ] = None,
) -> None:
    """Faults injected into a simulated deployment under streaming load: per
    scenario a fresh deployment (1 v4 latency + 2 v3 throughput simulators at speedup 4, one
    gateway at its default settings) and closed-loop users streaming completions of exactly
    1024 tokens. Prints per scenario: requests sent, OK (complete: all tokens, one id, a right
    usage, [DONE]), failed before the first byte, streams cut, streams continued, the longest
    silence within a stream, time to eject and to re-admit the faulty engine (from /state at
    20 Hz), TTFT p50/p99 while the fault lasts, upstream attempts per client request; then a
    MET / NOT MET line per reliability goal (README, Reliability) the run judges. Every process is
    stopped at the end, on failure and on Ctrl-C."""
    import sys

    from loadtests.common.report import command_line

    # The report shows the command without --logs: a folder on this machine says nothing there.
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--logs="):
            skip = False
        elif arg == "--logs":
            skip = True
        else:
            argv.append(arg)
    setup_logging("warning")
    try:
        run(Options(scenarios=tuple(scenario or SCENARIO_NAMES), seconds=seconds, users=users,
                    out=out, logs=logs, command=command_line(argv)))  # fmt: skip
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None
