"""The OpenAI routes' output: chat.completion / text_completion objects, their
stream chunks (SSE text as worker-vllm sends them), and /v1/models."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from handler.job.costs import build, finished_bytes
from handler.job.stream import stream_batches
from handler.openai.choices import choice_output, flat
from handler.tools.chat_output import chat_output


class OpenAIFormatter:
    """Builds chat.completion / text_completion objects and their stream chunks."""

    def __init__(self, route: str, job_id: str, model: str, *, role: str = "assistant", raw: bool = True,
                 include_usage: bool = False):
        self.chat = route == "/v1/chat/completions"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + job_id
        self.model = model
        self.role = role
        self.raw = raw
        self.include_usage = include_usage
        self.created = int(time.time())

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
               "total_tokens": prompt_tokens + completion_tokens}
        if cached_tokens:
            out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return out

    def response(self, text: str, finish_reason: str, usage: dict, *, choices: list[tuple] | None = None) -> dict:
        """`choices`: (index, text, finish_reason, logprobs) of each (handler.openai.choices)."""
        out = []
        for index, ctext, reason, logprobs in choices or [(0, text, finish_reason, None)]:
            if self.chat:
                out.append({"index": index, "message": {"role": self.role, "content": ctext}, "logprobs": logprobs,
                            "finish_reason": reason})
            else:
                out.append({"index": index, "text": ctext, "logprobs": logprobs, "finish_reason": reason})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": out, "usage": usage}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, first: bool = False, index: int = 0,
              logprobs: dict | None = None) -> dict:
        if self.chat:
            delta: dict = {"role": self.role, "content": text or ""} if first else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": usage}

    def pack(self, chunks: list[dict], done: bool = False) -> str | list[dict]:
        """One stream item: SSE text (RAW_OPENAI_OUTPUT, worker-vllm's default) or a list of chunks."""
        if not self.raw:
            return chunks
        text = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks)
        return text + ("data: [DONE]\n\n" if done else "")


def models_response(model: str, max_model_len: int | None = None,
                    adapters: list[tuple[str, str, str]] = ()) -> dict:
    """/v1/models: the served model, then each LoRA adapter as vLLM lists them, (id, root: its
    path, parent: its base model)."""
    created = int(time.time())
    cards = [{"id": model, "object": "model", "created": created, "owned_by": "runpod-llm-worker",
              "root": model, "parent": None}]
    cards += [{"id": name, "object": "model", "created": created, "owned_by": "runpod-llm-worker",
               "root": root, "parent": parent} for name, root, parent in adapters]
    if max_model_len:
        for card in cards:
            card["max_model_len"] = max_model_len
    return {"object": "list", "data": cards}


def sendable(chunks: list[dict]) -> list[dict]:
    """The chunks less the chat ones that carry nothing (a parser holding text back, a forced
    call's whitespace): vLLM sends none of those either."""
    def empty(c: dict) -> bool:
        return c.get("object") == "chat.completion.chunk" and bool(c["choices"]) and all(
            not ch.get("delta") and ch.get("finish_reason") is None and ch.get("logprobs") is None
            for ch in c["choices"])

    return [c for c in chunks if not empty(c)]


async def openai_items(run, request, engine_request_id: str, model: str) -> AsyncIterator[Any]:
    """An OpenAI job's items: one response object, or (streaming) SSE items of chunks."""
    spec, settings = run.spec, run.settings
    fmt = OpenAIFormatter(spec.route, run.ctx.id, model, role=settings.openai_response_role,
                          raw=settings.raw_openai_output, include_usage=spec.include_usage)
    fmt = chat_output(fmt, spec)  # reasoning and tool calls parsed out (handler.tools.chat_output)
    choices = choice_output(run, fmt, request)  # n > 1, logprobs, echo (handler.openai.choices)
    head = choices.head() if choices else ((fmt.chunk("", first=True),) if fmt.chat else ())
    wrap = choices.chunks if choices else fmt.chunk
    async for kind, value in stream_batches(run, request, engine_request_id, wrap, head):
        if kind == "items":
            chunks = sendable(flat(value))
            if chunks:
                yield fmt.pack(chunks)
            continue
        comp, chunks = value
        chunks = sendable(flat(chunks))
        usage = fmt.usage(comp.prompt_tokens, comp.completion_tokens, comp.cached_tokens)
        if not spec.stream:
            rows = await build(lambda: choices.rows(comp), finished_bytes(request.params, comp)) if choices else None
            yield fmt.response(comp.text, comp.finish_reason, usage, choices=rows)
            return
        chunks += choices.finish_chunks(comp) if choices else [fmt.chunk(None, comp.finish_reason)]
        if spec.include_usage:
            chunks.append(fmt.usage_chunk(usage))
        yield fmt.pack(chunks, done=True)
