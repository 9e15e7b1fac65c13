"""Request outputs in vLLM's shape (RequestOutput holding CompletionOutputs),
and how a request's state becomes one."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.logprobs import Logprob

if TYPE_CHECKING:
    from engine.sequence import Sequence


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per token: the sampled one's and the top ones
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None
    delta_text: str = ""  # text new since the previous output of this request


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    error: Exception | None = None  # an EngineError when the request failed
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # per prompt token (the first: None)


def request_output(seq: Sequence) -> RequestOutput:
    """The request's output now: its visible text, the delta since the last
    output made (this advances it), tokens, finish reason, metrics, error."""
    finished = seq.finish_reason is not None
    text = seq.detok.output_text(finished)
    delta = text[seq.emitted_len :]
    seq.emitted_len = len(text)
    comp = CompletionOutput(
        index=seq.index,
        text=text,
        token_ids=list(seq.output_token_ids),
        cumulative_logprob=seq.cumulative_logprob,
        logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
        finish_reason=seq.finish_reason if seq.finish_reason != "error" else None,
        stop_reason=seq.stop_reason,
        delta_text=delta,
    )
    return RequestOutput(
        request_id=seq.request_id,
        prompt=seq.prompt,
        prompt_token_ids=seq.prompt_token_ids,
        outputs=[comp],
        finished=finished,
        num_cached_tokens=seq.num_cached_prompt_tokens,
        metrics={
            "arrival_time": seq.arrival_time,
            "first_token_time": seq.first_token_time,
            "finished_time": time.monotonic() if finished else None,
            "num_preemptions": seq.num_preemptions,
            **({"spec_draft_tokens": seq.spec.draft_tokens, "spec_accepted_tokens": seq.spec.accepted_tokens}
               if seq.spec is not None else {}),
        },
        error=seq.error,
        prompt_logprobs=seq.prompt_logprobs,  # complete once the prompt is computed (not copied)
    )
