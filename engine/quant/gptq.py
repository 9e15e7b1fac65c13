"""GPTQ checkpoints (AutoGPTQ / GPTQModel / optimum; llm_kernels.w4a16.gptq_format describes the
layout): 4-bit repacked at load into AWQ's layout and run by the AWQ kernels
(act-order permuted to contiguous groups, the activations gathered to match), 8-bit
dequantized at load."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.quant.base import QuantMethod
from engine.quant.names import listed
from engine.quant.repacked import apply_parts, dense_part, int4_parts
from llm_kernels.w4a16.gptq_format import gptq_dequantize, gptq_unpack

BITS = (4, 8)
GROUP_SIZES = (-1, 32, 64, 128)
FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what is added to the stored zeros


@dataclass(frozen=True, slots=True)
class GPTQ(QuantMethod):
    """qweight [K*bits/32, N], qzeros [G, N*bits/32], scales [G, N], g_idx [K] per merged
    shard. At finalize each layer becomes engine.quant.repacked parts: shards whose
    act-order permutations agree share one AWQ-layout weight and one gather of x."""

    bits: int
    group_size: int
    desc_act: bool = False
    zero_offset: int = 1
    skip: tuple[str, ...] = ()  # modules_in_block_to_quantize given: the names it leaves out

    name: ClassVar[str] = "gptq"

    @classmethod
    def from_config(cls, q: dict) -> GPTQ:
        bits, group = q.get("bits"), q.get("group_size", -1)
        fmt = str(q.get("checkpoint_format", "gptq")).lower()
        if bits not in BITS:
            raise UnsupportedModelError(f"GPTQ with {bits} bits is not supported ({BITS})")
        if group not in GROUP_SIZES:
            raise UnsupportedModelError(f"GPTQ group size {group} is not supported ({GROUP_SIZES})")
        if fmt not in FORMATS:
            raise UnsupportedModelError(f"GPTQ checkpoint_format {fmt!r} is not supported ({sorted(FORMATS)})")
        if q.get("lm_head"):
            raise UnsupportedModelError("GPTQ with a quantized lm_head is not supported")
        if q.get("dynamic"):
            raise UnsupportedModelError("GPTQ per-module overrides (`dynamic`) are not supported")
        return cls(int(bits), int(group), bool(q.get("desc_act")), FORMATS[fmt], _unlisted(q))

    def covers(self, prefix: str) -> bool:
        return not listed(prefix, lambda name: name.rpartition(".")[2] in self.skip)

    @property
    def pack(self) -> int:
        return 32 // self.bits

    @property
    def tp_dims(self) -> dict:
        per_channel = self.group_size == -1
        return {"qweight": (1, 0), "qzeros": (1, None if per_channel else 0),
                "scales": (1, None if per_channel else 0), "g_idx": (None, 0), "bias": (0, None)}

    def tp_unit(self, split: str) -> tuple[int, str]:
        if split == "column":
            return self.pack, f", must be a multiple of {self.pack} (GPTQ zero packing)"
        if self.desc_act:
            raise UnsupportedModelError("GPTQ act-order (desc_act) scatters groups over the input features: "
                                        "row-parallel layers cannot take a contiguous slice; use tensor_parallel_size 1")
        unit = 16 if self.group_size == -1 else max(self.group_size, self.pack)
        return unit, f", must be whole GPTQ groups of {unit}"

    # -- one linear layer's weights ---------------------------------------------------
    def create_weights(self, layer, bias: bool, dtype, device) -> None:
        k, sizes = layer.in_features, layer.output_sizes
        group = self.group_size if self.group_size > 0 else k
        if k % group or k % self.pack or any(s % self.pack for s in sizes):
            raise ValueError(f"GPTQ layer {k}x{sizes} does not fit group {self.group_size} / packing {self.pack}")
        n, g = sum(sizes), k // group
        layer.register_buffer("qweight", torch.zeros(k // self.pack, n, dtype=torch.int32, device=device))
        layer.register_buffer("qzeros", torch.zeros(g, n // self.pack, dtype=torch.int32, device=device))
        layer.register_buffer("scales", torch.zeros(g, n, dtype=dtype, device=device))
        trivial = (torch.arange(k, dtype=torch.int32, device=device) // group).expand(len(sizes), k).clone()
        layer.register_buffer("g_idx", trivial, persistent=False)  # random (dummy) weights keep it trivial
        layer.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
        layer.parts = None

    def tensor_names(self, layer) -> list[str]:
        return ["qweight", "qzeros", "scales", "g_idx"] + (["bias"] if layer.bias is not None else [])

    def load(self, layer, shard: int, name: str, tensor: torch.Tensor) -> None:
        off, size, k = layer.shard_offset(shard), layer.output_sizes[shard], layer.in_features
        g, p = layer.scales.shape[0], self.pack
        if name == "g_idx":
            if tuple(tensor.shape) != (k,):
                raise ValueError(f"g_idx: checkpoint shape {tuple(tensor.shape)}, expected {(k,)}")
            layer.g_idx[shard].copy_(tensor)
            return
        where = {"qweight": (layer.qweight, 1, (k // p, size)), "qzeros": (layer.qzeros, p, (g, size // p)),
                 "scales": (layer.scales, 1, (g, size)), "bias": (layer.bias, 1, (size,))}
        if name not in where or where[name][0] is None:
            raise KeyError(name)
        buf, unit, want = where[name]
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        if name == "bias":
            buf.data[off : off + size].copy_(tensor)
        else:
            buf[:, off // unit : (off + size) // unit].copy_(tensor)

    def finalize(self, layer) -> None:
        dtype, device = layer.scales.dtype, layer.scales.device
        bounds = [(layer.shard_offset(i), layer.shard_offset(i) + s) for i, s in enumerate(layer.output_sizes)]
        if self.bits == 8:
            w = torch.cat([gptq_dequantize(layer.qweight[:, a:b], layer.qzeros[:, a // 4 : b // 4], layer.scales[:, a:b],
                                           layer.g_idx[i] - layer.g_idx[i].min(), 8, self.zero_offset)
                           for i, (a, b) in enumerate(bounds)], dim=1)
            layer.parts = [dense_part(w, dtype)]
        else:
            q, z = gptq_unpack(layer.qweight, layer.qzeros, 4, self.zero_offset)
            shards = [(q[:, a:b], z[:, a:b], layer.scales[:, a:b], layer.g_idx[i]) for i, (a, b) in enumerate(bounds)]
            layer.parts = int4_parts(shards, self.group_size, dtype)
        for name in ("qweight", "qzeros", "scales", "g_idx"):  # the checkpoint copies are not needed any more
            setattr(layer, name, torch.empty(0, dtype=getattr(layer, name).dtype, device=device))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return apply_parts(layer.parts, x, bias)


def _unlisted(q: dict) -> tuple[str, ...]:
    """The projections modules_in_block_to_quantize leaves dense (none when it is absent)."""
    listed = q.get("modules_in_block_to_quantize")
    if not listed:
        return ()
    names = {n.rsplit(".", 1)[-1] for group in listed for n in (group if isinstance(group, list) else [group])}
    known = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    return tuple(sorted(known - names))
