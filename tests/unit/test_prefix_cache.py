"""Automatic prefix caching: the block cache alone, then inside the scheduler on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engines.sim import tokens
from engines.sim.prefix import PrefixCache, block_hashes
from engines.sim.profile import Cost, Profile
from engines.sim.scheduler import Scheduler, Sequence

COST = Cost(base_s=0.01, per_token_s=0.0001, prefill_per_token_s=0.001)


def profile(**kw: object) -> Profile:
    data: dict[str, object] = {"name": "t", "cost": COST, "num_gpu_blocks": 10_000} | kw
    return Profile.model_validate(data)


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


# -- the hashes ----------------------------------------------------------------------------------
def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes(words(15), 16) == ()
    assert len(block_hashes(words(16), 16)) == 1
    assert len(block_hashes(words(47), 16)) == 2


def test_hashes_are_chained_over_the_whole_prefix() -> None:
    base = block_hashes(words(64), 16)
    longer = block_hashes(words(64) + ["extra"] * 20, 16)
    assert longer[:4] == base  # a shared prefix: the same leading hashes
    # A different first block changes every hash after it, even for identical later blocks.
    other = block_hashes(["x", *words(64)[1:]], 16)
    assert all(a != b for a, b in zip(base, other, strict=True))
    # The same tokens in block 2 but not at the same place in the prompt: no match.
    shifted = block_hashes(words(16, "z") + words(64)[16:], 16)
    assert shifted[1:] != base[1:]


def test_chat_tokens_count_as_count_chat_and_include_roles() -> None:
    msgs = [("system", "be brief"), ("user", "one two three")]
    assert len(tokens.chat_tokens(msgs)) == tokens.count_chat([c for _, c in msgs])
    assert tokens.chat_tokens(msgs) != tokens.chat_tokens([("user", "be brief"), msgs[1]])


# -- the cache -----------------------------------------------------------------------------------
def test_a_shared_prefix_hits_and_a_different_first_block_misses_everything() -> None:
    cache = PrefixCache()
    prompt = block_hashes(words(80), 16)  # 5 blocks
    cache.acquire(prompt)
    cache.release(prompt)
    same_prefix = block_hashes(words(48) + words(40, "q"), 16)
    assert cache.match(same_prefix, limit=10) == 3
    assert cache.match(prompt, limit=10) == 5
    assert cache.match(prompt, limit=2) == 2
    other_first = block_hashes(words(16, "q") + words(80)[16:], 16)
    assert cache.match(other_first, limit=10) == 0


def test_lru_eviction_of_unreferenced_blocks() -> None:
    cache = PrefixCache()
    a, b, c = (block_hashes(words(32, tag), 16) for tag in "abc")
    for hashes in (a, b, c):
        cache.acquire(hashes)
        cache.release(hashes)
    cache.acquire(a)  # a hit makes a the most recently used once released
    cache.release(a)
    assert cache.evict_to(4) == 2
    assert cache.match(b, 2) == 0
    assert (cache.match(c, 2), cache.match(a, 2)) == (2, 2)
    # A prompt's tail goes before its head: one more eviction takes c's second block.
    assert cache.evict_to(3) == 1
    assert c[0] in cache
    assert c[1] not in cache
    assert cache.unreferenced == len(cache) == 3


def test_referenced_blocks_are_never_evicted() -> None:
    cache = PrefixCache()
    held, idle = block_hashes(words(48), 16), block_hashes(words(48, "i"), 16)
    cache.acquire(held)
    cache.acquire(idle)
    cache.release(idle)
    assert cache.evict_to(0) == 3
    assert cache.match(held, 10) == 3
    assert len(cache) == 3
    cache.acquire(held[:1])  # a second reader of the first block
    cache.release(held)
    assert cache.unreferenced == 2  # block 0 is still held by the second reader
    cache.evict_to(0)
    assert held[0] in cache
    assert cache.match(held, 10) == 1


# -- in the scheduler ----------------------------------------------------------------------------
def seq(name: str, prompt: list[str], out: int = 4) -> Sequence:
    return Sequence(name, len(prompt), out, 0.0, block_hashes=block_hashes(prompt, 16))


def run_alone(sched: Scheduler, s: Sequence, now: float = 0.0) -> float:
    """Runs `s` to the end on an otherwise idle scheduler; returns its prefill step's duration."""
    sched.add(s)
    first: float | None = None
    while (step := sched.plan(now)) is not None:
        first = step.duration if first is None else first
        now += step.duration
        sched.commit(step, now)
    assert first is not None
    assert s.finished
    return first


def test_prefill_time_shrinks_by_the_cached_tokens() -> None:
    sched = Scheduler(profile())
    prompt = words(200)
    cold = run_alone(sched, seq("a", prompt))
    assert cold == pytest.approx(COST.step_s(0, 200))
    warm_seq = seq("b", prompt)
    warm = run_alone(sched, warm_seq)
    assert warm_seq.cached_tokens == 192  # 12 full blocks; the last 8 tokens are computed
    assert warm == pytest.approx(COST.step_s(0, 8))
    partial_seq = seq("c", words(100) + words(100, "new"))
    partial = run_alone(sched, partial_seq)
    assert partial_seq.cached_tokens == 96
    assert partial == pytest.approx(COST.step_s(0, 104))
    assert (sched.prefix_queries, sched.prefix_hits) == (600, 192 + 96)
    assert sched.free_blocks == sched.profile.num_gpu_blocks


def test_a_fully_cached_prompt_still_computes_one_token() -> None:
    sched = Scheduler(profile())
    run_alone(sched, seq("a", words(64)))
    again = seq("b", words(64))
    duration = run_alone(sched, again)
    assert again.cached_tokens == 48  # 4 blocks cached, 3 reused: vLLM recomputes the last
    assert duration == pytest.approx(COST.step_s(0, 16))
    run_alone(sched, seq("c", words(65)))  # 4 full blocks cached now (they were already)
    once_more = seq("d", words(65))
    assert run_alone(sched, once_more) == pytest.approx(COST.step_s(0, 1))
    assert once_more.cached_tokens == 64


def test_no_prefix_caching_prefills_everything_and_counts_nothing() -> None:
    sched = Scheduler(profile(enable_prefix_caching=False))
    run_alone(sched, seq("a", words(200)))
    again = seq("b", words(200))
    assert run_alone(sched, again) == pytest.approx(COST.step_s(0, 200))
    assert (again.cached_tokens, sched.prefix_queries, sched.prefix_hits) == (0, 0, 0)


def test_cached_blocks_live_in_free_kv_and_go_least_recently_used_first() -> None:
    # 20 blocks of 16 tokens; a 64-token prompt with 4 output tokens holds 5 while running.
    sched = Scheduler(profile(num_gpu_blocks=20))
    prompts = {tag: words(64, tag) for tag in "abcd"}
    for tag, prompt in prompts.items():
        run_alone(sched, seq(tag, prompt))
    assert sched.cache is not None
    # 4 prompts x 4 blocks = 16 cached blocks, all in the free pool.
    assert (len(sched.cache), sched.cache.unreferenced, sched.free_blocks) == (16, 16, 20)
    # A 96-token prompt holds 7 blocks while it runs: 13 stay free, so 3 cached blocks go, the
    # least recently used ones: a's (the oldest), its tail first.
    run_alone(sched, seq("f", words(96, "f")))
    hashes = {tag: block_hashes(prompt, 16) for tag, prompt in prompts.items()}
    assert [sched.cache.match(hashes[t], 4) for t in "abcd"] == [1, 4, 4, 4]
    assert sched.cache.match(block_hashes(words(96, "f"), 16), 6) == 6
    assert sched.cache.unreferenced == len(sched.cache) == 19 <= sched.free_blocks


def test_blocks_of_running_sequences_are_not_evicted() -> None:
    sched = Scheduler(profile(num_gpu_blocks=12))
    long_runner = seq("long", words(64), out=1000)
    sched.add(long_runner)
    step = sched.plan(0.0)
    assert step is not None
    sched.commit(step, step.duration)
    assert sched.cache is not None
    assert long_runner.cache_refs == 4
    # Others churn through the remaining room until the cache must give way.
    now = step.duration
    for tag in "pqrs":
        other = seq(tag, words(48, tag))
        sched.add(other)
        while not other.finished:
            step = sched.plan(now)
            assert step is not None
            now += step.duration
            sched.commit(step, now)
    assert sched.cache.unreferenced <= sched.free_blocks
    assert all(h in sched.cache for h in long_runner.block_hashes)
    # A newcomer sharing the running prompt reuses its blocks.
    twin = seq("twin", words(64) + ["more"] * 4)
    sched.add(twin)
    step = sched.plan(now)
    assert step is not None
    assert twin in step.prefills
    assert twin.cached_tokens == 64


def test_preempted_sequences_release_their_blocks_and_recompute_from_the_cache() -> None:
    sched = Scheduler(profile(num_gpu_blocks=12, max_num_batched_tokens=4096))
    a, b = seq("a", words(64, "a"), out=60), seq("b", words(64, "b"), out=60)
    sched.add(a)
    sched.add(b)
    now = 0.0
    while not (a.finished and b.finished):
        step = sched.plan(now)
        assert step is not None
        now += step.duration
        sched.commit(step, now)
    assert sched.preemptions >= 1
    assert sched.free_blocks == 12
    assert sched.cache is not None
    assert sched.cache.unreferenced == len(sched.cache) <= 12
    # Counted once per request, not per recompute.
    assert sched.prefix_queries == 128


# -- what a sequence generates -------------------------------------------------------------------
def reply_seq(name: str, prompt: list[str], out: int, seed: int = 0) -> Sequence:
    """A sequence hashed as the server hashes it: its prompt, then its planned output."""
    hashes = block_hashes([*prompt, *tokens.output_tokens(seed, out)], 16)
    return Sequence(name, len(prompt), out, 0.0, block_hashes=hashes)


def step_until(sched: Scheduler, done: Callable[[], bool], now: float = 0.0) -> float:
    """Steps the scheduler on a virtual clock until `done()`; returns the clock."""
    while not done():
        step = sched.plan(now)
        assert step is not None
        now += step.duration
        sched.commit(step, now)
        assert sched.cache is not None
        assert sched.cache.unreferenced <= sched.free_blocks
    return now


@pytest.mark.parametrize(
    ("prompt", "out", "cached"),
    [
        (64, 1, 4),  # 64 tokens computed: the one output token never had its KV computed
        (64, 16, 4),  # 79 computed
        (64, 17, 5),  # 80 computed: one block of output
        (40, 30, 4),  # 69 computed
        (10, 3, 0),  # not one full block
    ],
)
def test_a_finished_sequence_caches_the_full_blocks_it_computed(
    prompt: int, out: int, cached: int
) -> None:
    sched = Scheduler(profile())
    s = reply_seq("a", words(prompt), out)
    run_alone(sched, s)
    assert sched.cache is not None
    assert (len(sched.cache), sched.cache.unreferenced) == (cached, cached)
    assert sched.cache.match(s.block_hashes, 100) == cached
    assert sched.free_blocks == sched.profile.num_gpu_blocks


SYSTEM = ("system", " ".join(words(100, "s")))  # renders to 104 tokens
QUESTION = ("user", " ".join(words(20, "q")))  # 24; with the reply header, a 131-token prompt


@pytest.mark.parametrize(
    ("kind", "max_tokens", "stop", "cached"),
    [
        # 131 + 40 tokens, 170 computed: 10 full blocks (the prompt alone has 8).
        ("chat", 40, None, 160),
        ("chat", 45, None, 160),  # 175 computed: not the block the last token completes
        ("chat", 46, None, 176),
        # 35 tokens generated, the stop word hidden: the next turn repeats 165 tokens.
        ("chat", 40, " model", 160),
        ("completion", 40, None, 176),  # 150 + 40 tokens, 189 computed: 11 full blocks
        ("completion", 2, None, 144),  # no block of the answer is full: the prompt's 9
    ],
)
def test_a_next_turn_hits_the_previous_answer(
    kind: str, max_tokens: int, stop: str | None, cached: int
) -> None:
    plan = tokens.plan_output(seed=0, max_tokens=max_tokens, min_tokens=0, ignore_eos=True,
                              stop=[stop] if stop else [], natural=max_tokens)  # fmt: skip
    answer = tokens.visible_text(0, plan.tokens, plan.stop_reason)  # as the server returns it
    if kind == "chat":
        first = tokens.chat_tokens([SYSTEM, QUESTION])
        then = tokens.chat_tokens([SYSTEM, QUESTION, ("assistant", answer), ("user", "and then")])
    else:
        text = " ".join(words(150))
        first, then = text.split(), text.split() + answer.split() + ["and", "then"]
        assert tokens.prompt_tokens(text + answer + " and then") == then
    # The next prompt repeats the first one and the answer it was shown, token for token.
    shown = len(answer.split())
    assert then[: len(first) + shown] == [*first, *tokens.output_tokens(0, shown)]
    sched = Scheduler(profile())
    run_alone(sched, reply_seq("first", first, plan.tokens))
    nxt = reply_seq("next", then, 8)
    run_alone(sched, nxt)
    assert nxt.cached_tokens == cached
    assert sched.prefix_hits == cached
    assert sched.prefix_queries == len(first) + len(then)


@pytest.mark.parametrize(
    ("steps", "cached"),
    [
        (0, 0),  # still waiting: nothing computed
        (1, 4),  # prefilled: the prompt's 4 full blocks (its first output token has no KV)
        (16, 4),  # 79 tokens computed
        (17, 5),  # 80: the first block of output
        (40, 6),
    ],
)
def test_an_aborted_sequence_leaves_what_it_computed_cached(steps: int, cached: int) -> None:
    sched = Scheduler(profile())
    s = reply_seq("a", words(64), 100)
    sched.add(s)
    step_until(sched, lambda: s.generated >= steps)
    assert s.generated == steps
    assert sched.abort(s)
    assert sched.cache is not None
    assert (len(sched.cache), sched.cache.unreferenced) == (cached, cached)
    assert sched.cache.match(s.block_hashes, 100) == cached
    assert sched.free_blocks == sched.profile.num_gpu_blocks


def test_a_preempted_sequence_recomputes_only_past_its_cached_output() -> None:
    # 8 blocks: a (48 + 45 tokens) and b (16 + 100) fill them when a needs its 6th block, at
    # 80 tokens; b, the newest, is preempted with 48 tokens, 47 computed: 2 full blocks cached.
    sched = Scheduler(profile(num_gpu_blocks=8))
    a, b = reply_seq("a", words(48, "a"), 45), reply_seq("b", words(16, "b"), 100)
    sched.add(a)
    sched.add(b)
    now = step_until(sched, lambda: b.preemptions > 0)
    assert (b.context, b.generated) == (48, 32)
    now = step_until(sched, lambda: a.finished, now)
    assert b in sched.waiting
    step = sched.plan(now)
    assert step is not None
    assert step.prefills == [b]
    # Recomputed from its 2 cached blocks (prompt and first output block): 16 tokens, not 48.
    assert step.tokens == 16
    sched.commit(step, now + step.duration)
    step_until(sched, lambda: b.finished, now + step.duration)
    assert (b.cached_tokens, sched.prefix_queries) == (0, 64)  # counted at first scheduling
    assert sched.free_blocks == 8


def test_output_blocks_are_evicted_least_recently_used_tail_first() -> None:
    # 20 blocks; each 64-token prompt with 40 output tokens leaves 6 cached blocks (103 tokens
    # computed) and holds 7 at its longest.
    sched = Scheduler(profile(num_gpu_blocks=20))
    seqs = {tag: reply_seq(tag, words(64, tag), 40) for tag in "abcd"}
    now = 0.0
    for s in seqs.values():
        sched.add(s)
        now = step_until(sched, lambda: sched.idle, now)
    assert sched.cache is not None
    # d needed 7 blocks beside 18 cached ones: 5 of a's went, its output blocks first.
    assert [sched.cache.match(s.block_hashes, 100) for s in seqs.values()] == [1, 6, 6, 6]
    assert sched.cache.unreferenced == len(sched.cache) == 19 <= sched.free_blocks == 20
