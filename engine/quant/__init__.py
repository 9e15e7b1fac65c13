"""Quantization methods, one object per method (engine.quant.base.QuantMethod), and
the table that picks one from a checkpoint's quantization_config."""
from __future__ import annotations

from engine.errors import UnsupportedModelError
from engine.quant.awq import AWQ
from engine.quant.base import LinearMethod, QuantMethod

METHODS: dict[str, type[QuantMethod]] = {m.name: m for m in (AWQ,)}

__all__ = ["AWQ", "METHODS", "LinearMethod", "QuantMethod", "quant_from_config"]


def quant_from_config(hf_config, asked: str | None = None) -> QuantMethod | None:
    """The checkpoint's quantization method (None: dense), checked against the one
    asked for (None: whatever the checkpoint has; "none": dense only)."""
    q = getattr(hf_config, "quantization_config", None)
    method = None
    if q:
        q = q if isinstance(q, dict) else q.to_dict()
        name = str(q.get("quant_method", "")).lower()
        if name not in METHODS:
            raise UnsupportedModelError(f"quantization method {name!r} is not supported ({sorted(METHODS)})")
        method = METHODS[name].from_config(q)
    if asked not in (None, "none") and (method is None or method.name != asked):
        raise UnsupportedModelError(f"QUANTIZATION={asked} but the checkpoint has no {asked.upper()} quantization_config")
    if asked == "none" and method is not None:
        raise UnsupportedModelError(f"quantization 'none' asked, but the checkpoint is {method.name.upper()}-quantized")
    return method
