"""The simulator's text rules: prompt counting and how a request's output length is decided."""

from __future__ import annotations

import pytest

from engines.sim import tokens


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("one", 1),
        ("hello there  world\n", 3),
        ("", 1),
        ([1, 2, 3, 4], 4),
        (" ".join(["w"] * 50), 50),
    ],
)
def test_prompt_counting_rule(prompt: str | list[int], expected: int) -> None:
    assert tokens.count_prompt(prompt) == expected


def test_chat_counting_rule() -> None:
    assert tokens.count_chat(["hi there", "yes"]) == (2 + 4) + (1 + 4) + 3


def test_output_is_one_word_per_token_and_deterministic() -> None:
    text = tokens.text_of(7, 0, 25)
    assert len(text.split()) == 25
    assert text == tokens.text_of(7, 0, 10) + tokens.text_of(7, 10, 25)
    assert text != tokens.text_of(8, 0, 25)


BASE = {"seed": 0, "min_tokens": 0, "stop": (), "natural": 40}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"max_tokens": 256, "ignore_eos": True}, (256, "length", None)),
        ({"max_tokens": 256, "ignore_eos": False}, (40, "stop", None)),
        ({"max_tokens": 30, "ignore_eos": False}, (30, "length", None)),
        ({"max_tokens": 256, "ignore_eos": False, "min_tokens": 100}, (100, "stop", None)),
        ({"max_tokens": 90, "ignore_eos": False, "min_tokens": 100}, (90, "length", None)),
    ],
)
def test_plan_output(kw: dict[str, object], expected: tuple[int, str, str | None]) -> None:
    plan = tokens.plan_output(**(BASE | kw))  # type: ignore[arg-type]
    assert (plan.tokens, plan.finish_reason, plan.stop_reason) == expected


def test_stop_string_ends_output_and_is_cut() -> None:
    words = tokens.text_of(0, 0, 20).split()
    target = words[5]
    first = words.index(target)
    plan = tokens.plan_output(
        seed=0, max_tokens=20, min_tokens=0, ignore_eos=True, stop=[target], natural=99
    )
    assert (plan.tokens, plan.finish_reason, plan.stop_reason) == (first + 1, "stop", target)
    visible = tokens.visible_text(0, plan.tokens, plan.stop_reason)
    assert target not in visible.split()
    assert visible.split() == words[:first]


def test_stop_is_not_honoured_before_min_tokens() -> None:
    first = tokens.text_of(0, 0, 1).strip()
    plan = tokens.plan_output(
        seed=0, max_tokens=50, min_tokens=10, ignore_eos=True, stop=[first], natural=99
    )
    assert plan.tokens >= 10
