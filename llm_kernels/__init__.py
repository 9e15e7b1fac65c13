"""Compute ops of the engine: one public function per op.

Each op has a plain PyTorch reference (the CPU path and the test oracle);
Triton kernels take over on CUDA tensors (and on CPU tensors under
TRITON_INTERPRET=1). Importing this package never touches CUDA.
"""
from llm_kernels.dispatch import use_triton
from llm_kernels.activation import act_and_mul_quant, gelu_tanh_and_mul, silu_and_mul
from llm_kernels.dense import dense_linear
from llm_kernels.attention import paged_decode_attention, paged_prefill_attention
from llm_kernels.w4a16 import W4A16Weight, awq_dequantize, awq_gemm, pack_awq_int4, unpack_awq_int4
from llm_kernels.w4a16 import linear as w4a16_linear
from llm_kernels.w4a16 import prepare as w4a16_prepare
from llm_kernels.kv_cache import FP8_DTYPES, write_kv_cache
from llm_kernels.lora import add_lora
from llm_kernels.moe import AWQExperts, awq_experts_dequantize, fused_moe, fused_moe_awq, moe_align
from llm_kernels.moe_gemm_kpack import KPackExperts, kpack_experts, kpack_fits
from llm_kernels.moe_route import select_experts
from llm_kernels.norm import fused_add_rms_norm, fused_add_rms_norm_quant, rms_norm, rms_norm_quant
from llm_kernels.rotary import rotary_embedding
from llm_kernels.sampling import logits_summary
from llm_kernels.token_mask import apply_token_bitmask

__all__ = [
    "FP8_DTYPES",
    "AWQExperts",
    "KPackExperts",
    "kpack_experts",
    "kpack_fits",
    "act_and_mul_quant",
    "add_lora",
    "awq_experts_dequantize",
    "fused_moe",
    "fused_moe_awq",
    "moe_align",
    "apply_token_bitmask",
    "awq_dequantize",
    "awq_gemm",
    "dense_linear",
    "fused_add_rms_norm",
    "fused_add_rms_norm_quant",
    "gelu_tanh_and_mul",
    "logits_summary",
    "pack_awq_int4",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rms_norm_quant",
    "rotary_embedding",
    "select_experts",
    "silu_and_mul",
    "unpack_awq_int4",
    "W4A16Weight",
    "w4a16_linear",
    "w4a16_prepare",
    "use_triton",
    "write_kv_cache",
]
