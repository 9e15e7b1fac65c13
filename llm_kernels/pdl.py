"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start
while the kernel before it in the stream finishes, and waits (`griddepcontrol.wait`) only where
it first needs that kernel's results. A decode step is hundreds of launches of a few
microseconds each, and every boundary costs a drain, a launch and a ramp; with PDL the next
kernel's programs are resident and set up when the previous one ends.

A kernel takes part by declaring `PDL: tl.constexpr = False` as its last parameter, being
built with `@lazy_jit(pdl=True)`, and running `if PDL: gdc_wait(); gdc_launch_dependents()`
before its first load of anything an earlier kernel writes, in every program (a program that
returned without waiting could let the grid finish before the kernel it depends on; the
kernels wait at their top, so the next kernel may start once every program of this one has).
The launch then adds PDL=True and launch_pdl=True on GPUs of
compute capability 9.0 and above (pdl_on); elsewhere, and in the interpreter, PDL stays False
and the two instructions are compiled out. The LoRA kernels wait later (llm_kernels.lora.kernels):
they read before the wait only what kernels two launches back wrote, and release the next
kernel only after it."""
import os

import torch

try:  # Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None

_ON: dict = {}  # device index -> PDL launches on that GPU


def pdl_on() -> bool:
    """Whether kernels that take part launch with PDL on the current CUDA device: compute
    capability 9.0 or above, a Triton with the grid-dependency instructions, and
    LLM_KERNELS_PDL not "0"."""
    if gdc_wait is None or os.environ.get("LLM_KERNELS_PDL", "1") == "0" or not torch.cuda.is_initialized():
        return False  # (no kernel launches on a GPU before CUDA is initialized)
    idx = torch.cuda.current_device()
    on = _ON.get(idx)
    if on is None:
        on = _ON[idx] = torch.cuda.get_device_capability(idx) >= (9, 0)
    return on


def pdl_for(arch: int) -> bool:
    """Whether a kernel compiled ahead for sm_<arch> takes the PDL path (as its launch would)."""
    return gdc_wait is not None and arch >= 90
