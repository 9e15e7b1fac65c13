"""SamplingParams with vLLM's field names, validated on creation. The per-token logits
edits (logit_bias, allowed_token_ids, bad_words) and the logprobs are applied by
engine.sampler; n / best_of by engine.parallel_sampling; structured_outputs by
engine.structured."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from engine.errors import InvalidInputError
from engine.structured.params import StructuredOutputsParams
from engine.validation import is_int, is_number


def _check(cond: bool, fieldname: str, message: str):
    if not cond:
        raise InvalidInputError(f"sampling params: {fieldname} {message}", field=fieldname)


def are_token_ids(values: list) -> bool:
    """Every value an integer >= 0 (never a bool): one C-speed pass for plain ints, however many."""
    if set(map(type, values)) <= {int}:
        return not values or min(values) >= 0
    return all(is_int(v) and v >= 0 for v in values)


def _first_bad(values: list, ok) -> str:
    """Which item of a list fails `ok`, for the error message."""
    i = next(i for i, v in enumerate(values) if not ok(v))
    return f"item {i} ({values[i]!r:.40})"


def _check_stop_lists(stop, stop_token_ids) -> None:
    """stop: a list of non-empty strings; stop_token_ids: a list of integers >= 0 (both C-speed when right)."""
    _check(isinstance(stop, list), "stop", "must be a non-empty string or a list of them")
    if not (set(map(type, stop)) <= {str} and all(stop)):
        bad = _first_bad(stop, lambda s: isinstance(s, str) and s)
        _check(False, "stop", f"must be a non-empty string or a list of them; {bad} is not a non-empty string")
    _check(isinstance(stop_token_ids, list), "stop_token_ids", "must be a list of integers >= 0")
    if not are_token_ids(stop_token_ids):
        bad = _first_bad(stop_token_ids, lambda t: is_int(t) and t >= 0)
        _check(False, "stop_token_ids", f"must be a list of integers >= 0; {bad} is not")


MAX_LOGPROBS_LIMIT = 1024  # a ceiling of the engine's own max_logprobs (EngineConfig, default 20)
MAX_CHOICES = 128  # n and best_of


def _check_choices(n, best_of) -> None:
    _check(is_int(n) and 1 <= n <= MAX_CHOICES, "n", f"must be an integer in [1, {MAX_CHOICES}]")
    if best_of is not None:
        _check(is_int(best_of) and n <= best_of <= MAX_CHOICES, "best_of",
               f"must be an integer in [n, {MAX_CHOICES}]")


def _check_logits_edits(p) -> None:
    """logit_bias {token id: bias in [-100, 100]}, allowed_token_ids (non-empty), bad_words (strings)."""
    if p.logit_bias is not None:
        _check(isinstance(p.logit_bias, dict), "logit_bias", "must be an object of token id -> bias")
        for tok, bias in p.logit_bias.items():
            _check(is_int(tok) and tok >= 0, "logit_bias", f"key {tok!r:.40} is not a token id (an integer >= 0)")
            _check(is_number(bias) and -100 <= bias <= 100, "logit_bias", f"value of {tok} must be in [-100, 100]")
    if p.allowed_token_ids is not None:
        ids = p.allowed_token_ids
        _check(isinstance(ids, list) and ids and are_token_ids(ids), "allowed_token_ids",
               "must be a non-empty list of integers >= 0")
    if p.bad_words is not None:
        _check(isinstance(p.bad_words, list) and all(isinstance(w, str) and w.strip() for w in p.bad_words),
               "bad_words", "must be a list of non-empty strings")


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
    logprobs: int | None = None  # top logprobs per output token (0: the sampled token's only)
    prompt_logprobs: int | None = None  # the same for each prompt token (the first one has None)
    n: int = 1  # choices of one prompt (its prefill shared)
    best_of: int | None = None  # choices sampled, the n with the highest cumulative logprob kept
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (OpenAI's [-100, 100])
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # words never generated (their last token banned after the rest)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True  # False: token ids only (benchmarks), no text and no stop strings
    bad_words_token_ids: list[list[int]] | None = None  # bad_words tokenized (the input processor's)
    structured_outputs: StructuredOutputsParams | None = None  # the output matches a schema, regex, ... (a dict of its fields too)
    # speculative decoding for this request, when the engine has a speculative_config: None as the
    # config says, False never, True also under the config's opt_in (the worker's summarize jobs)
    speculative: bool | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None or isinstance(self.stop, tuple):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.logit_bias, dict) and any(isinstance(k, str) for k in self.logit_bias):
            # JSON keys are strings (OpenAI sends {"50256": -100}): decimal ones are token ids
            self.logit_bias = {int(k) if isinstance(k, str) and k.isdecimal() else k: v
                               for k, v in self.logit_bias.items()}
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs)
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
        _check_stop_lists(self.stop, self.stop_token_ids)
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output", "detokenize"):
            _check(isinstance(getattr(self, name), bool), name, "must be true or false")
        _check(self.detokenize or not self.stop, "stop", "needs detokenize=True")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check(is_int(value) and 0 <= value <= MAX_LOGPROBS_LIMIT, name,
                       f"must be an integer in [0, {MAX_LOGPROBS_LIMIT}]")
        _check_choices(self.n, self.best_of)
        _check_logits_edits(self)
        _check(self.speculative is None or isinstance(self.speculative, bool), "speculative", "must be true, false or unset")

    @property
    def num_choices(self) -> int:
        """Sequences sampled for the request: best_of, or n."""
        return self.best_of or self.n

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# the fields a request may set; `detokenize` is the engine's own switch (benchmarks),
# bad_words_token_ids the input processor's, `speculative` the caller's (not vLLM's)
REQUEST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams)
                                        if f.name not in ("detokenize", "bad_words_token_ids", "speculative"))
