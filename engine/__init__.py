"""Our inference engine: paged KV cache with prefix caching, continuous
batching with chunked prefill and preemption, Llama-family models.
Importing it loads no weights and touches no device."""
from engine.async_engine import AsyncLLMEngine
from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
