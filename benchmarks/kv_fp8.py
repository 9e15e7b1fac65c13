"""K2 with an FP8 KV cache (kv_cache_dtype="fp8", e4m3 with per-tensor scales) on a CUDA GPU:
our paged decode attention reading an FP8 cache against the same kernel reading bf16 (the
peer, measured in this run on the same shapes) and against the FP8 cache's bytes floor.
Shapes, timing and floors as benchmarks/kernel_bench.py's K2 (Qwen2.5-7B heads: 28 query,
4 KV, head_dim 128).

    python benchmarks/kv_fp8.py --out $OUT/kv_fp8.json

Rows: ratio_to_floor = FP8 bytes / copy bandwidth over our FP8 time; ratio_to_peer = our
bf16 time over our FP8 time (above 1: the halved bytes pay).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llm_kernels  # noqa: E402
from benchmarks import kernel_bench as kb  # noqa: E402

SHAPES = [(1, 4096), (16, 4096), (64, 2048), (64, 8192), (256, 1024)]


def decode_time(B, ctx, dtype, bs=16):
    """Seconds per paged decode over B sequences of ctx tokens, the cache in dtype."""
    nblk = B * ctx // bs
    q = kb.rand((B, kb.HQ, kb.D))
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    kvbytes = 2 * B * ctx * kb.HKV * kb.D * torch.empty((), dtype=dtype).element_size()
    fns = []
    scales = dict(k_scale=0.05, v_scale=0.05) if dtype == torch.float8_e4m3fn else {}
    for _ in range(kb.nsets(kvbytes)):
        kc, vc = (kb.rand((nblk, bs, kb.HKV, kb.D), scale=4.0).to(dtype) for _ in range(2))
        tables = torch.randperm(nblk, device="cuda", generator=kb.GEN).view(B, ctx // bs).int()
        fns.append(lambda kc=kc, vc=vc, t=tables: llm_kernels.paged_decode_attention(q, kc, vc, t, lens, kb.D**-0.5,
                                                                                 **scales))
    t = kb.bench_rot(fns)
    del fns
    torch.cuda.empty_cache()
    return t, kvbytes + 2 * q.numel() * 2 + B * (ctx // bs) * 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "kv_fp8.json"))
    args = ap.parse_args()
    kb.GEN = torch.Generator(device="cuda").manual_seed(1234)
    bw, _ = kb.ceilings()
    rows = []
    for B, ctx in SHAPES:
        bf16, _ = decode_time(B, ctx, torch.bfloat16)
        fp8, nbytes = decode_time(B, ctx, torch.float8_e4m3fn)
        rows.append(kb.row("K2", f"B={B} ctx={ctx} fp8 KV", fp8, nbytes / bw, bf16,
                           0.75 if B >= 16 else None, 1.0, gbps=nbytes / fp8 / 1e9, bf16_us=bf16 * 1e6))
        r = rows[-1]
        print(f"K2 {r['case']:26} fp8 {fp8 * 1e6:8.1f} us  bf16 {bf16 * 1e6:8.1f} us  x bf16 "
              f"{r['ratio_to_peer']:.2f}  floor {r['ratio_to_floor']:.2f}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": bw / 1e9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
