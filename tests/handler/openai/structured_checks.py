"""Helpers of the structured-output route tests: a worker on the tiny random model (its text is
random, so only the constraint makes it valid JSON), the JSON-schema check (jsonschema), and
stream reassembly."""
from __future__ import annotations

import jsonschema
from openai.types.chat import ChatCompletionChunk

from tests.handler.conftest import run, settings_for
from tests.handler.sse import parse_sse
from tests.handler.tools.test_tools_and_reasoning import TOOL_TEMPLATE

ENV = {"CUSTOM_CHAT_TEMPLATE": TOOL_TEMPLATE, "DEFAULT_MAX_TOKENS": "300", "MAX_MODEL_LEN": "1024",
       "ALLOW_LONG_MAX_MODEL_LEN": "1", "NUM_KV_BLOCKS": "256"}
SEEDS = [None, 1, 2, 3, 4, 5]  # None: temperature 0


def start_worker(model_dir: str, loop, **env):
    from handler.worker import Worker

    worker = Worker(settings_for(model_dir, **{**ENV, **env}))
    run(loop, worker, {"prompt": "warm up", "sampling_params": {"max_tokens": 2}})
    return worker


def sampling(seed) -> dict:
    return {"temperature": 0} if seed is None else {"seed": seed}


def check(schema: dict, value, where: str = "$") -> None:
    """Assert `value` follows `schema` (jsonschema, the reference validator)."""
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise AssertionError(f"{where}: {exc.message} ({value!r:.200})") from None


def chunks_of(result: dict) -> list[ChatCompletionChunk]:
    """A streamed chat job's chunks, each validated as the openai package's type."""
    assert result["status"] == "COMPLETED", result
    return [ChatCompletionChunk.model_validate(c) for item in result["output"] for c in parse_sse(item)]


def assembled_calls(chunks: list[ChatCompletionChunk], index: int = 0) -> tuple[list[tuple], str | None]:
    """([(id, name, arguments)] of choice `index`'s streamed tool-call deltas, its finish_reason),
    checking the header of each call comes first and its fragments carry no name."""
    calls: dict[int, list] = {}
    reason = None
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.index != index:
                continue
            assert not choice.delta.content, choice.delta  # a forced call has no content
            reason = choice.finish_reason or reason
            for d in choice.delta.tool_calls or ():
                if d.index not in calls:
                    assert d.id.startswith("call_") and d.type == "function" and d.function.name, d
                    calls[d.index] = [d.id, d.function.name, d.function.arguments or ""]
                else:
                    assert d.id is None and d.function.name is None, d
                    calls[d.index][2] += d.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return [tuple(calls[i]) for i in sorted(calls)], reason
