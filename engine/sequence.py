"""Per-request state: token ids, progress, KV blocks, detokenizer state."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams

_arrival = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: never None
    priority: int = 0
    cache_salt: str | None = None
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    arrival: int = field(default_factory=lambda: next(_arrival))
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None  # when a step first ran any of it (None: still queued)
    preempted_time: float | None = None  # when it was last preempted (waiting again since, until rescheduled)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: Exception | None = None
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    cumulative_logprob: float = 0.0
    logprobs: list[dict] | None = None  # per output token: token id -> engine.logprobs.Logprob
    prompt_logprobs: list[dict | None] | None = None  # per prompt token (the first: None), when asked
    device_tensors: dict | None = None  # engine.logits_processors' tensors of this request
    index: int = 0  # its choice among the n of a request (engine.parallel_sampling)
    parent: object = None  # engine.parallel_sampling.ParentRequest of a request of n > 1 choices
    generator: object = None  # torch.Generator for seeded sampling
    detok: object = None  # engine.detokenizer.Detokenizer (text and stop checks)
    matcher: object = None  # its grammar's state when it has structured_outputs (engine.structured)
    emitted_len: int = 0  # characters of text already reported
    num_released_blocks: int = 0  # leading block table entries released (outside every layer's window)
    long_rope: bool = False  # longrope: rotated with the long factors (its length passed the switch)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts verified in the coming step (engine.spec_decode)
    spec: object = None  # engine.spec_decode.speculator.SpecState once it may speculate
    lora_request: object = None  # engine.lora.LoRARequest: the adapter it runs with (None: the base model)
    lora_slot: int = -1  # the device slot holding its adapter while it runs (engine.lora.manager)

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def sort_key(self) -> tuple[int, int]:
        """Lower runs first: priority, then arrival."""
        return (self.priority, self.arrival)
