"""A request's output text and its stop checks: incremental decoding that never
emits a broken character while a multi-byte one is still arriving, stop strings
found across token borders (one automaton per request: a check costs the new
characters, not the list), trimmed exactly and held back while streaming, and
the finish rule (EOS and stop token ids, stop strings, the token limit)."""
from __future__ import annotations

from engine.sampling_params import SamplingParams

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes output tokens a few at a time: each step decodes a short window
    ending at the newest token and emits the text past the window's already
    emitted part, holding back text that ends in an incomplete character."""

    CONTEXT = 5  # tokens of left context so leading spaces decode correctly

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # vLLM's switch, passed to the tokenizer's decode only when off (a fast tokenizer ignores it, as in vLLM)
        self.decode_kwargs = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        self.ids: list[int] = list(prompt_token_ids[-self.CONTEXT :])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens, **self.decode_kwargs)

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
        """At the end: whatever is still held back, less a character whose bytes never all
        arrived (generation stopped inside it: it would decode as U+FFFD). As in `add`, a
        trailing U+FFFD counts as incomplete, so one the model spelled out in full as its
        very last character is dropped too."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        new = full[len(prefix) :].rstrip(REPLACEMENT) if len(full) > len(prefix) else ""
        self.read_offset = len(self.ids)
        self.text += new
        return new


class StopAutomaton:
    """One request's stop strings as one Aho-Corasick automaton, built once: read a character at
    a time, it knows the longest stop string ending at that character, so the stop check of a
    token costs its new characters, however many stop strings there are."""

    def __init__(self, stops: list[str]):
        self.goto: list[dict[str, int]] = [{}]  # node -> next node by character (node 0: the root)
        ends: list[tuple[int, int] | None] = [None]  # node -> (length, list index) of the string it spells
        for index, stop in enumerate(stops):
            node = 0
            for ch in stop:
                nxt = self.goto[node].get(ch)
                if nxt is None:
                    nxt = self.goto[node][ch] = len(self.goto)
                    self.goto.append({})
                    ends.append(None)
                node = nxt
            if ends[node] is None:  # a repeated string keeps its first place in the list
                ends[node] = (len(stop), index)
        self.fail = [0] * len(self.goto)  # node -> the node of its longest proper suffix in the trie
        self.longest = ends  # node -> the longest stop string ending there (its own, or a suffix's)
        queue = list(self.goto[0].values())
        for node in queue:  # breadth first: a suffix is shallower, so its links are done
            for ch, child in self.goto[node].items():
                f = self.fail[node]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[child] = self.goto[f].get(ch, 0)
                if self.longest[child] is None:
                    self.longest[child] = self.longest[self.fail[child]]
                queue.append(child)

    def read(self, state: int, text: str, start: int) -> tuple[int, tuple[int, int] | None]:
        """Read text[start:] from `state`: (the new state, (start, list index) of the first stop
        string ending in it: the one starting first, then the one listed first; or None)."""
        goto, fail, longest = self.goto, self.fail, self.longest
        best = None
        for pos in range(start, len(text)):
            ch = text[pos]
            while (nxt := goto[state].get(ch)) is None and state:
                state = fail[state]
            state = nxt or 0
            hit = longest[state]
            if hit is not None and (best is None or (pos + 1 - hit[0], hit[1]) < best):
                best = (pos + 1 - hit[0], hit[1])
        return state, best


class StopChecker:
    """Stop strings in the decoded text, as vLLM finds them: the first one that ends in new text
    stops it (the one starting first, then the one listed first), cut before the string (or after
    it, with include_stop_str); a tail that could still grow into one is held back while streaming.
    Each check reads only the new characters (StopAutomaton, built at the first check)."""

    def __init__(self, stops: list[str], include_stop_str: bool = False):
        self.stops = list(stops)
        self.include = include_stop_str
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.cut: int | None = None
        self._automaton: StopAutomaton | None = None  # built in the engine's step, not when the request is added
        self._state = 0
        self._read = 0  # characters of the text the automaton has read

    def _advance(self, text: str) -> tuple[int, int] | None:
        if self._automaton is None:
            self._automaton = StopAutomaton(self.stops)
        self._state, best = self._automaton.read(self._state, text, self._read)
        self._read = len(text)
        return best

    def check(self, text: str) -> str | None:
        """The stop string that ends text now, or None."""
        if not self.stops or self.cut is not None:
            return None
        best = self._advance(text)
        if best is None:
            return None
        idx, s = best[0], self.stops[best[1]]
        self.cut = idx + (len(s) if self.include else 0)
        return s

    def skip(self, text: str) -> None:
        """Text that may not stop the request (before min_tokens): no stop string ending in it
        counts, but one that began in it and ends later does."""
        if self.stops and self.cut is None:
            self._advance(text)

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
        self.decoder = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens,
                                              params.spaces_between_special_tokens)
        self.stops = StopChecker(params.stop, params.include_stop_str_in_output)
        self.stop_token_ids = frozenset(params.stop_token_ids)

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
        if is_eos or token in self.stop_token_ids:  # the sampler bans both before min_tokens
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

    def complete(self) -> tuple[str, None]:
        """The request's grammar is complete (structured output): it ends with "stop"."""
        self.decoder.flush()
        return "stop", None
