"""The two commands a newcomer runs first: `tiergate up` and `tiergate serve --config`."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loadtests.harness.procs import free_port, free_ports, wait_http

pytestmark = pytest.mark.e2e
MODEL = "meta-llama/Llama-2-7b-chat-hf"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


EXAMPLE_TENANTS = Path(__file__).resolve().parents[2] / "examples" / "tenants.yaml"


def test_up_serves_then_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    sim_port = free_ports(2, avoid=(port,))  # `up` puts its simulators on both
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "up", "--port", str(port), "--sim-port",
         str(sim_port), "--throughput", "1", "--speedup", "10", "--logs", str(tmp_path),
         "--tenants", str(EXAMPLE_TENANTS)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/ready", timeout=30, proc=proc)
        except RuntimeError:
            said = proc.stdout.read() if proc.stdout else b""  # it exited: the pipe ends
            raise AssertionError(f"tiergate up did not start:\n{said.decode()[-3000:]}") from None
        url, ask = f"http://127.0.0.1:{port}/v1/completions", {"model": MODEL, "prompt": "hi",
                                                               "max_tokens": 4}  # fmt: skip
        assert httpx.post(url, json=ask).status_code == 401  # the demo tenants' keys only
        r = httpx.post(url, json=ask, headers={"authorization": "Bearer sk-demo-interactive"})
        assert r.status_code == 200
        # Either tier: the default policy may explore the pool with the first requests.
        assert r.headers["x-tiergate-tier"] in ("latency", "throughput")
        assert r.headers["x-ratelimit-limit-requests"] == "600"
        r = httpx.post(url, json=ask, headers={"authorization": "Bearer sk-demo-batch"})
        assert r.headers["x-ratelimit-limit-requests"] == "60"
        assert _port_open(sim_port)
        assert _port_open(sim_port + 1)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    text = out.decode()
    assert "tiergate is up" in text
    assert "curl" in text
    assert not _port_open(port)
    assert not _port_open(sim_port)
    assert not _port_open(sim_port + 1)
    assert "Traceback" not in text


def test_serve_rejects_a_bad_config_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "tiers.yaml"
    bad.write_text("tiers:\n  - name: a\n    role: latency\n    backends:\n"
                   "      - {url: 'ftp://x', models: [m]}\n")  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "tiergate", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 2
    assert "tiers.0.backends.0.url" in r.stderr
    assert "Traceback" not in r.stderr


def test_hf_says_what_is_missing_instead_of_a_traceback() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: this checks the message given without it")
    r = subprocess.run([sys.executable, "-m", "tiergate", "hf", "--random-weights"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert "needs the `hf` extra" in r.stderr
    assert "Traceback" not in r.stderr
    both = subprocess.run([sys.executable, "-m", "tiergate", "hf"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert both.returncode == 2
    assert "--random-weights" in both.stderr
