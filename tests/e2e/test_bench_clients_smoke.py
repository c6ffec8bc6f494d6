"""A benchmark client of the field against `tiergate up`: NVIDIA's aiperf (installed by
scripts/_clients.sh into .venv-clients) profiles streamed `/v1/completions` through the gateway
in front of the simulated tiers, with a tokenizer this test builds (one token per
whitespace-separated word, the simulator's counting rule; nothing fetched from a model hub), and
finds no error and the token counts it asked for, in its own count and in the gateway's usage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.harness.procs import free_port, free_ports, terminate, wait_http
from tests.e2e.test_cli import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".venv-clients" / "bin"
REQUESTS, CONCURRENCY, PROMPT, OUTPUT = 24, 4, 50, 32

# Builds a WordLevel tokenizer that splits on whitespace only, saved as a transformers
# tokenizer folder (run by the clients' Python, which has tokenizers and transformers).
TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["[UNK]", "the", "engine", "serves", "tokens"]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


@pytest.fixture
def up(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    sim_port = free_ports(3, avoid=(port,))  # `up`'s three simulators
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "up", "--port", str(port), "--sim-port",
         str(sim_port), "--speedup", "20", "--logs", str(tmp_path / "logs")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=60, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: `up` stops its simulators too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        terminate(proc)


def test_aiperf_profiles_streamed_completions_through_the_gateway(up: str, tmp_path: Path) -> None:
    if not (CLIENTS / "aiperf").exists():
        pytest.skip("aiperf is not installed: ./scripts/test installs it (scripts/_clients.sh)")
    tok = tmp_path / "tokenizer"
    subprocess.run([str(CLIENTS / "python"), "-c", TOKENIZER, str(tok)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    art = tmp_path / "aiperf"
    cmd = [
        str(CLIENTS / "aiperf"), "profile", "--model", MODEL, "--url", up,
        "--endpoint-type", "completions", "--streaming", "--tokenizer", str(tok),
        "--concurrency", str(CONCURRENCY), "--request-count", str(REQUESTS),
        "--synthetic-input-tokens-mean", str(PROMPT), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(OUTPUT), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--ui-type", "none", "--artifact-dir", str(art),
    ]  # fmt: skip
    # A local folder is loaded from disk, not the hub. Hugging Face's offline switches must be
    # unset, not "0": aiperf 0.13 takes any value as offline, and offline it looks the folder
    # up as a repository name in the hub's cache (HFValidationError).
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env["COLUMNS"] = "200"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads((art / "profile_export_aiperf.json").read_text())
    assert report["request_count"]["avg"] == REQUESTS
    assert report["request_error_rate"]["avg"] == 0
    assert not report.get("error_summary")
    # Exact counts: every request's prompt and answer as asked, by aiperf's own tokenizer...
    for name, want in (("input_sequence_length", PROMPT), ("output_sequence_length", OUTPUT)):
        stat = report[name]
        assert (stat["min"], stat["max"], stat["count"]) == (want, want, REQUESTS), name
    # ...and as the gateway's usage reports them.
    assert report["usage_completion_tokens"]["min"] == OUTPUT
    assert report["usage_completion_tokens"]["max"] == OUTPUT
    assert report["usage_prompt_tokens"]["min"] == report["usage_prompt_tokens"]["max"] == PROMPT
    assert report.get("osl_mismatch_count", {}).get("avg", 0) == 0
    assert report.get("usage_discrepancy_count", {}).get("avg", 0) == 0
