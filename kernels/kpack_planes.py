"""The nibble planes of the kpack layout (kernels.awq_kpack) as MMA operands,
shared by the kernels that read it (kernels.awq_kpack, kernels.awq_splitk):
the inline PTX that turns a pair of packed half-words into two 16-bit floats
q - z (or (q - z) s), the Triton routine that applies it (or the exact float
path of the interpreter and of float32 inputs), and the dot in either
orientation."""
from functools import lru_cache

import torch
import triton.language as tl

from kernels.dispatch import jit_helper

ROWS = 128  # rows of K per packed block: 8 planes of 16


@lru_cache(maxsize=None)
def dequant_asm(j: int, dtype, scaled: bool = False) -> str:
    """PTX for nibble j of two packed half-words -> two 16-bit floats q - z ($2: -(OFF + z) twice);
    scaled: (q - z) * s ($3: the scale twice), rounded once (q - z is exact), by an FMA with -0
    (sm_80 has no bf16x2 multiply)."""
    magic, one, fma = (("0x43004300", "0x3F803F80", "fma.rn.bf16x2") if dtype == torch.bfloat16
                       else ("0x64006400", "0x3C003C00", "fma.rn.f16x2"))
    shift = f"shr.b32 t, $1, {4 * j}; lop3.b32 t, t, 0x000F000F, {magic}, 0xEA;" if j else \
        f"lop3.b32 t, $1, 0x000F000F, {magic}, 0xEA;"
    if not scaled:
        return "{ .reg .b32 t, one; " + shift + f" mov.b32 one, {one}; {fma} $0, t, one, $2; }}"
    return ("{ .reg .b32 t, one, nz; " + shift + f" mov.b32 one, {one}; mov.b32 nz, 0x80008000;"
            f" {fma} t, t, one, $2; {fma} $0, t, $3, nz; }}")


@jit_helper
def _plane(h, j: tl.constexpr, nz, zf, sb, like, ASM: tl.constexpr, EXACT: tl.constexpr, FOLD: tl.constexpr):
    """Nibble j of the half-words h ([16, BN], or [BN, 16] when swapped) as q - z in like's
    dtype (float32 when EXACT), times the scale when FOLD; nz, zf and sb (the scale in
    like's dtype) are broadcast to h's shape."""
    if EXACT:
        b = ((h.to(tl.int32) >> (4 * j)) & 0xF).to(tl.float32) - zf
        if FOLD:
            b = b * sb.to(tl.float32)
        if like.dtype != tl.float32:
            b = b.to(like.dtype)
    elif FOLD:
        b = tl.inline_asm_elementwise(ASM, "=r,r,r,r", [h, nz, sb], dtype=like.dtype, is_pure=True, pack=2)
    else:
        b = tl.inline_asm_elementwise(ASM, "=r,r,r", [h, nz], dtype=like.dtype, is_pure=True, pack=2)
    return b


@jit_helper
def _mma(x, b, acc, SWAP: tl.constexpr, EXACT: tl.constexpr):
    """acc + x b, or acc + b x when SWAP (b is then W^T's tile and x is x^T's)."""
    if SWAP:
        if EXACT and x.dtype == tl.float32:
            acc = tl.dot(b, x, acc, input_precision="ieee")
        else:
            acc = tl.dot(b, x, acc)
    else:
        if EXACT and x.dtype == tl.float32:
            acc = tl.dot(x, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, b, acc)
    return acc
