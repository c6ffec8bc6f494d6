"""How routing's frozen dataclasses pickle and copy: by their constructor.

Compiled (gateway.routing.native), a class has no instance dict, and pickle's and copy's own
way, setting the fields one by one, is what a frozen class refuses. Each such class returns
`rebuilt(self)` from `__reduce__`, so a value pickles and copies alike in both builds (the
routing study hands its runs' specifications to worker processes by pickle)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

__all__ = ["rebuilt"]


def rebuilt(obj: Any) -> tuple[type[Any], tuple[Any, ...]]:
    """(the class, its init fields' values): what `__reduce__` returns for a frozen
    dataclass; the fields its `__post_init__` derives are derived again."""
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj) if f.init)
