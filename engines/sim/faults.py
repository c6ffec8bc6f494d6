"""Fault injection, for the gateway's reliability tests.

By flag (`tiergate sim --fault-...`), at run time (`POST /sim/faults` with a JSON object of the
fields below), or per request with the header `x-sim-fault`, a comma-separated list of:
`error` (500, or `error_status`, before any output), `error-mid` (the stream fails after its
first chunk), `slow=S` (S extra seconds before the first token), `hang` (never answer),
`crash` (the process exits).

The speculative acceptance (the vLLM face, on a profile with a `speculative` section) changes the
same three ways, to simulate a workload that the draft model predicts better or worse:

- at start: `tiergate sim --acceptance 0.5,0.4,0.3,0.2,0.1` (k probabilities) replaces the
  profile's vector;
- at run time: `GET /sim/speculative` answers
  `{"acceptance": [k floats], "num_speculative_tokens": k, "mean_tokens_per_step": x}`;
  `POST /sim/speculative` with `{"acceptance": [k floats, each 0..1]}` or `{"scale": s}` (s >= 0:
  the starting vector's probabilities times s, clamped to 1) replaces the vector of every sequence
  without its own, from the next engine step on, and answers as GET;
- per request: the header `x-sim-acceptance` holds k comma-separated probabilities
  (`0.5,0.4,0.3,0.2,0.1`) or one number, a scale of the starting vector as above (so with k = 1 a
  single number is a scale too); it applies to that request's sequence only.

Anything else, and either on an engine that does not speculate, is a 400 in vLLM's error shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """The faults one request will suffer."""

    error: bool = False
    error_after_first: bool = False
    slow_first_token_s: float = 0.0
    hang: bool = False
    crash: bool = False


class Faults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(
        0.0, ge=0, le=1, description="share of requests answered with error_status"
    )
    error_status: int = Field(
        500, ge=400, le=599, description="the status of those answers (e.g. 503 while /health"
        " still answers 200: an engine that refuses work but looks alive)"
    )
    slow_first_token_s: float = Field(0.0, ge=0, description="extra delay before first token")
    hang: bool = Field(False, description="the engine stops: requests are accepted, never answered")
    crash_after: int | None = Field(None, ge=1, description="exit after this many requests")
    unhealthy: bool = Field(False, description="/health answers 503")

    def for_request(self, header: str | None, rng: random.Random) -> FaultRequest:
        error = self.error_rate > 0 and rng.random() < self.error_rate
        slow, error_mid, hang, crash = self.slow_first_token_s, False, self.hang, False
        for item in (header or "").split(","):
            key, _, value = item.strip().partition("=")
            if key == "error":
                error = True
            elif key == "error-mid":
                error_mid = True
            elif key == "slow":
                try:
                    slow = max(0.0, float(value))
                except ValueError:
                    slow = 1.0
            elif key == "hang":
                hang = True
            elif key == "crash":
                crash = True
        return FaultRequest(error, error_mid, slow, hang, crash)
