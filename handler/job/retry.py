"""The empty-output retry (EMPTY_OUTPUT_RETRIES): a sampled request whose output came out
empty runs again with a fresh seed before its job fails empty_output; a greedy one fails at
once. Among n > 1 choices, only the empty ones are sampled again (one request of that many
choices), the others kept. The failure is retryable when a resubmission could sample
otherwise (no seed given)."""
from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from handler.errors import JobError

SEED_STEP = 0x9E3779B97F4A7C15  # odd: the retries of one seed never meet a seed again
SEED_LIMIT = 2**63  # SamplingParams.seed's range


def is_sampled(params) -> bool:
    """Whether another run of the same request could give other tokens (not greedy)."""
    return not (params.greedy or params.top_k == 1)


def retry_seed(seed: int | None, attempt: int) -> int:
    """The seed of retry `attempt` (1, 2, ...): derived from the request's own seed, so a seeded
    job stays reproducible; a random one when the request has none."""
    if seed is None:
        return secrets.randbelow(SEED_LIMIT)
    return (seed + attempt * SEED_STEP) % SEED_LIMIT


class EmptyOutputRetry:
    """One request's attempts: `request` and `request_id` are the current attempt's; `again`
    checks a finished attempt against the failure contract and says whether to run another."""

    def __init__(self, run: Any, request, engine_request_id: str):
        self.run = run
        self.original = self.request = request
        self.base_id = engine_request_id
        self.attempt = 0
        retries = getattr(run.settings, "empty_output_retries", 0) or 0
        self.allowed = retries if is_sampled(request.params) else 0
        self.kept = None  # (the completion before, the indices of its empty choices) while those are resampled
        self.completion = None  # the finished Completion that passed the check

    @property
    def request_id(self) -> str:
        return self.base_id if not self.attempt else f"{self.base_id}:retry{self.attempt}"

    def again(self, comp, streamed: bool) -> bool:
        """True when the attempt's output was empty and another attempt runs (not when some of
        it was streamed already); raises the attempt's JobError when the job fails. `completion`
        is then the job's Completion (a resample's choices in the empty ones' places)."""
        comp = self._merged(comp)
        try:
            self.run.check(comp)
            self.completion = comp
            return False
        except JobError as err:
            if err.code != "empty_output":
                raise
            if streamed or self.attempt >= self.allowed:
                raise self._final(err) from None
            empty = err.details.get("empty_choices")
        self.attempt += 1
        ctx = self.run.ctx
        ctx.empty_output_retries += 1
        ctx.log.info("empty output: retry %d of %d with a fresh seed (finish_reason %s, %d tokens%s)",
                     self.attempt, self.allowed, comp.finish_reason, comp.completion_tokens,
                     f", choices {empty} again" if empty else "")
        seed = retry_seed(self.original.params.seed, self.attempt)
        if empty:  # only the empty choices, as many as there are
            self.kept = (comp, empty)
            params = dataclasses.replace(self.original.params, seed=seed, n=len(empty), best_of=None)
        else:
            params = dataclasses.replace(self.original.params, seed=seed)
        self.request = dataclasses.replace(self.original, params=params)
        return True

    def _merged(self, comp):
        """`comp` of a resample of empty choices put in their places in the completion before."""
        if self.kept is None:
            return comp
        (before, slots), self.kept = self.kept, None
        from handler.job.choices import Choice

        new = comp.choices or [Choice(0, comp.text, [], None, comp.finish_reason)]  # one choice: plain events
        fresh = {slot: dataclasses.replace(c, index=slot) for slot, c in zip(slots, new)}
        choices = [fresh.get(c.index, c) for c in before.choices]
        replaced = sum(len(c.token_ids) for c in before.choices if c.index in fresh)
        tokens = before.completion_tokens - replaced + comp.completion_tokens
        first = choices[0]
        return dataclasses.replace(before, text=first.text, finish_reason=first.finish_reason,
                                   completion_tokens=tokens, choices=choices)

    def _final(self, err: JobError) -> JobError:
        params = self.original.params
        err.retryable = is_sampled(params) and params.seed is None
        if self.attempt:
            err.message += f" ({self.attempt + 1} attempts, each with its own seed)"
        return err
