"""speculative_config with vLLM's names, checked once: a bad value raises
InvalidInputError naming `speculative_config.<field>`."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from engine.errors import InvalidInputError
from engine.validation import is_int, is_number

FIELD = "speculative_config"
METHODS = ("ngram", "draft_model")
# steps with more running requests than this propose nothing (vLLM's disable_by_batch_size),
# unless the config sets it: the crossover measured where the engine runs (benchmarks/spec_decode.py,
# S1-x, summaries decoding together with speculation forced on against off). On the 2-core CPU in
# float32 verify steps of 5 positions still paid at 8 (1.18x decode speed); in bfloat16, where the
# int4 kernel's time grows with the rows and attention is cheaper, 1.18x at 1, 1.07x at 2, 0.97x
# at 4, 0.82x at 8: 2. On an H100 a verify step of 5 positions costs 0.99-1.02x a decode step at
# any batch from 1 to 64 when steps are timed alone (S2), yet E1 with the switch at 64 served
# 0.76x (c=10) and 0.73x (c=50) the tokens of the same run without speculation (E1-spec; at 8:
# 1.00x both): 8.
DEFAULT_DISABLE_BY_BATCH_SIZE = 8
CPU_BF16_DISABLE_BY_BATCH_SIZE = 2
LOOKUP_MIN, LOOKUP_MAX = 2, 4  # the n-grams looked up when neither bound is given


def _fail(name: str, problem: str):
    raise InvalidInputError(f"{FIELD}.{name} {problem}", field=f"{FIELD}.{name}")


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4  # k: drafted tokens verified per request and step
    model: str | None = None  # draft_model: the small model of the same tokenizer that drafts (a folder or hub id)
    prompt_lookup_max: int = LOOKUP_MAX  # longest n-gram looked up (ngram)
    prompt_lookup_min: int = LOOKUP_MIN  # shortest n-gram looked up (ngram)
    disable_by_batch_size: int | None = None  # None: default_switch() for the engine's device and dtype
    # vLLM's draft model sharding: only 1 (the draft model runs whole, on one device), taken so
    # that vLLM's documented draft-model configs load as written
    draft_tensor_parallel_size: int | None = None
    # ours: a request whose last `acceptance_window` drafted tokens were accepted less often than
    # this pauses its drafts for as many steps (then tries again); 0: never pauses
    min_acceptance_rate: float = 0.2
    acceptance_window: int = 32
    # ours: False: every request speculates unless its SamplingParams.speculative is False;
    # True: only requests whose SamplingParams.speculative is True (the worker's summarize jobs)
    opt_in: bool = False

    @classmethod
    def from_value(cls, value: Any) -> "SpeculativeConfig | None":
        """A SpeculativeConfig from a dict (vLLM's keys), an instance, or None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise InvalidInputError(f"{FIELD} must be an object such as "
                                    '{"method": "ngram", "num_speculative_tokens": 4}', field=FIELD)
        known = {f.name for f in fields(cls)}
        for key in value:
            if key not in known:
                _fail(str(key), f"is not supported (supported: {', '.join(sorted(known))})")
        if "method" not in value:
            _fail("method", f"is required: one of {', '.join(METHODS)}")
        if "num_speculative_tokens" not in value:
            _fail("num_speculative_tokens", "is required (drafted tokens per step, e.g. 4)")
        lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        values = dict(value)
        if lo is None and hi is not None:  # one bound given: the other's default, within it
            values["prompt_lookup_min"] = min(hi, LOOKUP_MIN) if is_int(hi) else hi
        if hi is None and lo is not None:
            values["prompt_lookup_max"] = max(lo, LOOKUP_MAX) if is_int(lo) else lo
        return cls(**values)

    def __post_init__(self):
        if self.method not in METHODS:
            _fail("method", f"must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name, low, high in (("num_speculative_tokens", 1, 16), ("prompt_lookup_max", 1, 64),
                                ("prompt_lookup_min", 1, 64), ("disable_by_batch_size", 1, 1 << 20),
                                ("acceptance_window", 1, 1 << 20)):
            v = getattr(self, name)
            if v is None and name == "disable_by_batch_size":
                continue
            if not (is_int(v) and low <= v <= high):
                _fail(name, f"must be an integer in [{low}, {high}], got {v!r}")
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            _fail("model", "is required with method draft_model: the drafting model's folder or hub id")
        if self.method == "ngram" and self.model is not None:
            _fail("model", "is for method draft_model (ngram drafts by prompt lookup, with no model)")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            _fail("prompt_lookup_min", f"({self.prompt_lookup_min}) must not exceed prompt_lookup_max "
                  f"({self.prompt_lookup_max})")
        if self.draft_tensor_parallel_size is not None and not (
                is_int(self.draft_tensor_parallel_size) and self.draft_tensor_parallel_size == 1):
            _fail("draft_tensor_parallel_size", f"must be 1 (the draft model runs unsharded, on one device), "
                  f"got {self.draft_tensor_parallel_size!r}")
        if not (is_number(self.min_acceptance_rate) and 0 <= self.min_acceptance_rate <= 1):
            _fail("min_acceptance_rate", f"must be a number in [0, 1], got {self.min_acceptance_rate!r}")
        if not isinstance(self.opt_in, bool):
            _fail("opt_in", "must be true or false")

    def for_engine(self, device: str, dtype) -> "SpeculativeConfig":
        """This config with disable_by_batch_size set: its own, or the default measured for the device and dtype."""
        if self.disable_by_batch_size is not None:
            return self
        return replace(self, disable_by_batch_size=default_switch(device, dtype))


def default_switch(device: str, dtype) -> int:
    """disable_by_batch_size's default where the engine runs (see DEFAULT_DISABLE_BY_BATCH_SIZE)."""
    cpu_bf16 = device == "cpu" and str(dtype).removeprefix("torch.") == "bfloat16"
    return CPU_BF16_DISABLE_BY_BATCH_SIZE if cpu_bf16 else DEFAULT_DISABLE_BY_BATCH_SIZE
