"""Activations quantized by the kernel that produces them. Where the next linear is FP8 and
its kernel for the step takes e4m3 activations quantized per token (W8A8, cuBLAS FP8), the
RMSNorm or the SiLU/GELU-and-mul before it quantizes its output in its own launch and leaves
it on the linear (`fp8_input`, taken by engine.quant.fp8.apply_fp8 at the linear's next
call) instead of the linear running a quantization pass of its own. Elsewhere (other
formats, weight-only steps, the CPU) they run as before."""
from __future__ import annotations

import llm_kernels
from llm_kernels.fp8 import wants_quantized_input


def _wants(linear, x) -> bool:
    """Whether `linear`'s step on x's tokens takes them quantized (llm_kernels.fp8.wants_quantized_input)."""
    w = getattr(linear, "fp8", None)
    return w is not None and wants_quantized_input(w, x)


def norm_before(norm, x, residual, linear):
    """norm(x, residual) in front of `linear` (None: none), its output quantized in the same
    launch where the linear takes it so."""
    if linear is None or not _wants(linear, x):
        return norm(x, residual)
    out, residual, linear.fp8_input = norm.quantized(x, residual)
    return out, residual


def act_before(gate_up, gelu: bool, linear):
    """act(gate) * up (SiLU, or GELU-tanh with gelu) in front of `linear`, quantized in the
    same launch where the linear takes it so (rows of up to llm_kernels.fp8.act_quant.MAX_ROW)."""
    if _wants(linear, gate_up) and (fused := llm_kernels.act_and_mul_quant(gate_up, gelu)) is not None:
        out, q, s = fused
        linear.fp8_input = (q, s)
        return out
    return (llm_kernels.gelu_tanh_and_mul if gelu else llm_kernels.silu_and_mul)(gate_up)
