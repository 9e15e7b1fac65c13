"""A request's output text and its stop checks: incremental decoding that never
emits a broken character while a multi-byte one is still arriving, stop strings
found across token borders, trimmed exactly and held back while streaming, and
the finish rule (EOS and stop token ids, stop strings, the token limit)."""
from __future__ import annotations

from engine.sampling_params import SamplingParams

REPLACEMENT = "\ufffd"


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


class StopChecker:
    """Stop strings in the decoded text: the first one found ends it, cut before
    the string (or after it, with include_stop_str); a tail that could still
    grow into one is held back while streaming."""

    def __init__(self, stops: list[str], include_stop_str: bool = False):
        self.stops = list(stops)
        self.include = include_stop_str
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.cut: int | None = None
        self.scanned = 0

    def check(self, text: str) -> str | None:
        """The stop string that ends text now, or None."""
        if not self.stops or self.cut is not None:
            return None
        start = max(0, self.scanned - self.hold)
        best = None
        for s in self.stops:
            idx = text.find(s, start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        self.scanned = len(text)
        if best is None:
            return None
        idx, s = best
        self.cut = idx + (len(s) if self.include else 0)
        return s

    def skip(self, text: str) -> None:
        """Text that may not stop the request (before min_tokens): later checks start
        past it, but for a stop string that began in its last characters."""
        self.scanned = len(text)

    def visible_text(self, text: str, finished: bool) -> str:
        if self.cut is not None:
            return text[: self.cut]
        if finished or not self.hold:
            return text
        return text[: max(0, len(text) - self.hold)]


class Detokenizer:
    """One request's text and finish rule, token by token: EOS (unless ignore_eos) and
    stop token ids end it with "stop"; then, past min_tokens, a stop string ("stop",
    naming it); then its token limit or the context's end ("length")."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams, eos_token_ids: set[int],
                 max_tokens: int, max_model_len: int):
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.max_tokens, self.max_model_len = max_tokens, max_model_len
        self.num_prompt_tokens = len(prompt_token_ids)
        self.decoder = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.stops = StopChecker(params.stop, params.include_stop_str_in_output)

    @property
    def text(self) -> str:
        """All text decoded so far (past any stop string too)."""
        return self.decoder.text

    def output_text(self, finished: bool) -> str:
        """The text a client may see now."""
        return self.stops.visible_text(self.decoder.text, finished)

    def update(self, token: int, num_output_tokens: int) -> tuple[str, str | int | None] | None:
        """Take the newest token (the num_output_tokens-th); (finish_reason, stop_reason) when it ends the request."""
        p = self.params
        is_eos = token in self.eos_token_ids and not p.ignore_eos
        if is_eos or token in p.stop_token_ids:  # the sampler bans both before min_tokens
            self.decoder.flush()
            return "stop", (None if is_eos else token)
        if p.detokenize:
            self.decoder.add(token)
        if num_output_tokens >= p.min_tokens:
            hit = self.stops.check(self.decoder.text)
            if hit is not None:
                return "stop", hit
        else:
            self.stops.skip(self.decoder.text)
        if num_output_tokens >= self.max_tokens or self.num_prompt_tokens + num_output_tokens >= self.max_model_len:
            self.decoder.flush()
            return "length", None
        return None
