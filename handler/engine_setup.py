"""Engine construction from the settings: the EngineConfig, the settings check at start,
and the model to load (MODEL_NAME, or the embedded default model prepared on first use)."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("handler")

# EngineConfig field -> the variable that sets it (so a refusal names the variable)
ENGINE_FIELDS = {
    "model": "MODEL_NAME", "revision": "MODEL_REVISION", "dtype": "DTYPE", "quantization": "QUANTIZATION",
    "block_size": "BLOCK_SIZE", "max_model_len": "MAX_MODEL_LEN", "max_num_seqs": "MAX_NUM_SEQS",
    "max_num_batched_tokens": "MAX_NUM_BATCHED_TOKENS", "enable_prefix_caching": "ENABLE_PREFIX_CACHING",
    "gpu_memory_utilization": "GPU_MEMORY_UTILIZATION", "num_kv_blocks": "NUM_KV_BLOCKS", "seed": "SEED",
    "fault_injection": "FAULT_INJECTION", "tensor_parallel_size": "TENSOR_PARALLEL_SIZE",
    "enforce_eager": "ENFORCE_EAGER",
}


def engine_config(settings: Any, model: str):
    """The EngineConfig for these settings (raises engine InvalidInputError naming the field)."""
    from engine import EngineConfig

    ttl = {}
    if settings.prefix_cache_ttl_s:  # a field once the engine has one; until then in `extra`
        names = {f.name for f in dataclasses.fields(EngineConfig)}
        ttl = ({"prefix_cache_ttl_s": settings.prefix_cache_ttl_s} if "prefix_cache_ttl_s" in names
               else {"extra": {"prefix_cache_ttl_s": settings.prefix_cache_ttl_s}})
    return EngineConfig(
        model=model, revision=settings.model_revision, dtype=settings.dtype, quantization=settings.quantization,
        block_size=settings.block_size, max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        gpu_memory_utilization=settings.gpu_memory_utilization, num_kv_blocks=settings.num_kv_blocks,
        seed=settings.seed, fault_injection=settings.fault_injection,
        tensor_parallel_size=settings.tensor_parallel_size, enforce_eager=settings.enforce_eager, **ttl,
    )


def check_engine_settings(settings: Any) -> None:
    """Let the engine judge the settings at start; raises SettingsError naming the variable."""
    from engine.errors import InvalidInputError

    from handler.settings import SettingsError

    try:
        config = engine_config(settings, settings.model_name or "default-model")
    except InvalidInputError as exc:
        name = ENGINE_FIELDS.get(exc.field or "", exc.field or "settings")
        raise SettingsError(name, str(getattr(settings, name.lower(), "")), exc.message) from None
    if "prefix_cache_ttl_s" in getattr(config, "extra", {}):
        log.warning("PREFIX_CACHE_TTL_S is set but this engine has no prefix-cache expiry yet; it is not applied")


def default_model_path(settings: Any, on_progress: Callable[[str], None] | None = None) -> str:
    from handler import default_model  # the embedded model's preparation: imported only when needed

    return default_model.ensure_default_model(base_path=settings.base_path, on_progress=on_progress)


def build_engine(settings: Any, on_progress: Callable[[str], None] | None = None):
    """Resolve the model (preparing the default one if none is named) and load it. Blocking;
    `on_progress` hears the default model's preparation steps."""
    from engine import AsyncLLMEngine

    from handler.model_roots import check_model_path

    model = settings.model_name or default_model_path(settings, on_progress)
    check_model_path(model, settings)  # ALLOWED_MODEL_ROOTS, before any file of it is read
    return AsyncLLMEngine.from_config(engine_config(settings, model))


def summary_defaults(settings: Any) -> dict:
    """Sampling of summarize jobs: the default model's tuned values when it is served."""
    from handler import summarize_core

    defaults = {**summarize_core.SUMMARY_SAMPLING, "max_tokens": summarize_core.SUMMARY_MAX_TOKENS}
    if not settings.model_name:
        try:
            from handler import default_model

            defaults.update(getattr(default_model, "SUMMARIZE_SAMPLING", {}))
        except ImportError:
            pass
    return defaults
