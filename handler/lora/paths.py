"""Where an adapter of LORA_MODULES is, found the way MODEL_NAME is (handler.model_roots,
handler.cached_model, the engine's hub download): a local folder (within ALLOWED_MODEL_ROOTS),
a hub id already in a Hugging Face hub cache (RunPod's cached models, the network volume under
BASE_PATH, HF_HOME: no hub call), else a hub id downloaded into the Hugging Face cache as the
base model is (HF_TOKEN, HF_HUB_OFFLINE honoured). Failures are LoRAErrors naming the adapter."""
from __future__ import annotations

import logging
import os
from typing import Any

from engine.errors import LoRAError
from handler.lora.modules import LoRAModule

log = logging.getLogger("handler")


def _fail(module: LoRAModule, reason: str, message: str) -> LoRAError:
    return LoRAError(f"LoRA adapter {module.name!r} ({module.path}): {message}", adapter=module.name, reason=reason)


def _local_folder(module: LoRAModule, settings: Any) -> str:
    from engine.errors import ModelLoadError

    from handler.model_roots import check_model_path

    try:
        check_model_path(module.path, settings)  # ALLOWED_MODEL_ROOTS, before any file of it is read
    except ModelLoadError as exc:
        raise _fail(module, "not_allowed", exc.message) from None
    if not os.path.isdir(module.path):
        raise _fail(module, "missing_file", "no such folder")
    return module.path


def adapter_folder(module: LoRAModule, settings: Any) -> str:
    """The folder the adapter loads from (blocking: a hub id not in any cache downloads).
    LoRAError reasons: not_allowed (outside ALLOWED_MODEL_ROOTS), missing_file (no such folder),
    fetch_failed (not on the hub, no access, offline)."""
    from handler.cached_model import find_in_hub_caches, is_hub_id

    if not is_hub_id(module.path):
        return _local_folder(module, settings)
    from engine.errors import ModelLoadError

    label = f"LoRA adapter {module.name!r} ({module.path})"
    try:
        cached = find_in_hub_caches(settings, module.path, None, label)
    except ModelLoadError as exc:  # its snapshot in the cache is incomplete
        raise LoRAError(exc.message, adapter=module.name, reason="missing_file") from None
    if cached is not None:
        log.info("%s: loading the cached adapter in %s, snapshot %s (%s), offline", label, cached.repo_folder,
                 os.path.basename(cached.snapshot), cached.chosen_by)
        return cached.snapshot
    from engine.model.loader import resolve_model_path  # the base model's own download

    log.info("%s: in no hub cache; downloading it from the hub", label)
    try:
        return resolve_model_path(module.path)
    except ModelLoadError as exc:
        raise _fail(module, "fetch_failed", f"not a folder here, and {exc.message}") from None
