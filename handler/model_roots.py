"""ALLOWED_MODEL_ROOTS: the folders a local model may be loaded from (symlinks resolved), so a
mistyped or hostile MODEL_NAME cannot point the loader at the rest of the file system."""
from __future__ import annotations

import os
import tempfile
from typing import Any

ANYWHERE = "*"


def default_roots(settings: Any) -> list[str]:
    """Where models live when nobody says otherwise: the network volume, baked models, the
    Hugging Face and user caches (the default model), home, the working and the temp folder."""
    home = os.path.expanduser("~")
    roots = [settings.base_path, "/runpod-volume", "/models", os.environ.get("HF_HOME"),
             os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), home, os.getcwd(),
             tempfile.gettempdir()]
    try:
        from huggingface_hub import constants

        roots.append(constants.HF_HUB_CACHE)
    except ImportError:
        pass
    return [r for r in roots if r and os.path.realpath(r) != os.path.sep]


def allowed_roots(settings: Any) -> list[str] | None:
    """The roots in force, resolved; None: anywhere."""
    raw = getattr(settings, "allowed_model_roots", None)
    if raw is not None and raw.strip() == ANYWHERE:
        return None
    roots = [r.strip() for r in raw.split(":") if r.strip()] if raw else default_roots(settings)
    return list(dict.fromkeys(os.path.realpath(os.path.expanduser(r)) for r in roots))


def is_local_path(model: str) -> bool:
    """What the loader reads as a folder rather than a hub id."""
    return os.path.isabs(model) or model.startswith(".") or os.path.exists(model)


def check_model_path(model: str, settings: Any) -> None:
    """Raise ModelLoadError (model_load_failed) when a local model folder lies outside the allowed roots."""
    from engine.errors import ModelLoadError

    if not is_local_path(model):
        return
    roots = allowed_roots(settings)
    if roots is None:
        return
    real = os.path.realpath(model)
    if not any(real == r or real.startswith(r.rstrip(os.path.sep) + os.path.sep) for r in roots):
        where = f" (resolved to {real!r})" if real != model else ""
        raise ModelLoadError(f"model path {model!r}{where} is outside ALLOWED_MODEL_ROOTS ({':'.join(roots)}); "
                             "add its folder to ALLOWED_MODEL_ROOTS to load it")
