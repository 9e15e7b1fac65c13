"""A 4-bit linear layer prepared for its device (`prepare`) and x W computed by the kernel
llm_kernels.w4a16.select names for the step (`linear`): the one place that tells CUDA, the
Triton interpreter and the CPU apart. Weights come in AutoAWQ's "GEMM" format
(llm_kernels.w4a16.awq_format); GPTQ and compressed-tensors are repacked into it first."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from llm_kernels.dense import dense_linear
from llm_kernels.dispatch import autotune, interpret_mode
from llm_kernels.w4a16 import ckpt, cpu, kpack
from llm_kernels.w4a16.awq_format import awq_dequantize, awq_gemm_reference, check_awq_shapes
from llm_kernels.w4a16.configs import DENSE, ckpt_configs, kpack_configs, shape_key
from llm_kernels.w4a16.select import CHECKPOINT, HOST, HOST_INT4, KPACK, candidates, device_class
from llm_kernels.w4a16.workspace import workspace

TUNED = {KPACK: "w4a16_kpack", CHECKPOINT: "w4a16_checkpoint"}  # the tuner's name of each layout's choices


@dataclass
class W4A16Weight:
    """One layer in one layout (llm_kernels.w4a16.select names them): KPACK holds `qk` int16
    [N'/S, K/4, S] and `zeros_k` int16 [K/G, N] (llm_kernels.w4a16.kpack); CHECKPOINT the
    checkpoint's `qweight` [K, N/8] and `qzeros` [K/G, N/8]; HOST and HOST_INT4 (the CPU) the
    dequantized `dense` [N, K] in the scales' dtype, and for HOST_INT4 torch's `int4` pack."""

    layout: str
    in_features: int
    out_features: int
    group_size: int
    scales: torch.Tensor  # [K/G, N]
    qweight: torch.Tensor | None = None
    qzeros: torch.Tensor | None = None
    qk: torch.Tensor | None = None
    zeros_k: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    int4: cpu.Int4Pack | None = None


def default_layout(device: torch.device, K: int, dtype) -> str:
    """The layout a layer takes on a device: the K-packed one for the Triton kernels where K
    allows (a multiple of kpack.ROWS), else the checkpoint's; on the CPU outside the
    interpreter the dense weight, with torch's int4 pack where that kernel takes the layer."""
    if device.type == "cuda" or interpret_mode():
        return KPACK if K % kpack.ROWS == 0 else CHECKPOINT
    return HOST_INT4 if dtype == torch.bfloat16 and cpu.int4_available() else HOST


def prepare(qweight, qzeros, scales, group_size: int, layout: str | None = None) -> W4A16Weight:
    """Check a layer's AutoAWQ-format tensors and hold them in `layout` (default_layout unless
    given). Call once at load time, outside graph capture: on CUDA it also reserves the
    split-K workspace."""
    K, N8 = qweight.shape
    check_awq_shapes(K, N8, qzeros, scales, group_size, "w4a16 prepare")
    layout = layout or default_layout(qweight.device, K, scales.dtype)
    w = W4A16Weight(layout, K, N8 * 8, group_size, scales.contiguous())
    if layout == KPACK:
        w.qk, w.zeros_k = kpack.kpack_from_awq(qweight, qzeros, group_size)
    elif layout == CHECKPOINT:
        w.qweight, w.qzeros = qweight.contiguous(), qzeros.contiguous()
    elif layout in (HOST, HOST_INT4):
        w.dense = awq_dequantize(qweight, qzeros, scales, group_size, torch.float32).t().contiguous().to(scales.dtype)
        if layout == HOST_INT4:
            w.int4 = cpu.int4_pack(qweight, qzeros, scales, group_size, scales.dtype)
            w.layout = HOST_INT4 if w.int4 is not None else HOST
    else:
        raise ValueError(f"w4a16 prepare: unknown layout {layout!r}")
    if scales.is_cuda:
        workspace(scales.device)
    return w


def dequantize(w: W4A16Weight, dtype) -> torch.Tensor:
    """The layer's dense [K, N] weight in dtype."""
    if w.layout == KPACK:
        if w.qk.is_cuda or interpret_mode():
            return kpack.dequantize(w.qk, w.zeros_k, w.scales, w.group_size, dtype)
        return kpack.kpack_dequantize_reference(w.qk, w.zeros_k, w.scales, w.group_size, dtype)
    if w.layout == CHECKPOINT:
        if w.qweight.is_cuda or interpret_mode():
            return ckpt.dequantize(w.qweight, w.qzeros, w.scales, w.group_size, dtype)
        return awq_dequantize(w.qweight, w.qzeros, w.scales, w.group_size, dtype)
    return w.dense.t().to(dtype)


def linear(x: torch.Tensor, w: W4A16Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W (+ bias) -> [..., N] in x's dtype."""
    K = x.shape[-1]
    if K != w.in_features:
        raise ValueError(f"w4a16 linear: x has K={K}, the layer {w.in_features}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    names = candidates(device_class(x2), x2.dtype, x2.shape[0], w.layout)
    if names == ("cpu_int4",):
        y = cpu.int4_mm(x2.contiguous(), w.int4)
    elif names == ("cpu_dense",):
        return dense_linear(x, w.dense, bias)
    elif names == ("reference",):
        y = (x2.float() @ dequantize(w, torch.float32)).to(x.dtype)
    else:
        return _tuned(x2, w, names, bias).view(*lead, w.out_features)
    if bias is not None:
        y = y + bias
    return y.view(*lead, w.out_features)


def _tuned(x2: torch.Tensor, w: W4A16Weight, names: tuple[str, ...], bias: torch.Tensor | None) -> torch.Tensor:
    """The Triton layouts: the candidates' configs timed once per shape (llm_kernels.dispatch.autotune),
    the dequantize-then-matmul path first (the yardstick, and the choice inside a capture
    before the shape was tuned). The bias goes into the GEMM (cuBLAS's epilogue, the kpack
    kernel's store), not a separate add over the output."""
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, K = x2.shape
    N = w.out_features
    if M == 0:
        return x2.new_empty(0, N)
    if bias is not None and bias.dtype != x2.dtype:
        bias = bias.to(x2.dtype)

    def configs():
        out = [DENSE] if "dequant_matmul" in names else []
        if "kpack" in names:
            out += kpack_configs(M, x2.dtype, x2.device)
        if "checkpoint" in names:
            out += [c for c in ckpt_configs(M, x2.dtype, x2.device)
                    if ckpt.fits(M, N, K, w.group_size, c, x2.device)]
        return out

    def launch(cfg):
        if cfg["kind"] == "dense":
            W = dequantize(w, x2.dtype)
            return x2 @ W if bias is None else torch.addmm(bias, x2, W)
        if w.layout == KPACK:
            return kpack.launch(x2, w.qk, w.zeros_k, w.scales, w.group_size, cfg, bias=bias)
        y = ckpt.launch(x2, w.qweight, w.qzeros, w.scales, w.group_size, cfg)
        return y if bias is None else y + bias

    cfg = autotune(TUNED[w.layout], shape_key(M, N, K, w.group_size, x2.dtype), configs, launch,
                   checked=(x2.dtype, w.group_size), cold_l2_device=x2.device if x2.is_cuda else None)
    return launch(cfg)


def awq_gemm(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """x [M, K] @ dequant(qweight) [K, N] -> [M, N] in x's dtype, on the checkpoint's own
    layout as it is (the checkpoint-layout kernels; the reference on the CPU)."""
    K = x.shape[-1]
    if qweight.shape[0] != K or K % group_size:
        raise ValueError(f"awq_gemm: x has K={K}, qweight {tuple(qweight.shape)}, group {group_size}")
    if not (x.is_cuda or interpret_mode()):
        return awq_gemm_reference(x, qweight, qzeros, scales, group_size)
    return linear(x, prepare(qweight, qzeros, scales, group_size, CHECKPOINT))

