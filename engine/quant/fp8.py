"""FP8 checkpoints (quant_method "fp8": vLLM's and transformers' FineGrainedFP8, e.g.
the official Qwen3 FP8 releases) and the FP8 linear layer that compressed-tensors'
float-quantized scheme shares: e4m3 weights, activations quantized per token at run
time or kept in 16 bits (llm_kernels.fp8 picks the kernel per step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.quant.base import QuantMethod
from engine.quant.names import listed
from llm_kernels.fp8 import FP8
from llm_kernels.fp8 import linear as fp8_linear
from llm_kernels.fp8 import prepare as fp8_prepare


@dataclass(frozen=True, slots=True)
class FP8Scheme:
    """How one FP8 linear is stored: weight e4m3 [N, K]; scales per "tensor" (one per
    merged shard), "channel" ([N] or [N, 1]) or "block" (weight_scale_inv [N/bn, K/bk],
    the activations then quantized per token and group of bk); dynamic activation
    quantization, or none (weight-only)."""

    strategy: str
    block: tuple[int, int] | None = None
    act_dynamic: bool = True
    scale_name: str = "weight_scale"


def create_fp8(scheme: FP8Scheme, layer, bias: bool, dtype, device) -> None:
    k, sizes = layer.in_features, layer.output_sizes
    n = sum(sizes)
    if scheme.block is not None:
        bn, bk = scheme.block
        scale = torch.zeros(sum(-(-s // bn) for s in sizes), -(-k // bk), dtype=torch.float32, device=device)
    else:
        scale = torch.zeros(n, dtype=torch.float32, device=device)
    layer.register_buffer("weight", torch.zeros(n, k, dtype=FP8, device=device))
    layer.register_buffer(scheme.scale_name, scale)
    layer.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
    layer.fp8 = None  # llm_kernels.fp8.FP8Weight (finalize_fp8)
    layer.fp8_input = None  # the next call's input quantized by its producer (engine.model.layers.quantized_input)
    layer.dtype = dtype


def fp8_tensor_names(scheme: FP8Scheme, layer) -> list[str]:
    return ["weight", scheme.scale_name] + (["bias"] if layer.bias is not None else [])


def fp8_tp_dims(scheme: FP8Scheme) -> dict:
    scale = {"tensor": (None, None), "channel": (0, None), "block": (0, 1)}[scheme.strategy]
    return {"weight": (0, 1), scheme.scale_name: scale, "bias": (0, None)}


def load_fp8(scheme: FP8Scheme, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
    off, size, k = layer.shard_offset(shard), layer.output_sizes[shard], layer.in_features
    if name == "bias" and layer.bias is not None:
        want, dst = (size,), layer.bias.data[off : off + size]
    elif name == "weight":
        want, dst = (size, k), layer.weight[off : off + size]
        if tensor.dtype != FP8:
            raise ValueError(f"weight: checkpoint dtype {tensor.dtype}, expected {FP8}")
    elif name == scheme.scale_name and scheme.block is not None:
        bn, bk = scheme.block
        rows = sum(-(-s // bn) for s in layer.output_sizes[:shard])
        want = (-(-size // bn), -(-k // bk))
        dst = getattr(layer, name)[rows : rows + want[0]]
    elif name == scheme.scale_name:
        n = tensor.numel()
        if n not in ((1, size) if scheme.strategy == "tensor" else (size,)):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {scheme.strategy} scales")
        getattr(layer, name)[off : off + size].copy_(tensor.float().reshape(-1).expand(size))
        return
    else:
        raise KeyError(name)
    if tuple(tensor.shape) != want:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
    dst.copy_(tensor)


def finalize_fp8(scheme: FP8Scheme, layer) -> None:
    """Hold the layer for its device (llm_kernels.fp8.prepare): on a GPU the e4m3 weight
    alone, which every kernel reads; on the CPU the dequantized weight alone."""
    act = None if not scheme.act_dynamic else "group" if scheme.block is not None else "token"
    scale = getattr(layer, scheme.scale_name)
    layer.fp8 = fp8_prepare(layer.weight, scale, layer.dtype, scheme.block, act, layer.output_sizes)
    if layer.fp8.weight is None:  # dequantized: the fp8 copy goes
        layer.weight = torch.empty(0, dtype=FP8, device=scale.device)


def apply_fp8(layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T (+ bias); x's per-token quantization taken from the layer where its producer left it."""
    xq, layer.fp8_input = layer.fp8_input, None
    return fp8_linear(x, layer.fp8, bias, xq)


@dataclass(frozen=True, slots=True)
class FP8Method(QuantMethod):
    """quant_method "fp8": block-wise (weight_block_size, weight_scale_inv) or per-tensor
    weight scales, dynamic activations (per token and group of the block width for
    block-wise weights, as transformers' and vLLM's kernels do). On a GPU the e4m3 weight
    stays as it is: the W8A16 kernel at small token counts, the dequantized weight with
    cuBLAS (or, per-tensor, torch._scaled_mm) above; on the CPU it is dequantized at load."""

    scheme: FP8Scheme
    skip: tuple[str, ...] = ()

    name: ClassVar[str] = "fp8"

    @classmethod
    def from_config(cls, q: dict) -> FP8Method:
        if str(q.get("fmt", "e4m3")).lower() != "e4m3":
            raise UnsupportedModelError(f"FP8 format {q.get('fmt')!r} is not supported (e4m3)")
        if str(q.get("activation_scheme", "dynamic")).lower() != "dynamic":
            raise UnsupportedModelError(f"FP8 activation_scheme {q.get('activation_scheme')!r} is not supported "
                                        "(dynamic)")
        block = q.get("weight_block_size")
        if block is not None and (len(block) != 2 or min(block) < 16):
            raise UnsupportedModelError(f"FP8 weight_block_size {block} is not supported")
        scheme = (FP8Scheme("block", tuple(int(b) for b in block), True, "weight_scale_inv") if block
                  else FP8Scheme("tensor"))
        skip = tuple(q.get("modules_to_not_convert") or ()) + tuple(q.get("ignored_layers") or ())
        return cls(scheme, skip)

    def covers(self, prefix: str) -> bool:
        return not listed(prefix, lambda n: any(n == m or n.endswith("." + m) or n.startswith(m + ".")
                                                for m in self.skip))

    @property
    def tp_dims(self) -> dict:
        return fp8_tp_dims(self.scheme)

    def tp_unit(self, split: str) -> tuple[int, str]:
        if self.scheme.block is None:
            return 1, ""
        unit = self.scheme.block[0 if split == "column" else 1]
        return unit, f", must be whole FP8 weight blocks of {unit}"

    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        create_fp8(self.scheme, layer, bias, dtype, device)

    def tensor_names(self, layer) -> list[str]:
        return fp8_tensor_names(self.scheme, layer)

    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        load_fp8(self.scheme, layer, shard, name, tensor)

    def finalize(self, layer) -> None:
        finalize_fp8(self.scheme, layer)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_fp8(layer, x, bias)
