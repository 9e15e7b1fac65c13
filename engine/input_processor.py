"""The input processor: turns a request (a prompt and sampling values) into what
the engine runs, once: prompt rendering (chat templates), token checks,
SamplingParams, and max_tokens resolved against the context and the KV cache."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidInputError, KVCapacityError, PromptTooLongError
from engine.sampling_params import REQUEST_FIELDS, SamplingParams
from engine.validation import is_int


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A processed request: the engine adds it as it is."""

    prompt: str | None  # the prompt's text, when it had one
    prompt_token_ids: list[int]
    params: SamplingParams  # max_tokens set: the asked value, or what fits
    max_tokens: int  # output tokens it may produce: max_tokens within the context


def sampling_params(values: Mapping[str, Any] | SamplingParams | None) -> SamplingParams:
    """SamplingParams from a request's values (None: the defaults; a None value: unset).
    An unknown name or a bad value raises InvalidInputError naming the field."""
    if isinstance(values, SamplingParams):
        return values
    if values is None:
        return SamplingParams()
    if not isinstance(values, Mapping):
        raise InvalidInputError("sampling params must be SamplingParams or a mapping of its fields",
                                field="sampling_params")
    for key in values:
        if key not in REQUEST_FIELDS:
            raise InvalidInputError(f"sampling params: {key} is not a sampling parameter; supported: "
                                    + ", ".join(sorted(REQUEST_FIELDS)), field=str(key))
    return SamplingParams(**{k: v for k, v in values.items() if v is not None})


class InputProcessor:
    """One model's prompt rules: its tokenizer and chat template, its vocabulary,
    its context length and the KV cache's capacity."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, kv_capacity_tokens: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens

    @property
    def max_request_tokens(self) -> int:
        """The largest request (prompt + output tokens) one sequence can be."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    # -- prompts ------------------------------------------------------------------
    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to messages ({role, content} with string values)."""
        if not isinstance(messages, list) or not messages:
            raise InvalidInputError("messages must be a non-empty list", field="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InvalidInputError(f"messages[{i}] must be an object with string 'role' and 'content'",
                                        field=f"messages[{i}]")
        if not self.has_chat_template:
            raise InvalidInputError("this model's tokenizer has no chat template; send a prompt instead",
                                    field="messages")
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # noqa: BLE001 - a template's refusal (e.g. role order) is the input's fault
            raise InvalidInputError(f"the chat template refused these messages: {exc}", field="messages") from None

    def encode(self, prompt) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt: a string, {"prompt": text}, {"prompt_token_ids": ids}
        (with an optional "prompt" text beside), or {"messages": [...]} (and optionally
        "add_generation_prompt", default true) rendered by the chat template, which writes
        its own special tokens (BOS included), as vLLM's chat path does."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInputError("prompt is empty", field="prompt")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), self.check_token_ids(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "messages" in prompt:
            text = self.render_chat(prompt["messages"], prompt.get("add_generation_prompt", True))
            return text, self.tokenizer.encode(text, add_special_tokens=False)
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self.encode(prompt["prompt"])
        raise InvalidInputError("prompt must be a string, {'prompt_token_ids': [...]} or {'messages': [...]}",
                                field="prompt")

    def check_token_ids(self, ids) -> list[int]:
        if not isinstance(ids, list) or not ids or not all(is_int(t) for t in ids):
            raise InvalidInputError("prompt_token_ids must be a non-empty list of integers", field="prompt_token_ids")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidInputError(f"prompt_token_ids: token ids outside the vocabulary (size {self.vocab_size}): "
                                    f"{bad[:3]}", field="prompt_token_ids")
        return list(ids)

    # -- the request ---------------------------------------------------------------
    def process(self, prompt, params: Mapping[str, Any] | SamplingParams | None = None, *,
                default_max_tokens: int | None = None) -> EngineRequest:
        """The request as the engine runs it. A missing max_tokens means what fits the
        context and the KV cache, capped at default_max_tokens when given (never vLLM's 16).
        Raises InvalidInputError (naming the field), PromptTooLongError or KVCapacityError."""
        text, ids = self.encode(prompt)
        params = sampling_params(params)
        n = len(ids)
        if n >= self.max_model_len:
            raise PromptTooLongError(n, self.max_model_len)
        capacity = self.kv_capacity_tokens
        if n + 1 > capacity:
            raise KVCapacityError(n + 1, capacity)
        if params.max_tokens is None:
            room = self.max_request_tokens - n
            max_tokens = room if default_max_tokens is None else max(1, min(default_max_tokens, room))
            params = dataclasses.replace(params, max_tokens=max_tokens)  # validated again (min_tokens)
        else:
            max_tokens = min(params.max_tokens, self.max_model_len - n)
            if n + max_tokens > capacity:
                raise KVCapacityError(n + max_tokens, capacity)
        return EngineRequest(text, ids, params, max_tokens)
