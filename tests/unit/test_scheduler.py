"""The scheduler on a virtual clock: no sleeping, every number exact."""

from __future__ import annotations

import random

import pytest

from engines.sim.profile import Cost, Profile, Speculative, load_profile, mean_tokens_per_step
from engines.sim.scheduler import Scheduler, Sequence

COST = Cost(base_s=0.01, per_token_s=0.0001, prefill_per_token_s=0.0001)


def profile(**kw: object) -> Profile:
    data: dict[str, object] = {"name": "t", "cost": COST, "num_gpu_blocks": 10_000} | kw
    return Profile.model_validate(data)


def run_to_end(sched: Scheduler, limit: int = 100_000) -> float:
    now = 0.0
    for _ in range(limit):
        step = sched.plan(now)
        if step is None:
            return now
        now += step.duration
        sched.commit(step, now)
    raise AssertionError("scheduler did not drain")


def test_running_batch_is_bounded_by_max_num_seqs() -> None:
    sched = Scheduler(profile(max_num_seqs=8))
    for i in range(16):
        sched.add(Sequence(str(i), 50, 100, 0.0))
    step = sched.plan(0.0)
    assert step is not None
    assert len(step.prefills) == 8
    assert (len(sched.running), len(sched.waiting)) == (8, 8)


def test_every_sequence_gets_exactly_its_tokens() -> None:
    sched = Scheduler(profile(max_num_seqs=4))
    seqs = [Sequence(str(i), 10 + i, 1 + 7 * i, 0.0) for i in range(10)]
    for s in seqs:
        sched.add(s)
    run_to_end(sched)
    assert [s.generated for s in seqs] == [s.target_tokens for s in seqs]
    assert sched.free_blocks == sched.profile.num_gpu_blocks
    assert sched.idle


def test_prefill_shares_the_step_and_yields_the_first_token() -> None:
    sched = Scheduler(profile())
    a = Sequence("a", 50, 10, 0.0)
    sched.add(a)
    step = sched.plan(0.0)
    assert step is not None
    assert step.tokens == 50
    assert step.duration == pytest.approx(COST.step_s(0, 50))
    (em,) = sched.commit(step, step.duration)
    assert (em.tokens, a.first_token_at) == (1, step.duration)
    b = Sequence("b", 30, 10, 0.0)
    sched.add(b)
    step = sched.plan(1.0)
    assert step is not None
    assert (step.decodes, step.prefills, step.tokens) == ([a], [b], 1 + 30)


def test_decode_step_cost_grows_with_batch() -> None:
    durations = []
    for batch in (1, 16, 64):
        sched = Scheduler(profile())
        for i in range(batch):
            sched.add(Sequence(str(i), 10, 5, 0.0))
        first = sched.plan(0.0)
        assert first is not None
        sched.commit(first, 1.0)
        step = sched.plan(1.0)
        assert step is not None
        durations.append(step.duration)
    assert durations[0] < durations[1] < durations[2]


def test_kv_exhaustion_preempts_the_newest_and_recomputes_it() -> None:
    # 4 blocks of 16 tokens: two sequences of 20 prompt tokens fit, but not as they grow.
    sched = Scheduler(profile(num_gpu_blocks=4, block_size=16))
    old, new = Sequence("old", 20, 40, 0.0), Sequence("new", 20, 40, 0.0)
    sched.add(old)
    sched.add(new)
    run_to_end(sched)
    assert sched.preemptions >= 1
    assert new.preemptions >= 1
    assert old.preemptions == 0
    assert (old.generated, new.generated) == (40, 40)
    assert sched.free_blocks == 4


def test_fcfs_head_of_line_blocks_when_kv_is_full() -> None:
    sched = Scheduler(profile(num_gpu_blocks=4, block_size=16))
    sched.add(Sequence("big", 60, 1, 0.0))  # needs 4 blocks
    sched.add(Sequence("small", 5, 1, 0.0))
    step = sched.plan(0.0)
    assert step is not None
    assert [s.rid for s in step.prefills] == ["big"]
    assert [s.rid for s in sched.waiting] == ["small"]


def test_serial_profile_runs_one_request_at_a_time() -> None:
    sched = Scheduler(profile(max_num_seqs=1))
    a, b = Sequence("a", 10, 3, 0.0), Sequence("b", 10, 3, 0.0)
    sched.add(a)
    sched.add(b)
    running_sizes = []
    now = 0.0
    while (step := sched.plan(now)) is not None:
        running_sizes.append(len(step.decodes) + len(step.prefills))
        now += step.duration
        sched.commit(step, now)
    assert set(running_sizes) == {1}
    assert a.last_token_at is not None
    assert b.first_token_at is not None
    assert b.first_token_at > a.last_token_at


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_steps_emit_one_to_k_plus_one_tokens(seed: int) -> None:
    spec = Speculative(num_speculative_tokens=5, acceptance=(0.8, 0.75, 0.7, 0.65, 0.6))
    sched = Scheduler(profile(speculative=spec), random.Random(seed))
    seq = Sequence("s", 10, 2000, 0.0)
    sched.add(seq)
    now, sizes = 0.0, []
    while (step := sched.plan(now)) is not None:
        if step.decodes:
            assert step.tokens == 6  # verification covers k + 1 positions
        now += step.duration
        sizes += [e.tokens for e in sched.commit(step, now) if not step.prefills]
    assert seq.generated == 2000
    assert min(sizes) >= 1
    assert max(sizes) == 6
    mean = sum(sizes[:-1]) / len(sizes[:-1])
    assert mean == pytest.approx(spec.mean_tokens_per_step(), rel=0.1)
    c = sched.spec
    assert c.drafts == len(sizes)
    assert c.draft_tokens == 5 * c.drafts
    assert c.accepted_per_pos[0] >= c.accepted_per_pos[1] >= c.accepted_per_pos[4]
    assert sum(c.accepted_per_pos) == c.accepted_tokens


def test_abort_frees_blocks_and_leaves_the_queue() -> None:
    sched = Scheduler(profile(max_num_seqs=1))
    a, b = Sequence("a", 100, 50, 0.0), Sequence("b", 100, 50, 0.0)
    sched.add(a)
    sched.add(b)
    step = sched.plan(0.0)
    assert step is not None
    assert sched.abort(a)
    assert sched.abort(b)
    assert not sched.abort(b)
    assert sched.commit(step, 1.0) == []
    assert sched.free_blocks == sched.profile.num_gpu_blocks
    assert sched.idle


SPEC = Speculative(num_speculative_tokens=5, acceptance=(0.8, 0.75, 0.7, 0.65, 0.6))
ZEROS, ONES = (0.0,) * 5, (1.0,) * 5


def decode_sizes(sched: Scheduler, seqs: list[Sequence]) -> dict[str, list[int]]:
    """Tokens each sequence got per decode step (its prefill's first token left out)."""
    for seq in seqs:
        sched.add(seq)
    sizes: dict[str, list[int]] = {s.rid: [] for s in seqs}
    now = 0.0
    while (step := sched.plan(now)) is not None:
        now += step.duration
        decoding = {id(s) for s in step.decodes}
        for em in sched.commit(step, now):
            if id(em.seq) in decoding:
                sizes[em.seq.rid].append(em.tokens)
    return sizes


def test_scheduler_acceptance_starts_as_the_profile_and_is_read_at_every_step() -> None:
    sched = Scheduler(profile(speculative=SPEC), random.Random(0))
    assert sched.acceptance == SPEC.acceptance
    sched.acceptance = ZEROS
    assert decode_sizes(sched, [Sequence("a", 10, 41, 0.0)])["a"] == [1] * 40
    assert (sched.spec.drafts, sched.spec.accepted_tokens) == (40, 0)
    assert sched.spec.draft_tokens == 5 * 40
    sched.acceptance = ONES
    # 1 token from prefill, then k + 1 = 6 per step, the last step capped at what remains.
    assert decode_sizes(sched, [Sequence("b", 10, 20, 0.0)])["b"] == [6, 6, 6, 1]
    assert sched.spec.accepted_tokens == 4 * 5
    assert sched.spec.accepted_per_pos == [4] * 5


def test_a_new_vector_applies_from_the_next_step() -> None:
    sched = Scheduler(profile(speculative=SPEC.model_copy(update={"acceptance": ONES})))
    seq = Sequence("a", 10, 1000, 0.0)
    sched.add(seq)
    sizes = []
    now = 0.0
    for i in range(6):
        if i == 3:
            sched.acceptance = ZEROS
        step = sched.plan(now)
        assert step is not None
        now += step.duration
        sizes += [em.tokens for em in sched.commit(step, now)]
    assert sizes == [1, 6, 6, 1, 1, 1]


def test_a_sequence_with_its_own_vector_ignores_the_schedulers() -> None:
    sched = Scheduler(profile(speculative=SPEC), random.Random(3))
    sched.acceptance = ONES
    own = Sequence("own", 10, 31, 0.0, acceptance=ZEROS)
    shared = Sequence("shared", 10, 31, 0.0)
    sizes = decode_sizes(sched, [own, shared])
    assert sizes["own"] == [1] * 30
    assert sizes["shared"] == [6] * 5
    c = sched.spec
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (35, 175, 25)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_low_vector_gives_its_mean_and_acceptance_rate(seed: int) -> None:
    low = (0.45, 0.35, 0.3, 0.25, 0.2)
    sched = Scheduler(profile(speculative=SPEC), random.Random(seed))
    seq = Sequence("s", 10, 3000, 0.0, acceptance=low)
    sizes = decode_sizes(sched, [seq])["s"][:-1]
    assert sum(sizes) / len(sizes) == pytest.approx(mean_tokens_per_step(low), rel=0.05)
    c = sched.spec
    expected_rate = (mean_tokens_per_step(low) - 1) / 5
    assert c.accepted_tokens / c.draft_tokens == pytest.approx(expected_rate, rel=0.08)


def test_speculative_vector_validation_and_scale() -> None:
    assert SPEC.with_acceptance([0.1] * 5).acceptance == (0.1,) * 5
    with pytest.raises(ValueError, match="needs 5 probabilities"):
        SPEC.with_acceptance([0.5] * 4)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        SPEC.with_acceptance([0.5, 0.5, 0.5, 0.5, 1.5])
    assert SPEC.scaled(0.5).acceptance == pytest.approx((0.4, 0.375, 0.35, 0.325, 0.3))
    assert SPEC.scaled(1.5).acceptance == pytest.approx((1.0, 1.0, 1.0, 0.975, 0.9))
    assert SPEC.scaled(0).mean_tokens_per_step() == 1.0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale"):
            SPEC.scaled(bad)
    # Text (header, flag): k numbers are the vector, one number scales it.
    assert SPEC.parse("0.5,0.4,0.3,0.2,0.1").acceptance == (0.5, 0.4, 0.3, 0.2, 0.1)
    assert SPEC.parse("0.5") == SPEC.scaled(0.5)
    not_numbers = "not a comma-separated"
    wrong = [("0.5,0.4", "needs 5"), ("a,b,c,d,e", not_numbers), ("", not_numbers),
             ("0.5,0.4,0.3,0.2,", not_numbers)]  # fmt: skip
    for text, says in wrong:
        with pytest.raises(ValueError, match=says):
            SPEC.parse(text)
    assert mean_tokens_per_step(ZEROS) == 1.0
    assert mean_tokens_per_step(ONES) == 6.0


@pytest.mark.parametrize(
    "name", ["v0", "v1", "v2", "v3", "v4", "v4-low", "v4-high", "instant", "paced"]
)
def test_shipped_profiles_load(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.cost.step_s(1, 0) >= 0


@pytest.mark.parametrize(
    ("name", "decode", "prefill", "step"),
    [("instant", 1, 0, 0.0), ("instant", 64, 4096, 0.0),
     ("paced", 1, 0, 0.002), ("paced", 64, 4096, 0.002)],
)  # fmt: skip
def test_the_overhead_profiles_cost_nothing_but_their_pace(
    name: str, decode: int, prefill: int, step: float
) -> None:
    """`instant` takes no time at all; `paced` 2 ms a step whatever it holds, so that a stream's
    events reach a reader a step apart (`tiergate bench instructions --paced`)."""
    assert load_profile(name).cost.step_s(decode, prefill) == pytest.approx(step)


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match="v3"):
        load_profile("v9")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("fcfs", ["b1", "b2", "i1", "s1"]), ("priority", ["i1", "s1", "b1", "b2"])],
)
def test_priority_scheduling_orders_the_waiting_queue(policy: str, expected: list[str]) -> None:
    sched = Scheduler(profile(max_num_seqs=1, scheduling_policy=policy))
    running = Sequence("r", 10, 50, 0.0)
    sched.add(running)
    sched.plan(0.0)  # r takes the one slot: the others wait
    for rid, prio in (("b1", 1), ("b2", 1), ("i1", -1), ("s1", 0)):
        sched.add(Sequence(rid, 10, 5, 0.0, priority=prio))
    assert [s.rid for s in sched.waiting] == expected
