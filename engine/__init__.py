"""Our inference engine: paged KV cache with prefix caching, continuous
batching with chunked prefill and preemption, a model registry.
Importing it loads no weights and touches no device; the front ends
(and torch) load on first use of their names."""
from __future__ import annotations

import importlib

_EXPORTS = {
    "LLM": "engine.llm",
    "AsyncLLMEngine": "engine.async_engine",
    "CompletionOutput": "engine.outputs",
    "EngineConfig": "engine.config",
    "EngineRequest": "engine.input_processor",
    "LLMEngine": "engine.llm_engine",
    "LoRARequest": "engine.lora.request",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
