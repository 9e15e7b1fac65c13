"""Engine configuration (vLLM's argument names)."""
from __future__ import annotations

from dataclasses import dataclass

from engine import faults
from engine.errors import InvalidInputError
from engine.quant.names import QUANTIZATIONS
from engine.spec_decode.config import SpeculativeConfig
from engine.validation import is_int


KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(slots=True)
class EngineConfig:
    model: str
    revision: str | None = None
    # the name the model is known by (logs, the served name), when `model` is a folder standing for
    # it (a hub cache's snapshot); None: `model` itself (vLLM's served_model_name)
    served_model_name: str | None = None
    tokenizer: str | None = None
    tokenizer_revision: str | None = None  # None: the model's revision (when tokenizer is None too)
    chat_template: str | None = None  # a Jinja chat template replacing the tokenizer's own (vLLM's --chat-template)
    dtype: str = "auto"  # auto: bfloat16 on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16, AMX), else float32
    device: str = "auto"
    quantization: str | None = None  # None: read from the checkpoint; "awq" to insist
    # the KV cache's element type (vLLM's names): auto (the model's dtype), bfloat16, float16,
    # float32, or fp8 (= fp8_e4m3) / fp8_e5m2: half the bytes of a 16-bit cache, per-tensor scales
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_model_len: int | None = None
    allow_long_max_model_len: bool = False  # max_model_len past the model's positions: a warning, not a refusal
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_ttl_s: float | None = None  # cached blocks unused this long are never reused
    gpu_memory_utilization: float = 0.9  # fraction of the GPU's memory the engine may fill (weights, activations, KV)
    enforce_eager: bool = False  # True: no CUDA graphs at all
    # steps that are not pure decode (prefill chunks, with or without decodes) of up to this many tokens
    # replay CUDA graphs too (engine.mixed_graphs); 0: they run eagerly. Larger steps always run eagerly.
    max_cudagraph_tokens: int = 512
    # steady decode steps launched while the previous one runs (engine.async_scheduling); False: every step waits.
    # None: on CUDA only (on the CPU a forward runs as it is launched: nothing would overlap, and each output
    # would reach its stream one step late)
    async_scheduling: bool | None = None
    num_kv_blocks: int | None = None
    seed: int = 0
    load_format: str = "auto"  # "dummy": random weights of the checkpoint's shapes (benchmarks)
    tensor_parallel_size: int = 1  # ranks (GPUs) the model is split across; > 1 spawns ranks 1.. as processes
    # special-token text inside chat message contents parsed as control tokens (vLLM's way);
    # False: encoded as plain text, so a message cannot forge a turn
    allow_special_tokens_in_content: bool = False
    max_logprobs: int = 20  # the most logprobs / prompt_logprobs a request may ask for (vLLM's default)
    # Testing only, off by default (engine/faults.py): {"oom_at_step": N, "oom_request_id": "id"}
    # raises torch.OutOfMemoryError in the first step >= N holding that request (and for it alone
    # when retried); nan_* (nan_value "nan" | "inf" | "-inf") poisons its logits row, detokenize_error_*
    # raises while it detokenizes, dead_* is an unrecoverable device error, load_error_after_tensors
    # an I/O error while the weights load.
    fault_injection: dict | None = None
    # speculative decoding (vLLM's dict, engine.spec_decode.config): {"method": "ngram",
    # "num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": m, ...}; None: off
    speculative_config: dict | None = None
    # LoRA adapters (engine.lora, vLLM's names): requests name one with a LoRARequest; max_loras adapters sit
    # in device slots at once (a request of another waits for a slot), of rank up to max_lora_rank;
    # max_cpu_loras loaded adapters are kept on the host (None: max_loras)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise InvalidInputError("model must be a path or a hub id", field="model")
        if self.block_size not in (8, 16, 32):
            raise InvalidInputError(f"block_size must be 8, 16 or 32, got {self.block_size}", field="block_size")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise InvalidInputError(f"dtype {self.dtype!r} is not auto, float32, float16 or bfloat16", field="dtype")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InvalidInputError("gpu_memory_utilization must be in (0, 1]", field="gpu_memory_utilization")
        if self.max_num_seqs < 1:
            raise InvalidInputError("max_num_seqs must be >= 1", field="max_num_seqs")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise InvalidInputError("max_num_batched_tokens must be >= 1", field="max_num_batched_tokens")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise InvalidInputError("num_kv_blocks must be >= 1", field="num_kv_blocks")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidInputError("max_model_len must be >= 2", field="max_model_len")
        if not isinstance(self.max_logprobs, int) or isinstance(self.max_logprobs, bool) or not (
                0 <= self.max_logprobs <= 1024):
            raise InvalidInputError("max_logprobs must be an integer in [0, 1024]", field="max_logprobs")
        if self.prefix_cache_ttl_s is not None and not self.prefix_cache_ttl_s > 0:
            raise InvalidInputError("prefix_cache_ttl_s must be > 0", field="prefix_cache_ttl_s")
        tps = self.tensor_parallel_size
        if not isinstance(tps, int) or isinstance(tps, bool) or tps < 1:
            raise InvalidInputError(f"tensor_parallel_size must be an integer >= 1, got {tps!r}",
                                    field="tensor_parallel_size")
        if not isinstance(self.enforce_eager, bool):
            raise InvalidInputError("enforce_eager must be true or false", field="enforce_eager")
        mct = self.max_cudagraph_tokens
        if not isinstance(mct, int) or isinstance(mct, bool) or not 0 <= mct <= 8192:
            raise InvalidInputError(f"max_cudagraph_tokens must be an integer in [0, 8192], got {mct!r}",
                                    field="max_cudagraph_tokens")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise InvalidInputError("async_scheduling must be true, false or unset", field="async_scheduling")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidInputError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                                    f"{', '.join(KV_CACHE_DTYPES)}", field="kv_cache_dtype")
        if self.load_format not in ("auto", "dummy"):
            raise InvalidInputError(f"load_format {self.load_format!r} is not auto or dummy", field="load_format")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise InvalidInputError(f"quantization {self.quantization!r} is not supported ({', '.join(QUANTIZATIONS)})",
                                    field="quantization")
        faults.validate(self.fault_injection)
        self._check_lora()
        SpeculativeConfig.from_value(self.speculative_config)  # raises naming the field

    def _check_lora(self) -> None:
        if not isinstance(self.enable_lora, bool):
            raise InvalidInputError("enable_lora must be true or false", field="enable_lora")
        for name, low, high in (("max_loras", 1, 256), ("max_lora_rank", 1, 512), ("max_cpu_loras", 1, 4096)):
            value = getattr(self, name)
            if value is None and name == "max_cpu_loras":
                continue
            if not is_int(value) or not low <= value <= high:
                raise InvalidInputError(f"{name} must be an integer in [{low}, {high}], got {value!r}", field=name)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidInputError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                                    f"({self.max_loras})", field="max_cpu_loras")
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise InvalidInputError("LoRA adapters do not run under tensor parallelism yet: set "
                                    "tensor_parallel_size=1 or enable_lora=false", field="enable_lora")
