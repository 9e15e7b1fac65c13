"""KV-cache write by slot mapping: token t goes to flat slot slot_mapping[t]
(block * block_size + offset); a slot of -1 is skipped (padding).
A Triton program copies the K and V heads of a few tokens (tuned per shape on CUDA)."""
import triton.language as tl

from kernels.dispatch import autotune, lazy_jit, next_pow2, use_triton


def write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping):
    num_blocks, block_size, num_heads, head_dim = k_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    k_cache.view(-1, num_heads, head_dim).index_copy_(0, slots, key[valid].to(k_cache.dtype))
    v_cache.view(-1, num_heads, head_dim).index_copy_(0, slots, value[valid].to(v_cache.dtype))


@lazy_jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    T, H, D, block_size,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    for i in tl.static_range(TOKENS):  # a few tokens per program: fewer, fuller programs
        t = tl.program_id(0).to(tl.int64) * TOKENS + i
        tvalid = t < T
        slot = tl.load(slot_ptr + t, mask=tvalid, other=-1).to(tl.int64)
        valid = (tl.zeros([BLOCK_H, BLOCK_D], tl.int64) + slot) >= 0
        mask = (heads < H) & (dims < D) & valid
        blk = slot // block_size
        off = slot % block_size
        dst = blk * stride_cb + off * stride_cs + heads * stride_ch + dims
        k = tl.load(k_ptr + t * stride_kt + heads * stride_kh + dims, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + heads * stride_vh + dims, mask=mask)
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping) -> None:
    """key, value [T, Hkv, D]; caches [num_blocks, block_size, Hkv, D]."""
    if not (use_triton(key, value, k_cache, v_cache, slot_mapping) and key.shape[0]):
        write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping)
        return
    T, H, D = key.shape
    assert value.shape == key.shape and k_cache.shape == v_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    block_h, block_d = next_pow2(H), next_pow2(D)

    def launch(cfg):
        tokens, warps = cfg
        _write_kv_kernel[(-(-T // tokens),)](
            key, value, k_cache, v_cache, slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            T, H, D, k_cache.shape[1],
            BLOCK_H=block_h, BLOCK_D=block_d, TOKENS=tokens, num_warps=warps,
        )

    # (tokens per program, warps): the first is the interpreter's and the one
    # used inside a graph capture before this shape was tuned
    wide = 4 if block_h * block_d <= 4096 else 8
    configs = [(1, wide) if key.is_cuda and T < 1024 else (4, wide)]
    if key.is_cuda:
        configs += [(t, w) for t in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8) if (t, w) != configs[0]
                    and 32 * w * 8 <= block_h * block_d]  # 16-byte accesses need 8 elements a thread
    cfg = autotune("write_kv", (next_pow2(T), H, D, key.dtype, k_cache.dtype, k_cache.shape[1]), configs, launch)
    launch(cfg)
