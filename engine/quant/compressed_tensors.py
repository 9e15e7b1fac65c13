"""compressed-tensors checkpoints (llm-compressor): "pack-quantized" int4 / int8
weight-only (W4A16 repacked into AWQ's layout for the AWQ kernels, W8A16
dequantized at load) and "float-quantized" FP8 weights with dynamic per-token FP8
activations (W8A8, engine.quant.fp8's layer). llm_kernels.w4a16.ct_format describes the layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.quant.base import QuantMethod
from engine.quant.fp8 import FP8Scheme, apply_fp8, create_fp8, finalize_fp8, fp8_tensor_names, fp8_tp_dims, load_fp8
from engine.quant.names import listed, name_matcher
from engine.quant.repacked import apply_parts, dense_part, int4_parts
from llm_kernels.w4a16.ct_format import ct_dequantize, ct_int_view

INT_FORMATS = ("pack-quantized",)
FLOAT_FORMATS = ("float-quantized", "naive-quantized")


@dataclass(frozen=True, slots=True)
class CompressedTensors(QuantMethod):
    """One quantization scheme over every Linear except `ignore`. Integer weights:
    weight_packed, weight_scale, weight_shape (+ weight_zero_point when asymmetric,
    weight_g_idx with activation order "group"); FP8: weight and weight_scale."""

    bits: int
    group_size: int  # -1: per channel
    symmetric: bool = True
    g_idx: bool = False
    fp8: FP8Scheme | None = None
    ignore: tuple[str, ...] = ()

    name: ClassVar[str] = "compressed-tensors"

    @classmethod
    def from_config(cls, q: dict) -> CompressedTensors:
        return parse_config(cls, q)

    def covers(self, prefix: str) -> bool:
        return not listed(prefix, name_matcher(self.ignore))

    @property
    def tp_dims(self) -> dict:
        if self.fp8 is not None:
            return fp8_tp_dims(self.fp8)
        grouped = self.group_size > 0
        return {"weight_packed": (0, 1), "weight_scale": (0, 1 if grouped else None),
                "weight_zero_point": (0, 1 if grouped else None), "weight_g_idx": (None, 0),
                "weight_shape": (None, None), "bias": (0, None)}

    def tp_unit(self, split: str) -> tuple[int, str]:
        pack = 32 // self.bits
        if self.fp8 is not None:
            return 1, ""
        if split == "column":
            return pack, f", must be a multiple of {pack} (compressed-tensors packing)"
        if self.g_idx:
            raise UnsupportedModelError("compressed-tensors activation order \"group\" (weight_g_idx) scatters "
                                        "groups over the input features: use tensor_parallel_size 1")
        unit = max(self.group_size, pack) if self.group_size > 0 else 16
        return unit, f", must be whole compressed-tensors groups of {unit}"

    # -- one linear layer's weights ---------------------------------------------------
    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        if self.fp8 is not None:
            create_fp8(self.fp8, layer, bias, dtype, device)
            return
        k, sizes, pack = layer.in_features, layer.output_sizes, 32 // self.bits
        group = self.group_size if self.group_size > 0 else k
        if k % group or k % pack or (not self.symmetric and any(s % pack for s in sizes)):
            raise ValueError(f"compressed-tensors layer {k}x{sizes} does not fit group {group} / packing {pack}")
        n, g = sum(sizes), k // group
        layer.register_buffer("weight_packed", torch.zeros(n, k // pack, dtype=torch.int32, device=device))
        layer.register_buffer("weight_scale", torch.zeros(n, g, dtype=dtype, device=device))
        if not self.symmetric:
            layer.register_buffer("weight_zero_point", torch.zeros(n // pack, g, dtype=torch.int32, device=device))
        trivial = (torch.arange(k, dtype=torch.int32, device=device) // group).expand(len(sizes), k).clone()
        layer.register_buffer("weight_g_idx", trivial, persistent=False)
        layer.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
        layer.parts = None

    def tensor_names(self, layer) -> list[str]:
        if self.fp8 is not None:
            return fp8_tensor_names(self.fp8, layer)
        names = ["weight_packed", "weight_scale", "weight_shape"]
        names += [] if self.symmetric else ["weight_zero_point"]
        names += ["weight_g_idx"] if self.g_idx else []
        return names + (["bias"] if layer.bias is not None else [])

    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        if self.fp8 is not None:
            load_fp8(self.fp8, layer, shard, name, tensor)
            return
        off, size, k, pack = layer.shard_offset(shard), layer.output_sizes[shard], layer.in_features, 32 // self.bits
        g = layer.weight_scale.shape[1]
        if name == "weight_shape":
            if tensor.numel() != 2:
                raise ValueError(f"weight_shape: {tensor.tolist()} is not a 2-d shape")
            return
        if name == "weight_g_idx" and self.g_idx:
            want, dst = (k,), layer.weight_g_idx[shard]
        elif name == "weight_zero_point" and not self.symmetric:
            want, dst = (size // pack, g), layer.weight_zero_point[off // pack : (off + size) // pack]
        elif name in ("weight_packed", "weight_scale") or (name == "bias" and layer.bias is not None):
            buf = layer.bias.data if name == "bias" else getattr(layer, name)
            want, dst = (size, *buf.shape[1:]), buf[off : off + size]
        else:
            raise KeyError(name)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        dst.copy_(tensor)

    def finalize(self, layer) -> None:
        if self.fp8 is not None:
            finalize_fp8(self.fp8, layer)
            return
        zp = getattr(layer, "weight_zero_point", None)
        dtype, pack = layer.weight_scale.dtype, 32 // self.bits
        views = []
        for i, size in enumerate(layer.output_sizes):
            a = layer.shard_offset(i)
            z = zp[a // pack : (a + size) // pack] if zp is not None else None
            views.append((layer.weight_packed[a : a + size], layer.weight_scale[a : a + size], z, layer.weight_g_idx[i]))
        if self.bits == 8:
            w = torch.cat([ct_dequantize(p, s, z, g - g.min(), 8, layer.in_features, self.group_size)
                           for p, s, z, g in views], dim=1)
            layer.parts = [dense_part(w, dtype)]
        else:
            layer.parts = int4_parts([ct_int_view(p, s, z, g, 4, layer.in_features) for p, s, z, g in views],
                                     self.group_size, dtype)
        for name in ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx"):
            if hasattr(layer, name):  # the checkpoint copies are not needed any more
                setattr(layer, name, torch.empty(0, dtype=getattr(layer, name).dtype, device=layer.weight_scale.device))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.fp8 is not None:
            return apply_fp8(layer, x, bias)
        return apply_parts(layer.parts, x, bias)


def parse_config(cls, q: dict) -> CompressedTensors:
    """The one scheme of a compressed-tensors quantization_config; UnsupportedModelError
    naming the field otherwise."""
    if q.get("sparsity_config"):
        raise UnsupportedModelError("compressed-tensors sparsity (sparsity_config) is not supported")
    if q.get("transform_config"):
        raise UnsupportedModelError("compressed-tensors transforms (transform_config) are not supported")
    groups = list((q.get("config_groups") or {}).values())
    if not groups:
        raise UnsupportedModelError("compressed-tensors quantization_config has no config_groups")
    schemes = [{k: v for k, v in grp.items() if k != "targets"} for grp in groups]
    if any(s != schemes[0] for s in schemes[1:]):
        raise UnsupportedModelError("compressed-tensors with several different schemes (config_groups) is not supported")
    for grp in groups:
        targets = grp.get("targets") or []
        if targets != ["Linear"]:
            raise UnsupportedModelError(f"compressed-tensors config_groups targets {targets} are not supported (Linear)")
    grp, ignore = groups[0], tuple(q.get("ignore") or ())
    if not name_matcher(ignore)("lm_head"):
        raise UnsupportedModelError("compressed-tensors with a quantized lm_head is not supported: add it to ignore")
    w, act, fmt = grp.get("weights") or {}, grp.get("input_activations"), grp.get("format") or q.get("format")
    if grp.get("output_activations"):
        raise UnsupportedModelError("compressed-tensors output_activations quantization is not supported")
    if not w:
        raise UnsupportedModelError("compressed-tensors without weight quantization (config_groups.weights) "
                                    "is not supported")
    if w.get("type", "int") == "float":
        return cls(8, -1, True, False, _fp8_scheme(w, act, fmt), ignore)
    if act:
        raise UnsupportedModelError(f"compressed-tensors int{w.get('num_bits')} with activation quantization "
                                    f"(input_activations {act.get('type')}{act.get('num_bits')}) is not supported")
    bits, strategy, group = w.get("num_bits"), w.get("strategy"), w.get("group_size")
    if fmt not in INT_FORMATS:
        raise UnsupportedModelError(f"compressed-tensors format {fmt!r} is not supported for integer weights "
                                    f"({', '.join(INT_FORMATS)})")
    if bits not in (4, 8):
        raise UnsupportedModelError(f"compressed-tensors weights of {bits} bits are not supported (4, 8)")
    if strategy == "group" and group in (32, 64, 128):
        group_size = int(group)
    elif strategy == "channel":
        group_size = -1
    else:
        raise UnsupportedModelError(f"compressed-tensors weight strategy {strategy!r} (group_size {group}) is not "
                                    "supported (group of 32/64/128, channel)")
    if w.get("dynamic"):
        raise UnsupportedModelError("compressed-tensors dynamic weight quantization is not supported")
    actorder = w.get("actorder")
    return cls(int(bits), group_size, bool(w.get("symmetric", True)), actorder in ("group", "dynamic"), None, ignore)


def _fp8_scheme(w: dict, act: dict | None, fmt) -> FP8Scheme:
    if fmt not in FLOAT_FORMATS or w.get("num_bits") != 8:
        raise UnsupportedModelError(f"compressed-tensors float weights ({w.get('num_bits')} bits, format {fmt!r}) "
                                    "are not supported (FP8, float-quantized)")
    if not w.get("symmetric", True) or w.get("strategy") not in ("tensor", "channel"):
        raise UnsupportedModelError(f"compressed-tensors FP8 weight strategy {w.get('strategy')!r} is not supported "
                                    "(tensor, channel; symmetric)")
    if act is not None:
        dynamic = act.get("dynamic") in (True, "true", "local")
        if act.get("type") != "float" or act.get("num_bits") != 8 or not dynamic or act.get("strategy") != "token":
            raise UnsupportedModelError(
                f"compressed-tensors input_activations {act.get('type')}{act.get('num_bits')} "
                f"{act.get('strategy')} dynamic={act.get('dynamic')} is not supported (FP8 dynamic per token)")
    return FP8Scheme(w["strategy"], None, act is not None)
