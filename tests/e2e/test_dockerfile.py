"""The Dockerfile's install steps, replayed without Docker.

The Dockerfile is parsed, and its COPY / WORKDIR / ENV / RUN steps are run in a temporary
directory the way the image build would run them: files are copied from the build context as
`.dockerignore` filters it, ENV and ARG values are expanded as Docker expands them, RUN steps go
through `/bin/sh -c` with the image's environment, and every absolute path under the image's
own folders (`/app`, `/opt/uv`) is mapped into the temporary directory. The result is a fresh
install (its own uv, its own virtual environment built from uv.lock, not the repository's
.venv); the image's ENTRYPOINT + CMD then start from it, the HEALTHCHECK command must pass
against it, and a completion must go through it.

Only the step that creates the image's user (groupadd/useradd/chown) is not replayed: it would
change this machine's accounts. The test checks instead that the image ends up running as that
unprivileged user.

Takes ~20-40 s (uv's cache makes the install fast; uv itself comes from PyPI). It runs by
default, in CI too; set TIERGATE_SKIP_DOCKERFILE_TEST=1 to skip it where PyPI is unreachable.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from loadtests.harness.procs import free_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        os.environ.get("TIERGATE_SKIP_DOCKERFILE_TEST") == "1",
        reason="TIERGATE_SKIP_DOCKERFILE_TEST=1",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
# Folders of the image that the replay maps into its temporary directory.
IMAGE_ROOTS = ("/app", "/opt/uv")
# Commands that only the user-creation step may use; that step is checked, not replayed.
USER_SETUP_COMMANDS = {"groupadd", "useradd", "mkdir", "chown"}
# The base image's environment (python:3.11-slim) that the Dockerfile builds on.
BASE_ENV = {"LANG": "C.UTF-8"}
NETWORK_ENV = re.compile(
    r"(?i)^(?:https?_proxy|no_proxy|all_proxy|ssl_cert_(?:file|dir)|requests_ca_bundle"
    r"|curl_ca_bundle|pip_(?:cert|index_url|extra_index_url|find_links|default_timeout)"
    r"|uv_(?:index_url|extra_index_url|default_index|index|native_tls|system_certs|http_timeout))$"
)


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Image:
    """What the replay learned about the image besides the files it installed."""

    base: str = ""
    user: str = "root"
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    exposed: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    skipped: list[Instruction] = field(default_factory=list)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comments and the syntax line dropped."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def expand(value: str, env: dict[str, str]) -> str:
    """Docker's variable substitution in ENV/WORKDIR/COPY: $VAR, ${VAR}, ${VAR:-default}."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        default = match.group(3)
        got = env.get(name, "")
        return got if got or default is None else default

    return re.sub(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\})",
                  repl, value)  # fmt: skip


def exec_form(args: str) -> list[str] | None:
    if args.startswith("["):
        parsed = json.loads(args)
        assert isinstance(parsed, list)
        assert all(isinstance(a, str) for a in parsed)
        return [str(a) for a in parsed]
    return None


class DockerIgnore:
    """The build context as `.dockerignore` leaves it (patterns, `**`, `!` exceptions)."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line.lstrip("!").strip().strip("/")
            regex = ""
            i = 0
            while i < len(pattern):
                if pattern.startswith("**/", i):
                    regex += "(?:.*/)?"
                    i += 3
                elif pattern.startswith("**", i):
                    regex += ".*"
                    i += 2
                elif pattern[i] == "*":
                    regex += "[^/]*"
                    i += 1
                elif pattern[i] == "?":
                    regex += "[^/]"
                    i += 1
                else:
                    regex += re.escape(pattern[i])
                    i += 1
            self.rules.append((negate, re.compile(regex + r"\Z")))

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        verdict = False
        for negate, regex in self.rules:
            if any(regex.match(prefix) for prefix in prefixes):
                verdict = not negate
        return verdict


class Replay:
    def __init__(self, context: Path, scratch: Path) -> None:
        self.context = context
        self.scratch = scratch
        self.ignore = DockerIgnore((context / ".dockerignore").read_text())
        self.image = Image()
        self.args: dict[str, str] = {}
        # The base image's /usr/local/bin: `python`, `python3` and `python3.X` are this
        # machine's base interpreter (not a virtual environment's), as in python:3.X-slim.
        base_bin = scratch / "base-image-bin"
        base_bin.mkdir(parents=True, exist_ok=True)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        interpreter = Path(sys.base_prefix) / "bin" / version
        assert interpreter.exists(), f"no base interpreter at {interpreter}"
        for name in ("python", "python3", version):
            (base_bin / name).symlink_to(interpreter)
        host_path = [
            p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not (Path(p) / "activate").exists()  # no virtual environment's bin/
        ]  # fmt: skip
        self.image.env = {**BASE_ENV, "PATH": os.pathsep.join([str(base_bin), *host_path])}

    def host(self, image_path: str) -> Path:
        """Where an absolute path of the image lives in the replay."""
        for root in IMAGE_ROOTS:
            if image_path == root or image_path.startswith(root + "/"):
                return self.scratch / image_path.lstrip("/")
        raise AssertionError(f"{image_path} is outside the image folders {IMAGE_ROOTS}")

    def map_text(self, text: str) -> str:
        for root in IMAGE_ROOTS:
            text = re.sub(rf"(?<![\w./-]){re.escape(root)}(?=/|\b|$)",
                          str(self.scratch) + root, text)  # fmt: skip
        return text

    def env(self) -> dict[str, str]:
        # The builder's network settings (proxy, CA certificates, package indexes) carry over,
        # as they would on a build host; the image's own ENV wins over them.
        env = {key: value for key, value in os.environ.items() if NETWORK_ENV.match(key)}
        env.update({key: self.map_text(value) for key, value in self.image.env.items()})
        env["HOME"] = str(self.scratch / "home")
        # uv's cache stands in for the build's cache mount.
        env["UV_CACHE_DIR"] = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
        return env

    def workdir(self) -> Path:
        if self.image.workdir == "/":  # before any WORKDIR: the image's root folder
            return self.scratch
        return self.host(self.image.workdir)

    def run(self, instructions: list[Instruction]) -> Image:
        (self.scratch / "home").mkdir(parents=True, exist_ok=True)
        for ins in instructions:
            handler = getattr(self, f"do_{ins.keyword.lower()}", None)
            assert handler is not None, f"line {ins.line}: {ins.keyword} is not replayable"
            handler(ins)
        return self.image

    def do_from(self, ins: Instruction) -> None:
        self.image.base = ins.args.split()[0]

    def do_arg(self, ins: Instruction) -> None:
        name, _, default = ins.args.partition("=")
        self.args[name.strip()] = default.strip().strip('"')

    def do_env(self, ins: Instruction) -> None:
        scope = {**self.args, **self.image.env}
        for token in shlex.split(ins.args):
            key, sep, value = token.partition("=")
            assert sep, f"line {ins.line}: use ENV KEY=VALUE"
            value = expand(value, scope)
            self.image.env[key] = value
            scope[key] = value

    def do_workdir(self, ins: Instruction) -> None:
        path = expand(ins.args, {**self.args, **self.image.env})
        self.image.workdir = str(PurePosixPath(self.image.workdir) / path)
        self.workdir().mkdir(parents=True, exist_ok=True)

    def do_copy(self, ins: Instruction) -> None:
        words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
        assert not any(w.startswith("--from") for w in shlex.split(ins.args)), "COPY --from"
        *sources, dest = [expand(w, {**self.args, **self.image.env}) for w in words]
        target = PurePosixPath(self.image.workdir) / dest
        into_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1
        for src in sources:
            path = self.context / src
            assert path.exists(), f"line {ins.line}: COPY {src}: not in the build context"
            assert not self.ignore.excluded(src), f"line {ins.line}: {src} is .dockerignored"
            if path.is_dir():
                self._copy_tree(path, self.host(str(target)))
            else:
                out = self.host(str(target / path.name) if into_dir else str(target))
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out)

    def _copy_tree(self, src: Path, dest: Path) -> None:
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(self.context).as_posix()
            if path.is_dir() or self.ignore.excluded(rel):
                continue
            out = dest / path.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)

    def do_run(self, ins: Instruction) -> None:
        args = re.sub(r"^(?:--\S+\s+)+", "", ins.args)  # --mount=type=cache,...: a cache only
        if "useradd" in args:
            commands = {part.split()[0] for part in re.split(r"&&|;", args) if part.strip()}
            assert commands <= USER_SETUP_COMMANDS, f"line {ins.line}: {commands}"
            self.image.skipped.append(ins)
            return
        env = {**self.env(), **self.args}
        argv = exec_form(args) or ["/bin/sh", "-c", self.map_text(args)]
        done = subprocess.run(argv, cwd=self.workdir(), env=env, capture_output=True, text=True,
                              timeout=180, check=False)  # fmt: skip
        assert done.returncode == 0, (
            f"line {ins.line}: RUN {args}\nexit {done.returncode}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )

    def do_user(self, ins: Instruction) -> None:
        self.image.user = ins.args

    def do_expose(self, ins: Instruction) -> None:
        self.image.exposed += ins.args.split()

    def do_healthcheck(self, ins: Instruction) -> None:
        _, _, command = ins.args.partition("CMD ")
        self.image.healthcheck = exec_form(command.strip()) or ["/bin/sh", "-c", command]

    def do_entrypoint(self, ins: Instruction) -> None:
        self.image.entrypoint = exec_form(ins.args) or ["/bin/sh", "-c", ins.args]

    def do_cmd(self, ins: Instruction) -> None:
        self.image.cmd = exec_form(ins.args) or ["/bin/sh", "-c", ins.args]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Replay, Image]:
    scratch = tmp_path_factory.mktemp("image")
    replay = Replay(ROOT, scratch)
    image = replay.run(parse_dockerfile(DOCKERFILE.read_text()))
    return replay, image


def test_image_metadata(installed: tuple[Replay, Image]) -> None:
    _, image = installed
    assert image.base == "python:3.11-slim"
    assert image.entrypoint == ["tiergate"]
    assert "8000" in image.exposed
    assert image.healthcheck, "no HEALTHCHECK"
    assert image.user.split(":")[0] not in ("root", "0"), image.user
    assert len(image.skipped) == 1, "exactly one user-creation step"
    uid = image.user.split(":")[0]
    assert f"--uid {uid}" in image.skipped[0].args or f"useradd {uid}" in image.skipped[0].args


def test_install_is_a_fresh_venv_of_the_image_sources(installed: tuple[Replay, Image]) -> None:
    replay, _ = installed
    venv = replay.host("/app/.venv")
    python = venv / "bin" / "python"
    assert python.exists(), "uv sync did not create /app/.venv"
    assert venv.resolve() != (ROOT / ".venv").resolve()
    code = "import gateway, engines.sim, loadtests, locust, matplotlib; print(gateway.__file__)"
    # From a neutral folder: the package must come from the install, not from the current folder.
    done = subprocess.run(
        [str(python), "-c", code],
        cwd=replay.scratch / "home",
        env=replay.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(replay.host("/app/gateway/__init__.py")), done.stdout
    for tool in ("tiergate", "locust"):
        assert (venv / "bin" / tool).exists(), f"{tool} is not installed"
    profile = replay.host("/app/engines/sim/profiles")
    assert any(profile.glob("*.yaml")), "simulator profiles missing"
    assert not (replay.host("/app") / "tests").exists(), "tests/ should not be in the image"


def test_entrypoint_and_cmd_serve_and_pass_the_healthcheck(
    installed: tuple[Replay, Image],
) -> None:
    replay, image = installed
    port = free_ports(4)
    sim_port = port + 1
    env = {**replay.env(), "TIERGATE_PORT": str(port)}
    entry = shutil.which(image.entrypoint[0], path=env["PATH"])
    assert entry is not None
    assert entry.startswith(str(replay.scratch)), entry
    argv = [entry, *image.cmd, "--port", str(port), "--sim-port", str(sim_port), "--speedup", "10"]
    proc = subprocess.Popen(argv, cwd=replay.workdir(), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        check = [shutil.which(image.healthcheck[0], path=env["PATH"]) or image.healthcheck[0],
                 *image.healthcheck[1:]]  # fmt: skip
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            ok = subprocess.run(check, env=env, capture_output=True, check=False).returncode == 0
            if ok:
                break
            assert time.monotonic() < deadline, "HEALTHCHECK never passed"
            time.sleep(0.5)
        base = f"http://127.0.0.1:{port}"
        while True:
            try:
                with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "/ready never answered 200"
            time.sleep(0.2)
        body = json.dumps({"prompt": "hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(base + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
            assert r.headers["x-tiergate-tier"] in ("latency", "throughput")
            assert json.loads(r.read())["usage"]["completion_tokens"] == 4
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
