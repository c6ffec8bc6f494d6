"""One seed of a routing-sim cell with the learned policy: each scrape interval of the EAGLE engine
in a window of virtual time, as the latency model reads it (the engine's running count at both
ends, its inter-token samples, their mean step, the prompt tokens prefilled per step and what
the learned prefill cost takes off the step, whether the interval counts as steady).

    TIERGATE_COMPILED=0 python docs/results/routing-sim-reach/intervals.py SEED CELL FROM_S TO_S
        [WORKLOAD]
"""

from __future__ import annotations

from window import learned_run, window

import gateway.backends.latency_model as lm


def main() -> None:
    seed, cell, start, end, workload = window()
    observe = lm.BackendModel.observe_engine
    lines: list[str] = []

    def logged(self: lm.BackendModel, sample: lm.EngineSample, now: float) -> None:
        last = self._last
        speculates = sample.spec is not None  # the EAGLE engine
        if speculates and start <= now <= end and last is not None and sample.itl_count:
            steps = sample.itl_count - (last.itl_count or 0)
            if steps > 0:
                step = (sample.itl_sum or 0.0) - (last.itl_sum or 0.0)
                step /= steps
                n = (sample.running + last.running) / 2
                prefilled = max(0.0, (sample.prefilled or 0.0) - (last.prefilled or 0.0))
                per_step = prefilled * n / steps
                cost = self.prefill.per_token * per_step
                lines.append(
                    f"{now:6.2f} s  running {last.running:g} -> {sample.running:g}  samples "
                    f"{steps:g}  step {step * 1e3:5.1f} ms  prefill {per_step:4.0f} tokens/step "
                    f"x {self.prefill.per_token * 1e3:.3f} ms = {cost * 1e3:5.1f} ms  left "
                    f"{self.prefill.without(per_step, step) * 1e3:5.1f} ms  steady "
                    f"{lm._steady(last, sample)}  tokens/step {self.tps or 1.0:.2f}"
                )
        observe(self, sample, now)

    lm.BackendModel.observe_engine = logged  # type: ignore[method-assign]
    print(f"{learned_run(seed, cell, workload)}: EAGLE engine's intervals")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
