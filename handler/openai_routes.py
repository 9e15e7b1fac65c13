"""OpenAI routes (`openai_route` + `openai_input`, as worker-vllm takes them):
request parsing into a JobSpec, and response objects and stream chunks out."""
from __future__ import annotations

import json
import time
from typing import Any

from handler.errors import invalid
from handler.schema import check_sampling, parse_messages, parse_prompt

# OpenAI name -> engine SamplingParams name (vLLM's extensions pass through)
SAMPLING_MAP = {
    "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
    "top_p": "top_p", "seed": "seed", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "stop": "stop", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens", "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids", "skip_special_tokens": "skip_special_tokens",
    "include_stop_str_in_output": "include_stop_str_in_output",
}
# accepted only at these (no-op) values
NOOP = {
    "n": (1,), "best_of": (1,), "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,),
    "suffix": ("",), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none", "auto"),
    "response_format": ({"type": "text"},), "add_generation_prompt": (True,),
}
IGNORED = {"model", "user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream", "stream_options"}


def parse_openai_input(route: str, oi: Any, spec) -> None:
    """Fill `spec` from openai_input for `route`; raises invalid_input naming openai_input.<field>."""
    p = "openai_input."
    if route == "/v1/models":
        if oi is not None and not isinstance(oi, dict):
            raise invalid("openai_input", "must be an object")
        return
    if not isinstance(oi, dict):
        raise invalid("openai_input", "must be an object")
    if route == "/v1/chat/completions":
        if "messages" not in oi:
            raise invalid(p + "messages", "is required")
        spec.messages = parse_messages(oi["messages"], p + "messages")
    else:
        if "prompt" not in oi:
            raise invalid(p + "prompt", "is required")
        prompt = oi["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        elif isinstance(prompt, list) and prompt and all(isinstance(x, (str, list)) for x in prompt):
            raise invalid(p + "prompt", "batches of prompts are not supported: send one job per prompt")
        spec.prompt = parse_prompt(prompt, p + "prompt")
    model = oi.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(p + "model", "must be a string")
    stream = oi.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid(p + "stream", "must be true or false")
    spec.stream = stream
    options = oi.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise invalid(p + "stream_options", "must be {include_usage: bool}")
    spec.include_usage = options.get("include_usage", False)
    sampling = {}
    for key, value in oi.items():
        if key in ("messages", "prompt") or key in IGNORED or value is None:
            continue
        if key in NOOP:
            if value not in NOOP[key]:
                raise invalid(p + key, f"is not supported by this worker (only {NOOP[key][0]!r})")
        elif key in SAMPLING_MAP:
            sampling[SAMPLING_MAP[key]] = value
        else:
            spec.notes.append(f"openai_input.{key} is not supported and was ignored")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    spec.sampling = check_sampling(sampling, p)


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

    def response(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": self.role, "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, first: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": self.role, "content": text or ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
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


def models_response(model: str, max_model_len: int | None = None) -> dict:
    card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "runpod-llm-worker",
            "root": model, "parent": None}
    if max_model_len:
        card["max_model_len"] = max_model_len
    return {"object": "list", "data": [card]}


def parse_sse(item: str) -> list[dict]:
    """The chunks of a raw SSE stream item (for clients and tests)."""
    out = []
    for line in item.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: "):]))
    return out
