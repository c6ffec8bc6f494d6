"""Automatic prefix caching: the block cache alone, then inside the scheduler on a virtual clock."""

from __future__ import annotations

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
