# Sourced by the other scripts: make .venv and install the locked dependencies into it.
# Usage: . scripts/_venv.sh EXTRA...   (extras from pyproject.toml, e.g. dev, load)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "tiergate needs Python >= 3.11 (found: $("$py" --version 2>&1))" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$py" -m venv .venv 2>/dev/null; then
        # Debian ships venv separately.
        if [ "$(id -u)" = 0 ]; then
            apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
        else
            sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
        fi
        rm -rf .venv && "$py" -m venv .venv
    fi
fi
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q --disable-pip-version-check uv
extras=(--extra native)
for e in "$@"; do extras+=(--extra "$e"); done
# --inexact keeps uv itself (and anything else the user added) in the venv. Bytecode is
# compiled ahead (the environment's when uv installs, the project's each time, under a second):
# where PYTHONDONTWRITEBYTECODE is set, every process started (a gateway, a simulator: the tests
# start many) would otherwise compile its modules from source: a gateway's start 2.46 s against
# 1.06, a simulator's 0.82 against 0.46 (docs/results/bytecode).
UV_PROJECT_ENVIRONMENT=.venv .venv/bin/uv sync -q --frozen --inexact --compile-bytecode "${extras[@]}"
.venv/bin/python -m compileall -q gateway engines loadtests tiergate >/dev/null
export PATH="$root/.venv/bin:$PATH"
# The routing modules compiled with mypyc where a C compiler is found (rebuilt only when their
# sources change); without one, or if the build fails, the gateway runs them from source.
.venv/bin/python -m tiergate.native || true
