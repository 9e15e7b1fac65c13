"""The adapters this worker serves, loaded and checked right after the engine loads (in the same
load, so a bad adapter stops the worker at start, named, as a model that cannot load does): each
one's folder found (handler.lora.paths), read and checked against the model by the engine
(AsyncLLMEngine.load_lora: PEFT format, targets, shapes, rank within MAX_LORA_RANK, finite
values), and kept as the LoRARequest its jobs run with."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from handler.errors import JobError

log = logging.getLogger("handler")


class ServedAdapters:
    """LORA_MODULES' adapters by name: `wrap` an engine factory so that they load with the engine;
    `request(name)` is the LoRARequest a job of that adapter runs with."""

    def __init__(self, settings: Any):
        self.settings = settings
        self.modules = tuple(getattr(settings, "lora_modules", None) or ())
        self._requests: dict = {}  # name -> engine.LoRARequest, once loaded

    def __bool__(self) -> bool:
        return bool(self.modules)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.modules]

    def wrap(self, factory: Callable) -> Callable:
        """`factory(settings, on_progress)` that also loads the adapters into the engine it made."""
        if not self.modules:
            return factory

        def build(settings, on_progress):
            engine = factory(settings, on_progress)
            self.load(engine, on_progress)
            return engine

        return build

    def load(self, engine, on_progress: Callable[[str], None] | None = None) -> None:
        """Find, read and check every adapter, in order (blocking). Raises the first failure: a
        LoRAError naming the adapter (`adapter`) and why (`reason`)."""
        from engine import LoRARequest

        from handler.lora.paths import adapter_folder

        for m in self.modules:
            if on_progress is not None:
                on_progress(f"loading LoRA adapter {m.name}")
            request = LoRARequest(m.name, m.lora_int_id, adapter_folder(m, self.settings), m.base_model_name)
            engine.load_lora(request)
            self._requests[m.name] = request
            log.info("LoRA adapter %s (lora_int_id %d) checked: %s", m.name, m.lora_int_id, request.lora_path)

    def request(self, name: str | None):
        """The LoRARequest of a loaded adapter; None for the base model."""
        if name is None:
            return None
        request = self._requests.get(name)
        if request is None:  # the names were checked with the job's input; the engine loads them all first
            raise JobError("internal_error", f"the LoRA adapter {name!r} is not loaded")
        return request

    def model_cards(self, base: str) -> list[tuple[str, str, str]]:
        """(id, root, parent) of each adapter for /v1/models, as vLLM lists them: its name, its path
        as LORA_MODULES gives it, and the base model it was trained on (else the served one)."""
        return [(m.name, m.path, m.base_model_name or base) for m in self.modules]


def start_failure_exit(cause: Any) -> int:
    """An adapter that failed at start (`cause`: its LoRAError): log it, naming LORA_MODULES, the
    adapter and the reason, and return the worker's exit status: 1 when it could not be fetched
    (the hub, the network: another start may get it), 2 for an adapter this worker cannot serve
    (as a bad setting)."""
    details = getattr(cause, "details", None) or {}
    reason = details.get("reason", "unknown")
    if reason == "fetch_failed":
        log.error("LORA_MODULES: the LoRA adapter %r could not be fetched (%s): %s; taking no job",
                  details.get("adapter"), reason, cause.message)
        return 1
    log.error("invalid setting: LORA_MODULES: the LoRA adapter %r cannot be served (%s): %s; taking no job",
              details.get("adapter"), reason, cause.message)
    return 2
