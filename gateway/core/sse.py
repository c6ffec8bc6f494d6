"""An engine's event stream in the one form the gateway reads and relays: lines ended by LF,
and `data: ` with its space.

The SSE specification lets a server end its lines with CR, LF or CRLF and write `data:value`
with no space (servers built on sse-starlette, llama-cpp-python's among them, send CRLF), while
everything that reads the stream here (the relay, the usage and token counts, continuation, the
Triton translation) looks for `\\n\\n` between events and `data: ` at a line's start. Rewritten
once as the bytes arrive, in a form every SSE client reads as the same events, those readers
need to know one form only. A CRLF or a `data:` split across two reads is put together: a read
that ends with CR drops the LF that may start the next; a trailing piece of a line that may
still become `data:` waits for the next read (the relay sends whole events only, so waiting
costs nothing).

The common case costs two searches of the read: an engine that sends the canonical form
already (vLLM, SGLang, Triton) has no CR and a space after every `data:`.
"""

from __future__ import annotations

import re

__all__ = ["EventLines"]

_DATA = b"data:"
_DATA_SPACE = b"data: "
_NO_SPACE = re.compile(rb"^data:(?! )", re.MULTILINE)


class EventLines:
    """One stream's rewriter: `feed` each read in order, `flush` at the stream's end."""

    __slots__ = ("_cr", "_held")

    def __init__(self) -> None:
        self._cr = False  # the last read ended with CR (now LF): an LF next is its pair
        self._held = b""  # a trailing piece of a line that may still become `data:`

    def feed(self, data: bytes) -> bytes:
        if self._held:
            data, self._held = self._held + data, b""
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            self._cr = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = data.rfind(b"\n") + 1
        if cut < len(data) and len(data) - cut <= len(_DATA) and _DATA.startswith(data[cut:]):
            data, self._held = data[:cut], data[cut:]
        if data.count(_DATA) != data.count(_DATA_SPACE):
            data = _NO_SPACE.sub(_DATA_SPACE, data)
        return data

    def flush(self) -> bytes:
        """What is still held at the stream's end."""
        held, self._held = self._held, b""
        return held
