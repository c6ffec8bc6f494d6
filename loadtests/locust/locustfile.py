"""Locust load test for an OpenAI-compatible completions endpoint (tiergate, vLLM, ...).

Each user is a closed loop: it sends its next request as soon as the last one finished. A request
streams by default; the user times it on the SSE lines as `vllm bench serve` does (and as
loadtests/harness/client.py does):
  TTFT = first chunk with text, E2E = last chunk with text, N = usage.completion_tokens,
  TPOT = (E2E - TTFT) / (N - 1).
Locust's own timing of a streamed POST stops at the response headers, so the three are reported as
extra request events (type TTFT / TPOT / E2E, name = the tier that served the request), and every
request is appended to a JSONL file, the source of truth for percentiles (Locust buckets times).

    locust -f loadtests/locust/locustfile.py --headless -u 16 -r 16 -t 60s -H http://127.0.0.1:8000

Scenarios (load shapes) are in loadtests/locust/scenarios/; see loadtests/locust/README.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
from locust import FastHttpUser, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

# The summary reuses loadtests/locust/summarize.py: make the repository importable when locust
# is run from elsewhere (it only adds this file's directory to sys.path).
_ROOT = Path(__file__).resolve().parents[2]
if (_ROOT / "loadtests" / "locust" / "summarize.py").exists() and str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from loadtests.locust.summarize import format_table, summarize  # noqa: E402

log = logging.getLogger("tiergate.locust")

TIER_HEADER = "x-tiergate-tier"
BACKEND_HEADER = "x-tiergate-backend"


def _add_options(parser: Any) -> None:
    # on the parser itself, not a group: Locust's web UI shows only the parser's own arguments
    parser.add_argument(
        "--model", default="", help="model name (default: none, the server's only one)"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=50, help="prompt length in tokens (words)"
    )
    parser.add_argument(
        "--output-tokens", type=int, default=256, help="max_tokens, with ignore_eos"
    )
    parser.add_argument(
        "--slo-ttft", type=float, default=1.0, help="TTFT SLO in seconds, for goodput"
    )
    parser.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT SLO in seconds")
    parser.add_argument("--run-label", default="", help="label of this run in the JSONL records")
    parser.add_argument(
        "--jsonl",
        default="",
        help="per-request records (default runs/locust-<label>-<timestamp>.jsonl); appended to",
    )
    parser.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    parser.add_argument("--no-stream", action="store_true", help="non-streaming: TTFT = E2E")
    parser.add_argument(
        "--tier",
        default="",
        choices=["", "latency", "throughput"],
        help="pin requests to a tier (x-tiergate-tier request header)",
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="stop once this process has recorded this many requests (0: run for --run-time, "
        "which stays the cap)",
    )
    # Shared by the step and burst scenarios (declared here so that they cannot clash).
    parser.add_argument(
        "--phase-seconds",
        type=float,
        default=0.0,
        help="phase length of the step (30) and burst (20) scenarios",
    )
    parser.add_argument(
        "--steps",
        default="",
        help="the step scenario's users per phase, comma-separated (default 1,16,32,64,16,1)",
    )


@dataclass(frozen=True, slots=True)
class Workload:
    path: str
    body: str  # serialized once: every request of a run is the same
    headers: dict[str, str]
    stream: bool
    chat: bool

    @classmethod
    def from_options(cls, o: Any) -> Workload:
        prompt = " ".join(["hello"] * o.prompt_tokens)  # N tokens for the simulator: one per word
        body: dict[str, Any] = {
            "max_tokens": o.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": not o.no_stream,
        }
        if o.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if not o.no_stream:
            body["stream_options"] = {"include_usage": True}
        if o.model:
            body["model"] = o.model
        # identity: SSE must not be compressed, we read the raw socket lines
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if o.tier:
            headers[TIER_HEADER] = o.tier
        path = "/v1/chat/completions" if o.chat else "/v1/completions"
        return cls(path, json.dumps(body), headers, not o.no_stream, o.chat)


class Recorder:
    """This process's records: appended to the JSONL file and kept for the on-stop summary."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self.records: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered append: one write() per record, so several processes (--processes N)
        # can share one file without interleaving lines.
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if not self._file.closed:
            self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def _label(environment: Any) -> str:
    o = environment.parsed_options
    if o is not None and o.run_label:
        return str(o.run_label)
    shape = environment.shape_class
    if shape is not None:  # e.g. StepShape -> "step"
        return type(shape).__name__.removesuffix("Shape").lower() or "shape"
    return "locust"


def _jsonl_path(environment: Any, label: str) -> Path:
    o = environment.parsed_options
    if o is not None and o.jsonl:
        return Path(o.jsonl)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runner = environment.runner
    # Workers each compute their own default name: keep them apart.
    suffix = f"-w{runner.worker_index}-{os.getpid()}" if isinstance(runner, WorkerRunner) else ""
    return Path("runs") / f"locust-{label}-{stamp}{suffix}.jsonl"


def _on_test_start(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        return  # the workers send the requests and write the records
    old = getattr(environment, "tiergate_recorder", None)
    if old is not None:
        old.close()
    label = _label(environment)
    rec = Recorder(_jsonl_path(environment, label), label)
    environment.tiergate_recorder = rec
    log.info("per-request records: %s", rec.path)


def _on_test_stop(environment: Any, **_: Any) -> None:
    rec: Recorder | None = getattr(environment, "tiergate_recorder", None)
    if rec is None or isinstance(environment.runner, MasterRunner):
        return
    rec.close()
    if not rec.records:
        print(f"tiergate: no completed requests ({rec.path})", flush=True)
        return
    o = environment.parsed_options
    rows = summarize(rec.records, slo_ttft=o.slo_ttft, slo_tpot=o.slo_tpot)
    print(f"\ntiergate summary ({len(rec.records)} requests, {rec.path}):", flush=True)
    print(format_table(rows, o.slo_ttft, o.slo_tpot), flush=True)


# Register once per process: with `-f scenarios/step.py,locustfile.py` the scenario imports this
# module first, then Locust loads the file again under the same name (its classes are then
# ignored as duplicates of the same file, but listeners would be added twice).
if not getattr(events, "_tiergate_locustfile", False):
    events._tiergate_locustfile = True
    events.init_command_line_parser.add_listener(_add_options)
    events.test_start.add_listener(_on_test_start)
    events.test_stop.add_listener(_on_test_stop)

_user_ids = itertools.count(1)


class CompletionsUser(FastHttpUser):
    """Sends, times, reports and records requests (send_one); subclasses choose when."""

    abstract = True
    network_timeout = 120.0  # per socket read: covers a long queue before the first token
    connection_timeout = 10.0
    concurrency = 1  # one request at a time per user: one pooled connection is enough

    def on_start(self) -> None:
        self.workload = Workload.from_options(self.environment.parsed_options)
        runner = self.environment.runner
        # user ids are per process; workers get disjoint ranges
        base = runner.worker_index * 1_000_000 if isinstance(runner, WorkerRunner) else 0
        self.user_id = base + next(_user_ids)

    def send_one(self) -> dict[str, Any]:
        """Send one request, report it to Locust and record it; returns the record."""
        w = self.workload
        runner = self.environment.runner
        # target users of this process (the phase of a load shape; workers: current count)
        users = (runner.target_user_count or runner.user_count) if runner is not None else None
        ts = time.time()
        st = time.perf_counter()
        ttft = e2e = None
        tokens = 0
        error: str | None = None
        tier = backend = None
        with self.client.post(
            w.path, data=w.body, headers=w.headers, stream=w.stream, catch_response=True
        ) as resp:
            status = resp.status_code
            if resp.headers is not None:
                tier = resp.headers.get(TIER_HEADER)
                backend = resp.headers.get(BACKEND_HEADER)
            if status != 200:
                error = _http_error(resp, status)
            elif w.stream:
                try:
                    ttft, e2e, tokens, error = _read_stream(resp, st, w.chat)
                except Exception as exc:  # reset, socket timeout, malformed chunk
                    error = f"stream broken: {exc!r}"[:300]
                    # geventhttpclient may pool a socket with unread bytes: drop the connection
                    self.client.client.close()
            else:
                e2e = ttft = time.perf_counter() - st  # nothing finer to see without streaming
                try:
                    tokens = int(json.loads(resp.content)["usage"]["completion_tokens"])
                except (ValueError, KeyError, TypeError) as exc:
                    error = f"bad JSON body: {exc!r}"[:300]
            if error:
                resp.failure(error)
            else:
                resp.success()
        ok = error is None
        tpot = None
        if ok and w.stream and tokens > 1 and ttft is not None and e2e is not None:
            tpot = (e2e - ttft) / (tokens - 1)
        if ok:
            fire = self.environment.events.request.fire
            name = tier or "untiered"
            for kind, value in (("TTFT", ttft), ("TPOT", tpot), ("E2E", e2e)):
                if value is not None:
                    fire(request_type=kind, name=name, response_time=value * 1000,
                         response_length=0, exception=None, context={})  # fmt: skip
        recorder: Recorder | None = getattr(self.environment, "tiergate_recorder", None)
        rec: dict[str, Any] = {
            "ts": ts,
            "user": self.user_id,
            "label": recorder.label if recorder else _label(self.environment),
            "tier": tier,
            "backend": backend,
            "status": status,
            "ttft_s": ttft if ok else None,
            "tpot_s": tpot,
            "e2e_s": e2e if ok else None,
            "output_tokens": tokens if ok else 0,
            "ok": ok,
            "error": error,
            "users": users,
        }
        if recorder is not None:
            recorder.add(rec)
            cap = self.environment.parsed_options.stop_after
            if cap and len(recorder.records) == cap and runner is not None:
                gevent.spawn(runner.quit)  # not from this user's greenlet, which quit kills
        if status == 0:
            gevent.sleep(0.2)  # no server: do not spin the load generator's CPU on refusals
        return rec


class LLMUser(CompletionsUser):
    """One closed-loop client: one request at a time, no think time."""

    wait_time = constant(0)

    @task
    def generate(self) -> None:
        self.send_one()


def _http_error(resp: Any, status: int) -> str:
    if status == 0:  # no response at all (connection refused, timeout, ...)
        return f"connection error: {getattr(resp, 'error', None)!r}"[:300]
    try:
        body = (resp.content or b"")[:300].decode("utf-8", "replace")
    except Exception as exc:  # the body itself may fail to arrive
        body = repr(exc)
    return f"HTTP {status}: {body}"


def _has_text(chunk: dict[str, Any], chat: bool) -> bool:
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if text:
            return True
    return False


def _read_stream(
    resp: Any, st: float, chat: bool
) -> tuple[float | None, float | None, int, str | None]:
    """Time the SSE stream of `resp`: (ttft, e2e, completion tokens, error), times from `st`.

    Lines come from the geventhttpclient response's readline(), which returns each line as soon
    as it arrived. Locust's FastResponse has no iter_lines, and FastHttpSession.iter_lines reads
    with iter_content(1024), whose read(1024) waits until 1 KiB is buffered: that holds back the
    first few chunks (TTFT late) and hides the response headers (tier, backend).

    To keep the per-request cost low only a few lines are parsed as JSON: those up to the first
    text chunk, lines that mention "error", and at the end, from the last line backwards, those
    up to the usage chunk and the last text chunk."""
    raw = resp._response  # geventhttpclient HTTPSocketPoolResponse
    first: float | None = None
    tail: list[tuple[float, bytes]] = []  # data lines after the first text chunk
    done = False
    error: str | None = None
    while line := raw.readline(b"\n"):  # b"" at the end of the body
        now = time.perf_counter()
        if error or not line.startswith(b"data:"):
            continue  # blank separators, comments, event names; after an error: drain
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True  # read on to the end of the body: the connection is then reused
        elif b'"error"' in data and (err := json.loads(data).get("error")):
            error = "SSE error: " + json.dumps(err)[:300]
        elif first is None:
            if _has_text(json.loads(data), chat):
                first = now
        else:
            tail.append((now, data))
    if error:
        return None, None, 0, error
    if not done:
        return None, None, 0, "stream ended without [DONE]"
    if first is None:
        return None, None, 0, "no text in the stream"
    last: float | None = None
    tokens: int | None = None
    for t, data in reversed(tail):
        chunk = json.loads(data)
        if tokens is None and chunk.get("usage"):
            tokens = int(chunk["usage"]["completion_tokens"])
        if last is None and _has_text(chunk, chat):
            last = t
        if tokens is not None and last is not None:
            break
    if tokens is None:
        return None, None, 0, "no usage chunk (stream_options.include_usage ignored?)"
    return first - st, (last or first) - st, tokens, None
