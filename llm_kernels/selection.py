"""The ordered kernel lists of the quantized linears (llm_kernels.w4a16.select,
llm_kernels.fp8.select): a step is what a kernel choice depends on (device class, activation
dtype, token count M, the layout the layer was prepared in); each kernel says which steps it
can run; the kernels that can run a step are its candidates, in list order (where there are
two, the tuner times both on the layer's shape once and keeps the faster)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from llm_kernels.dispatch import interpret_mode

# device classes shared by every list: a CUDA GPU, CPU tensors under TRITON_INTERPRET=1 (the GPU's
# kernels, interpreted), the CPU
CUDA, INTERPRETER, CPU = "cuda", "interpreter", "cpu"
HALF = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Step:
    device: str
    dtype: torch.dtype
    m: int
    layout: str


@dataclass(frozen=True)
class Kernel:
    name: str
    what: str
    can_implement: Callable[[Step], bool]


def candidates(kernels: tuple[Kernel, ...], step: Step, family: str) -> tuple[str, ...]:
    """The names of the kernels that can run `step`, in list order (at least one)."""
    names = tuple(k.name for k in kernels if k.can_implement(step))
    assert names, f"no {family} kernel for {step}"
    return names


def host_class() -> str:
    """The device class of CPU tensors: the interpreter's or the CPU's."""
    return INTERPRETER if interpret_mode() else CPU
