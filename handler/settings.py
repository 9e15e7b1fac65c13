"""Worker settings from environment variables: one table (name, type, default,
description) that validation, the `Settings` object and the docs (docs/deploy.md) all come from."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from handler.setting_error import SettingsError  # its callers import it from here

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    type: str  # str | int | float | bool | choice | json
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple = ()
    secret: bool = False
    group: str = "worker"
    # a str setting's value read further, (variable, raw) -> value, raising SettingsError (LORA_MODULES)
    convert: Callable[[str, str], Any] | None = None

    @property
    def attr(self) -> str:
        return self.name.lower()

    def parse(self, raw: str) -> Any:
        """Parse and check one raw value; raises SettingsError naming the variable."""
        text = raw.strip()
        value: Any
        if self.type == "str":
            value = text if self.convert is None else self.convert(self.name, text)
        elif self.type == "bool":
            if text.lower() not in _TRUE | _FALSE:
                raise SettingsError(self.name, raw, "expected a boolean (true/false/1/0)")
            value = text.lower() in _TRUE
        elif self.type == "int" or (self.type == "choice" and isinstance(self.choices[0], int)):
            try:
                value = int(text)
            except ValueError:
                raise SettingsError(self.name, raw, "expected an integer") from None
        elif self.type == "float":
            try:
                value = float(text)
            except ValueError:
                raise SettingsError(self.name, raw, "expected a number") from None
            if not math.isfinite(value):
                raise SettingsError(self.name, raw, "expected a finite number")
        elif self.type == "choice":
            value = text.lower()
        elif self.type == "json":
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SettingsError(self.name, raw, f"expected JSON ({exc.msg})") from None
            if not isinstance(value, dict):
                raise SettingsError(self.name, raw, "expected a JSON object")
        else:
            raise AssertionError(self.type)
        if self.choices and value not in self.choices:
            raise SettingsError(self.name, raw, "expected one of " + ", ".join(str(c) for c in self.choices))
        if self.minimum is not None and (value <= self.minimum if self.exclusive_minimum else value < self.minimum):
            raise SettingsError(self.name, raw, f"must be {'>' if self.exclusive_minimum else '>='} {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise SettingsError(self.name, raw, f"must be <= {self.maximum:g}")
        return value


def _s(name, type_, default, description, **kw) -> Setting:
    return Setting(name, type_, default, description, **kw)


def _lora_modules(name: str, raw: str):
    from handler.lora.modules import parse_lora_modules  # light: no engine, no torch

    return parse_lora_modules(name, raw)


SETTINGS: tuple[Setting, ...] = (
    # model and engine (worker-vllm's names where they exist)
    _s("MODEL_NAME", "str", None, "Hugging Face hub id or local folder of the model, safetensors, of a supported "
       "architecture (Llama, Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE, Phi-3/4, Gemma 2, Gemma 3 text). A hub id "
       "already in a Hugging Face hub cache (RunPod's cached models, a network volume under BASE_PATH, HF_HOME) "
       "loads from there with no hub call, served under the name as written. Unset: the embedded default model "
       "(SmolLM2-135M-Instruct, AWQ 4-bit), prepared once into the cache.", group="model"),
    _s("MODEL_REVISION", "str", None, "Hub revision (branch, tag or commit) of MODEL_NAME; of a cached model, the "
       "snapshot to load (unset: the one refs/main names, else the newest).", group="model"),
    _s("TOKENIZER_NAME", "str", None, "Hub id or folder of a tokenizer to use in place of the model's "
       "(worker-vllm's name; `TOKENIZER` too).", group="model"),
    _s("TOKENIZER_REVISION", "str", None, "Hub revision of TOKENIZER_NAME.", group="model"),
    _s("CUSTOM_CHAT_TEMPLATE", "str", None, "A Jinja chat template replacing the tokenizer's own (worker-vllm's "
       "name; vLLM's --chat-template), e.g. for a model without one or to render tools. Unset with no "
       "MODEL_NAME: the embedded default model gets SmolLM2's ChatML with Hermes-style tools "
       "(handler/prepare/data/default_chat_template.jinja).", group="model"),
    _s("QUANTIZATION", "choice", None, "vLLM's names, checked against the checkpoint: `awq` (= `awq_marlin`), `gptq` "
       "(= `gptq_marlin`), `compressed-tensors`, `fp8`, or `none` for plain weights; unset: read from the "
       "checkpoint's config.json.",
       choices=("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "fp8", "none"), group="model"),
    _s("DTYPE", "choice", "auto", "Activation dtype; auto: bfloat16 on CUDA and on CPUs with native bfloat16 "
       "matmuls (AVX512-BF16, AMX), else float32.",
       choices=("auto", "float16", "bfloat16", "float32"), group="model"),
    _s("KV_CACHE_DTYPE", "choice", "auto", "KV cache element type (vLLM's names); auto: the model's dtype. "
       "`fp8` (= `fp8_e4m3`) or `fp8_e5m2` halves a 16-bit cache's memory (twice the tokens held), with the "
       "checkpoint's per-tensor k/v scales, else 1.0.",
       choices=("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2"), group="model"),
    _s("MAX_MODEL_LEN", "int", None, "Context length (prompt + output tokens); unset: the model's.", minimum=2,
       group="model"),
    _s("ALLOW_LONG_MAX_MODEL_LEN", "bool", False, "Let MAX_MODEL_LEN exceed the model's positions "
       "(config.json's max_position_embeddings, with its rope scaling), with a warning (vLLM's "
       "VLLM_ALLOW_LONG_MAX_MODEL_LEN); false: such a MAX_MODEL_LEN stops the worker at start (with MODEL_NAME; "
       "the default model's jobs fail model_load_failed).", group="model"),
    _s("GPU_MEMORY_UTILIZATION", "float", 0.9, "Fraction of GPU memory the engine may fill: weights, the profiled "
       "peak of a full-budget step, CUDA graphs, and the KV cache gets the rest.",
       minimum=0, exclusive_minimum=True, maximum=1, group="model"),
    _s("MAX_NUM_SEQS", "int", 256, "Most requests the engine runs in one batch.", minimum=1, group="model"),
    _s("MAX_NUM_BATCHED_TOKENS", "int", None, "Token budget of one engine step; unset: the engine's default.",
       minimum=1, group="model"),
    _s("BLOCK_SIZE", "choice", 16, "Tokens per KV-cache block.", choices=(8, 16, 32), group="model"),
    _s("ENABLE_PREFIX_CACHING", "bool", True, "Reuse KV blocks of shared prompt prefixes.", group="model"),
    _s("MAX_LOGPROBS", "int", 20, "Most logprobs (top_logprobs, prompt_logprobs) a request may ask for per "
       "token (worker-vllm's and vLLM's max_logprobs).", minimum=0, group="model"),
    _s("NUM_KV_BLOCKS", "int", None, "Fixed number of KV blocks; unset: sized from GPU_MEMORY_UTILIZATION.",
       minimum=1, group="model"),
    _s("PREFIX_CACHE_TTL_S", "float", 0.0, "Seconds an unused cached prefix block stays reusable; 0: until evicted.",
       minimum=0, group="model"),
    _s("SEED", "int", 0, "Engine seed for requests without their own seed.", minimum=0, group="model"),
    _s("ENFORCE_EAGER", "bool", False, "No CUDA graphs for decode steps (they are captured at load, batch sizes 1 to "
       "MAX_NUM_SEQS, and replayed for every decode step).", group="model"),
    _s("MAX_CUDAGRAPH_TOKENS", "int", 512, "Prefill and mixed prefill + decode steps of up to this many tokens "
       "replay CUDA graphs too (captured at load for 16 to this many tokens); larger steps run eagerly. 0: only "
       "decode steps use graphs.", minimum=0, maximum=8192, group="model"),
    _s("ASYNC_SCHEDULING", "bool", None, "Launch each steady decode step while the previous one still runs, its "
       "input tokens read on the GPU (vLLM's async scheduling); steps with structured output, penalties, logit bias "
       "or new requests to admit wait as before. False: every step waits for its samples. Unset: on with a GPU, off "
       "on the CPU (where nothing would overlap).", group="model"),
    _s("TENSOR_PARALLEL_SIZE", "int", 1, "GPUs one worker splits the model across (tensor parallelism, one process "
       "per GPU); the model's attention and KV heads must divide evenly, and the worker needs that many GPUs.",
       minimum=1, group="model"),
    _s("HF_TOKEN", "str", None, "Hugging Face token for gated or private models.", secret=True, group="model"),
    _s("BASE_PATH", "str", None, "Cache root, e.g. the network volume `/runpod-volume`: the default model and, "
       "where their variables are unset, the Hugging Face cache (HF_HOME), the kernels' tuned configs "
       "(LLM_KERNELS_CACHE_DIR) and Triton's compiled kernels (TRITON_CACHE_DIR) live under it, so a worker "
       "starting on the same volume skips the kernel tuning and compiling of the first.", group="model"),
    _s("ALLOWED_MODEL_ROOTS", "str", None, "Folders (separated by `:`) a local model folder must lie in, symlinks "
       "resolved; one outside fails model_load_failed. Unset: BASE_PATH, /runpod-volume, /models, the Hugging Face "
       "cache, the user's cache and home folders, the working folder (unless it is `/`) and the temp folder; `*`: "
       "anywhere.", group="model"),
    _s("SPECULATIVE_CONFIG", "json", None, "Speculative decoding for every job, vLLM's speculative_config as JSON "
       "(worker-vllm's name): `{\"method\": \"ngram\", \"num_speculative_tokens\": 4}` drafts up to 4 tokens a "
       "step by prompt lookup (`prompt_lookup_max`, `prompt_lookup_min`: the n-grams looked up) and verifies them in "
       "one forward; greedy output is unchanged. `{\"method\": \"draft_model\", \"model\": \"<folder or hub id>\", "
       "\"num_speculative_tokens\": 4}` drafts with a small model of the same tokenizer instead. Off above "
       "`disable_by_batch_size` running requests (default 8; 2 for bfloat16 on a CPU). "
       "Unset: only `summarize` jobs speculate (SUMMARIZE_SPECULATION).", group="model"),
    # LoRA adapters (worker-vllm's and vLLM's names; handler.lora)
    _s("ENABLE_LORA", "bool", None, "Serve LoRA adapters (LORA_MODULES) beside the base model; unset: on when "
       "LORA_MODULES names adapters (false with LORA_MODULES set stops the worker at start). Not with "
       "TENSOR_PARALLEL_SIZE > 1.", group="lora"),
    _s("LORA_MODULES", "str", None, "The adapters to serve, each a PEFT LoRA folder (adapter_config.json, "
       "adapter_model.safetensors) or a hub id, found as MODEL_NAME is (a local folder within ALLOWED_MODEL_ROOTS, "
       "a Hugging Face hub cache: RunPod's cached models, the volume under BASE_PATH; else downloaded with "
       "HF_TOKEN): a JSON list of `{\"name\": ..., \"path\": ..., \"base_model_name\": ...}` objects, or "
       "`name=path` entries separated by spaces or commas. Each is loaded and checked against the model at "
       "start; a job picks one by its name (OpenAI `model`, a native job's `lora` or `model`).",
       convert=_lora_modules, group="lora"),
    _s("MAX_LORAS", "int", 1, "Adapters on the GPU at once (slots); a request of another adapter waits for a "
       "slot to free.", minimum=1, maximum=256, group="lora"),
    _s("MAX_LORA_RANK", "int", 16, "Largest rank of an adapter (the slots' size); an adapter of a larger rank "
       "stops the worker at start.", minimum=1, maximum=512, group="lora"),
    _s("MAX_CPU_LORAS", "int", None, "Loaded adapters kept in host memory (the others are read again from "
       "disk when a job picks them); unset: MAX_LORAS. At least MAX_LORAS.", minimum=1, maximum=4096,
       group="lora"),
    _s("FAULT_INJECTION", "json", None, "Testing only, off by default: JSON handed to the engine's fault_injection, "
       "e.g. `{\"oom_at_step\": 3, \"oom_request_id\": \"job-1\"}`.", group="model"),
    # worker
    _s("MAX_CONCURRENCY", "int", 30, "Most jobs this worker takes at once; the concurrency actually used is the "
       "smaller of this and what the free KV blocks hold (JOB_KV_TOKENS each).", minimum=1),
    _s("JOB_KV_TOKENS", "int", 0, "KV tokens one job is assumed to need when the concurrency is computed from the "
       "free KV blocks; 0: the longest request the KV cache holds at once (max_model_len, or a window and a "
       "chunk when every layer slides).", minimum=0),
    _s("DEFAULT_MAX_TOKENS", "int", 4096, "Cap on output tokens when a job gives no max_tokens (it gets as many as fit "
       "the context, up to this; reaching it is reported as truncated, never silent).", minimum=1),
    _s("MAX_INPUT_CHARS", "int", 1_000_000, "Most characters of a job's input, together: the prompt (a token-id "
       "prompt: ids) or the messages' contents, the tool definitions and the assistant messages' tool calls (their "
       "JSON's strings and keys), the `bad_words`; or the document to summarize. More fails invalid_input naming the "
       "largest of them.", minimum=1),
    _s("SUMMARIZE_CONTEXT_TOKENS", "int", 0, "Most tokens of one engine call of a `summarize` job (prompt + "
       "summary); a longer document is summarized in parts (map-reduce). 0: the engine's longest request. On the "
       "CPU a lower value (e.g. 2048, one engine step there) bounds how long a short document arriving mid-run "
       "waits behind a long one's prefill, at the price of more map calls.", minimum=0),
    _s("SUMMARIZE_SPECULATION", "bool", True, "`summarize` jobs decode with n-gram speculation (prompt lookup: a "
       "summary reuses its document's words, so several tokens are accepted a step at low concurrency; the text is "
       "the same; 4 drafts a step, 3 on a CPU in bfloat16). False: they decode one token a step (or as "
       "SPECULATIVE_CONFIG says for every job, when set)."),
    _s("MAX_BAD_WORDS", "int", 256, "Most words in one job's `bad_words` (each is tokenized twice, as vLLM "
       "does); more fails invalid_input. Their characters count toward MAX_INPUT_CHARS.", minimum=1),
    _s("MAX_MESSAGES", "int", 1000, "Most chat messages in one job; more fails invalid_input.", minimum=1),
    _s("MAX_OUTPUT_TOKENS", "int", 32768, "Most output tokens a job may ask for (max_tokens, max_completion_tokens, "
       "summarize.max_tokens); more fails invalid_input. Also caps DEFAULT_MAX_TOKENS.", minimum=1),
    _s("MAX_CHOICES", "int", 32, "Most choices one job may ask for (n, or best_of); more fails invalid_input "
       "naming the field. A job's choices share every engine step with the other jobs: at 32 (with 20 logprobs) "
       "a streamed neighbour's time per token stayed within 1.3x on the CPU (benchmark R1); at 128, the engine's "
       "limit and OpenAI's, it was 2.3x (3.8x with logprobs).", minimum=1, maximum=128),
    _s("MAX_JOB_TOKENS", "int", 65536, "Most output tokens one job may ask for across its choices: n (or "
       "best_of) times max_tokens; more fails invalid_input naming n (or max_tokens). A job with no max_tokens "
       "gets what fits this (and MAX_RESPONSE_MB), reported as truncated when reached.", minimum=1),
    _s("MAX_RESPONSE_MB", "float", 16.0, "Most megabytes of a job's response, estimated before it runs from its "
       "choices, max_tokens, logprobs and echo (about 16 bytes a token, 96 a logprob entry); more fails "
       "invalid_input naming the field that grows it (logprobs, n, max_tokens).", minimum=0,
       exclusive_minimum=True),
    _s("MAX_STOP_STRINGS", "int", 256, "Most stop strings in one job (`stop`); more fails invalid_input.", minimum=1),
    _s("MAX_STOP_CHARS", "int", 16384, "Most characters of a job's stop strings together; more fails invalid_input.",
       minimum=1),
    _s("MAX_STOP_TOKEN_IDS", "int", 1024, "Most stop token ids in one job (`stop_token_ids`); more fails "
       "invalid_input.", minimum=1),
    _s("JOB_TIMEOUT_S", "float", 0.0, "Deadline of a job without its own timeout_s; 0: none.", minimum=0),
    _s("QUEUE_TIMEOUT_S", "float", 0.0, "A job still waiting this many seconds after it reached the worker, for "
       "room in the KV cache for all its choices or in the engine's queue with none of it running (also after a "
       "preemption), fails `overloaded` (retryable), so a router can send it elsewhere; a long prefill does not "
       "count; 0: off.", minimum=0),
    _s("DRAIN_TIMEOUT_S", "float", 4.0, "Seconds from SIGTERM (or the stop after a refresh) until the jobs still "
       "running fail `worker_shutdown` (retryable, with their partial text) and the worker exits: a little under "
       "the 5 s from SIGTERM to SIGKILL, the one window RunPod's docs state (for interruptible pods; none is "
       "stated for serverless workers).", minimum=0, exclusive_minimum=True),
    _s("EMPTY_OUTPUT_RETRIES", "int", 1, "Times a request whose output is empty (nothing but whitespace) is run "
       "again, each time with a fresh seed, before the job fails empty_output; only for sampled requests "
       "(temperature > 0), a greedy one fails at once.", minimum=0, maximum=10),
    _s("ALLOW_SPECIAL_TOKENS_IN_CONTENT", "bool", False, "Special-token text in chat message contents (e.g. "
       "`<|im_start|>`) becomes control tokens, as vLLM does; off: it is encoded as plain text, so a message "
       "cannot forge a turn. Raw `prompt` text is never changed."),
    _s("DEFAULT_BATCH_SIZE", "int", 50, "Most tokens per streamed item (worker-vllm's name).", minimum=1),
    _s("MIN_BATCH_SIZE", "int", 1, "Tokens in the first streamed item; later ones grow by BATCH_SIZE_GROWTH_FACTOR.",
       minimum=1),
    _s("BATCH_SIZE_GROWTH_FACTOR", "float", 3.0, "Growth of the streamed item size, from MIN_BATCH_SIZE up to "
       "DEFAULT_BATCH_SIZE.", minimum=1),
    _s("RAW_OPENAI_OUTPUT", "bool", True, "Streamed OpenAI routes yield SSE text (`data: {...}`) as worker-vllm "
       "does; false: lists of chunk objects."),
    _s("OPENAI_SERVED_MODEL_NAME_OVERRIDE", "str", None, "Model name the OpenAI routes report; unset: MODEL_NAME "
       "(or the default model's name)."),
    _s("OPENAI_RESPONSE_ROLE", "str", "assistant", "Role of the chat completion's message."),
    _s("ENABLE_AUTO_TOOL_CHOICE", "bool", True, "`tool_choice: \"auto\"` (and no tool_choice with tools): tool "
       "calls parsed from the model's text (TOOL_CALL_PARSER); false: `auto` fails invalid_input and tools without "
       "a tool_choice get text, as vLLM without --enable-auto-tool-choice (its default is false)."),
    _s("TOOL_CALL_PARSER", "str", None, "Tool-call format of the model's text, vLLM's --tool-call-parser names: "
       "`hermes` (Qwen2.5, Qwen3), `llama3_json`, `mistral`; unset: chosen from the chat template's markers. Another "
       "of vLLM's names stops the worker at start, unless ENABLE_AUTO_TOOL_CHOICE is false (then it is logged)."),
    _s("REASONING_PARSER", "str", None, "`qwen3` or `deepseek_r1` (vLLM's --reasoning-parser): `<think>...</think>` "
       "returned as `reasoning_content` (streamed as delta.reasoning_content; a Responses reasoning item); unset: "
       "the text stays whole. Another of vLLM's names stops the worker at start."),
    _s("OUTPUT_FORMAT", "choice", "default", "Items of non-OpenAI jobs: `default` (text, finish_reason, truncated, "
       "usage, timings) or `worker-vllm` (its `{\"choices\": [{\"tokens\": [...]}], \"usage\": {\"input\", "
       "\"output\"}}`).", choices=("default", "worker-vllm")),
    _s("RESULT_CACHE_SIZE", "int", 256, "Completed results kept by request_id (same id + same input returns the "
       "cached result); 0: off.", minimum=0),
    _s("RESULT_CACHE_TTL_S", "float", 3600.0, "Seconds a result stays cached by request_id.", minimum=0,
       exclusive_minimum=True),
    _s("LOAD_PROGRESS_INTERVAL_S", "float", 5.0, "Seconds between progress updates of jobs waiting for the model "
       "load.", minimum=0, exclusive_minimum=True),
    _s("SERVE_MAX_QUEUED_JOBS", "int", 10_000, "`--serve` (the local endpoint): most jobs waiting in its queue; "
       "past it /run and /runsync answer 429.", minimum=1),
    _s("SERVE_MAX_RETAINED_MB", "float", 1024.0, "`--serve`: most megabytes of job inputs and results it keeps "
       "(a finished job's input is let go at once); past it the oldest finished jobs are forgotten before their "
       "retention ends, and a job whose input the unfinished ones leave no room for is answered 429.",
       minimum=0, exclusive_minimum=True),
    _s("SERVE_BODY_TIMEOUT_S", "float", 30.0, "`--serve`: seconds a request's body may take to arrive; a slower "
       "one is answered 408 and its connection closed.", minimum=0, exclusive_minimum=True),
    _s("SERVE_HEADER_TIMEOUT_S", "float", 30.0, "`--serve`: seconds a connection's request line and headers may "
       "take to arrive after it opens; a slower connection is closed (one WARNING line).", minimum=0,
       exclusive_minimum=True),
    _s("LOAD_BALANCING", "bool", False, "Serve as a RunPod load-balancing endpoint's worker (as `python -m handler "
       "--load-balancing`): plain HTTP on PORT, no queue: the OpenAI routes (/v1/chat/completions, /v1/completions, "
       "/v1/responses, /v1/models) and POST /runsync (a job's `{\"input\"}`, answered with its result), `GET /ping` "
       "on PORT_HEALTH; the model loads at start. Past the worker's concurrency a request is answered 429."),
    _s("PORT", "int", 80, "Load-balancing mode: the port of the API (RunPod's variable; expose it as an HTTP port "
       "of the endpoint).", minimum=1, maximum=65535),
    _s("PORT_HEALTH", "int", None, "Load-balancing mode: the port of `GET /ping` (RunPod's variable: 204 while the "
       "model loads, 200 ready, 503 unhealthy or stopping); unset: PORT.", minimum=1, maximum=65535),
    _s("LB_REQUEST_TIMEOUT_S", "float", 330.0, "Load-balancing mode: most seconds one request runs (RunPod cuts a "
       "load-balanced request at 5.5 minutes): a request still running then fails `timeout` with its partial text "
       "(a stream ends with that error as its last event). A job's own `timeout_s` may only be shorter.",
       minimum=0, exclusive_minimum=True),
    _s("METRICS_PORT", "int", None, "Serve Prometheus metrics on this port (`/metrics`, for pods); unset: not "
       "served.", minimum=1, maximum=65535),
    _s("METRICS_HOST", "str", "127.0.0.1", "Address the METRICS_PORT server binds: 127.0.0.1 keeps the metrics "
       "inside the worker; `0.0.0.0` serves them to the network (a pod's exposed port, a scraper elsewhere)."),
    _s("METRICS_LOG_INTERVAL_S", "float", 60.0, "Seconds between the `metrics {...}` summary log lines (for "
       "serverless, where nothing scrapes); 0: only at exit.", minimum=0),
    _s("LOG_LEVEL", "choice", "info", "Log level of the worker's own logs.",
       choices=("debug", "info", "warning", "error")),
)

SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

Settings = dataclasses.make_dataclass(
    "Settings",
    [(s.attr, Any, dataclasses.field(default=s.default)) for s in SETTINGS],
    frozen=True,
    slots=True,
)
Settings.__module__ = __name__
Settings.__doc__ = "Validated settings; attribute names are the variables' names in lower case."


def load_settings(env: Mapping[str, str] | None = None) -> Any:
    """Read every setting from `env` (default os.environ); empty values count as unset.
    Raises SettingsError for the first bad value, naming its variable."""
    from handler.worker_vllm_env import translate

    # worker-vllm's names and values read as ours (DTYPE=half, ...); its variables we cannot honour refused
    env = translate(os.environ if env is None else env)[0]
    values = {}
    for s in SETTINGS:
        raw = env.get(s.name)
        values[s.attr] = s.default if raw is None or raw.strip() == "" else s.parse(raw)
    return Settings(**values)


def describe(settings: Any) -> dict[str, Any]:
    """The settings as a dict for a startup log line, secrets masked."""
    return {s.name: ("***" if s.secret and getattr(settings, s.attr) else getattr(settings, s.attr)) for s in SETTINGS}


def settings_markdown(filter_group: Callable[[str], bool] = lambda g: True) -> str:
    """The settings table in Markdown, for docs/deploy.md (python -m handler --print-settings)."""
    rows = ["| Variable | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        if not filter_group(s.group):
            continue
        kind = " \\| ".join(f"`{c}`" for c in s.choices) if s.choices else s.type
        default = "unset" if s.default is None else f"`{str(s.default).lower() if s.type == 'bool' else s.default}`"
        rows.append(f"| `{s.name}` | {kind} | {default} | {s.description} |")
    return "\n".join(rows) + "\n"


# where each cache goes under BASE_PATH when its own variable is unset
BASE_PATH_CACHES = {"HF_HOME": "huggingface-cache", "LLM_KERNELS_CACHE_DIR": "llm-kernels-cache",
                    "TRITON_CACHE_DIR": "triton-cache"}


def apply_base_path(settings: Any, environ: MutableMapping[str, str] = os.environ) -> None:
    """Point the unset cache variables of BASE_PATH_CACHES under settings.base_path (when set).
    Triton's only where that folder can be written: Triton fails to compile into one it cannot."""
    if not settings.base_path:
        return
    for var, folder in BASE_PATH_CACHES.items():
        path = os.path.join(settings.base_path, folder)
        if environ.get(var) or (var == "TRITON_CACHE_DIR" and not _writable_dir(path)):
            continue
        environ[var] = path


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)
