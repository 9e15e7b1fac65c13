"""AWQ: 4-bit AutoAWQ "GEMM" checkpoints (qweight/qzeros int32 packed 8 along N,
fp16 scales per group), read from quantization_config and run by llm_kernels.w4a16_linear."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

import llm_kernels
from engine.errors import UnsupportedModelError
from engine.quant.base import QuantMethod

GROUP_SIZES = (32, 64, 128)
PACK = 8  # int4 values per int32, along the output features


@dataclass(frozen=True, slots=True)
class AWQ(QuantMethod):
    """Run by llm_kernels.w4a16_linear on the layout llm_kernels.w4a16_prepare gives the layer
    for its device (docs/kernels.md says which kernel runs where). Under tensor parallelism
    "column" slices N (packed 8 per int32), "row" slices K (whole groups)."""

    group_size: int
    skip: tuple[str, ...] = ()  # modules_to_not_convert: names containing one stay dense

    name: ClassVar[str] = "awq"
    tp_dims: ClassVar[dict] = {"qweight": (1, 0), "qzeros": (1, 0), "scales": (1, 0), "bias": (0, None)}

    @classmethod
    def from_config(cls, q: dict) -> AWQ:
        bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
        version = str(q.get("version", "gemm")).lower()
        if bits != 4:
            raise UnsupportedModelError(f"AWQ with {bits} bits is not supported (only 4)")
        if group not in GROUP_SIZES:
            raise UnsupportedModelError(f"AWQ group size {group} is not supported ({GROUP_SIZES})")
        if version != "gemm":
            raise UnsupportedModelError(f"AWQ version {version!r} is not supported (only GEMM)")
        if not q.get("zero_point", True):
            raise UnsupportedModelError("AWQ without zero point is not supported")
        return cls(int(group), tuple(q.get("modules_to_not_convert") or ()))

    def covers(self, prefix: str) -> bool:
        return not any(m in prefix for m in self.skip)

    def tp_unit(self, split: str) -> tuple[int, str]:
        if split == "column":
            return PACK, f", must be a multiple of {PACK} (AWQ packing)"
        return self.group_size, f", must be whole AWQ groups of {self.group_size}"

    # -- one linear layer's weights ---------------------------------------------------
    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        k, sizes, tp = layer.in_features, layer.output_sizes, layer.tp
        if k % self.group_size or any(s % PACK for s in sizes):
            part = f" (this rank's part at tensor_parallel_size {tp.size})" if tp.size > 1 else ""
            raise ValueError(f"AWQ layer {k}x{sizes}{part} does not fit group {self.group_size} / packing {PACK}")
        n, g = sum(sizes), k // self.group_size
        layer.register_buffer("qweight", torch.zeros(k, n // PACK, dtype=torch.int32, device=device))
        layer.register_buffer("qzeros", torch.zeros(g, n // PACK, dtype=torch.int32, device=device))
        layer.register_buffer("scales", torch.zeros(g, n, dtype=dtype, device=device))
        layer.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
        layer.w4a16 = None  # llm_kernels.W4A16Weight, made by finalize

    def tensor_names(self, layer) -> list[str]:
        return ["qweight", "qzeros", "scales"] + (["bias"] if layer.bias is not None else [])

    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        off, size = layer.shard_offset(shard), layer.output_sizes[shard]
        g = layer.in_features // self.group_size
        packed = {
            "qweight": (layer.qweight, PACK, (layer.in_features, size // PACK)),
            "qzeros": (layer.qzeros, PACK, (g, size // PACK)),
            "scales": (layer.scales, 1, (g, size)),
        }
        if name == "bias" and layer.bias is not None:
            if tuple(tensor.shape) != (size,):
                raise ValueError(f"bias: checkpoint shape {tuple(tensor.shape)}, expected {(size,)}")
            layer.bias.data[off : off + size].copy_(tensor)
        elif name in packed:
            buf, pack, want = packed[name]
            if tuple(tensor.shape) != want:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
            buf[:, off // pack : (off + size) // pack].copy_(tensor)
        else:
            raise KeyError(name)

    def finalize(self, layer) -> None:
        layer.w4a16 = llm_kernels.w4a16_prepare(layer.qweight, layer.qzeros, layer.scales, self.group_size)
        if layer.qweight.is_cuda and layer.w4a16.qweight is None:  # repacked: the checkpoint copy can go
            layer.qweight = torch.empty(0, dtype=torch.int32, device=layer.qweight.device)
            layer.qzeros = torch.empty(0, dtype=torch.int32, device=layer.qzeros.device)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return llm_kernels.w4a16_linear(x, layer.w4a16, bias)
