"""The dense weight of a layer held in llm_kernels.awq_mma's layout only (no kpack copy):
what awq_linear multiplies with cuBLAS at the token counts the mma kernel does not take.
A Triton kernel (runs under the interpreter too); awq_mma.mma_dequantize_reference is its
oracle."""
import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit


@lazy_jit
def _mma_dequant_kernel(w_ptr, sz_ptr, out_ptr, N, KC, KG, GSHIFT):
    """One 64-row chunk (program_id 1) of one 16-column tile (program_id 0): its 128 words,
    32 lanes x 4, each 8 nibbles, written back to their (k, n) places (awq_mma.mma_pack)."""
    nt = tl.program_id(0)
    kc = tl.program_id(1)
    lane = tl.arange(0, 32)[:, None, None]
    j = tl.arange(0, 4)[None, :, None]
    e = tl.arange(0, 8)[None, None, :]
    word = tl.load(w_ptr + ((nt * KC + kc) * 32 + lane).to(tl.int64) * 4 + j)
    q = (word >> (4 * (e // 2 + 4 * (e % 2)))) & 0xF  # fragment element e sits at nibble e / 2 + 4 (e % 2)
    g, t, mid = lane // 4, lane % 4, (e // 2) % 2
    k = kc * 64 + t * 16 + j * 4 + (e // 4) * 2 + (e % 2)
    n = nt * 16 + mid * 8 + g
    sz = sz_ptr + ((nt * KG + (kc >> GSHIFT)) * 8 + g).to(tl.int64) * 4  # (s_g, s_g+8, -(128 + z_g), -(128 + z_g+8))
    s = tl.load(sz + mid).to(tl.float32)
    nz = tl.load(sz + 2 + mid).to(tl.float32)
    v = (q.to(tl.float32) + 128.0 + nz) * s  # (q - z) s: exact in float32, rounded once to out's dtype
    tl.store(out_ptr + k.to(tl.int64) * N + n, v.to(out_ptr.dtype.element_ty))


def mma_dequantize(words: torch.Tensor, sz: torch.Tensor, dtype) -> torch.Tensor:
    """words int32 [N/16, K/64, 32, 4], sz bf16 [N/16, K/G, 8, 4] -> the weight [K, N] in dtype."""
    NT, KC = words.shape[:2]
    KG = sz.shape[1]
    w = torch.empty(KC * 64, NT * 16, dtype=dtype, device=words.device)
    gshift = (KC // KG).bit_length() - 1
    _mma_dequant_kernel[(NT, KC)](words, sz, w, NT * 16, KC, KG, gshift, num_warps=4)
    return w

