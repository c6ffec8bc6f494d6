"""A continuous-batching scheduler modelled on vLLM's (V1), with no clock of its own.

The driver asks `plan(now)` for the next step (which sequences decode, which are prefilled, how
long the step takes), waits that long on whatever clock it has (real time in the server, a
virtual clock in tests and in the fitter), then calls `commit(step, end)` which hands out tokens.
Everything here is deterministic given the seeded RNG used for speculative acceptance.

What is modelled, as vLLM does it:
- a FCFS waiting queue and a running batch bounded by `max_num_seqs`, by the step's token budget
  (`max_num_batched_tokens`) and by KV capacity in blocks of `block_size` tokens;
- running sequences are served first; when one cannot get a KV slot for its next tokens the most
  recently admitted sequence is preempted (its blocks freed, to be recomputed from the front of
  the waiting queue: prompt plus what it had generated);
- prefill of newly admitted sequences shares the step with decodes (chunked prefill) and yields
  their first token;
- speculative decoding: each decode verifies k drafts, accepted position by position, so a step
  emits 1..k+1 tokens for that sequence; lookahead KV slots are reserved for all k+1. The
  acceptance probabilities are the workload's, not the hardware's: `Scheduler.acceptance` starts
  as the profile's and may be replaced at any time (it applies from the next step), and a
  sequence may carry its own (`Sequence.acceptance`), as a request of another kind of text would;
- automatic prefix caching (engines.sim.prefix): a sequence carries the block hashes of its
  prompt and planned output; it prefills only what follows its longest cached prefix (at least
  one token, as vLLM never reuses the whole prompt), and every block joins the cache once its
  tokens' KV is computed: the prompt's full blocks after prefill, each block of the output as
  decoding fills it (the last generated token has no KV, as in vLLM). They stay cached in the
  free part of the KV pool after the sequence ends, finished, aborted or preempted, so a next
  turn that repeats prompt and reply hits the reply too, and a recomputed sequence hits what it
  had generated. Blocks shared by running sequences are still counted once per sequence, so the
  pool fills a little sooner than in vLLM when they share prefixes.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from engines.sim.prefix import PrefixCache
from engines.sim.profile import Profile


@dataclass(slots=True, eq=False)
class Sequence:
    rid: str
    prompt_tokens: int
    target_tokens: int
    arrival: float
    generated: int = 0
    blocks: int = 0
    computed: bool = False  # KV holds prompt + generated
    first_scheduled: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    preemptions: int = 0
    finished: bool = False
    # This sequence's draft acceptance (k probabilities); None: the scheduler's.
    acceptance: tuple[float, ...] | None = None
    # Chained hashes of the full blocks of prompt + planned output (engines.sim.prefix), as far
    # as the caller knows the tokens; empty: never cached.
    block_hashes: tuple[int, ...] = ()
    cached_tokens: int = 0  # of the prompt, found in the prefix cache at first scheduling
    cache_refs: int = 0  # leading block_hashes this sequence holds a reference on
    priority: int = 0  # vLLM's `priority`: lower is scheduled first (priority scheduling)

    @property
    def remaining(self) -> int:
        return self.target_tokens - self.generated

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class Step:
    decodes: list[Sequence]
    prefills: list[Sequence]
    tokens: int
    duration: float


@dataclass(slots=True)
class Emission:
    seq: Sequence
    tokens: int
    finished: bool


@dataclass(slots=True)
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(self, profile: Profile, rng: random.Random | None = None) -> None:
        self.profile = profile
        self.rng = rng or random.Random(0)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_blocks = profile.num_gpu_blocks
        self.preemptions = 0
        spec = profile.speculative
        self.lookahead = spec.num_speculative_tokens if spec else 0
        # Read at every decode, so a new vector (k values, each 0..1) takes effect at once.
        self.acceptance: tuple[float, ...] = spec.acceptance if spec else ()
        self.spec = SpecCounters(accepted_per_pos=[0] * self.lookahead)
        self.cache = PrefixCache() if profile.enable_prefix_caching else None
        # vLLM's prefix-cache counters: prompt tokens looked up, and those found cached.
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- queue management ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.profile.scheduling_policy == "priority" and self.waiting:
            # Ahead of every waiting sequence of a higher priority value; after its equals.
            for i, other in enumerate(self.waiting):
                if other.priority > seq.priority:
                    self.waiting.insert(i, seq)
                    return
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> bool:
        """Drop a sequence wherever it is; returns whether it was still there."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return False
        self._free(seq)
        seq.finished = True
        return True

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def kv_usage(self) -> float:
        total = self.profile.num_gpu_blocks
        return (total - self.free_blocks) / total

    def fits(self, prompt_tokens: int) -> bool:
        """Whether a prompt could ever be scheduled (it alone must fit the KV pool)."""
        return self.profile.blocks_for(prompt_tokens + 1) <= self.profile.num_gpu_blocks

    # -- one step --------------------------------------------------------------------------
    def plan(self, now: float) -> Step | None:
        p = self.profile
        budget = p.max_num_batched_tokens
        per_decode = 1 + self.lookahead
        decodes: list[Sequence] = []
        # Running sequences first, oldest first; preempt from the newest end when KV runs out.
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            need = p.blocks_for(seq.context + per_decode) - seq.blocks
            while need > self.free_blocks and self.running[-1] is not seq:
                self._preempt(self.running[-1])
            if need > self.free_blocks:
                self._preempt(seq)  # not even the oldest fits: it waits for recompute
                continue
            self.free_blocks -= max(0, need)
            seq.blocks += max(0, need)
            decodes.append(seq)
            budget -= per_decode
            i += 1
        self._evict()
        prefills: list[Sequence] = []
        prefill_tokens = 0
        while self.waiting and len(self.running) < p.max_num_seqs:
            seq = self.waiting[0]
            hit = self._cached_blocks(seq)
            tokens = seq.context - hit * p.block_size
            if tokens > budget and (decodes or prefills):
                break
            need = p.blocks_for(seq.context + 1)
            if need > self.free_blocks:
                break  # FCFS: the head of the queue blocks the rest, as in vLLM
            self.waiting.popleft()
            self.free_blocks -= need
            seq.blocks = need
            if self.cache is not None:
                self.cache.acquire(seq.block_hashes[:hit])
                seq.cache_refs = hit
                self._evict()
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                seq.cached_tokens = hit * p.block_size
                self.prefix_queries += seq.prompt_tokens if self.cache is not None else 0
                self.prefix_hits += seq.cached_tokens
            self.running.append(seq)
            prefills.append(seq)
            prefill_tokens += tokens
            budget -= tokens
        if not decodes and not prefills:
            return None
        decode_tokens = len(decodes) * per_decode
        return Step(
            decodes=decodes,
            prefills=prefills,
            tokens=decode_tokens + prefill_tokens,
            duration=p.cost.step_s(decode_tokens, prefill_tokens),
        )

    def commit(self, step: Step, now: float) -> list[Emission]:
        out: list[Emission] = []
        for seq in step.decodes:
            if seq.finished or not seq.computed:
                continue  # aborted (or preempted) while the step ran
            out.append(self._emit(seq, self._decode_tokens(seq), now))
        for seq in step.prefills:
            if seq.finished:
                continue
            seq.computed = True
            out.append(self._emit(seq, 1, now))
        return out

    # -- internals -------------------------------------------------------------------------
    def _cached_blocks(self, seq: Sequence) -> int:
        """Leading blocks of `seq`'s context (its prompt, plus what it generated before a
        preemption) in the prefix cache, leaving at least one token to compute (vLLM needs one
        to produce the next token's logits). Never a block of output not generated yet."""
        if self.cache is None or not seq.block_hashes:
            return 0
        return self.cache.match(seq.block_hashes, (seq.context - 1) // self.profile.block_size)

    def _cache_computed(self, seq: Sequence) -> None:
        """Add the blocks whose KV is now computed to the prefix cache: every token of the
        context but the last generated, which no step has run yet (vLLM never computes the KV of
        a sequence's final token, so a block it would complete is not cached)."""
        if self.cache is None:
            return
        full = min(len(seq.block_hashes), (seq.context - 1) // self.profile.block_size)
        if full > seq.cache_refs:
            # Referenced while the sequence runs; released (and evictable) when it ends.
            self.cache.acquire(seq.block_hashes[seq.cache_refs : full])
            seq.cache_refs = full

    def _evict(self) -> None:
        """Unreferenced cached blocks live in free KV blocks: keep them within that room."""
        if self.cache is not None:
            self.cache.evict_to(self.free_blocks)

    def _decode_tokens(self, seq: Sequence) -> int:
        if not self.lookahead:
            return 1
        acceptance = self.acceptance if seq.acceptance is None else seq.acceptance
        accepted = 0
        for pos, prob in enumerate(acceptance):
            if self.rng.random() >= prob:
                break
            accepted += 1
            self.spec.accepted_per_pos[pos] += 1
        self.spec.drafts += 1
        self.spec.draft_tokens += self.lookahead
        self.spec.accepted_tokens += accepted
        return 1 + accepted

    def _emit(self, seq: Sequence, n: int, now: float) -> Emission:
        n = min(n, seq.remaining)
        seq.generated += n
        self._cache_computed(seq)
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now
        done = seq.remaining <= 0
        if done:
            seq.finished = True
            self.running.remove(seq)
            self._free(seq)
        else:
            # Keep the allocation tight to what the context holds now.
            keep = self.profile.blocks_for(seq.context)
            if seq.blocks > keep:
                self.free_blocks += seq.blocks - keep
                seq.blocks = keep
        return Emission(seq, n, done)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.computed = False
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _free(self, seq: Sequence) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0
        if self.cache is not None and seq.cache_refs:
            self.cache.release(seq.block_hashes[: seq.cache_refs])
            seq.cache_refs = 0
