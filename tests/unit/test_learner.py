"""The learner: scrapes in, each backend's prediction out to routing, told what its tier-mates
have seen past its own frontier."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gateway.backends.learner import Learner, engine_sample
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import BackendConfig, LearningConfig, Settings, TierConfig
from gateway.observe.telemetry import Telemetry
from gateway.routing import BackendLoad, PolicyParams, Slo
from gateway.routing.learned import Learned, TighterClasses, most_streams, outlook
from gateway.wire.metrics import EngineStats

MODEL = "m"
POOL = ("http://awq-0:8000", "http://awq-1:8000")
FAST = "http://eagle-0:8000"


def _learner(unlike: float = 0.1) -> Learner:
    def tier(name: str, role: str, urls: tuple[str, ...]) -> TierConfig:
        backends = [BackendConfig(url=u, models=[MODEL]) for u in urls]
        return TierConfig.model_validate({"name": name, "role": role, "backends": backends})

    settings = Settings(
        tiers=[tier("eagle", "latency", (FAST,)), tier("awq", "throughput", POOL)],
        learning=LearningConfig(tier_unlike=unlike),
    )
    telemetry = Telemetry()
    registry = Registry(settings, MemoryInflightStore(), telemetry, lambda: 0.0)
    return Learner(registry, settings, telemetry, lambda: 0.0)


def _run(learner: Learner, url: str, loads: range, step_s: float) -> None:
    """Scrapes of `url` holding each of `loads` streams for a while, at `step_s` a step."""
    entry, steps, t = learner.registry.entry(url), 0.0, 0.0
    for n in loads:
        for _ in range(8):
            steps += 100
            stats = EngineStats(running=n, itl_sum=steps * step_s, itl_count=steps)
            learner.scraped(entry, {MODEL: stats}, t)
            t += 0.25
    learner.refresh()


def test_a_backend_is_told_what_its_tier_mate_saw_past_its_frontier() -> None:
    learner = _learner()
    _run(learner, POOL[0], range(1, 33), 0.02)
    _run(learner, POOL[1], range(1, 3), 0.02)
    _run(learner, FAST, range(1, 3), 0.01)
    curves = learner.registry.curves
    seen, new = curves[POOL[0]], curves[POOL[1]]
    own = learner.own[POOL[1]]
    assert (seen.frontier, new.frontier) == (32, 2)  # what it saw is still its own
    assert new is not own
    for n in (4, 16, 32, 64):
        assert new.doubt[n] < own.doubt[n]  # surer past its frontier than alone
    assert new.tpot.at(16) < own.tpot.at(16)  # the mate found no knee there
    # The mate that saw the most is told nothing; another tier's backend is told nothing.
    assert seen is learner.own[POOL[0]]
    assert curves[FAST] is learner.own[FAST]


def test_a_tier_mate_learning_more_updates_the_others() -> None:
    learner = _learner()
    _run(learner, POOL[1], range(1, 3), 0.02)
    before = learner.registry.curves[POOL[1]]
    assert before is learner.own[POOL[1]]  # nothing seen further yet
    _run(learner, POOL[0], range(1, 17), 0.02)  # only the mate learns
    after = learner.registry.curves[POOL[1]]
    assert after.doubt[16] < before.doubt[16]
    assert math.isclose(after.tpot.at(2), before.tpot.at(2))


def test_new_predictions_know_the_tighter_classes_limits_before_a_decision_asks() -> None:
    learner = _learner()
    entry = learner.registry.entry(POOL[0])
    entry.slos = ((0.012, 2), (0.025, 3))  # two classes in flight
    learner.registry.entry(FAST).recent = ((0.05, 0.5),)  # a third lately, elsewhere
    _run(learner, POOL[0], range(1, 17), 0.02)
    _run(learner, FAST, range(1, 9), 0.005)
    for url in (POOL[0], FAST):
        pred = learner.registry.curves[url]
        fresh = replace(pred)
        wanted = {math.log2(s) * math.log(2.0): most_streams(math.log2(s) * math.log(2.0), fresh)
                  for s in (0.012, 0.025)}  # fmt: skip
        assert pred.limits == wanted  # the loosest class (50 ms) is never asked of
        # ... under the very keys a decision reads them by: asking adds nothing
        TighterClasses([pred], [BackendLoad(slos=entry.slos)], 0.05).able(
            math.log2(0.012) * math.log(2.0))
        assert pred.limits == wanted


def test_one_class_alone_leaves_the_limits_to_the_decisions() -> None:
    learner = _learner()
    learner.registry.entry(POOL[0]).slos = ((0.025, 3),)
    _run(learner, POOL[0], range(1, 9), 0.02)
    assert learner.registry.curves[POOL[0]].limits == {}


def test_a_new_prediction_remembers_the_outlooks_asked_of_the_one_it_replaces() -> None:
    learner = _learner()
    _run(learner, POOL[0], range(1, 9), 0.02)
    old = learner.registry.curves[POOL[0]]
    backend = learner.registry.entry(POOL[0]).backend
    params = Learned.build("learned", PolicyParams()).limits
    loads = [BackendLoad(running=n, inflight=n, slos=((0.025, n),)) for n in range(1, 6)]
    for lb in loads:
        outlook(backend, lb, old, Slo(), params)
    _run(learner, POOL[0], range(9, 13), 0.02)  # it learns: a refit replaces the prediction
    new = learner.registry.curves[POOL[0]]
    assert new is not old
    assert set(new.outlooks) == set(old.outlooks)  # told before any decision asks ...
    for lb in loads:  # ... each as the new prediction computes it, not the old one's
        assert outlook(backend, lb, new, Slo(), params) == outlook(
            backend, lb, replace(new), Slo(), params
        )
    assert learner.registry.curves[FAST].outlooks == {}  # nothing asked of it, nothing told


def test_an_engines_computed_prompt_tokens_are_its_prompts_less_their_cache_hits() -> None:
    """Summed over the engine's models; an engine that does not count its prompts says
    nothing (and a model without the counter adds nothing to one that has it)."""
    stats = {
        "a": EngineStats(running=2, prompt_tokens=5000, prefix_hit_tokens=3000),
        "b": EngineStats(running=1, prompt_tokens=700),  # no prefix cache: nothing hit
        "c": EngineStats(running=1),
    }
    assert engine_sample(stats).prefilled == 2700
    assert engine_sample({"c": EngineStats(running=1)}).prefilled is None


def test_an_engines_prefills_are_summed_where_it_times_them_and_counts_their_tokens() -> None:
    """Recent vLLM: the prefill-time histogram with the tokens each prefill computed; a model
    without either adds nothing, and an engine without them says nothing."""
    stats = {
        "a": EngineStats(running=2, prefill_time_sum=3.0, prefill_time_count=10,
                         prefill_computed_sum=6000),
        "b": EngineStats(running=1, prefill_time_sum=1.0, prefill_time_count=2,
                         prefill_computed_sum=500),
        "c": EngineStats(running=1, prefill_time_sum=1.0, prefill_time_count=2),  # older vLLM
    }  # fmt: skip
    assert engine_sample(stats).prefill == (4.0, 6500, 12)
    assert engine_sample({"c": stats["c"]}).prefill is None


def test_a_prompt_tokens_prefill_time_learned_is_shown_per_backend() -> None:
    """Requests prefilled one at a time, their prompts of 200 to 2,000 computed tokens, each
    1,000 of them 100 ms more; the step the curve needs comes from the inter-token counts."""
    learner = _learner()
    entry, t = learner.registry.entry(POOL[0]), 0.0
    took = computed = count = itl = samples = 0.0
    for i in range(40):
        size = (200.0, 800.0, 2000.0)[i % 3]
        took, computed, count = took + 0.02 + 0.0001 * size, computed + size, count + 1
        samples, itl = samples + 100, itl + 100 * 0.02
        stats = EngineStats(running=10, itl_sum=itl, itl_count=samples, prefill_time_sum=took,
                            prefill_time_count=count, prefill_computed_sum=computed)  # fmt: skip
        learner.scraped(entry, {MODEL: stats}, t)
        t += 0.25
    learner.refresh()
    view = learner.view(POOL[0], t)
    assert view is not None
    assert view.prompt_ms_per_1k_tokens == pytest.approx(100, rel=0.01)
    assert learner.registry.curves[POOL[0]].prefill_s == pytest.approx(0.0001, rel=0.01)


def test_the_prefill_cost_learned_is_shown_per_backend() -> None:
    """Scrapes at one load whose prompts vary: each 1,000 prompt tokens a step add 100 ms."""
    learner = _learner()
    entry, t = learner.registry.entry(POOL[0]), 0.0
    samples = itl = prompt = 0.0
    for i in range(40):
        per_step = (0.0, 100.0, 300.0)[i % 3]
        samples, prompt = samples + 100, prompt + 10 * per_step  # 10 steps of 10 streams
        itl += 100 * (0.02 + 0.0001 * per_step)
        stats = EngineStats(running=10, itl_sum=itl, itl_count=samples, prompt_tokens=prompt)
        learner.scraped(entry, {MODEL: stats}, t)
        t += 0.25
    learner.refresh()
    shown = learner.telemetry.registry.get_sample_value(
        "tiergate_backend_prefill_seconds_per_token",
        {"tier": "throughput", "backend": POOL[0]},
    )
    assert shown == pytest.approx(0.0001, rel=0.01)
    view = learner.view(POOL[0], t)
    assert view is not None
    assert view.prefill_ms_per_1k_tokens == pytest.approx(100, rel=0.01)
    assert learner.registry.curves[POOL[0]].tpot.at(10) == pytest.approx(0.02, rel=0.01)


def test_an_engines_steps_are_summed_only_where_every_model_counts_them() -> None:
    """vLLM counts its steps per model (`vllm:iteration_tokens_total`); where one model of an
    engine says nothing, the steps of the others would be too few for all of its prompts."""
    stats = {"a": EngineStats(running=2, steps=100), "b": EngineStats(running=1, steps=40)}
    assert engine_sample(stats).steps == 140
    assert engine_sample({**stats, "c": EngineStats(running=1)}).steps is None
    assert engine_sample({}).steps is None
