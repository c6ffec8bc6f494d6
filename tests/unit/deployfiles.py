"""Reading the deployment files the way their tools read them, for the deployment tests.

- `read_dotenv` / `interpolate` / `load_compose` / `enabled_services`: Docker Compose's `.env`
  file, variable interpolation (`$$`, `$VAR`, `${VAR}`, `${VAR:-d}`, `${VAR-d}`, `${VAR:?e}`,
  `${VAR?e}`, `${VAR:+r}`, `${VAR+r}`) and profiles (a `--profile` flag replaces
  COMPOSE_PROFILES; services without `profiles` are always enabled).
- `yaml_documents`: every document of a multi-document YAML file (Kubernetes manifests).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOTENV = ROOT / ".env"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is missing, or a malformed expression."""


def read_dotenv(path: Path = DOTENV) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and `#` comments skipped; one pair of quotes removed."""
    env: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _NAME.fullmatch(key):
            raise ValueError(f"{path}:{number}: not KEY=VALUE: {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def dotenv_comments(path: Path = DOTENV) -> dict[str, list[str]]:
    """For each key of a `.env` file, the comment lines right above it (its documentation)."""
    docs: dict[str, list[str]] = {}
    block: list[str] = []
    after_key = False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#"):
            if after_key:
                block, after_key = [], False
            block.append(line.lstrip("# "))
        elif not line:
            block, after_key = [], False
        else:
            # A group of keys right under one comment shares it.
            docs[line.partition("=")[0].strip()] = list(block)
            after_key = True
    return docs


def _expression(text: str, start: int) -> tuple[str, int]:
    """The inside of the `${...}` opening at `start`, and the index after its closing brace."""
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 2 : i], i + 1
        i += 1
    raise InterpolationError(f"unclosed ${{ in {text!r}")


def interpolate_str(text: str, env: Mapping[str, str], used: set[str] | None = None) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            inner, i = _expression(text, i)
            out.append(_substitute(inner, env, used))
        elif text[i] == "$" and (match := _NAME.match(text, i + 1)):
            name = match.group(0)
            if used is not None:
                used.add(name)
            out.append(env.get(name, ""))
            i = match.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _substitute(inner: str, env: Mapping[str, str], used: set[str] | None) -> str:
    match = _NAME.match(inner)
    if match is None:
        raise InterpolationError(f"invalid expression ${{{inner}}}")
    name, rest = match.group(0), inner[match.end() :]
    if used is not None:
        used.add(name)
    value = env.get(name)
    if not rest:
        return value or ""
    for op in (":-", "-", ":?", "?", ":+", "+"):
        if rest.startswith(op):
            arg = interpolate_str(rest[len(op) :], env, used)
            unset_or_empty = not value if op.startswith(":") else value is None
            if op in (":-", "-"):
                return arg if unset_or_empty else (value or "")
            if op in (":?", "?"):
                if unset_or_empty:
                    raise InterpolationError(f"{name}: {arg or 'required'}")
                return value or ""
            return "" if unset_or_empty else arg
    raise InterpolationError(f"invalid expression ${{{inner}}}")


def interpolate(value: Any, env: Mapping[str, str], used: set[str] | None = None) -> Any:
    """Interpolate every string value of a parsed YAML tree (keys are left as they are)."""
    if isinstance(value, str):
        return interpolate_str(value, env, used)
    if isinstance(value, list):
        return [interpolate(item, env, used) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, env, used) for key, item in value.items()}
    return value


def raw_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def load_compose(env: Mapping[str, str] | None = None, path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file with its YAML anchors merged and `.env` (or `env`) interpolated."""
    model = interpolate(raw_compose(path), read_dotenv() if env is None else env)
    assert isinstance(model, dict)
    return model


def active_profiles(env: Mapping[str, str], flags: Iterable[str] = ()) -> set[str]:
    """What Compose enables: the --profile flags if any, else COMPOSE_PROFILES."""
    given = [flag for flag in flags if flag]
    if given:
        return set(given)
    return {p.strip() for p in env.get("COMPOSE_PROFILES", "").split(",") if p.strip()}


def enabled_services(model: Mapping[str, Any], profiles: set[str]) -> dict[str, Any]:
    services: dict[str, Any] = model["services"]
    return {
        name: svc
        for name, svc in services.items()
        if not svc.get("profiles") or profiles & set(svc["profiles"])
    }


def network_names(name: str, service: Mapping[str, Any]) -> set[str]:
    """The names a service answers to on the default network: its own and its aliases."""
    names = {name}
    networks = service.get("networks") or {}
    if isinstance(networks, dict):
        for net in networks.values():
            names.update((net or {}).get("aliases", []))
    return names


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in an argument list."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert all(isinstance(doc, dict) for doc in docs), path
    return docs
