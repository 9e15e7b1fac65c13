"""The Responses API's output (`/v1/responses`): one `response` object, or (streaming) its
events from response.created to response.completed (SSE text `event: ...` / `data: ...`,
or lists of event objects when RAW_OPENAI_OUTPUT is false), in the `openai` package's shapes;
reasoning and tool calls split out of the text as in chat (handler.tools)."""
from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from handler.job.choices import is_truncated
from handler.job.stream import stream_batches
from handler.tools.chat_output import message_parser


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def reasoning_item(text: str, done: bool = True, item_id: str | None = None) -> dict:
    return {"id": item_id or _id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if done else [],
            "status": "completed" if done else "in_progress"}


def message_item(text: str | None, done: bool = True, item_id: str | None = None) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"id": item_id or _id("msg"), "type": "message", "role": "assistant", "content": content,
            "status": "completed" if done else "in_progress"}


def call_item(call, done: bool = True) -> dict:
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": call.arguments if done else "",
            "status": "completed" if done else "in_progress"}


class ResponseBuilder:
    """The Response object of one job: its echoed request fields, output items and usage."""

    def __init__(self, run, job_id: str, model: str):
        self.run, self.chat = run, run.spec.chat
        self.id, self.model, self.created = "resp_" + job_id, model, time.time()

    def response(self, output: list[dict], status: str = "completed", comp=None, reasoning: str = "") -> dict:
        req = self.chat.request or {}
        tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
                  "parameters": t["function"].get("parameters"), "strict": False} for t in (self.chat.tools or [])]
        out = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
               "status": status, "output": output, "parallel_tool_calls": self.chat.parallel_tool_calls,
               "tool_choice": self.tool_choice(), "tools": tools, "error": None,
               "incomplete_details": None, "instructions": req.get("instructions"),
               "metadata": req.get("metadata"), "temperature": req.get("temperature"), "top_p": req.get("top_p"),
               "max_output_tokens": req.get("max_output_tokens"), "user": req.get("user"),
               "text": req.get("text", {"format": {"type": "text"}}), "usage": None}
        if comp is not None:
            out["usage"] = self.usage(comp, reasoning)
            if is_truncated(comp.finish_reason):
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        return out

    def tool_choice(self) -> str | dict:
        if self.chat.tool_name is not None:
            return {"type": "function", "name": self.chat.tool_name}
        return self.chat.tool_choice or "auto"

    def usage(self, comp, reasoning: str) -> dict:
        tokens = len(self.run.engine.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
        return {"input_tokens": comp.prompt_tokens, "input_tokens_details": {"cached_tokens": comp.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": comp.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(tokens, comp.completion_tokens)},
                "total_tokens": comp.prompt_tokens + comp.completion_tokens}

    def whole(self, comp) -> dict:
        reasoning, content, calls = message_parser(self.chat).parse(comp.text)
        output = [reasoning_item(reasoning)] if reasoning else []
        if content or not calls:
            output.append(message_item(content or ""))
        output += [call_item(c) for c in calls]
        return self.response(output, comp=comp, reasoning=reasoning or "")


class ResponseEvents:
    """A streamed Response's events: `start`, then `feed(text)` per delta, then `finish(comp)`."""

    def __init__(self, builder: ResponseBuilder):
        self.b = builder
        self.parser = message_parser(builder.chat)
        self.seq, self.output, self.open, self.text, self.reasoning = 0, [], None, "", ""

    def event(self, kind: str, **fields) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        head = self.b.response([], status="in_progress")
        return [self.event("response.created", response=head), self.event("response.in_progress", response=head)]

    def _open(self, kind: str) -> list[dict]:
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self._close()
        self.open, self.text = (reasoning_item("", False) if kind == "reasoning" else message_item("", False)), ""
        at = {"output_index": len(self.output), "item_id": self.open["id"]}
        events.append(self.event("response.output_item.added", output_index=at["output_index"], item=self.open))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self.event("response.content_part.added", content_index=0, part=part, **at))
        return events

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        item, text, at = self.open, self.text, {"output_index": len(self.output), "item_id": self.open["id"]}
        if item["type"] == "reasoning":
            done = reasoning_item(text, item_id=item["id"])
            events = [self.event("response.reasoning_text.done", content_index=0, text=text, **at)]
        else:
            done = message_item(text, item_id=item["id"])
            events = [self.event("response.output_text.done", content_index=0, text=text, logprobs=[], **at),
                      self.event("response.content_part.done", content_index=0, part=done["content"][0], **at)]
        events.append(self.event("response.output_item.done", output_index=at["output_index"], item=done))
        self.output.append(done)
        self.open = None
        return events

    def _deltas(self, reasoning: str, content: str) -> list[dict]:
        events = []
        for kind, text, name in (("reasoning", reasoning, "response.reasoning_text.delta"),
                                 ("message", content, "response.output_text.delta")):
            if not text:
                continue
            events += self._open(kind)
            self.text += text
            if kind == "reasoning":
                self.reasoning += text
            extra = {"logprobs": []} if kind == "message" else {}
            events.append(self.event(name, output_index=len(self.output), item_id=self.open["id"], content_index=0,
                                     delta=text, **extra))
        return events

    def feed(self, text: str) -> list[dict]:
        return self._deltas(*self.parser.feed(text))

    def finish(self, comp) -> list[dict]:
        reasoning, content, calls = self.parser.finish()
        events = self._deltas(reasoning, content)
        if not calls and not any(i["type"] == "message" for i in self.output) and (
                self.open is None or self.open["type"] != "message"):
            events += self._open("message")  # a reply of reasoning only still has its (empty) message
        events += self._close()
        for call in calls:
            index, item = len(self.output), call_item(call, done=False)
            events.append(self.event("response.output_item.added", output_index=index, item=item))
            events.append(self.event("response.function_call_arguments.delta", output_index=index,
                                     item_id=item["id"], delta=call.arguments))
            events.append(self.event("response.function_call_arguments.done", output_index=index,
                                     item_id=item["id"], name=call.name, arguments=call.arguments))
            self.output.append(call_item(call))
            events.append(self.event("response.output_item.done", output_index=index, item=self.output[-1]))
        final = self.b.response(self.output, comp=comp, reasoning=self.reasoning)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return events + [self.event(kind, response=final)]


def pack(events: list[dict], raw: bool) -> Any:
    if not raw:
        return events
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events)


async def responses_items(run, request, engine_request_id: str, model: str) -> AsyncIterator[Any]:
    """A /v1/responses job's items: the Response object, or (streaming) its events."""
    builder, raw = ResponseBuilder(run, run.ctx.id, model), run.settings.raw_openai_output
    events = ResponseEvents(builder)
    head = (events.start(),) if run.spec.stream else ()
    async for kind, value in stream_batches(run, request, engine_request_id, events.feed, head):
        if kind == "items":
            flat = [e for batch in value for e in batch]
            if flat:
                yield pack(flat, raw)
            continue
        comp, rest = value
        if not run.spec.stream:
            yield builder.whole(comp)
            return
        yield pack([e for batch in rest for e in batch] + events.finish(comp), raw)
