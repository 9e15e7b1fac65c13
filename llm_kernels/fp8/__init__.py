"""FP8 linear layers: e4m3 weights with per-tensor, per-channel or block scales (compressed-
tensors' FP8 schemes, quant_method "fp8" checkpoints) times 16-bit activations. `prepare`
holds a layer for its device once, `linear` runs a step on the kernel `select.candidates`
names for it (docs/kernels.md is that list as a table): the Triton W8A16 kernel at small
token counts, torch._scaled_mm (W8A8) or the dequantized weight with cuBLAS above, the
dequantized weight on the CPU. `reference` holds the math they are checked against."""
from llm_kernels.fp8.reference import (FP8, FP8_MAX, dequantize_fp8, fp8_qdq_per_token, per_token_scales,
                                       quantize_activations, quantize_fp8, scaled_mm_available, w8a16_reference)
from llm_kernels.fp8.select import KERNELS, candidates
from llm_kernels.fp8.weight import FP8Weight, dequantize, linear, plan, prepare, wants_quantized_input

__all__ = ["FP8", "FP8_MAX", "FP8Weight", "KERNELS", "candidates", "dequantize", "dequantize_fp8",
           "fp8_qdq_per_token", "linear", "per_token_scales", "plan", "prepare", "quantize_activations",
           "quantize_fp8", "scaled_mm_available", "w8a16_reference", "wants_quantized_input"]
