"""`python -m tiergate ...` with a bytecode counter (sys.settrace, opcode events) switched on by
SIGUSR1 and off by SIGUSR2, which writes each function's own bytecodes and calls to the JSON
file named by BYTECODES_OUT. The main thread only (the gateway's event loop)."""

import collections
import json
import os
import runpy
import signal
import sys
from types import FrameType
from typing import Any

Key = tuple[str, int, str]
own: collections.Counter[Key] = collections.Counter()
calls: collections.Counter[Key] = collections.Counter()


def _key(frame: FrameType) -> Key:
    code = frame.f_code
    return code.co_filename, code.co_firstlineno, code.co_name


def _local(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "opcode":
        own[_key(frame)] += 1
    return _local


def _tracer(frame: FrameType, event: str, arg: Any) -> Any:
    if event != "call":
        return None
    frame.f_trace_opcodes, frame.f_trace_lines = True, False
    calls[_key(frame)] += 1
    return _local


def _on(*_: object) -> None:
    own.clear()
    calls.clear()
    sys.settrace(_tracer)


def _off(*_: object) -> None:
    sys.settrace(None)
    with open(os.environ["BYTECODES_OUT"], "w") as f:
        json.dump({"own": [[*k, v] for k, v in own.items()],
                   "calls": [[*k, v] for k, v in calls.items()]}, f)  # fmt: skip


signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
sys.argv = ["tiergate", *sys.argv[1:]]
runpy.run_module("tiergate", run_name="__main__", alter_sys=True)
