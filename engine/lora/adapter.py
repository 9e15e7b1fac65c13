"""A PEFT LoRA adapter read from its folder (adapter_config.json, adapter_model.safetensors or
.bin) and checked against the model: every tensor placed on one of the model's linears, its
rank within max_lora_rank, its values finite. The result holds CPU tensors, the scaling
(lora_alpha / r, or / sqrt(r) for rsLoRA) folded into B."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch

from engine.errors import LoRAError
from engine.lora.request import LoRARequest
from engine.lora.targets import LoRATargets

CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.(lora_A|lora_B)(?:\.[\w-]+)?\.weight$")


@dataclass(slots=True)
class LoRAAdapter:
    """An adapter's low-rank pairs by target: (our linear's name, shard) -> (A [r, K], B*scaling [N, r])."""

    request: LoRARequest
    rank: int  # the largest rank of its pairs
    pairs: dict[tuple[str, object], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _fail(request: LoRARequest, reason: str, message: str) -> LoRAError:
    return LoRAError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {message}",
                     adapter=request.lora_name, reason=reason)


def read_config(request: LoRARequest) -> dict:
    path = os.path.join(request.lora_path, CONFIG)
    if not os.path.isfile(path):
        raise _fail(request, "missing_file", f"no {CONFIG} in the folder")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise _fail(request, "bad_config", f"{CONFIG} is not readable JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _fail(request, "bad_config", f"{CONFIG} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise _fail(request, "unsupported", f"peft_type {kind!r} is not LORA")
    for key, bad, what in (("use_dora", True, "DoRA"), ("fan_in_fan_out", True, "fan_in_fan_out (Conv1D) layers")):
        if config.get(key) == bad:
            raise _fail(request, "unsupported", f"{what} is not supported ({key}: {bad})")
    if config.get("bias", "none") != "none":
        raise _fail(request, "unsupported", f"trained biases (bias: {config['bias']!r}) are not supported")
    if config.get("modules_to_save"):
        raise _fail(request, "unsupported", f"modules_to_save {config['modules_to_save']} (fully trained "
                    "modules such as lm_head or embed_tokens) are not supported")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _fail(request, "bad_config", f"{key} must be a positive number, got {value!r}")
    return config


def read_tensors(request: LoRARequest) -> dict[str, torch.Tensor]:
    for name in WEIGHTS:
        path = os.path.join(request.lora_path, name)
        if not os.path.isfile(path):
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(path, device="cpu")
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a corrupt file: the adapter's error, named
            raise _fail(request, "bad_weights", f"{name} could not be read: {exc}") from None
    raise _fail(request, "missing_file", f"no {' or '.join(WEIGHTS)} in the folder")


def _pattern(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern: the value of the first key that ends the module's name."""
    for key, value in (patterns or {}).items():
        if re.fullmatch(rf"(?:.*\.)?{key}", module):
            return value
    return default


def load_adapter(request: LoRARequest, targets: LoRATargets, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """Read and check an adapter against the model's targets; LoRAError naming what is wrong."""
    config = read_config(request)
    tensors = read_tensors(request)
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise _fail(request, "unsupported", f"tensor {key!r} is not a LoRA A or B weight (embedding "
                        "adapters, DoRA magnitudes and trained modules are not supported)")
        found.setdefault(m.group(1), {})[m.group(2)] = tensor
    if not found:
        raise _fail(request, "bad_weights", "the weights file holds no LoRA tensors")
    adapter = LoRAAdapter(request, rank=0)
    for module, pair in sorted(found.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            raise _fail(request, "bad_weights", f"{module} has {sorted(pair)} but needs lora_A and lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        target = targets.find(module)
        if target is None:
            raise _fail(request, "unknown_module", f"target module {module} is not a linear of this model that "
                        f"adapters can change ({targets.describe()})")
        rank = a.shape[0]
        if rank > max_rank:
            raise _fail(request, "rank_too_large", f"{module} has rank {rank}, above max_lora_rank={max_rank}")
        in_features, out_features = targets.shape(target)
        if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (rank, in_features) or tuple(b.shape) != (out_features, rank):
            raise _fail(request, "shape", f"{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit "
                        f"a linear of {in_features} inputs and {out_features} outputs (another base model?)")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise _fail(request, "non_finite", f"{module} holds NaN or infinite weights")
        r = _pattern(config.get("rank_pattern"), module, config["r"])
        alpha = _pattern(config.get("alpha_pattern"), module, config["lora_alpha"])
        scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        adapter.pairs[target] = (a.to(dtype), (b.float() * scaling).to(dtype))
        adapter.rank = max(adapter.rank, rank)
    return adapter
