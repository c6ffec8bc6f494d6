"""Loaded by a gateway started with this folder on PYTHONPATH: where TIERGATE_BURN is set, the
intake of every request first runs that many iterations of a Python loop, a known amount of
interpreted work added to each request (not part of the gateway)."""

import os

_K = int(os.environ.get("TIERGATE_BURN", "0"))
if _K:
    from gateway.pipeline import intake

    _read = intake.Intake.read

    async def _burning(self, ex, receive):  # type: ignore[no-untyped-def]
        x = 0
        for i in range(_K):
            x += i
        return await _read(self, ex, receive)

    intake.Intake.read = _burning  # type: ignore[method-assign]
