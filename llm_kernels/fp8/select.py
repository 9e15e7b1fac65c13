"""Which FP8 kernel runs a step: an ordered list of kernels, each saying which steps it can run
(device class, activation dtype, token count M, the layout the layer was prepared in). The
kernels that can run a step are its candidates; where there are several, the tuner times each
on the layer's shape once and keeps the fastest. docs/kernels.md is this list as a table, and a
test checks that the two agree."""
from __future__ import annotations

from functools import lru_cache

import torch

from llm_kernels.selection import CPU, CUDA, HALF, INTERPRETER, Kernel, Step, host_class
from llm_kernels.selection import candidates as _candidates

# device classes: llm_kernels.selection's, and a CUDA GPU with FP8 tensor cores (sm_89+:
# torch._scaled_mm) apart from one without (CUDA: Ampere)
CUDA_FP8 = "cuda-fp8"
# layouts a layer is prepared in (llm_kernels.fp8.weight.prepare): the e4m3 weight [N, K] with
SCALED = "scaled"  # per-channel (or per-tensor) scales, activations quantized per token, K and N multiples of 16
CHANNEL = "channel"  # per-channel (or per-tensor) scales otherwise: weight-only schemes, other K or N
BLOCK = "block"  # block scales (128 x 128 in the official Qwen3 / DeepSeek FP8 releases)
HOST = "host"  # or the weight dequantized at load alone: the CPU (and blocks too narrow for a dot)

TRITON_DEVICES = (CUDA_FP8, CUDA, INTERPRETER)
E4M3_LAYOUTS = (SCALED, CHANNEL, BLOCK)


def _scaled_mm_step(s: Step) -> bool:
    """torch._scaled_mm's steps: FP8 tensor cores, a W8A8 layer, 16-bit activations."""
    return s.device == CUDA_FP8 and s.layout == SCALED and s.dtype in HALF


def _w8a16_max_m(s: Step) -> int:
    """The weight-only kernel's token range: to 128 where _scaled_mm (twice bf16's tensor-core
    rate) takes over, 512 where the dequantized weight with cuBLAS does; 64 in float32 (the
    correctness path)."""
    if s.dtype not in HALF:
        return 64
    return 128 if _scaled_mm_step(s) else 512


KERNELS: tuple[Kernel, ...] = (
    Kernel("w8a16", "Triton W8A16 GEMM: e4m3 weights converted in registers, 16-bit dots (llm_kernels.fp8.w8a16)",
           lambda s: s.device in TRITON_DEVICES and s.layout in E4M3_LAYOUTS and s.m <= _w8a16_max_m(s)),
    Kernel("w8a8", "Triton W8A8 GEMM: activations quantized per token (and scale block) in one launch, e4m3 "
           "dots on FP8 tensor cores (llm_kernels.fp8.w8a16, A8)",
           lambda s: s.device == CUDA_FP8 and s.layout in (SCALED, BLOCK) and s.dtype in HALF and s.m <= 512),
    Kernel("scaled_mm", "activations quantized per token in one launch, torch._scaled_mm (cuBLAS FP8, W8A8)",
           lambda s: _scaled_mm_step(s) and s.m > 16),
    Kernel("dequant_matmul", "the weight dequantized by a Triton kernel (llm_kernels.fp8.dequant), then cuBLAS",
           lambda s: s.device in TRITON_DEVICES and s.layout in E4M3_LAYOUTS and not _scaled_mm_step(s)
           and s.m > 64),
    Kernel("dense", "the weight dequantized at load, torch's matmul (the CPU's path)", lambda s: s.layout == HOST),
    Kernel("reference", "float32 product with the dequantized weight (a GPU layout on the CPU: tests' oracle)",
           lambda s: s.device == CPU and s.layout in E4M3_LAYOUTS),
)


def candidates(device: str, dtype: torch.dtype, m: int, layout: str) -> tuple[str, ...]:
    """The kernels that can run this step, in list order."""
    return _candidates(KERNELS, Step(device, dtype, m, layout), "FP8")


def device_class(x: torch.Tensor) -> str:
    """CUDA_FP8, CUDA, INTERPRETER or CPU for a step's activations."""
    if x.is_cuda:
        return _cuda_class(x.device.index if x.device.index is not None else torch.cuda.current_device())
    return host_class()


@lru_cache(maxsize=None)
def _cuda_class(index: int) -> str:
    return CUDA_FP8 if torch.cuda.get_device_capability(index) >= (8, 9) else CUDA
