"""worker-vllm's environment variables (its README and docs/configuration.md, old and new):
each is honoured under our own setting of the same name, read under ours through an alias
(`translate`), or logged once at start as not applicable here (`start_notes`); none stops
the worker. Values worker-vllm accepts that ours would refuse are mapped (DTYPE=half) or
dropped to our default with a note (MAX_MODEL_LEN=auto)."""
from __future__ import annotations

import json
from collections.abc import Collection, Mapping

# worker-vllm's name -> ours (ours wins when both are set)
ALIASES = {
    "DEFAULT_MIN_BATCH_SIZE": "MIN_BATCH_SIZE", "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": "BATCH_SIZE_GROWTH_FACTOR",
    "NUM_GPU_BLOCKS_OVERRIDE": "NUM_KV_BLOCKS", "TOKENIZER": "TOKENIZER_NAME",
    "SERVED_MODEL_NAME": "OPENAI_SERVED_MODEL_NAME_OVERRIDE", "REQUEST_TIMEOUT": "JOB_TIMEOUT_S",
}
DTYPES = {"half": "float16", "float": "float32"}
# vLLM's names this engine has no method for (ours: awq, gptq and their _marlin names, compressed-tensors, fp8)
VLLM_ONLY_QUANTIZATIONS = frozenset({
    "aqlm", "deepspeedfp", "tpu_int8", "ptpc_fp8", "fbgemm_fp8", "modelopt", "modelopt_fp4", "marlin", "bitblas",
    "gguf", "gptq_marlin_24", "gptq_bitblas", "bitsandbytes", "qqq", "hqq", "experts_int8", "neuron_quant", "ipex",
    "quark", "moe_wna16", "torchao", "auto-round", "rtn", "inc", "mxfp4", "squeezellm", "awq_triton",
})
VLLM_ONLY_BLOCK_SIZES = frozenset({"1", "64", "128"})

_ENGINE = "a vLLM engine option this engine does not have"
_FEATURE = "not implemented by this worker"
NOT_APPLICABLE = {
    **dict.fromkeys((
        "SKIP_TOKENIZER_INIT", "TOKENIZER_MODE", "DOWNLOAD_DIR", "LOAD_FORMAT", "QUANTIZATION_PARAM_PATH",
        "DISTRIBUTED_EXECUTOR_BACKEND", "WORKER_USE_RAY", "PIPELINE_PARALLEL_SIZE", "MAX_PARALLEL_LOADING_WORKERS",
        "RAY_WORKERS_USE_NSIGHT", "DISABLE_SLIDING_WINDOW", "NUM_LOOKAHEAD_SLOTS", "ROPE_SCALING", "ROPE_THETA",
        "TOKENIZER_POOL_SIZE", "TOKENIZER_POOL_TYPE", "TOKENIZER_POOL_EXTRA_CONFIG", "SWAP_SPACE",
        "MAX_SEQ_LEN_TO_CAPTURE", "MAX_CONTEXT_LEN_TO_CAPTURE", "DISABLE_CUSTOM_ALL_REDUCE", "ENABLE_EXPERT_PARALLEL",
        "VLLM_USE_DEEP_GEMM", "ATTENTION_BACKEND", "VLLM_ATTENTION_BACKEND", "ASYNC_SCHEDULING", "STREAM_INTERVAL",
        "MODEL_LOADER_EXTRA_CONFIG", "PREEMPTION_MODE", "PREEMPTION_CHECK_PERIOD", "PREEMPTION_CPU_CAPACITY",
        "USE_V2_BLOCK_MANAGER", "NUM_SCHEDULER_STEPS", "COMPILATION_CONFIG", "CUDA_GRAPH_SIZES",
    ), _ENGINE),
    **dict.fromkeys((
        "ENABLE_LORA", "MAX_LORAS", "MAX_LORA_RANK", "LORA_EXTRA_VOCAB_SIZE", "LORA_DTYPE", "LONG_LORA_SCALING_FACTORS",
        "MAX_CPU_LORAS", "FULLY_SHARDED_LORAS", "LORA_MODULES", "SPECULATIVE_METHOD",
        "SPECULATIVE_MODEL", "NUM_SPECULATIVE_TOKENS", "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE",
        "SPECULATIVE_MAX_MODEL_LEN", "SPECULATIVE_DISABLE_BY_BATCH_SIZE", "NGRAM_PROMPT_LOOKUP_MAX",
        "NGRAM_PROMPT_LOOKUP_MIN", "GUIDED_DECODING_BACKEND", "RETURN_TOKENS_AS_TOKEN_IDS",
        "TRUST_REQUEST_CHAT_TEMPLATE", "EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE",
    ), _FEATURE),
    **dict.fromkeys(("DISABLE_LOG_STATS", "ENABLE_LOG_REQUESTS", "DISABLE_LOG_REQUESTS", "DISABLE_LOGGING_REQUEST",
                     "MAX_LOG_LEN", "ENABLE_LOG_OUTPUTS", "LOG_ERROR_STACK"),
                    "vLLM's own logging; this worker logs one line per job (LOG_LEVEL)"),
    **dict.fromkeys(("VLLM_PORT", "VLLM_STARTUP_TIMEOUT", "VLLM_EXTRA_ARGS", "VLLM_CONFIG_FILE", "VLLM_BASE_URL"),
                    "there is no vllm serve process here"),
    "TRUST_REMOTE_CODE": "remote code is never run: only supported architectures load",
    "ENABLE_CHUNKED_PREFILL": "prefills are always chunked within MAX_NUM_BATCHED_TOKENS",
    "ENABLE_PROMPT_TOKENS_DETAILS": "usage always has prompt_tokens_details.cached_tokens when some were cached",
    "ENABLE_FORCE_INCLUDE_USAGE": "a streamed job's usage comes with stream_options.include_usage",
    "WORKER_CUDA_VERSION": "a build argument of worker-vllm's image",
    "VLLM_VERSION": "a build argument of worker-vllm's image",
    "MAX_LOGPROBS": "logprobs are not returned by this worker yet",  # unless our settings have it
}


def translate(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the environment as our settings read it, notes on what was changed)."""
    out, notes = dict(env), []
    for theirs, ours in ALIASES.items():
        if (env.get(theirs) or "").strip() and not (env.get(ours) or "").strip():
            out[ours] = env[theirs]
    dtype = (out.get("DTYPE") or "").strip().lower()
    if dtype in DTYPES:
        out["DTYPE"] = DTYPES[dtype]
    for name, ok, why in (
            ("MAX_MODEL_LEN", lambda v: v not in ("auto", "-1"), "the model's context length is used"),
            ("QUANTIZATION", lambda v: v not in VLLM_ONLY_QUANTIZATIONS, "not supported here; the checkpoint's "
             "own quantization (config.json) is used"),
            ("BLOCK_SIZE", lambda v: v not in VLLM_ONLY_BLOCK_SIZES, "this engine's blocks are 8, 16 or 32 "
             "tokens; 16 is used")):
        value = (out.get(name) or "").strip().lower()
        if value and not ok(value):
            notes.append(f"{name}={value}: {why}")
            out[name] = ""
    _speculative(out, notes)
    return out, notes


def _speculative(out: dict[str, str], notes: list[str]) -> None:
    """SPECULATIVE_CONFIG as vLLM reads it: `"model": "[ngram]"` (its older spelling) is method ngram;
    a method this engine lacks (a draft model, EAGLE, ...) is dropped with a note."""
    raw = (out.get("SPECULATIVE_CONFIG") or "").strip()
    try:
        config = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return  # the setting's own check names the variable
    if not isinstance(config, dict):
        return
    model = config.get("model")
    method = config.get("method") or ("ngram" if model in ("[ngram]", "ngram") else "draft_model" if model else None)
    if method == "ngram":
        config = {k: v for k, v in config.items() if k != "model"} | {"method": "ngram"}
        out["SPECULATIVE_CONFIG"] = json.dumps(config)
    elif method is not None:
        notes.append(f"SPECULATIVE_CONFIG: method {method!r} is not implemented here (only ngram); speculation "
                     "stays as without it")
        out["SPECULATIVE_CONFIG"] = ""


def start_notes(env: Mapping[str, str], ours: Collection[str]) -> list[str]:
    """One line for each worker-vllm variable set in `env` that this worker does not apply
    (`ours`: our settings' names, which win: MAX_LOGPROBS once logprobs exist)."""
    from handler.tools import reasoning, tool_calls

    notes = translate(env)[1]
    for name, known, what in (("TOOL_CALL_PARSER", tool_calls.PARSERS, 'tool_choice "auto" fails invalid_input'),
                              ("REASONING_PARSER", reasoning.PARSERS, "reasoning stays in the content")):
        value = (env.get(name) or "").strip().lower()
        if value and value not in known:
            notes.append(f"{name}={value} is not implemented here (only {', '.join(known)}): {what}")
    for name, why in NOT_APPLICABLE.items():
        if (env.get(name) or "").strip() and name not in ours:
            notes.append(f"{name} (a worker-vllm setting) is not applicable to this worker: {why}; ignored")
    return notes
