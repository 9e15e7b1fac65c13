"""SamplingParams with vLLM's field names, validated on creation."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from engine.errors import InvalidInputError
from engine.validation import is_int, is_number


def _check(cond: bool, fieldname: str, message: str):
    if not cond:
        raise InvalidInputError(f"sampling params: {fieldname} {message}", field=fieldname)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int | None = None  # None: as many as fit the context
    min_tokens: int = 0
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only (benchmarks), no text and no stop strings

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None or isinstance(self.stop, tuple):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self):
        if self.max_tokens is not None:
            _check(is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1")
        _check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", "must not exceed max_tokens")
        _check(is_number(self.temperature) and self.temperature >= 0, "temperature", "must be a number >= 0")
        _check(is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 0), "top_k", "must be -1 (off) or >= 0")
        _check(is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        _check(is_number(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty", "must be > 0")
        _check(is_number(self.presence_penalty) and -2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]")
        _check(is_number(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]")
        if self.seed is not None:
            _check(is_int(self.seed) and 0 <= self.seed < 2**63, "seed", "must be an integer in [0, 2**63)")
        _check(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop), "stop",
               "must be a non-empty string or a list of them")
        _check(isinstance(self.stop_token_ids, list) and all(is_int(t) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids", "must be a list of integers >= 0")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a boolean")
        _check(isinstance(self.detokenize, bool), "detokenize", "must be a boolean")
        _check(self.detokenize or not self.stop, "stop", "needs detokenize=True")
        if self.logprobs is not None:
            _check(is_int(self.logprobs) and 0 <= self.logprobs <= 20, "logprobs", "must be an integer in [0, 20]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# the fields a request may set; `detokenize` is the engine's own switch (benchmarks)
REQUEST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams) if f.name != "detokenize")
