"""Which W4A16 kernel runs a step: an ordered list of kernels, each saying which steps it can
run (device class, activation dtype, token count M, the layout the layer was prepared in).
The kernels that can run a step are its candidates; where there are two, the tuner times both
on the layer's shape once and keeps the faster. docs/kernels.md is this list as a table, and a
test checks that the two agree."""
from __future__ import annotations

import torch

from llm_kernels.selection import CPU, CUDA, HALF, INTERPRETER, Kernel, Step, host_class
from llm_kernels.selection import candidates as _candidates
from llm_kernels.w4a16.cpu import INT4_MAX_ROWS

# layouts a layer is prepared in (llm_kernels.w4a16.weight.prepare picks one per device and shape)
KPACK = "kpack"  # K-packed half-words (llm_kernels.w4a16.kpack): K a multiple of 128
CHECKPOINT = "checkpoint"  # AutoAWQ's own packing (llm_kernels.w4a16.ckpt): any K
HOST_INT4 = "host+int4"  # CPU: the dequantized weight and torch's int4 pack beside it
HOST = "host"  # CPU: the dequantized weight alone

TRITON_DEVICES = (CUDA, INTERPRETER)


def _triton_max_m(step: Step, half_max: int) -> int:
    """The Triton kernels' token range: half_max in bf16/fp16; 64 in float32 (exact float
    planes and ieee dots: the correctness path)."""
    return half_max if step.dtype in HALF else 64


def _int4_step(step: Step) -> bool:
    """A CPU step torch's int4 kernel takes: few rows of a bfloat16 model with the pack."""
    return step.device == CPU and step.layout == HOST_INT4 and step.dtype == torch.bfloat16 \
        and 1 <= step.m <= INT4_MAX_ROWS


KERNELS: tuple[Kernel, ...] = (
    Kernel("cpu_int4", "torch's CPU int4 matmul on the packed weight (a quarter of the bytes)", _int4_step),
    Kernel("cpu_dense", "the dequantized weight, torch's matmul",
           lambda s: s.device == CPU and s.layout in (HOST, HOST_INT4) and not _int4_step(s)),
    Kernel("kpack", "Triton W4A16 GEMM on the K-packed layout (llm_kernels.w4a16.kpack)",
           lambda s: s.device in TRITON_DEVICES and s.layout == KPACK and s.m <= _triton_max_m(s, 512)),
    Kernel("checkpoint", "Triton W4A16 GEMM on AutoAWQ's packing (llm_kernels.w4a16.ckpt)",
           lambda s: s.device in TRITON_DEVICES and s.layout == CHECKPOINT and s.m <= _triton_max_m(s, 16)),
    Kernel("dequant_matmul", "the weight dequantized by a Triton kernel, then torch.matmul (cuBLAS)",
           lambda s: s.device in TRITON_DEVICES and s.layout in (KPACK, CHECKPOINT)
           and s.m > (16 if s.dtype in HALF else 64)),
    Kernel("reference", "float32 product with the dequantized weight (tests' oracle)",
           lambda s: s.device == CPU and s.layout in (KPACK, CHECKPOINT)),
)


def candidates(device: str, dtype: torch.dtype, m: int, layout: str) -> tuple[str, ...]:
    """The kernels that can run this step, in list order."""
    return _candidates(KERNELS, Step(device, dtype, m, layout), "W4A16")


def device_class(x: torch.Tensor) -> str:
    """CUDA, INTERPRETER or CPU for a step's activations."""
    return CUDA if x.is_cuda else host_class()
