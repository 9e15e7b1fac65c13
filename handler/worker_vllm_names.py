"""Every environment variable worker-vllm reads (its docs/configuration.md and README, the
`vllm serve` flags its args_builder forwards by name, the flags it drops as removed from vLLM,
and the names of its previous engine worker that endpoints still carry) and what this worker
does with it: honoured (our setting of the same name), mapped (read as another of ours, or a
value translated), noted (logged at start: its absence changes nothing a job relies on) or
refused (the worker exits at start naming it and what to do: its meaning cannot be honoured
here, and ignoring it would answer jobs differently from what the user configured).
docs/deploy.md's table of them is `markdown()` (python -m handler --print-worker-vllm-settings)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

HONOURED, MAPPED, NOTED, REFUSED = "honoured", "mapped", "noted", "refused"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str  # HONOURED | MAPPED | NOTED | REFUSED
    text: str  # the table's words: what it is read as, or why it does not apply here
    # a refusal of some values only: (value, the whole environment) -> refused; None: a REFUSED
    # rule refuses any value, another rule none
    refused_if: Callable[[str, Mapping[str, str]], bool] | None = None
    refusal: str = ""  # what the refusal message says to do, for `refused_if`


def _true(value: str, env: Mapping[str, str] | None = None) -> bool:
    return value.strip().lower() in _TRUE


def _not_in(*fine: str) -> Callable[[str, Mapping[str, str]], bool]:
    return lambda value, env: value.strip().lower() not in fine


def _media_allowed(value: str, env: Mapping[str, str]) -> bool:
    """LIMIT_MM_PER_PROMPT: `{"image": 0, ...}` (or vLLM's older `image=0,video=0`) allows no
    media, as a text-only model here; any other count asks for media inputs."""
    try:
        limits = json.loads(value)
    except json.JSONDecodeError:
        limits = dict(p.split("=", 1) for p in value.split(",") if "=" in p)
    if not isinstance(limits, dict) or not limits:
        return True
    return any(not (isinstance(v, (int, str)) and str(v).strip() == "0") for v in limits.values())


def _unknown_tool_parser(value: str, env: Mapping[str, str]) -> bool:
    from handler.tools import tool_calls

    auto_off = (env.get("ENABLE_AUTO_TOOL_CHOICE") or "").strip().lower() in ("0", "false", "no", "off")
    return value.strip().lower() not in tool_calls.PARSERS and not auto_off


def _unknown_reasoning_parser(value: str, env: Mapping[str, str]) -> bool:
    from handler.tools import reasoning

    return value.strip().lower() not in reasoning.PARSERS


_ENGINE = "a vLLM engine option (tuning, parallelism, memory layout) this engine does not have; output is unchanged"
_SERVER = "an option of vllm serve's HTTP server; there is none here (jobs arrive through RunPod)"
_LOGS = "vLLM's own logging and tracing; this worker logs one line per job (LOG_LEVEL) and has METRICS_PORT"
_TEXT = "multimodal input tuning; models here are text-only (a non-text content part fails invalid_input)"
_LORA_KNOB = ("a vLLM LoRA tuning knob this engine does not have; adapters run as ENABLE_LORA, LORA_MODULES, "
              "MAX_LORAS, MAX_LORA_RANK and MAX_CPU_LORAS say")
_GONE = "gone from vLLM (worker-vllm ignores it too)"
_OLD_SPEC = "worker-vllm no longer reads it either; use SPECULATIVE_CONFIG (`ngram` or `draft_model` here)"
_PLUGIN = "vLLM's Python plugins are not loaded here: unset it"
_MM_LORA = ("multimodal LoRA adapters (per modality) are not served here: models here are text-only; unset it "
            "and name text adapters in LORA_MODULES")

_EXPLICIT: dict[str, Rule] = {
    # worker-vllm's wrapper and build
    "VLLM_EXTRA_ARGS": Rule(MAPPED, "each `--flag value` in it (shlex-split; `--flag` alone: true, `--no-flag`: "
                            "false) is read as the variable named after the flag (upper case, dashes to "
                            "underscores), as this table says; a flag not in this table is refused"),
    "VLLM_CONFIG_FILE": Rule(REFUSED, "a vllm serve YAML config is not read here: set its keys as environment "
                             "variables (upper case, dashes to underscores), as this table says"),
    "VLLM_PORT": Rule(NOTED, "there is no vllm serve process here"),
    "VLLM_STARTUP_TIMEOUT": Rule(NOTED, "there is no vllm serve process here"),
    "VLLM_BASE_URL": Rule(NOTED, "there is no vllm serve process here"),
    "VLLM_API_KEY": Rule(NOTED, "RunPod authenticates callers (worker-vllm does not read it either)"),
    "VLLM_VERSION": Rule(NOTED, "a build argument of worker-vllm's image"),
    "WORKER_CUDA_VERSION": Rule(NOTED, "a build argument of worker-vllm's image"),
    "TRANSFORMERS_VERSION": Rule(NOTED, "a build argument of worker-vllm's image"),
    "PYTORCH_ALLOC_CONF": Rule(HONOURED, "read by PyTorch in this worker too"),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": Rule(MAPPED, "`ALLOW_LONG_MAX_MODEL_LEN`: vLLM's own variable, which "
                                          "worker-vllm hands to vllm serve"),
    "VLLM_USE_DEEP_GEMM": Rule(NOTED, _ENGINE),
    "VLLM_ATTENTION_BACKEND": Rule(NOTED, _ENGINE),
    "REQUEST_TIMEOUT": Rule(MAPPED, "`JOB_TIMEOUT_S`"),
    # names of worker-vllm's that are others of ours, or values translated
    "DEFAULT_MIN_BATCH_SIZE": Rule(MAPPED, "`MIN_BATCH_SIZE`"),
    "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": Rule(MAPPED, "`BATCH_SIZE_GROWTH_FACTOR`"),
    "NUM_GPU_BLOCKS_OVERRIDE": Rule(MAPPED, "`NUM_KV_BLOCKS`"),
    "TOKENIZER": Rule(MAPPED, "`TOKENIZER_NAME`"),
    "SERVED_MODEL_NAME": Rule(MAPPED, "`OPENAI_SERVED_MODEL_NAME_OVERRIDE`"),
    "RESPONSE_ROLE": Rule(MAPPED, "`OPENAI_RESPONSE_ROLE`"),
    "REVISION": Rule(MAPPED, "`MODEL_REVISION`"),
    "CHAT_TEMPLATE": Rule(MAPPED, "`CUSTOM_CHAT_TEMPLATE` as the template's text, checked at start (not a file path)"),
    "DTYPE": Rule(HONOURED, "`half` is read as `float16`, `float` as `float32`"),
    "MAX_MODEL_LEN": Rule(HONOURED, "`auto` or `-1`: the model's context length"),
    "MAX_NUM_BATCHED_TOKENS": Rule(HONOURED, "`0` (as worker-vllm): unset, the engine's default"),
    "BLOCK_SIZE": Rule(HONOURED, "8, 16 or 32; vLLM's 1, 64 and 128 are read as 16, with a note"),
    "QUANTIZATION": Rule(HONOURED, "`awq`, `gptq` (and their `_marlin` names), `compressed-tensors`, `fp8`, "
                         "`none`; vLLM's other methods (bitsandbytes, gguf, ...) are noted and the checkpoint's "
                         "own quantization is used"),
    "SPECULATIVE_CONFIG": Rule(HONOURED, "methods `ngram` (`\"model\": \"[ngram]\"` too) and `draft_model` (a "
                               "`model` without a method, as vLLM reads it); other methods (EAGLE, Medusa, MTP, ...) "
                               "are noted and dropped: speculation changes the speed, not what is generated"),
    "TOOL_CALL_PARSER": Rule(HONOURED, "`hermes`, `llama3_json`, `mistral`", _unknown_tool_parser,
                             "this tool-call parser is not implemented here (hermes, llama3_json, mistral): set "
                             "one of those, unset it (chosen from the chat template), or ENABLE_AUTO_TOOL_CHOICE="
                             "false"),
    "REASONING_PARSER": Rule(HONOURED, "`qwen3`, `deepseek_r1`", _unknown_reasoning_parser,
                             "this reasoning parser is not implemented here (qwen3, deepseek_r1): set one of "
                             "those, or unset it to get the reasoning inside the content"),
    "ENABLE_AUTO_TOOL_CHOICE": Rule(HONOURED, "its default here is true (worker-vllm's: false)"),
    # LoRA adapters (handler.lora)
    "ENABLE_LORA": Rule(HONOURED, "on by itself when LORA_MODULES names adapters; `false` with LORA_MODULES stops "
                        "the worker at start; not with TENSOR_PARALLEL_SIZE > 1"),
    "LORA_MODULES": Rule(HONOURED, "worker-vllm's JSON (a list of `{name, path, base_model_name}` objects, or one) "
                         "or vLLM's `name=path` entries; each adapter is loaded and checked at start, and a job "
                         "picks it by name (OpenAI `model`, a native job's `lora` or `model`)"),
    "MAX_LORAS": Rule(HONOURED, "adapters on the GPU at once; a request of another waits for a slot"),
    "MAX_LORA_RANK": Rule(HONOURED, "an adapter of a larger rank stops the worker at start"),
    "MAX_CPU_LORAS": Rule(HONOURED, "unset: MAX_LORAS"),
    # features a user relies on that this worker does not have
    "DEFAULT_MM_LORAS": Rule(REFUSED, _MM_LORA),
    "LIMIT_MM_PER_PROMPT": Rule(REFUSED, "refused unless every count is 0", _media_allowed,
                                "models here are text-only (images, audio and video fail invalid_input): unset "
                                "it, or serve a multimodal model elsewhere"),
    "ENABLE_PROMPT_EMBEDS": Rule(REFUSED, "refused when true", _true,
                                 "prompt embeddings are not accepted here: unset it and send text or token ids"),
    "RETURN_TOKENS_AS_TOKEN_IDS": Rule(REFUSED, "refused when true", _true,
                                       "logprobs name their tokens as text here, never `token_id:N`: unset it"),
    "OVERRIDE_GENERATION_CONFIG": Rule(REFUSED, "default sampling overrides are not read here: unset it and set "
                                       "them in each job's sampling_params (DEFAULT_MAX_TOKENS for a missing "
                                       "max_tokens)"),
    "HF_OVERRIDES": Rule(REFUSED, "config.json overrides are not applied here: unset it (a longer context: "
                         "MAX_MODEL_LEN with ALLOW_LONG_MAX_MODEL_LEN)"),
    "HF_CONFIG_PATH": Rule(REFUSED, "the model's own config.json is read: unset it"),
    "RUNNER": Rule(REFUSED, "refused unless `auto` or `generate`", _not_in("auto", "generate"),
                   "only text generation is served here (no pooling or embedding runner): unset it"),
    "CONVERT": Rule(REFUSED, "refused unless `auto` or `none`", _not_in("auto", "none"),
                    "models are not converted to pooling or embedding models here: unset it"),
    "TOOL_SERVER": Rule(REFUSED, "built-in tool servers are not implemented here: unset it and run the tools "
                        "client-side"),
    "TOOL_PARSER_PLUGIN": Rule(REFUSED, _PLUGIN + " (TOOL_CALL_PARSER: hermes, llama3_json, mistral)"),
    "LOGITS_PROCESSORS": Rule(REFUSED, _PLUGIN),
    "IO_PROCESSOR_PLUGIN": Rule(REFUSED, _PLUGIN),
    "SCHEDULER_CLS": Rule(REFUSED, "refused unless `auto`", _not_in("auto"), _PLUGIN),
    "WORKER_CLS": Rule(REFUSED, "refused unless `auto`", _not_in("auto"), _PLUGIN),
    "WORKER_EXTENSION_CLS": Rule(REFUSED, _PLUGIN),
    # absent here, with nothing a job relies on lost
    "TRUST_REMOTE_CODE": Rule(NOTED, "remote code is never run: only supported architectures load"),
    "CODE_REVISION": Rule(NOTED, "remote code is never run"),
    "ENABLE_CHUNKED_PREFILL": Rule(NOTED, "prefills are always chunked within MAX_NUM_BATCHED_TOKENS"),
    "ENABLE_PROMPT_TOKENS_DETAILS": Rule(NOTED, "usage always has prompt_tokens_details.cached_tokens when some "
                                         "were cached"),
    "ENABLE_FORCE_INCLUDE_USAGE": Rule(NOTED, "a streamed job's usage comes with stream_options.include_usage"),
    "MODEL_IMPL": Rule(NOTED, "this engine has its own implementation of each architecture"),
    "LOAD_FORMAT": Rule(NOTED, "weights load from safetensors only"),
    "PT_LOAD_MAP_LOCATION": Rule(NOTED, "weights load from safetensors only"),
    "DOWNLOAD_DIR": Rule(NOTED, "weights download into the Hugging Face cache (HF_HOME, under BASE_PATH)"),
    "IGNORE_PATTERNS": Rule(NOTED, "only the model's safetensors, config and tokenizer files are read"),
    "CONFIG_FORMAT": Rule(NOTED, "the model's config.json is read"),
    "TOKENIZER_MODE": Rule(NOTED, "the model's Hugging Face tokenizer is used"),
    "SKIP_TOKENIZER_INIT": Rule(NOTED, "the tokenizer always loads"),
    "GENERATION_CONFIG": Rule(NOTED, "generation_config.json's stop tokens are read; sampling defaults are the "
                              "job's"),
    "STRUCTURED_OUTPUTS_CONFIG": Rule(NOTED, "structured output has this worker's own backend"),
    "GUIDED_DECODING_BACKEND": Rule(NOTED, "structured output has this worker's own backend"),
    "SCHEDULING_POLICY": Rule(NOTED, "requests run first come, first served"),
    "TRUST_REQUEST_CHAT_TEMPLATE": Rule(NOTED, "not implemented by this worker"),
    "EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE": Rule(NOTED, "not implemented by this worker"),
    "CHAT_TEMPLATE_CONTENT_FORMAT": Rule(NOTED, "message contents reach the chat template as text"),
    "CPU_OFFLOAD_GB": Rule(NOTED, _ENGINE + "; a model too large for the GPU fails to load, naming the cause"),
    "KV_CACHE_MEMORY_BYTES": Rule(NOTED, _ENGINE + " (NUM_KV_BLOCKS, GPU_MEMORY_UTILIZATION)"),
    "PIPELINE_PARALLEL_SIZE": Rule(NOTED, _ENGINE + " (TENSOR_PARALLEL_SIZE splits a model across GPUs)"),
    "DATA_PARALLEL_SIZE": Rule(NOTED, "one engine per worker: RunPod's workers are the replicas"),
    "POOLER_CONFIG": Rule(NOTED, "no pooling models here"),
    "LORA_DTYPE": Rule(NOTED, _LORA_KNOB + " (adapters run in the model's dtype)"),
    "FULLY_SHARDED_LORAS": Rule(NOTED, _LORA_KNOB + " (LoRA runs on one GPU: no tensor parallelism)"),
    "LONG_LORA_SCALING_FACTORS": Rule(NOTED, _LORA_KNOB),
    "SPECULATIVE_METHOD": Rule(NOTED, _OLD_SPEC), "SPECULATIVE_MODEL": Rule(NOTED, _OLD_SPEC),
    "NUM_SPECULATIVE_TOKENS": Rule(NOTED, _OLD_SPEC), "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE": Rule(NOTED, _OLD_SPEC),
    "SPECULATIVE_MAX_MODEL_LEN": Rule(NOTED, _OLD_SPEC), "SPECULATIVE_DISABLE_BY_BATCH_SIZE": Rule(NOTED, _OLD_SPEC),
    "NGRAM_PROMPT_LOOKUP_MAX": Rule(NOTED, _OLD_SPEC), "NGRAM_PROMPT_LOOKUP_MIN": Rule(NOTED, _OLD_SPEC),
}
_GROUPS = {
    _ENGINE: (
        "ADDITIONAL_CONFIG", "ATTENTION_BACKEND", "CALCULATE_KV_SCALES", "COMPILATION_CONFIG",
        "DATA_PARALLEL_ADDRESS", "DATA_PARALLEL_BACKEND", "DATA_PARALLEL_HYBRID_LB", "DATA_PARALLEL_RANK",
        "DATA_PARALLEL_RPC_PORT", "DATA_PARALLEL_SIZE_LOCAL", "DATA_PARALLEL_START_RANK", "DBO_DECODE_TOKEN_THRESHOLD",
        "DBO_PREFILL_TOKEN_THRESHOLD", "DECODE_CONTEXT_PARALLEL_SIZE", "DISABLE_CASCADE_ATTN",
        "DISABLE_CUSTOM_ALL_REDUCE", "DISABLE_HYBRID_KV_CACHE_MANAGER", "DISABLE_SLIDING_WINDOW",
        "DISTRIBUTED_EXECUTOR_BACKEND", "ENABLE_DBO", "ENABLE_EPLB", "ENABLE_EXPERT_PARALLEL", "EPLB_CONFIG",
        "EXPERT_PLACEMENT_STRATEGY", "KV_EVENTS_CONFIG", "KV_OFFLOADING_BACKEND", "KV_OFFLOADING_SIZE",
        "KV_SHARING_FAST_PREFILL", "KV_TRANSFER_CONFIG", "LOGPROBS_MODE", "LONG_PREFILL_TOKEN_THRESHOLD",
        "MAMBA_CACHE_DTYPE", "MAMBA_SSM_CACHE_DTYPE", "MAX_PARALLEL_LOADING_WORKERS", "MODEL_LOADER_EXTRA_CONFIG",
        "OVERRIDE_ATTENTION_DTYPE", "PREFIX_CACHING_HASH_ALGO", "RAY_WORKERS_USE_NSIGHT", "SAFETENSORS_LOAD_STRATEGY",
        "ENABLE_SLEEP_MODE", "DEVICE", "SCHEDULER_DELAY_FACTOR", "QUANTIZATION_PARAM_PATH", "WORKER_USE_RAY",
        "TOKENIZER_POOL_SIZE", "TOKENIZER_POOL_TYPE", "TOKENIZER_POOL_EXTRA_CONFIG", "MAX_SEQ_LEN_TO_CAPTURE",
        "STREAM_INTERVAL", "PREEMPTION_MODE", "PREEMPTION_CHECK_PERIOD", "PREEMPTION_CPU_CAPACITY",
        "USE_V2_BLOCK_MANAGER", "NUM_SCHEDULER_STEPS"),
    _SERVER: (
        "ALLOWED_HEADERS", "ALLOWED_METHODS", "ALLOWED_ORIGINS", "ALLOW_CREDENTIALS", "API_SERVER_COUNT",
        "DISABLE_FASTAPI_DOCS", "DISABLE_UVICORN_ACCESS_LOG", "ENABLE_REQUEST_ID_HEADERS",
        "ENABLE_SERVER_LOAD_TRACKING", "ENABLE_SSL_REFRESH", "ENABLE_TOKENIZER_INFO_ENDPOINT",
        "H11_MAX_HEADER_COUNT", "H11_MAX_INCOMPLETE_EVENT_SIZE", "MIDDLEWARE", "ROOT_PATH", "SSL_CA_CERTS",
        "SSL_CERTFILE", "SSL_CERT_REQS", "SSL_KEYFILE", "UDS"),
    _LOGS: (
        "COLLECT_DETAILED_TRACES", "DISABLE_LOG_STATS", "ENABLE_LOG_OUTPUTS", "ENABLE_LOG_REQUESTS", "LOG_CONFIG_FILE",
        "LOG_ERROR_STACK", "MAX_LOG_LEN", "OTLP_TRACES_ENDPOINT", "SHOW_HIDDEN_METRICS_FOR_VERSION",
        "USE_TQDM_ON_LOAD", "UVICORN_LOG_LEVEL", "DISABLE_LOGGING_REQUEST"),
    _TEXT: (
        "ALLOWED_LOCAL_MEDIA_PATH", "ALLOWED_MEDIA_DOMAINS", "DISABLE_CHUNKED_MM_INPUT", "INTERLEAVE_MM_STRINGS",
        "MEDIA_IO_KWARGS", "MM_ENCODER_TP_MODE", "MM_PROCESSOR_CACHE_GB", "MM_PROCESSOR_CACHE_TYPE",
        "MM_PROCESSOR_KWARGS", "MM_SHM_CACHE_MAX_OBJECT_SIZE_MB", "SKIP_MM_PROFILING", "VIDEO_PRUNING_RATE"),
    _GONE: (
        "CUDA_GRAPH_SIZES", "DISABLE_FRONTEND_MULTIPROCESSING", "DISABLE_LOG_REQUESTS", "DISABLE_MM_PREPROCESSOR_CACHE",
        "ENABLE_LORA_BIAS", "ENABLE_MULTIMODAL_ENCODER_DATA_PARALLEL", "EPLB_LOG_BALANCEDNESS", "EPLB_STEP_INTERVAL",
        "EPLB_WINDOW_SIZE", "GUIDED_DECODING_DISABLE_ADDITIONAL_PROPERTIES", "GUIDED_DECODING_DISABLE_ANY_WHITESPACE",
        "GUIDED_DECODING_DISABLE_FALLBACK", "LOGITS_PROCESSOR_PATTERN", "LORA_EXTRA_VOCAB_SIZE",
        "MAX_LONG_PARTIAL_PREFILLS", "MAX_NUM_PARTIAL_PREFILLS", "NUM_LOOKAHEAD_SLOTS", "NUM_REDUNDANT_EXPERTS",
        "OVERRIDE_POOLER_CONFIG", "ROPE_SCALING", "ROPE_THETA", "SWAP_SPACE", "TASK", "MAX_CONTEXT_LEN_TO_CAPTURE"),
}
# worker-vllm's names that are ours too, read as ours
HONOURED_NAMES = (
    "MODEL_NAME", "MODEL_REVISION", "TOKENIZER_NAME", "TOKENIZER_REVISION", "CUSTOM_CHAT_TEMPLATE", "HF_TOKEN",
    "BASE_PATH", "MAX_CONCURRENCY", "OPENAI_SERVED_MODEL_NAME_OVERRIDE", "OPENAI_RESPONSE_ROLE", "RAW_OPENAI_OUTPUT",
    "DEFAULT_BATCH_SIZE", "KV_CACHE_DTYPE", "GPU_MEMORY_UTILIZATION", "MAX_NUM_SEQS", "ENABLE_PREFIX_CACHING",
    "SEED", "ENFORCE_EAGER", "ASYNC_SCHEDULING", "TENSOR_PARALLEL_SIZE", "MAX_LOGPROBS",
)
RULES: dict[str, Rule] = {
    **{name: Rule(HONOURED, "") for name in HONOURED_NAMES},
    **{name: Rule(NOTED, why) for why, names in _GROUPS.items() for name in names},
    **_EXPLICIT,
}
# flags only VLLM_EXTRA_ARGS can carry (worker-vllm reserves their variables' names, some of
# which are ours: PORT) and vLLM's short flags, as the variable they stand for
EXTRA_ARGS_RULES: dict[str, Rule] = {
    "MODEL": Rule(MAPPED, "`MODEL_NAME`"),
    "HOST": Rule(NOTED, "there is no vllm serve process here"),
    "PORT": Rule(NOTED, "there is no vllm serve process here"),
    "API_KEY": Rule(NOTED, "RunPod authenticates callers"),
    "CONFIG": RULES["VLLM_CONFIG_FILE"],
}
SHORT_FLAGS = {"-tp": "TENSOR_PARALLEL_SIZE", "-pp": "PIPELINE_PARALLEL_SIZE", "-dp": "DATA_PARALLEL_SIZE",
               "-q": "QUANTIZATION", "-O": "COMPILATION_CONFIG"}
# worker-vllm's names read as another of ours (ours wins when both are set)
ALIASES = {name: rule.text.split("`")[1] for name, rule in RULES.items()
           if rule.kind == MAPPED and rule.text.startswith("`")}


def markdown() -> str:
    """docs/deploy.md's table of worker-vllm's variables (python -m handler --print-worker-vllm-settings)."""
    rows = ["| worker-vllm variable | here | why, or what to do |", "| --- | --- | --- |"]
    for name in sorted(RULES):
        rule = RULES[name]
        kind, text = rule.kind, rule.text
        if name in ALIASES:  # "`OURS` and what else to know"
            kind, text = f"mapped to `{ALIASES[name]}`", text.split("`", 2)[2].strip(" :")
        if rule.refused_if is not None:
            text = f"{text}: {rule.refusal}" if rule.kind == REFUSED else f"{text}; refused otherwise: {rule.refusal}"
        rows.append(f"| `{name}` | {kind} | {text} |")
    return "\n".join(rows) + "\n"
