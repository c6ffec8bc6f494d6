"""What this folder's scripts share: one-off requests (a serial number appended to each prompt,
one serial for the whole process) and a gateway's configuration in front of two `instant`
simulators with `policy.prefix_affinity` on or off."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.procs import SimProcess
from loadtests.instructions import config

MODEL = "meta-llama/Llama-2-7b-chat-hf"
SERIAL = itertools.count()


def post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> None:
    data = json.dumps(body | {"prompt": f"{body['prompt']} {next(SERIAL):08d}"}).encode()
    conn.request("POST", "/v1/completions", body=data,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    assert r.status == 200


@contextlib.contextmanager
def two_sims(folder: Path, affinity: bool, profile: str = "instant") -> Iterator[Path]:
    """A gateway configuration (written in `folder`) in front of two simulators (`instant`
    unless `profile` says otherwise), running while the block runs."""
    with SimProcess(profile=profile) as a, SimProcess(profile=profile) as b:
        cfg = folder / "gw.yaml"
        c = config([a.url, b.url], MODEL)
        c.setdefault("policy", {})["prefix_affinity"] = affinity
        cfg.write_text(yaml.safe_dump(c))
        yield cfg
