#!/usr/bin/env bash
# Install the benchmark client the smoke test drives (aiperf, with the exact versions of
# tests/clients/aiperf.txt) into its own environment, .venv-clients: its dependencies pin other
# versions of packages the gateway uses, so it cannot share .venv. Needs .venv's uv
# (scripts/_venv.sh). Does nothing when the environment already matches the file.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
req=tests/clients/aiperf.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x .venv-clients/bin/aiperf ] && [ "$(cat .venv-clients/.requirements 2>/dev/null)" = "$want" ]; then
    exit 0
fi
rm -rf .venv-clients
.venv/bin/uv venv -q --python .venv/bin/python .venv-clients
# Compiled ahead: aiperf starts several processes, each of which would otherwise compile its
# modules again where PYTHONDONTWRITEBYTECODE is set (the smoke test 17-19 s against 11-12 s).
VIRTUAL_ENV="$root/.venv-clients" .venv/bin/uv pip install -q --compile-bytecode -r "$req"
echo "$want" > .venv-clients/.requirements
