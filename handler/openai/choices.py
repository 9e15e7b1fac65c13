"""The OpenAI objects of a request of n > 1 choices or logprobs: each choice by index, its
logprobs as OpenAI's types define them (chat `logprobs.content[{token, logprob, bytes,
top_logprobs}]`; completions `logprobs {tokens, token_logprobs, top_logprobs, text_offset}`),
stream chunks interleaved by index, and completions' `echo`. A token's text is vLLM's
decoded_token (the token decoded alone); a -inf logprob is sent as -9999.0, as vLLM does."""
from __future__ import annotations

from typing import Any

from handler.job.choices import Choice, ChoiceDelta

FLOOR = -9999.0  # JSON has no -inf


def _lp(value: float) -> float:
    return max(value, FLOOR)


def _top(lp: dict, n: int) -> list[tuple[int, Any]]:
    """The n most likely entries of a position's dict, by rank."""
    return sorted(lp.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 0)[:n]


def chat_logprobs(token_ids: list[int], positions: list[dict], top_n: int) -> dict:
    def entry(text: str, value: float) -> dict:
        return {"token": text, "logprob": _lp(value), "bytes": list(text.encode("utf-8", errors="replace"))}

    content = []
    for tok, lp in zip(token_ids, positions):
        e = lp[tok]
        item = entry(e.decoded_token or "", e.logprob)
        item["top_logprobs"] = [entry(v.decoded_token or "", v.logprob) for _, v in _top(lp, top_n)]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(token_ids: list[int], positions: list, top_n: int, offset: int, decode) -> dict:
    """`positions[i]` None (the prompt's first token, echoed): no logprob; its text from `decode`."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, lp in zip(token_ids, positions):
        text = decode(tok) if lp is None else (lp[tok].decoded_token or "")
        out["tokens"].append(text)
        out["token_logprobs"].append(None if lp is None else _lp(lp[tok].logprob))
        out["top_logprobs"].append(None if lp is None else {v.decoded_token or "": _lp(v.logprob)
                                                             for _, v in _top(lp, top_n)})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


class ChoiceOutput:
    """One request's choices through an OpenAIFormatter (`fmt`, or a wrapper of it)."""

    def __init__(self, fmt, spec, decode, prompt_text: str | None = None):
        self.fmt, self.chat = fmt, fmt.chat
        self.top_n = spec.params.logprobs  # None: not asked
        self.decode = decode
        self.echo = prompt_text if spec.echo else None  # completions: the prompt's text before each choice
        self.offsets: dict[int, int] = {}  # completions: characters of each choice sent so far
        self.n = spec.params.n

    def _logprobs(self, token_ids, positions, index: int, offset: int | None = None):
        if self.top_n is None or positions is None:
            return None
        if self.chat:
            return chat_logprobs(token_ids, positions, self.top_n)
        return completion_logprobs(token_ids, positions, self.top_n, offset or 0, self.decode)

    def head(self) -> list[dict]:
        """The first chunks: the role of every choice (chat), the echoed prompt (completions)."""
        if self.chat:
            return [self.fmt.chunk("", first=True, index=i) for i in range(self.n)]
        if self.echo:
            for i in range(self.n):
                self.offsets[i] = len(self.echo)
            return [self.fmt.chunk(self.echo, index=i) for i in range(self.n)]
        return []

    def chunks(self, deltas: list[ChoiceDelta] | str) -> list[dict]:
        """One chunk per choice that advanced, by index (stream_batches' `wrap`); a plain text delta
        (a request of one choice without logprobs, echoed) is choice 0's."""
        if isinstance(deltas, str):
            deltas = [ChoiceDelta(0, deltas, [], None)]
        out = []
        for d in deltas:
            offset = self.offsets.get(d.index, 0)
            logprobs = self._logprobs(d.token_ids, d.logprobs, d.index, offset)
            self.offsets[d.index] = offset + len(d.text)
            if d.text or logprobs is not None:
                out.append(self.fmt.chunk(d.text, index=d.index, logprobs=logprobs))
        return out

    def finish_chunks(self, comp) -> list[dict]:
        return [self.fmt.chunk(None, c.finish_reason, index=c.index) for c in _choices(comp)]

    def rows(self, comp) -> list[tuple]:
        """(index, text, finish_reason, logprobs) of each choice of a finished request."""
        rows = []
        for c in _choices(comp):
            text, logprobs = c.text, self._logprobs(c.token_ids, c.logprobs, c.index)
            if self.echo is not None:
                text = self.echo + text
                if logprobs is not None:
                    logprobs = self._echo_logprobs(comp, c)
            rows.append((c.index, text, c.finish_reason, logprobs))
        return rows

    def _echo_logprobs(self, comp, c) -> dict:
        prompt = comp.prompt_logprobs or [None] * len(comp.prompt_token_ids or [])
        ids = list(comp.prompt_token_ids or []) + c.token_ids
        return completion_logprobs(ids, list(prompt) + list(c.logprobs), self.top_n, 0, self.decode)


def _choices(comp) -> list[Choice]:
    return comp.choices or [Choice(0, comp.text, [], None, comp.finish_reason)]


def flat(pieces: list) -> list[dict]:
    """Stream pieces as chunks: ChoiceOutput.chunks gives a list per engine output."""
    return [c for piece in pieces for c in (piece if isinstance(piece, list) else [piece])]


def choice_output(run, fmt, request) -> ChoiceOutput | None:
    """A ChoiceOutput for a request of n > 1, logprobs or echo; None for the plain one."""
    from handler.job.choices import detailed

    spec = run.spec
    if not (detailed(request.params) or spec.echo):
        return None
    tokenizer = run.engine.tokenizer
    prompt = None
    if spec.echo:
        prompt = spec.prompt if isinstance(spec.prompt, str) else tokenizer.decode(spec.prompt)
    return ChoiceOutput(fmt, spec, lambda t: tokenizer.decode([t]), prompt)
