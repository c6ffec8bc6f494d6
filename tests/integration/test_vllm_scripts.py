"""engines/vllm/v2.sh, v3.sh, v4.sh: the `vllm serve` command lines they build.

Each script runs with a fake `vllm` first on PATH that records its arguments and the GPU it was
given, so the test sees exactly what vLLM would receive. The last test checks that the
docker-compose engines (with .env applied) pass the same flags as the scripts.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.deployfiles import flag_value, load_compose, read_dotenv

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "engines" / "vllm"
FAKE_VLLM = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_VLLM_LOG"], "w") as f:
    json.dump({"argv": sys.argv[1:], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
"""
# Flags the tutorial used that current vLLM no longer takes.
OLD_FLAGS = {
    "--speculative-model",
    "--num-speculative-tokens",
    "--speculative-draft-tensor-parallel-size",
    "--use-v2-block-manager",
    "--model",
}


class Run:
    def __init__(self, returncode: int, argv: list[str], gpu: str | None, stderr: str) -> None:
        self.returncode = returncode
        self.argv = argv
        self.gpu = gpu
        self.stderr = stderr

    def flag(self, name: str) -> str | None:
        return flag_value(self.argv, name)


@pytest.fixture
def run(tmp_path: Path) -> Any:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "vllm"
    fake.write_text(FAKE_VLLM)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "argv.json"

    def go(script: str, *args: str, **env: str) -> Run:
        log.unlink(missing_ok=True)
        base = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "SYSTEMROOT")}
        base["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"
        base["FAKE_VLLM_LOG"] = str(log)
        done = subprocess.run(["bash", str(SCRIPTS / script), *args], env={**base, **env},
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if not log.exists():
            return Run(done.returncode, [], None, done.stderr)
        data = json.loads(log.read_text())
        return Run(done.returncode, data["argv"], data["gpu"], done.stderr)

    return go


@pytest.mark.parametrize("script", ["v2.sh", "v3.sh", "v4.sh"])
def test_script_is_strict_bash(script: str) -> None:
    path = SCRIPTS / script
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(path, os.X_OK), f"{script} is not executable"
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.parametrize("script", ["v2.sh", "v3.sh", "v4.sh"])
def test_common_flags_and_passthrough(run: Any, script: str) -> None:
    r = run(script, "--load-format", "dummy", "--api-key", "a key with spaces")
    assert r.returncode == 0, r.stderr
    assert r.argv[0] == "serve"
    assert not r.argv[1].startswith("-"), "the model is positional"
    assert r.flag("--served-model-name") == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.flag("--gpu-memory-utilization") == "0.9"
    assert r.flag("--max-model-len") == "4096"
    assert (r.flag("--host"), r.flag("--port")) == ("0.0.0.0", "8000")
    assert r.argv[-4:] == ["--load-format", "dummy", "--api-key", "a key with spaces"]
    assert not OLD_FLAGS & set(r.argv)
    assert r.gpu is None


def test_v2_bf16(run: Any) -> None:
    r = run("v2.sh")
    assert r.argv[1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.flag("--dtype") == "bfloat16"
    assert r.flag("--max-num-seqs") == "256"
    assert r.flag("--quantization") is None
    assert r.flag("--speculative-config") is None


def test_v3_awq(run: Any) -> None:
    r = run("v3.sh")
    assert r.argv[1] == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    assert r.flag("--quantization") == "awq_marlin"
    assert r.flag("--dtype") == "float16"
    assert r.flag("--max-num-seqs") == "384"
    assert r.flag("--speculative-config") is None
    assert run("v3.sh", QUANTIZATION="awq").flag("--quantization") == "awq"
    bad = run("v3.sh", QUANTIZATION="gptq")
    assert bad.returncode != 0
    assert bad.argv == []
    assert "QUANTIZATION" in bad.stderr


def test_v4_eagle3(run: Any) -> None:
    r = run("v4.sh")
    assert r.returncode == 0, r.stderr
    assert r.argv[1] == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    assert r.flag("--max-num-seqs") == "16"
    assert r.flag("--quantization") == "awq_marlin"
    spec = json.loads(r.flag("--speculative-config") or "")
    assert spec == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 5,
    }


def test_v4_settings_are_environment_variables(run: Any) -> None:
    r = run(
        "v4.sh",
        MODEL="meta-llama/Llama-2-7b-chat-hf",
        DRAFT_MODEL="yuhuili/EAGLE-llama2-chat-7B",
        SPEC_METHOD="eagle",
        NUM_SPECULATIVE_TOKENS="3",
        QUANTIZATION="none",
        PORT="8201",
        GPU="2",
        SERVED_MODEL_NAME="llama2",
        MAX_NUM_SEQS="8",
    )
    assert r.returncode == 0, r.stderr
    assert r.argv[1] == "meta-llama/Llama-2-7b-chat-hf"
    spec = json.loads(r.flag("--speculative-config") or "")
    assert spec == {"method": "eagle", "model": "yuhuili/EAGLE-llama2-chat-7B",
                    "num_speculative_tokens": 3}  # fmt: skip
    assert r.flag("--quantization") is None
    assert r.flag("--dtype") is None
    assert (r.flag("--port"), r.gpu, r.flag("--served-model-name")) == ("8201", "2", "llama2")
    assert r.flag("--max-num-seqs") == "8"


@pytest.mark.parametrize(
    "env",
    [
        {"NUM_SPECULATIVE_TOKENS": "five"},
        {"NUM_SPECULATIVE_TOKENS": "0"},
        {"DRAFT_MODEL": 'x","method":"ngram'},
        {"QUANTIZATION": "fp8"},
    ],
)
def test_v4_rejects_settings_that_would_break_its_json(run: Any, env: dict[str, str]) -> None:
    r = run("v4.sh", **env)
    assert r.returncode != 0
    assert r.argv == [], "vllm must not start"


def test_missing_vllm_is_reported(run: Any) -> None:
    r = run("v3.sh", VLLM="no-such-vllm")
    assert r.returncode == 127
    assert "not found" in r.stderr


@pytest.mark.parametrize(("service", "script"), [("v4", "v4.sh"), ("v3-a", "v3.sh"),
                                                 ("v3-b", "v3.sh")])  # fmt: skip
def test_compose_engines_pass_the_scripts_flags(run: Any, service: str, script: str) -> None:
    env = read_dotenv()
    compose = [str(arg) for arg in load_compose(env)["services"][service]["command"]]
    prefix = "V4" if service == "v4" else "V3"
    r = run(
        script,
        MODEL=env["AWQ_MODEL"],
        DRAFT_MODEL=env["DRAFT_MODEL"],
        SPEC_METHOD=env["SPEC_METHOD"],
        NUM_SPECULATIVE_TOKENS=env["NUM_SPECULATIVE_TOKENS"],
        SERVED_MODEL_NAME=env["SERVED_MODEL_NAME"],
        QUANTIZATION=env["QUANTIZATION"],
        MAX_MODEL_LEN=env["MAX_MODEL_LEN"],
        MAX_NUM_SEQS=env[f"{prefix}_MAX_NUM_SEQS"],
        GPU_MEMORY_UTILIZATION=env[f"{prefix}_GPU_MEMORY_UTILIZATION"],
        PORT="8000",
    )
    assert r.returncode == 0, r.stderr
    assert r.argv[0] == "serve"

    def pairs(argv: list[str]) -> dict[str, str]:
        return {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1, 2)}

    assert r.argv[1] == compose[0]
    assert pairs(["serve", *compose[1:]]) == pairs(["serve", *r.argv[2:]])
