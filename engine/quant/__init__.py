"""Quantization methods, one object per method (engine.quant.base.QuantMethod), and
the table that picks one from a checkpoint's quantization_config, checked against
the `quantization=` name asked for (vLLM's names, engine.quant.names.QUANTIZATIONS)."""
from __future__ import annotations

from engine.errors import UnsupportedModelError
from engine.quant.awq import AWQ
from engine.quant.base import LinearMethod, QuantMethod
from engine.quant.compressed_tensors import CompressedTensors
from engine.quant.fp8 import FP8Method
from engine.quant.gptq import GPTQ
from engine.quant.names import QUANTIZATIONS

METHODS: dict[str, type[QuantMethod]] = {m.name: m for m in (AWQ, GPTQ, CompressedTensors, FP8Method)}

__all__ = ["AWQ", "GPTQ", "METHODS", "QUANTIZATIONS", "CompressedTensors", "FP8Method", "LinearMethod", "QuantMethod",
           "quant_from_config"]


def quant_from_config(hf_config, asked: str | None = None) -> QuantMethod | None:
    """The checkpoint's quantization method (None: dense), checked against the one
    asked for (None: whatever the checkpoint has; "none": dense only; awq_marlin and
    gptq_marlin are vLLM's kernel choices for awq and gptq checkpoints: ours run the same
    kernels either way). UnsupportedModelError, naming the field, before any weight is read."""
    q = getattr(hf_config, "quantization_config", None)
    method = None
    if q:
        q = q if isinstance(q, dict) else q.to_dict()
        name = str(q.get("quant_method", "")).lower()
        if name not in METHODS:
            raise UnsupportedModelError(f"quantization method {name!r} (quantization_config.quant_method) is not "
                                        f"supported "
                                        f"({', '.join(sorted(METHODS))})")
        method = METHODS[name].from_config(q)
    if asked is None:
        return method
    if asked not in QUANTIZATIONS:
        raise UnsupportedModelError(f"QUANTIZATION={asked}: not a supported quantization "
                                    f"({', '.join(QUANTIZATIONS)})")
    want = QUANTIZATIONS[asked]
    have = method.name if method is not None else None
    if want != have:
        found = f"is {have}-quantized (quantization_config.quant_method {have!r})" if have else "is not quantized"
        hint = "" if have else "; quantizing at load time is not supported"
        raise UnsupportedModelError(f"QUANTIZATION={asked} (quantization={asked!r}) asked, but the checkpoint "
                                    f"{found}{hint}")
    return method
