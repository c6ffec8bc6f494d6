"""A throwaway nginx reverse proxy in front of one upstream: the floor the gateway is measured
against (what a plain, compiled proxy costs on the same machine, with the same client).

It runs in the foreground from a temporary prefix that holds everything it writes (config, pid,
error log, temp files), so it needs no system paths and leaves nothing behind:
`nginx -p DIR -c DIR/nginx.conf -e DIR/error.log -g 'daemon off;'`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from loadtests.harness.procs import free_port, terminate, wait_http

DEBIAN_NGINX = "/usr/sbin/nginx"


def nginx_binary() -> str | None:
    """The nginx executable, or None when it is not installed (/usr/sbin is often off PATH)."""
    found = shutil.which("nginx")
    if found:
        return found
    return DEBIAN_NGINX if os.access(DEBIAN_NGINX, os.X_OK) else None


def _missing_modules(binary: str) -> set[str]:
    """Modules compiled out of this build: their directives would make the config invalid."""
    out = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stderr
    return {
        part.removeprefix("--without-http_").removesuffix("_module")
        for part in out.split()
        if part.startswith("--without-http_")
    }


def render_config(
    prefix: Path, port: int, upstream: str, missing: AbstractSet[str] = frozenset()
) -> str:
    """nginx.conf for one worker proxying everything on 127.0.0.1:`port` to `upstream`
    (host:port), streaming responses as they come (SSE) over pooled keep-alive connections."""
    # Every temp path lives in the prefix: the compiled-in defaults (/var/lib/nginx/...) may not
    # exist or be writable.
    temp = [f"client_body_temp_path {prefix}/client_body;", f"proxy_temp_path {prefix}/proxy;"]
    temp += [
        f"{m}_temp_path {prefix}/{m};" for m in ("fastcgi", "uwsgi", "scgi") if m not in missing
    ]
    temp_lines = "\n    ".join(temp)
    return f"""\
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    {temp_lines}
    # nginx closes a keep-alive connection after 1000 requests by default; the load generators
    # and the gateway keep theirs open, so do the same to compare like with like.
    keepalive_requests 1000000;

    upstream sim {{
        server {upstream};
        keepalive 64;
        keepalive_requests 1000000;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@dataclass
class NginxProcess:
    """nginx on a free loopback port in front of `upstream` (host:port); ready once a request
    proxied to the upstream's `ready_path` answers 200."""

    upstream: str
    binary: str
    port: int = 0
    ready_path: str = "/health"
    prefix: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        """The worker processes (where the proxying happens), children of the master."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []

    def start(self, timeout: float = 10.0) -> Self:
        if not self.port:
            self.port = free_port()
        self.prefix = Path(tempfile.mkdtemp(prefix="tiergate-nginx-"))
        # Workers run as an unprivileged user when the master is root: let them into the prefix.
        self.prefix.chmod(0o755)
        conf = self.prefix / "nginx.conf"
        conf.write_text(
            render_config(self.prefix, self.port, self.upstream, _missing_modules(self.binary))
        )
        cmd = [self.binary, "-p", str(self.prefix), "-c", str(conf),
               "-e", str(self.prefix / "error.log"), "-g", "daemon off;"]  # fmt: skip
        # Messages from before the config is read go to stderr: keep them with the error log.
        with open(self.prefix / "stderr.log", "wb") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL
            )
        try:
            wait_http(self.url + self.ready_path, timeout, self.proc)
        except BaseException as e:
            detail = self.error_log()
            self.stop()
            if isinstance(e, Exception):
                raise RuntimeError(f"nginx did not start: {e}\n{detail}") from e
            raise
        return self

    def error_log(self) -> str:
        if self.prefix is None:
            return ""
        text = ""
        for name in ("stderr.log", "error.log"):
            with contextlib.suppress(OSError):
                text += (self.prefix / name).read_text()[-2000:]
        return text

    def stop(self) -> None:
        if self.proc is not None:
            # SIGTERM is nginx's fast shutdown: the master stops its workers and exits.
            terminate(self.proc)
            self.proc = None
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
