"""n > 1 and best_of (vLLM's parallel sampling): one request fans out into child sequences,
one per choice. The first child prefills the prompt; the others are held back until its
prompt is computed, then find its full KV blocks in the prefix cache (ref counted, shared),
so the prompt is prefilled once and each later child computes less than one block of it.
Child i samples from seed + i when the request has a seed (its own stream either way).
The request's output holds every child's CompletionOutput, by index; with best_of > n it
comes once, at the end: the n children with the highest cumulative logprob (vLLM's rule)."""
from __future__ import annotations

import dataclasses

from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

SEED_LIMIT = 2**63  # SamplingParams.seed's range


def child_id(request_id: str, index: int) -> str:
    """A child's engine id (a NUL inside: never a client's id)."""
    return f"{request_id}\x00{index}"


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index`'s params: one choice, seed + index, prompt_logprobs on the first child only
    (a child asking them would skip the prefix cache)."""
    seed = None if params.seed is None else (params.seed + index) % SEED_LIMIT
    return dataclasses.replace(params, n=1, best_of=None, seed=seed,
                               prompt_logprobs=params.prompt_logprobs if index == 0 else None)


class ParentRequest:
    """One request's children and their latest outputs."""

    def __init__(self, request_id: str, params: SamplingParams, children: list[Sequence]):
        assert len(children) == params.num_choices > 1
        self.request_id = request_id
        self.n = params.n
        self.keep_best = params.num_choices > params.n
        self.children = children
        self.held = list(children[1:])  # added to the scheduler once the first child's prompt is computed
        self.latest: dict[int, RequestOutput] = {}

    def release(self) -> list[Sequence]:
        held, self.held = self.held, []
        return held

    def update(self, out: RequestOutput) -> None:
        self.latest[out.outputs[0].index] = out

    @property
    def failed(self) -> bool:
        return any(o.error is not None for o in self.latest.values())

    @property
    def finished(self) -> bool:
        return self.failed or (len(self.latest) == len(self.children)
                               and all(o.finished for o in self.latest.values()))

    def output(self) -> RequestOutput | None:
        """The request's output now (None: best_of still running)."""
        finished = self.finished
        if self.keep_best and not finished:
            return None
        first = self.latest.get(0) or next(iter(self.latest.values()))
        comps = [self.latest[i].outputs[0] if i in self.latest else CompletionOutput(i, "", [])
                 for i in range(len(self.children))]
        if self.keep_best:
            best = sorted(comps, key=lambda c: c.cumulative_logprob or 0.0, reverse=True)[: self.n]
            comps = [dataclasses.replace(c, index=i) for i, c in enumerate(best)]
        error = next((o.error for o in self.latest.values() if o.error is not None), None)
        return RequestOutput(request_id=self.request_id, prompt=first.prompt, prompt_token_ids=first.prompt_token_ids,
                             outputs=comps, finished=finished, num_cached_tokens=first.num_cached_tokens,
                             metrics=dict(first.metrics), error=error, prompt_logprobs=first.prompt_logprobs)
