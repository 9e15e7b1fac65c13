"""The worker's engine: its EngineConfig from the settings (checked at start),
the model to load (MODEL_NAME, or the embedded default model prepared on first
use), and the one lazy load that the jobs arriving during it share."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from handler.errors import JobError
from handler.prepare.default_model import DEFAULT_MODEL_NAME

log = logging.getLogger("handler")

# EngineConfig field -> the variable that sets it: the config is built from this table, and a
# refusal names the variable
ENGINE_FIELDS = {
    "model": "MODEL_NAME", "revision": "MODEL_REVISION", "dtype": "DTYPE", "quantization": "QUANTIZATION",
    "block_size": "BLOCK_SIZE", "max_model_len": "MAX_MODEL_LEN",
    "allow_long_max_model_len": "ALLOW_LONG_MAX_MODEL_LEN", "max_num_seqs": "MAX_NUM_SEQS",
    "max_num_batched_tokens": "MAX_NUM_BATCHED_TOKENS", "enable_prefix_caching": "ENABLE_PREFIX_CACHING",
    "gpu_memory_utilization": "GPU_MEMORY_UTILIZATION", "num_kv_blocks": "NUM_KV_BLOCKS", "seed": "SEED",
    "fault_injection": "FAULT_INJECTION", "tensor_parallel_size": "TENSOR_PARALLEL_SIZE",
    "enforce_eager": "ENFORCE_EAGER", "async_scheduling": "ASYNC_SCHEDULING",
    "max_cudagraph_tokens": "MAX_CUDAGRAPH_TOKENS", "prefix_cache_ttl_s": "PREFIX_CACHE_TTL_S", "max_logprobs": "MAX_LOGPROBS",
    "allow_special_tokens_in_content": "ALLOW_SPECIAL_TOKENS_IN_CONTENT", "kv_cache_dtype": "KV_CACHE_DTYPE",
    "tokenizer": "TOKENIZER_NAME", "tokenizer_revision": "TOKENIZER_REVISION", "chat_template": "CUSTOM_CHAT_TEMPLATE",
    "speculative_config": "SPECULATIVE_CONFIG", "enable_lora": "ENABLE_LORA", "max_loras": "MAX_LORAS",
    "max_lora_rank": "MAX_LORA_RANK", "max_cpu_loras": "MAX_CPU_LORAS",
}


def serves_default_model(settings: Any) -> bool:
    """No MODEL_NAME: the worker serves the embedded default model (handler.prepare.default_model)."""
    return not settings.model_name


def model_name(settings: Any) -> str:
    """MODEL_NAME, or the embedded default model's name."""
    return DEFAULT_MODEL_NAME if serves_default_model(settings) else settings.model_name


# the engine's speculation when only summarize jobs use it: requests opt in (handler.summarize.job)
SUMMARIZE_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "opt_in": True}
# drafts a step on a CPU in bfloat16, where 4-bit models take torch's int4 kernel, which runs rows
# in blocks of 4: the default model's linears took 1.6x a decode step's time for a verify step of
# 4 rows, 2.9x for 5. Summaries of the notes decoded 1.42x as fast as without speculation with 3
# drafts against 1.20x with 4, the report 1.31x against 1.36x (benchmarks/spec_decode.py, S1).
CPU_BF16_SUMMARIZE_DRAFTS = 3


def speculative_config(settings: Any) -> dict | None:
    """SPECULATIVE_CONFIG for every job; unset, n-gram drafts for the summarize jobs that ask."""
    config = getattr(settings, "speculative_config", None)
    if config is not None:
        return config
    if not getattr(settings, "summarize_speculation", False):
        return None
    return {**SUMMARIZE_NGRAM, "num_speculative_tokens": summarize_drafts(getattr(settings, "dtype", "auto"))}


def summarize_drafts(dtype: str) -> int:
    """The summarize jobs' drafts a step for the engine's device and DTYPE."""
    import torch

    from engine.llm_engine import resolve_device, resolve_dtype

    device = resolve_device("auto")
    cpu_bf16 = device == "cpu" and resolve_dtype(dtype or "auto", device) == torch.bfloat16
    return CPU_BF16_SUMMARIZE_DRAFTS if cpu_bf16 else SUMMARIZE_NGRAM["num_speculative_tokens"]


def engine_config(settings: Any, model: str, revision_in_path: bool = False):
    """The EngineConfig for these settings, `model` the folder or hub id to load, served under
    MODEL_NAME (or the default model's name); `revision_in_path`: `model` is already
    MODEL_REVISION's snapshot (raises engine InvalidInputError naming the field)."""
    from engine import EngineConfig

    from handler.lora.modules import lora_enabled

    values = {name: getattr(settings, variable.lower()) for name, variable in ENGINE_FIELDS.items()}
    values["model"] = model
    values["speculative_config"] = speculative_config(settings)
    values["enable_lora"] = lora_enabled(settings)  # unset ENABLE_LORA: on with LORA_MODULES
    values["served_model_name"] = model_name(settings)
    if revision_in_path:
        values["revision"] = None
    values["prefix_cache_ttl_s"] = values["prefix_cache_ttl_s"] or None  # 0: cached blocks never expire
    if values["chat_template"] is None and serves_default_model(settings):  # its tool-aware template
        from handler.prepare.default_model import chat_template

        values["chat_template"] = chat_template()
    return EngineConfig(**values)


def check_engine_settings(settings: Any) -> None:
    """Let the engine judge the settings at start; raises SettingsError naming the variable."""
    from engine.errors import InvalidInputError

    from handler.lora.modules import check_lora_settings
    from handler.settings import SettingsError
    from handler.start_checks import check_chat_template

    check_chat_template(settings)
    check_lora_settings(settings, base_names(settings))
    try:
        engine_config(settings, model_name(settings))
    except InvalidInputError as exc:
        name = ENGINE_FIELDS.get((exc.field or "").split(".")[0], exc.field or "settings")  # speculative_config.x
        message = exc.message
        if name == "ENABLE_LORA":  # LoRA under tensor parallelism, in the variables' words
            message = message.replace("tensor_parallel_size=1 or enable_lora=false", "TENSOR_PARALLEL_SIZE=1, or "
                                      "leave LoRA off (ENABLE_LORA and LORA_MODULES unset)")
            name = "LORA_MODULES" if settings.enable_lora is None else name  # on because LORA_MODULES names some
        raw = getattr(settings, name.lower(), "")
        raw = " ".join(f"{m.name}={m.path}" for m in raw) if name == "LORA_MODULES" else \
            str(raw).lower() if isinstance(raw, bool) else str(raw)
        raise SettingsError(name, raw, message) from None


def base_names(settings: Any) -> set[str]:
    """The names a job's `model` picks the base model by: the served name and MODEL_NAME (or the
    default model's name)."""
    return {model_label(settings), model_name(settings)}


def model_label(settings: Any) -> str:
    """The model's name as the OpenAI routes report it."""
    return settings.openai_served_model_name_override or model_name(settings)


def default_model_path(settings: Any, on_progress: Callable[[str], None] | None = None) -> str:
    from handler.prepare import default_model  # the embedded model's preparation: imported only when needed

    return default_model.ensure_default_model(base_path=settings.base_path, on_progress=on_progress)


def build_engine(settings: Any, on_progress: Callable[[str], None] | None = None):
    """Resolve the model (preparing the default one if none is named; a hub id already in a hub
    cache loads from there, offline) and load it. Blocking; `on_progress` hears the default
    model's preparation steps."""
    from engine import AsyncLLMEngine

    from handler.cached_model import find_cached_model
    from handler.model_roots import check_model_path
    from handler.start_checks import check_cached_snapshot

    model = default_model_path(settings, on_progress) if serves_default_model(settings) else settings.model_name
    check_model_path(model, settings)  # ALLOWED_MODEL_ROOTS, before any file of it is read
    cached = None if serves_default_model(settings) else find_cached_model(settings)
    if cached is None:  # the default model, a local folder, or a hub id to download
        return AsyncLLMEngine.from_config(engine_config(settings, model))
    check_cached_snapshot(settings.model_name, cached.snapshot)
    log.info("MODEL_NAME=%s: loading the cached model in %s, snapshot %s (%s), offline", settings.model_name,
             cached.repo_folder, os.path.basename(cached.snapshot), cached.chosen_by)
    return AsyncLLMEngine.from_config(engine_config(settings, cached.snapshot, revision_in_path=True))


class EngineLoader:
    """The engine, built on the first job's demand in a thread (`factory(settings,
    on_stage)`); jobs arriving during the load wait for the same one, with progress
    updates. A failed load fails every job `model_load_failed` (retryable) and calls
    `on_failure`. With MODEL_NAME the worker loads before taking jobs instead (`load_now`)."""

    def __init__(self, settings: Any, factory: Callable, metrics, *, progress: Callable | None = None,
                 on_failure: Callable[[str], None] = lambda why: None):
        self.settings, self.metrics = settings, metrics
        self.engine = None
        self._factory, self._progress, self._on_failure = factory, progress, on_failure
        self._task: asyncio.Task | None = None
        self._error: JobError | None = None
        self._stage: str | None = None
        self._summary_task: asyncio.Task | None = None

    async def get(self, ctx):
        """The engine, loading it if needed (within the job's deadline)."""
        if self.engine is not None:
            self.start_summary()
            return self.engine
        if self._error is not None:
            raise JobError(self._error.code, self._error.message, retryable=self._error.retryable)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._load())
        task, t0 = self._task, time.monotonic()
        while not task.done():
            now = time.monotonic()
            if ctx.deadline is not None and now >= ctx.deadline:
                raise JobError("timeout", f"the job's deadline of {ctx.spec.timeout_s:g}s passed while the model "
                               "was loading", timeout_s=ctx.spec.timeout_s)
            payload = {"status": "loading model", "waited_s": round(now - t0, 1)}
            if self._stage:
                payload["stage"] = self._stage
            self._send_progress(ctx, payload)
            wait = self.settings.load_progress_interval_s
            if ctx.deadline is not None:
                wait = min(wait, ctx.deadline - now)
            await asyncio.wait({task}, timeout=wait)
        ctx.waited_for_load = time.monotonic() - t0
        if task.exception() is not None:
            err = JobError.from_exception(task.exception())
            raise JobError(err.code, err.message, retryable=err.retryable)
        return task.result()

    def load_in_background(self) -> asyncio.Task:
        """Start the load on the running event loop now, not on the first job's demand (a
        load-balancing worker); jobs arriving meanwhile wait for the same load. The task's result
        is the engine, or it raises the load's JobError (model_load_failed), its cause chained."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._load())
        return self._task

    @property
    def failed(self) -> bool:
        """The load failed (every job fails model_load_failed)."""
        return self._error is not None

    def load_now(self) -> None:
        """Load before any job (a worker with MODEL_NAME: a model that cannot serve is found at
        start, not by the jobs). Blocking; raises the load's JobError (model_load_failed), its
        cause chained."""
        t0 = time.monotonic()
        log.info("loading the model (%s) before taking jobs", model_name(self.settings))
        try:
            engine = self._factory(self.settings, lambda message: None)
        except Exception as exc:  # noqa: BLE001 - every load failure becomes model_load_failed
            raise self._failed(exc)[0] from exc
        self._ready(engine, t0)

    async def _load(self):
        t0 = time.monotonic()
        log.info("loading the model (%s)", model_name(self.settings))

        def stage(message: str) -> None:  # called from the loading thread
            self._stage = message

        try:
            engine = await asyncio.to_thread(self._factory, self.settings, stage)
        except Exception as exc:  # noqa: BLE001 - every load failure becomes model_load_failed
            error, expected = self._failed(exc)
            log.error("model load failed: %s", error.message, exc_info=not expected)
            self._on_failure("the model could not be loaded")
            raise error from exc
        return self._ready(engine, t0)

    def _failed(self, exc: Exception) -> tuple[JobError, bool]:
        """The load's failure as the jobs see it: model_load_failed, retryable (this worker asks
        to be replaced; another may load); and whether it was one of the engine's own refusals."""
        err = JobError.from_exception(exc)
        expected = err.code in ("model_load_failed", "invalid_input")
        message = err.message if expected else f"{type(exc).__name__}: {exc}"
        self._error = JobError("model_load_failed", message, retryable=True)
        return self._error, expected

    def _ready(self, engine, t0: float):
        self.engine = engine
        seconds = time.monotonic() - t0
        self.metrics.load_seconds.set(seconds)
        self.metrics.bind_engine(engine.stats)
        stats = engine.stats()
        log.info("engine ready in %.1fs: %s, max_model_len %d, %d KV blocks of %d tokens (%d tokens)",
                 seconds, engine.model_name, engine.max_model_len, stats["kv_blocks_total"],
                 stats["kv_block_size"], engine.kv_capacity_tokens)
        self.start_summary()
        return engine

    def start_summary(self) -> None:
        """The periodic metrics summary line, once an event loop runs (METRICS_LOG_INTERVAL_S)."""
        interval = self.settings.metrics_log_interval_s
        if self._summary_task is not None or not interval:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # loaded before the SDK's loop: the first job starts it
            return
        self._summary_task = loop.create_task(self.metrics.log_every(interval))

    def _send_progress(self, ctx, payload: dict) -> None:
        waited = payload.get("waited_s", 0)
        ctx.log.log(logging.INFO if not waited else logging.DEBUG, "waiting for the model load (%.0fs)", waited)
        if self._progress is not None:
            try:
                self._progress(ctx.job, payload)
            except Exception:  # noqa: BLE001 - a lost progress update must not fail the job
                ctx.log.warning("progress update failed", exc_info=True)

    async def aclose(self) -> None:
        """Stop the background tasks (the summary logger, the engine's loop)."""
        if self._summary_task is not None:
            self._summary_task.cancel()
            self._summary_task = None
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            await self.engine.shutdown()


def load_failure_exit(settings: Any, exc: Any) -> int:
    """A model that could not load at start (`exc`: the load's JobError, its cause chained): log
    why, naming the setting, and return the worker's exit status: 2 for a setting the model
    refuses (as any bad setting), 1 for the load itself."""
    cause = exc.__cause__
    adapter = (getattr(cause, "details", None) or {}).get("adapter")
    if adapter is not None:  # an adapter of LORA_MODULES (handler.lora.served): named, with why
        from handler.lora.served import start_failure_exit

        return start_failure_exit(cause)
    variable = ENGINE_FIELDS.get(getattr(cause, "field", None) or "")
    if variable:  # a setting the model refuses (MAX_MODEL_LEN past its positions)
        message = cause.message.replace("allow_long_max_model_len=True", "ALLOW_LONG_MAX_MODEL_LEN=true")
        log.error("invalid setting: %s=%r: %s", variable, getattr(settings, variable.lower()), message)
        return 2
    log.error("the model could not be loaded (MODEL_NAME=%s): %s; taking no job", settings.model_name, exc.message)
    return 1
