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

An engine's SSE writer frames every event of a stream alike (the separator and the field's
prefix are constants of its server), so a stream whose first whole line comes in the canonical
form already (vLLM's, SGLang's, Triton's) is passed through untouched from then on: checking
every read cost ~1,500 instructions an event, 7% of a relayed stream's
(docs/results/instructions-sse-every-read.md). Any other form is rewritten to the stream's end.
"""

from __future__ import annotations

import re

__all__ = ["EventLines", "event_data", "skip_space"]

_DATA = b"data:"
_DATA_SPACE = b"data: "
_NO_SPACE = re.compile(rb"^data:(?! )", re.MULTILINE)


class EventLines:
    """One stream's rewriter: `feed` each read in order, `flush` at the stream's end."""

    __slots__ = ("_cr", "_held", "_odd", "plain")

    def __init__(self) -> None:
        self._cr = False  # the last read ended with CR (now LF): an LF next is its pair
        self._held = b""  # a trailing piece of a line that may still become `data:`
        self._odd = False  # a form other than the canonical one was seen: rewrite to the end
        # The first whole line was canonical: the rest passes through (a reader may stop
        # feeding then; nothing is held).
        self.plain = False

    def feed(self, data: bytes) -> bytes:
        if self.plain:
            return data
        if self._held:
            data, self._held = self._held + data, b""
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            self._odd = True
            self._cr = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = data.rfind(b"\n") + 1
        if cut < len(data) and len(data) - cut <= len(_DATA) and _DATA.startswith(data[cut:]):
            data, self._held = data[:cut], data[cut:]
        if data.count(_DATA) != data.count(_DATA_SPACE):
            fixed = _NO_SPACE.sub(_DATA_SPACE, data)
            self._odd = self._odd or fixed != data
            data = fixed
        if not self._odd and not self._held and b"\n" in data:
            self.plain = True
        return data

    def flush(self) -> bytes:
        """What is still held at the stream's end."""
        held, self._held = self._held, b""
        return held


def event_data(event: bytes) -> bytes | None:
    """The data of one event (its lines, without the blank line that ends it) as the SSE
    specification assembles it: the values of its `data` fields joined by LF, a value's one
    leading space dropped; comments (`:`) and other fields (`id`, `event`, `retry`) ignored. None
    when it has no `data` field. An engine may send `id:` or `event:` before the data, or a JSON
    payload over several `data:` lines: the continuation reads each as one event."""
    if event.startswith(_DATA_SPACE) and b"\n" not in event:  # vLLM's: one `data: ` line
        return event[6:]
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(_DATA):
            value = line[5:]
            parts.append(value[1:] if value[:1] == b" " else value)
        elif line == b"data":  # the field with no colon: an empty value
            parts.append(b"")
        # anything else: a comment or another field
    return b"\n".join(parts) if parts else None


_SPACE = frozenset(b" \t\r\n")  # JSON's whitespace


def skip_space(data: bytes, j: int) -> int:
    """The first index from `j` that is not JSON's whitespace: an event's JSON read in place
    where an engine may write it with spaces (Python's `json.dumps` defaults: `"text": "..."`)."""
    end = len(data)
    while j < end and data[j] in _SPACE:
        j += 1
    return j
