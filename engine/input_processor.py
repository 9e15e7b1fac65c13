"""The input processor: turns a request (a prompt and sampling values) into what
the engine runs, once: prompt rendering (chat templates, special-token text in message
contents kept plain text), token checks, SamplingParams, and max_tokens resolved
against the context and the KV cache."""
from __future__ import annotations

import dataclasses
import re
import secrets
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
    grammar: Any = None  # engine.structured.grammar.Grammar of its structured_outputs


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


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids as vLLM finds them: the word alone, and with a leading space
    when that spells it with another first token but as many tokens (mid-text)."""
    out: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out += [plain] if plain else []
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return out


class InputProcessor:
    """One model's prompt rules: its tokenizer and chat template, its vocabulary,
    its context length and the KV cache's capacity. Control-token text (`<|im_start|>`,
    `</s>`, ...) in chat message contents is encoded as plain text, so a message cannot
    forge a turn, unless `allow_special_tokens_in_content` (vLLM's behaviour)."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, kv_capacity_tokens: int, *,
                 allow_special_tokens_in_content: bool = False, max_logprobs: int = 20, eos_token_ids=()):
        from engine.structured.grammar import GrammarCompiler

        self.tokenizer = tokenizer
        self.grammars = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)  # structured_outputs
        self.max_logprobs = max_logprobs
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens
        self.allow_special_tokens_in_content = allow_special_tokens_in_content
        self._control: tuple[re.Pattern | None, frozenset[int]] | None = None  # made on first use

    @property
    def max_request_tokens(self) -> int:
        """The largest request (prompt + output tokens) one sequence can be."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    # -- prompts ------------------------------------------------------------------
    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The chat template applied to messages ({role, content} with string values; an assistant
        message with `tool_calls` may have None content), with the tool definitions (OpenAI's
        [{type: function, function: {...}}]) and extra template variables (`chat_template_kwargs`,
        e.g. Qwen3's enable_thinking) as transformers' apply_chat_template takes them."""
        if not isinstance(messages, list) or not messages:
            raise InvalidInputError("messages must be a non-empty list", field="messages")
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            if (not isinstance(m, dict) or not isinstance(m.get("role"), str)
                    or not (isinstance(content, str) or content is None and m.get("tool_calls"))):
                raise InvalidInputError(f"messages[{i}] must be an object with string 'role' and 'content'",
                                        field=f"messages[{i}]")
        if not self.has_chat_template:
            raise InvalidInputError("this model's tokenizer has no chat template; send a prompt instead",
                                    field="messages")
        reserved = {"messages", "tools", "add_generation_prompt", "tokenize", "chat_template", "return_dict"}
        extra = dict(template_kwargs or {})
        if reserved & set(extra):
            raise InvalidInputError(f"chat_template_kwargs may not set {sorted(reserved & set(extra))[0]}",
                                    field="chat_template_kwargs")
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **extra)
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
            return self.encode_chat(prompt["messages"], prompt.get("add_generation_prompt", True),
                                    tools=prompt.get("tools"), template_kwargs=prompt.get("chat_template_kwargs"))
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self.encode(prompt["prompt"])
        raise InvalidInputError("prompt must be a string, {'prompt_token_ids': [...]} or {'messages': [...]}",
                                field="prompt")

    # -- chat messages: the template's control tokens only ----------------------------
    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, list[int]]:
        """(text, token ids) of chat messages through the template. Control-token text in a
        message's content is encoded as plain text: the content is rendered with each such
        token between markers of a random nonce (unguessable, so content cannot fake one),
        and the rendered text is encoded piece by piece, the marked tokens as plain text."""
        render = {"tools": tools, "template_kwargs": template_kwargs}
        text = self.render_chat(messages, add_generation_prompt, **render)
        pattern, _ = self._control_tokens()
        if not self.allow_special_tokens_in_content and pattern is not None:
            self._refuse_control_text(pattern, tools, messages)
        if (self.allow_special_tokens_in_content or pattern is None
                or not any(pattern.search(m["content"] or "") for m in messages)):
            return text, self.tokenizer.encode(text, add_special_tokens=False)
        nonce = secrets.token_hex(8)
        start, end = f"\U000f0000{nonce}\U000f0001", f"\U000f0001{nonce}\U000f0000"
        marked = [{**m, "content": pattern.sub(lambda t: start + t.group() + end, m["content"])}
                  if m["content"] else m for m in messages]
        rendered = self.render_chat(marked, add_generation_prompt, **render)
        s, e = re.escape(start), re.escape(end)
        # [text, marked token, text, ...]; a marker the template split from its token leaves None (dropped,
        # but it still parts the text on its two sides, so they never join into a control token)
        pieces = re.split(f"{s}({pattern.pattern}){e}|{s}|{e}", rendered)
        ids = self.tokenizer.encode(pieces[0], add_special_tokens=False)
        for i, piece in enumerate(pieces[1:], 1):
            if piece:
                ids += self._encode_piece(piece, plain=i % 2 == 1)
        return text, ids

    @staticmethod
    def _refuse_control_text(pattern: re.Pattern, tools: list | None, messages: list[dict]) -> None:
        """Control-token text in tool definitions or in an assistant message's tool calls is
        refused (only contents are encoded as plain text): it could forge a turn."""
        import json

        if tools and pattern.search(json.dumps(tools, ensure_ascii=False)):
            raise InvalidInputError("tools: a tool definition holds a control token's text", field="tools")
        for i, m in enumerate(messages):
            if m.get("tool_calls") and pattern.search(json.dumps(m["tool_calls"], ensure_ascii=False)):
                raise InvalidInputError(f"messages[{i}].tool_calls: holds a control token's text",
                                        field=f"messages[{i}].tool_calls")

    def _control_tokens(self) -> tuple[re.Pattern | None, frozenset[int]]:
        """A pattern of the tokenizer's control tokens (its special tokens, and the added tokens its
        chat template writes; none of whitespace alone), longest first; and their ids."""
        if self._control is None:
            tok = self.tokenizer
            template = str(getattr(tok, "chat_template", None) or "")
            added = getattr(tok, "added_tokens_decoder", None) or {}
            names = {t.content for t in added.values() if t.special or t.content in template}
            names |= {str(t) for t in (getattr(tok, "all_special_tokens", None) or ())}
            names = sorted((n for n in names if n.strip()), key=len, reverse=True)
            ids = frozenset(i for i, t in added.items() if t.content in names)
            self._control = (re.compile("|".join(map(re.escape, names))) if names else None, ids)
        return self._control

    def _encode_piece(self, text: str, plain: bool) -> list[int]:
        """Token ids of a piece from the middle of a rendered chat: encoded after a newline (so a
        SentencePiece tokenizer adds no word-start space) that is then cut off. `plain`: without
        added tokens, so a control token's text stays text."""
        def encode(t: str) -> list[int]:
            return self._plain_ids(t) if plain else self.tokenizer.encode(t, add_special_tokens=False)

        newline, ids = encode("\n"), encode("\n" + text)
        ids = ids[len(newline):] if ids[:len(newline)] == newline else encode(text)
        if plain and not self._control_tokens()[1].isdisjoint(ids):  # the model's vocabulary spells it whole
            ids = [t for ch in text for t in encode(ch)]
        return ids

    def _plain_ids(self, text: str) -> list[int]:
        """`text` through the tokenizer's normalizer, pre-tokenizer and model, never its added tokens
        (the shared tokenizer's split_special_tokens switch is left alone: other threads encode too)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:  # a slow (Python) tokenizer takes the switch per call
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        splits = [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
        return [t.id for split in splits for t in backend.model.tokenize(split)]

    def check_token_ids(self, ids) -> list[int]:
        if not isinstance(ids, list) or not ids or not all(is_int(t) for t in ids):
            raise InvalidInputError("prompt_token_ids must be a non-empty list of integers", field="prompt_token_ids")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidInputError(f"prompt_token_ids: token ids outside the vocabulary (size {self.vocab_size}): "
                                    f"{bad[:3]}", field="prompt_token_ids")
        return list(ids)

    # -- the request ---------------------------------------------------------------
    def check_params(self, params: SamplingParams) -> SamplingParams:
        """The model's limits on a request's values: logprobs within max_logprobs, token ids of
        logit_bias and allowed_token_ids in the vocabulary; bad_words tokenized (vLLM's way)."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise InvalidInputError(f"{name} must be at most {self.max_logprobs} (MAX_LOGPROBS)", field=name)
        for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise InvalidInputError(f"{name}: token ids outside the vocabulary (size {self.vocab_size}): "
                                        f"{bad[:3]}", field=name)
        if params.bad_words and params.bad_words_token_ids is None:
            params = dataclasses.replace(params, bad_words_token_ids=bad_words_token_ids(self.tokenizer,
                                                                                         params.bad_words))
        return params


    def process(self, prompt, params: Mapping[str, Any] | SamplingParams | None = None, *,
                default_max_tokens: int | None = None) -> EngineRequest:
        """The request as the engine runs it. A missing max_tokens means what fits the
        context and the KV cache, capped at default_max_tokens when given (never vLLM's 16).
        Raises InvalidInputError (naming the field), PromptTooLongError or KVCapacityError."""
        text, ids = self.encode(prompt)
        params = self.check_params(sampling_params(params))
        grammar = self.grammars.compile(params.structured_outputs) if params.structured_outputs else None
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
        return EngineRequest(text, ids, params, max_tokens, grammar)
