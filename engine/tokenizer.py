"""Tokenizer loading, chat templates, and incremental detokenization that
never emits a broken character while a multi-byte one is still arriving."""
from __future__ import annotations

from engine.errors import InvalidInputError, ModelLoadError

REPLACEMENT = "\ufffd"


def load_tokenizer(path: str, revision: str | None = None):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - reported with its cause
        raise ModelLoadError(f"tokenizer at {path!r} could not be loaded: {exc}") from exc


def apply_chat_template(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("messages must be a non-empty list", field="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidInputError(
                f"messages[{i}] must be an object with string 'role' and 'content'", field=f"messages[{i}]"
            )
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidInputError("this model's tokenizer has no chat template; send a prompt", field="messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


class IncrementalDetokenizer:
    """Decodes output tokens a few at a time: each step decodes a short window
    ending at the newest token and emits the text past the window's already
    emitted part, holding back text that ends in an incomplete character."""

    CONTEXT = 5  # tokens of left context so leading spaces decode correctly

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-self.CONTEXT :])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Add one token; returns the new text (possibly empty)."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            new = full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.text += new
            return new
        return ""

    def flush(self) -> str:
        """At the end: whatever is still held back (a broken tail decodes as U+FFFD)."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        new = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.read_offset = len(self.ids)
        self.text += new
        return new
