"""A request's choices as a job reports them (n > 1, logprobs): what each engine output
adds to every choice (text, token ids, logprobs), and the finished Completion's choices.
A request that asks neither keeps the plain text deltas (`detailed` is False). `is_truncated`:
what a finish reason says of the output, for every route."""
from __future__ import annotations

from dataclasses import dataclass, field


def is_truncated(finish_reason: str | None) -> bool:
    """The output stopped at its token limit (max_tokens, or the context): finish_reason "length"."""
    return finish_reason == "length"


def detailed(params) -> bool:
    """Whether a request's events carry per-choice deltas (n > 1 or logprobs asked)."""
    return params.num_choices > 1 or params.logprobs is not None or params.prompt_logprobs is not None


@dataclass(slots=True)
class ChoiceDelta:
    """What one engine output added to choice `index`."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None  # engine Logprob dicts, one per new token (logprobs asked)
    finish_reason: str | None = None


@dataclass(slots=True)
class Choice:
    """A finished choice."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None
    finish_reason: str | None


@dataclass(slots=True)
class ChoiceTracker:
    """Follows a request's cumulative outputs: `advance` returns the new text of choice 0, the
    new tokens of all choices and the per-choice deltas."""

    texts: dict[int, str] = field(default_factory=dict)
    ntoks: dict[int, int] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.texts.get(0, "")

    @property
    def ntok(self) -> int:
        return sum(self.ntoks.values())

    def advance(self, out) -> tuple[str, int, list[ChoiceDelta]]:
        first_text, new_tokens, deltas = "", 0, []
        for comp in out.outputs:
            i = comp.index
            text, ntok = self.texts.get(i, ""), self.ntoks.get(i, 0)
            new_text, new_ids = comp.text[len(text):], comp.token_ids[ntok:]
            if i == 0:
                first_text = new_text
            new_tokens += len(new_ids)
            self.texts[i], self.ntoks[i] = comp.text, len(comp.token_ids)
            if new_text or new_ids:
                lps = comp.logprobs[ntok:] if comp.logprobs is not None else None
                deltas.append(ChoiceDelta(i, new_text, list(new_ids), lps, comp.finish_reason))
        return first_text, new_tokens, deltas

    @staticmethod
    def choices(out) -> list[Choice]:
        return [Choice(c.index, c.text, list(c.token_ids), c.logprobs, c.finish_reason) for c in out.outputs]
