"""gateway.core.sse: every form of line end and `data:` the SSE specification allows, split
anywhere across reads, comes out as LF-ended lines with `data: ` (EventLines); an event's data is
assembled as the specification says, whatever other fields and comments it has and over however
many `data` lines (event_data)."""

from __future__ import annotations

import pytest

from gateway.core.sse import EventLines, event_data

CANONICAL = b'data: {"a":1}\n\n: comment\n\ndata: {"b":"x\\r"}\ndata: 2\n\ndata: [DONE]\n\n'
FORMS = {
    "lf": CANONICAL,
    "crlf": CANONICAL.replace(b"\n", b"\r\n"),
    "cr": CANONICAL.replace(b"\n", b"\r"),
    "no space": CANONICAL.replace(b"data: ", b"data:"),
    "crlf, no space": CANONICAL.replace(b"\n", b"\r\n").replace(b"data: ", b"data:"),
    "mixed": b'data:{"a":1}\r\n\n: comment\r\rdata: {"b":"x\\r"}\ndata:2\r\n\r\ndata:[DONE]\r\r',
}


def _through(parts: list[bytes]) -> bytes:
    lines = EventLines()
    return b"".join(lines.feed(p) for p in parts) + lines.flush()


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_a_form_in_one_read(form: str) -> None:
    assert _through([FORMS[form]]) == CANONICAL


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_a_form_split_at_every_point(form: str) -> None:
    data = FORMS[form]
    for i in range(len(data) + 1):
        assert _through([data[:i], data[i:]]) == CANONICAL, (form, i, data[:i])


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_a_form_byte_by_byte(form: str) -> None:
    data = FORMS[form]
    assert _through([data[i : i + 1] for i in range(len(data))]) == CANONICAL


@pytest.mark.parametrize(
    ("reads", "out"),
    [
        ([b"data: x\n\n"], [b"data: x\n\n"]),  # canonical: as it came
        ([b"data: x\r", b"\n\r\n"], [b"data: x\n", b"\n"]),  # the LF of a split CRLF dropped
        ([b"data: x\n\nda", b"ta:y\n\n"], [b"data: x\n\n", b"data: y\n\n"]),  # held, then fixed
        ([b"data:", b" y\n\n"], [b"", b"data: y\n\n"]),  # one space, not two
        ([b"data:", b"  y\n\n"], [b"", b"data:  y\n\n"]),  # a value's own leading space kept
        ([b'data: {"t":"metadata:"}\n\n'], [b'data: {"t":"metadata:"}\n\n']),  # not at a start
    ],
)
def test_reads_and_what_each_gives(reads: list[bytes], out: list[bytes]) -> None:
    lines = EventLines()
    assert [lines.feed(r) for r in reads] == out
    assert lines.flush() == b""


def test_a_stream_that_starts_canonical_is_passed_through() -> None:
    """An engine's writer frames a stream's events alike: once its first whole line is in the
    canonical form, the rest goes through untouched (checking each read cost 7% of a stream's
    instructions); a stream that starts in another form is rewritten to its end."""
    plain = EventLines()
    assert plain.feed(b"data: x\n\n") == b"data: x\n\n"
    assert plain.feed(b"data:y\r\n\r\n") == b"data:y\r\n\r\n"
    odd = EventLines()
    assert odd.feed(b"data:x\n\n") == b"data: x\n\n"
    assert odd.feed(b"data: y\n\n") == b"data: y\n\n"
    assert odd.feed(b"data:z\r\n\r\n") == b"data: z\n\n"


def test_what_is_held_at_the_end_comes_out_on_flush() -> None:
    lines = EventLines()
    assert lines.feed(b"data: x\n\nda") == b"data: x\n\n"
    assert lines.flush() == b"da"


@pytest.mark.parametrize(
    ("event", "data"),
    [
        (b'data: {"a":1}', b'{"a":1}'),  # vLLM's
        (b'data:{"a":1}', b'{"a":1}'),  # no space
        (b"data:  two spaces", b" two spaces"),  # only the first space is dropped
        (b"data: [DONE]", b"[DONE]"),
        (b'id: 7\nevent: message\ndata: {"a":1}', b'{"a":1}'),  # other fields first
        (b'data: {"a":1}\nid: 7', b'{"a":1}'),  # ... or after
        (b": a comment\ndata: x", b"x"),
        (b'data: {"a":\ndata: 1}', b'{"a":\n1}'),  # several data lines, joined by LF
        (b"data: a\ndata\ndata: b", b"a\n\nb"),  # a `data` field with no colon: empty
        (b"data:", b""),
        (b": only a comment", None),
        (b"id: 1\nretry: 5", None),
        (b"datum: x", None),  # another field's name
    ],
)
def test_an_events_data_as_the_specification_assembles_it(event: bytes, data: bytes | None) -> None:
    assert event_data(event) == data
