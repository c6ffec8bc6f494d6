"""The configuration reference (docs/configuration-reference.md), generated from the settings
models so that it cannot drift from them: every field of `gateway.config.settings.Settings` and of
the models under it, with its type, default, bounds and meaning. The meaning is the field's
`description` where it has one, else the comment written above it (or beside it) in the source.

`python -m tiergate.config_reference > docs/configuration-reference.md` rewrites the file; a
test fails while the file and the models differ.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.config.settings import Settings
from gateway.wire.kinds import BUILTIN

__all__ = ["render"]

_FIELD = re.compile(r"^    (\w+)\s*:")
_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "at least"),
           ("max_length", "at most"))  # fmt: skip


def comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in the source of `model` and its bases: the comment lines right
    above the field, or the one after it on its line."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in source.splitlines()[1:]:
            stripped = line.strip()
            if line.startswith("    #"):
                above.append(stripped.lstrip("#").strip())
                continue
            match = _FIELD.match(line)
            if match:
                beside = line.split("  # ", 1)[1].strip() if "  # " in line else ""
                text = " ".join(above) or beside
                if text:
                    found[match.group(1)] = text
            above = []
    return found


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The settings models inside a field's type (list[X], X | None, X)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _type(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:  # constraints show as bounds, not in the type
        return _type(get_args(annotation)[0])
    if origin is Literal:
        return " | ".join(repr(a).replace("'", '"') for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(_type(a) for a in get_args(annotation))
    if origin is not None and get_args(annotation):
        inner = ", ".join(_type(a) for a in get_args(annotation) if a is not Ellipsis)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value!r}`".replace("'", '"')


def _bounds(info: FieldInfo) -> str:
    out = []
    for meta in info.metadata:
        for attr, word in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{word} {value}")
    return ", ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(path: str, model: type[BaseModel]) -> tuple[list[str], list[tuple[str, type]]]:
    notes = comments(model)
    doc = inspect.getdoc(model) if model.__doc__ and model.__module__.startswith("gateway") else ""
    lines = [f"## `{path}`" if path else "## Top level", ""]
    if doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    nested: list[tuple[str, type]] = []
    for name, info in model.model_fields.items():
        meaning = info.description or notes.get(name, "")
        if not meaning and any(True for _ in _models_in(info.annotation)):
            meaning = "its section below"
        lines.append(f"| `{name}` | {_cell(_type(info.annotation))} | {_cell(_default(info))} | "
                     f"{_bounds(info)} | {_cell(meaning)} |")  # fmt: skip
        for sub in _models_in(info.annotation):
            many = get_origin(info.annotation) is list
            nested.append((f"{path + '.' if path else ''}{name}{'[]' if many else ''}", sub))
    return lines, nested


def render() -> str:
    """The whole reference, as markdown."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the settings models (`gateway/config/settings.py`, the policy's "
        "parameters in `gateway/routing/params.py`, each engine kind's options in "
        "`gateway/wire/<kind>/options.py`) by `python -m tiergate.config_reference`; a test "
        "fails while this file and the models differ. Every field can be set in the YAML file "
        "(`--config`) or as an environment variable `TIERGATE_<FIELD>`, nested with `__` "
        "(`TIERGATE_POLICY__NAME=least-loaded`). [configuration.md](configuration.md) explains "
        "how the parts fit together; [examples/tiers.yaml](../examples/tiers.yaml) is a "
        "commented example.",
        "",
    ]
    todo: list[tuple[str, type]] = [("", Settings)]
    seen: set[str] = set()
    while todo:
        path, model = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        lines, nested = _section(path, model)
        out += [*lines, ""]
        todo += nested
    for kind in BUILTIN.values():
        # A backend's kind takes its own options beside the common fields, flat.
        lines, _ = _section(f"tiers[].backends[]` of kind `{kind.name}", kind.options)
        out += [*lines, ""]
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render(), end="")
