"""W4A16: 4-bit weights (AutoAWQ's format; GPTQ and compressed-tensors repacked into it)
times 16-bit activations. `prepare` holds a layer for its device once, `linear` runs a step on
the kernel `select.candidates` names for it (docs/kernels.md is that list as a table)."""
from llm_kernels.w4a16.awq_format import awq_dequantize, awq_gemm_reference, pack_awq_int4, unpack_awq_int4
from llm_kernels.w4a16.select import KERNELS, candidates
from llm_kernels.w4a16.weight import W4A16Weight, awq_gemm, dequantize, linear, prepare

__all__ = ["KERNELS", "W4A16Weight", "awq_dequantize", "awq_gemm", "awq_gemm_reference", "candidates", "dequantize",
           "linear", "pack_awq_int4", "prepare", "unpack_awq_int4"]
