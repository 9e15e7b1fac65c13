"""KV-cache write by slot mapping: token t goes to flat slot slot_mapping[t]
(block * block_size + offset); a slot of -1 is skipped (padding).
A Triton program copies the K and V heads of a few tokens (tuned per shape on CUDA).

An FP8 cache (float8_e4m3fn or float8_e5m2) stores K / k_scale and V / v_scale,
saturated to the format's largest finite value; readers multiply the scales back."""
import torch
import triton.language as tl

from llm_kernels.dispatch import autotune, lazy_jit, next_pow2, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype) -> float:
    """The largest finite value of an FP8 cache dtype; 0.0 for any other (no saturation)."""
    return float(torch.finfo(dtype).max) if dtype in FP8_DTYPES else 0.0


def to_cache_dtype(x: torch.Tensor, dtype, scale: float = 1.0) -> torch.Tensor:
    """x as the cache stores it: cast, or for FP8 divided by scale (times its inverse,
    as the kernel does) and saturated first."""
    top = fp8_max(dtype)
    if not top:
        return x.to(dtype)
    return (x.float() * (1.0 / scale)).clamp(-top, top).to(dtype)


def _put(cache, slots, rows, scale) -> None:
    flat = cache.view(-1, *cache.shape[2:])
    rows = to_cache_dtype(rows, cache.dtype, scale)
    if cache.dtype in FP8_DTYPES:  # index_copy_ has no FP8 kernel on the CPU: copy the bytes
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slots, rows)


def write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping, k_scale: float = 1.0,
                             v_scale: float = 1.0):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    _put(k_cache, slots, key[valid], k_scale)
    _put(v_cache, slots, value[valid], v_scale)


@lazy_jit(pdl=True)
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    T, H, D, block_size, k_inv, v_inv, fp8_max,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
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
        if FP8:  # scaled and saturated (a cast past the largest value is not)
            k = tl.minimum(tl.maximum(k.to(tl.float32) * k_inv, -fp8_max), fp8_max)
            v = tl.minimum(tl.maximum(v.to(tl.float32) * v_inv, -fp8_max), fp8_max)
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(key, value, k_cache, v_cache, slot_mapping, k_scale: float = 1.0,
                   v_scale: float = 1.0) -> None:
    """key, value [T, Hkv, D]; caches [num_blocks, block_size, Hkv, D]; the scales
    (Python floats, per tensor) divide what an FP8 cache stores."""
    if not (use_triton(key, value, k_cache, v_cache, slot_mapping) and key.shape[0]):
        write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
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
            T, H, D, k_cache.shape[1], 1.0 / k_scale, 1.0 / v_scale, fp8_max(k_cache.dtype),
            BLOCK_H=block_h, BLOCK_D=block_d, TOKENS=tokens, FP8=k_cache.dtype in FP8_DTYPES, num_warps=warps,
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
