"""Discovery from a file (gateway.backends.discovery.file): what a file may list, and the answers
its source gives as the file is written, rewritten, broken and removed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from gateway.backends.discovery import make_source
from gateway.backends.discovery.file import FileSource, parse
from gateway.config.settings import DiscoveryConfig, FileDiscovery


@pytest.mark.parametrize(
    ("case", "text", "urls"),
    [
        ("a YAML list", "- http://10.0.0.5:8000\n- http://10.0.0.6:8000/\n",
         {"http://10.0.0.5:8000", "http://10.0.0.6:8000"}),
        ("a JSON list", '["https://engine-a:443"]', {"https://engine-a:443"}),
        ("a mapping with backends", 'backends: ["http://[fd00::7]:8000"]',
         {"http://[fd00::7]:8000"}),
        ("an empty file", "", set()),
        ("an empty list", "[]", set()),
        ("duplicates once", "[http://a:1, http://a:1]", {"http://a:1"}),
    ],
)  # fmt: skip
def test_what_a_file_may_list(case: str, text: str, urls: set[str]) -> None:
    assert parse(text) == urls, case


@pytest.mark.parametrize(
    ("case", "text", "problem"),
    [
        ("not YAML", "[http://a:1", "not YAML or JSON"),
        ("a number", "42", "expected a list of URLs"),
        ("not a string", "[1]", "not a URL: 1"),
        ("no port", "[http://a]", "not an http(s)://host:port URL"),
        ("another scheme", "[grpc://a:1]", "not an http(s)://host:port URL"),
        ("a bad port", "[http://a:99999]", "not an http(s)://host:port URL"),
        ("a path", "[http://a:1/v1]", "a base URL has no path"),
    ],
)  # fmt: skip
def test_what_a_file_may_not_list(case: str, text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse(text)


async def test_answers_follow_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    cfg = DiscoveryConfig.model_validate(
        {"file": {"path": str(path), "interval_s": 0.01}, "backend": {"models": ["m"]}})
    source = make_source(cfg)
    assert isinstance(source, FileSource)
    answers = source.answers()

    async def until(check: object) -> None:
        async def loop() -> None:
            async for found in answers:
                if check(found):  # type: ignore[operator]
                    return
        await asyncio.wait_for(loop(), 10)

    await until(lambda f: f.error is not None and "FileNotFoundError" in f.error)
    path.write_text("[http://a:1]")
    await until(lambda f: f.urls == {"http://a:1"})
    new = tmp_path / "pool.yaml.new"
    new.write_text("[http://a:1, http://b:2]")
    new.replace(path)  # written whole, renamed over the old one
    await until(lambda f: f.urls == {"http://a:1", "http://b:2"})
    path.write_text("[http://a:1")
    await until(lambda f: f.error is not None and "not YAML or JSON" in f.error)
    await source.aclose()


def test_the_settings_name_the_file_source() -> None:
    cfg = DiscoveryConfig.model_validate(
        {"file": {"path": "pool.yaml"}, "backend": {"models": ["m"]}})
    assert cfg.source == "file"
    assert cfg.file == FileDiscovery(path=Path("pool.yaml"))
