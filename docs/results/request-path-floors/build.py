"""A copy of this tree with the request path compiled by mypyc, for floors.py: the committed
files (git archive HEAD) in DIR, the modules a request runs through compiled in place beside
their sources (the interpreter imports an extension before a source of the same name), and the
routing modules' own build (`python -m tiergate.native`). From the repository's root:

    python docs/results/request-path-floors/build.py DIR

mypyc 1.x compiles no `continue` inside `try/finally` (a `with` block is one): the one such
loop, the continuation's in gateway/pipeline/upstream.py, is rewritten in the copy with a flag,
doing the same. `gateway/serve/app.py` is left out: mypyc compiles no async generator.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODULES = [
    "gateway/core/http1.py", "gateway/core/sse.py", "gateway/core/exchange.py",
    "gateway/pipeline/intake.py", "gateway/pipeline/upstream.py", "gateway/pipeline/retry.py",
    "gateway/pipeline/admission.py", "gateway/pipeline/router.py", "gateway/serve/server.py",
]  # fmt: skip

SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(name="request-path", packages=[], script_args=["build_ext", "--inplace"],
      ext_modules=mypycify(sys.argv[1:], separate=True, opt_level="3"))
"""

BEFORE = """                with self.registry.lease(entry, ex.slo.tpot_s, ex.task) as lease:
                    try:
                        _, resp, first = await self._open(ex, lease, request, False)
                    except Retryable as e:
                        self.attempt_failed(backend, e, ex.attempts)
                        ex.failed_urls.add(backend.url)
                        continue
                    try:
                        if resp.status != 200:  # refused for good (e.g. a 400): end here
                            ex.failed_urls.add(backend.url)
                            continue
"""

AFTER = """                again: str | None = ""
                opened = None
                with self.registry.lease(entry, ex.slo.tpot_s, ex.task) as lease:
                    try:
                        opened = await self._open(ex, lease, request, False)
                    except Retryable as e:
                        self.attempt_failed(backend, e, ex.attempts)
                        ex.failed_urls.add(backend.url)
                    if opened is not None:
                        _, resp, first = opened
                        try:
                            if resp.status != 200:
                                ex.failed_urls.add(backend.url)
                                opened = None
                            else:
"""


def rewrite(upstream: Path) -> None:
    text = upstream.read_text()
    start = text.index(BEFORE)
    release = "                    finally:\n                        resp.release()\n"
    end = text.index(release, start)
    # The rest of the block under `if` and `else:`; the `continue` after the lease.
    rest = text[start + len(BEFORE) : end].splitlines(keepends=True)
    body = "".join("        " + line if line.strip() else line for line in rest)
    after = ("                        finally:\n                            resp.release()\n"
             "                if opened is None:\n                    continue\n")  # fmt: skip
    upstream.write_text(text[:start] + AFTER + body + after + text[end + len(release) :])


def main(folder: Path) -> None:
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    rewrite(folder / "gateway/pipeline/upstream.py")
    subprocess.run([sys.executable, "-c", SETUP, *MODULES], cwd=folder, check=True)
    subprocess.run([sys.executable, "-m", "tiergate.native"], cwd=folder, check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
