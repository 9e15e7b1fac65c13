"""Names: the quantization methods `quantization=` accepts (vLLM's), and matching our
linears' names against a checkpoint's lists of module names (our merged linears,
qkv_proj and gate_up_proj, stand for the checkpoint's projections)."""
from __future__ import annotations

import re
from typing import Callable

from engine.errors import UnsupportedModelError

# vLLM's quantization= name -> the quant_method of the checkpoint it runs (None: dense only)
QUANTIZATIONS = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
                 "compressed-tensors": "compressed-tensors", "fp8": "fp8", "none": None, "None": None}
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def listed(prefix: str, match: Callable[[str], bool]) -> bool:
    """Whether the linear `prefix` (our name) is matched: its own name, or every
    checkpoint projection it merges; UnsupportedModelError when only some are."""
    if match(prefix):
        return True
    parent, _, leaf = prefix.rpartition(".")
    parts = [f"{parent}.{p}" if parent else p for p in MERGED.get(leaf, ())]
    hits = [match(p) for p in parts]
    if any(hits) and not all(hits):
        raise UnsupportedModelError(f"{prefix} merges {', '.join(parts)}, of which only some are quantized")
    return bool(parts) and all(hits)


def name_matcher(patterns) -> Callable[[str], bool]:
    """compressed-tensors' rule for `ignore` / `targets` entries naming modules: an
    exact name, or "re:" and a regex that must match the whole name (re.match)."""
    exact = {p for p in patterns if not p.startswith("re:")}
    regexes = [re.compile(p[3:]) for p in patterns if p.startswith("re:")]
    return lambda name: name in exact or any(r.match(name) for r in regexes)
