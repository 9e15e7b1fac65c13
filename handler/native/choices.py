"""The native job's items for a request of n > 1 choices or vLLM's logprobs: logprobs in
vLLM's shape as JSON (per token {token id: {logprob, rank, decoded_token}}; prompt_logprobs
with null for the first prompt token). One choice: the usual items with `logprobs` beside
`text`. n > 1: each item holds `choices`, indexed as worker-vllm's items are
(`choices[i]`), each with its own text (new text when streaming), finish_reason, logprobs."""
from __future__ import annotations

from collections.abc import AsyncIterator

from handler.job.choices import is_truncated
from handler.job.costs import build, finished_bytes


def logprobs_json(positions: list | None) -> list | None:
    if positions is None:
        return None
    return [None if lp is None else {str(t): {"logprob": v.logprob, "rank": v.rank, "decoded_token": v.decoded_token}
                                     for t, v in lp.items()} for lp in positions]


def _merge(deltas: list) -> dict[int, dict]:
    """A batch of engine outputs' ChoiceDeltas as one entry per choice: text, logprobs."""
    out: dict[int, dict] = {}
    for batch in deltas:
        for d in batch:
            entry = out.setdefault(d.index, {"index": d.index, "text": "", "logprobs": None})
            entry["text"] += d.text
            if d.logprobs is not None:
                entry["logprobs"] = (entry["logprobs"] or []) + logprobs_json(d.logprobs)
    return out


def _item(entries: dict[int, dict], n: int) -> dict:
    if n == 1:
        entry = entries.get(0, {"text": "", "logprobs": None})
        item = {"text": entry["text"]}
        if entry["logprobs"] is not None:
            item["logprobs"] = entry["logprobs"]
        return item
    return {"choices": [{k: v for k, v in e.items() if v is not None} for _, e in sorted(entries.items())]}


async def native_choice_items(run, request, engine_request_id: str, stream_batches, final_item) -> AsyncIterator[dict]:
    """The items; `stream_batches` and `final_item` are handler.native.output's."""
    n, spec = request.params.n, run.spec
    async for kind, value in stream_batches(run, request, engine_request_id, lambda d: d):
        if kind == "items":
            yield _item(_merge(value), n)
            continue
        comp, rest = value
        if spec.stream:
            entries = _merge(rest)
        else:
            entries = await build(lambda: {c.index: {"index": c.index, "text": c.text,
                                                     "logprobs": logprobs_json(c.logprobs)} for c in comp.choices},
                                  finished_bytes(request.params, comp))
        for c in comp.choices:
            entry = entries.setdefault(c.index, {"index": c.index, "text": "", "logprobs": None})
            entry["finish_reason"], entry["truncated"] = c.finish_reason, is_truncated(c.finish_reason)
        item = final_item(run, comp, entries.get(0, {}).get("text", ""))
        if n == 1:
            item["logprobs"] = entries[0]["logprobs"] if 0 in entries else None
        else:
            del item["text"]
            item = {"choices": _item(entries, n)["choices"], **item}
        if comp.prompt_logprobs is not None:
            item["prompt_logprobs"] = await build(lambda: logprobs_json(comp.prompt_logprobs),
                                                  finished_bytes(request.params, comp))
        yield item


