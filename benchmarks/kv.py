"""KV cache benchmarks (benchmarks/README.md), each against a peer in the same run:

K2-fp8  paged decode attention reading an FP8 KV cache (kv_cache_dtype="fp8", e4m3 with
        per-tensor scales) against the same kernel reading bf16, and against the FP8 cache's
        bytes floor; K2's shapes, timing and floors (benchmarks/kernel_bench.py). CUDA.
E1-kv   the E1 workload (benchmarks/serve.py) with an FP8 KV cache against the same run with a
        bf16 one, each its own engine in this process. CUDA.
SW1     the KV one long sequence of a model whose every layer slides holds (Mistral 7B v0.1: a
        4,096-token window, 32 layers, 8 KV heads of 128): our scheduler and block manager
        releasing the blocks below the window, against keeping every block (what a
        full-attention layer needs). Host only, no model.

    python3 benchmarks/kv.py [--only K2-fp8,E1-kv,SW1] [--out PATH]   # default: all on CUDA, SW1 without
"""
from __future__ import annotations

import argparse
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path

K2_SHAPES = [(1, 4096), (16, 4096), (64, 2048), (64, 8192), (256, 1024)]
MISTRAL_7B = dict(window=4096, layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)


def decode_time(B, ctx, dtype, bs=16):
    """Seconds per paged decode over B sequences of ctx tokens, the cache in dtype."""
    import torch

    import llm_kernels
    from benchmarks import kernel_bench as kb

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


def k2_fp8() -> list[dict]:
    import torch

    from benchmarks import kernel_bench as kb

    kb.GEN = torch.Generator(device="cuda").manual_seed(1234)
    bw, _ = kb.ceilings()
    rows = []
    for B, ctx in K2_SHAPES:
        bf16, _ = decode_time(B, ctx, torch.bfloat16)
        fp8, nbytes = decode_time(B, ctx, torch.float8_e4m3fn)
        rows.append(kb.row("K2-fp8", f"B={B} ctx={ctx}", fp8, nbytes / bw, bf16, 0.75 if B >= 16 else None, 1.0,
                           gbps=nbytes / fp8 / 1e9, bf16_us=bf16 * 1e6, copy_GBps=bw / 1e9))
        r = rows[-1]
        print(f"K2-fp8 {r['case']:18} fp8 {fp8 * 1e6:8.1f} us  bf16 {bf16 * 1e6:8.1f} us  x bf16 "
              f"{r['ratio_to_peer']:.2f}  floor {r['ratio_to_floor']:.2f}", flush=True)
    return rows


def e1_kv(args) -> list[dict]:
    """E1 with kv_cache_dtype fp8 against auto (bf16), AWQ weights, the HF peer skipped."""
    from benchmarks import serve

    bw, peak = serve.measure_ceilings()
    runs = {kv: serve.run_engine_workload(f"E1-kv-{kv}", serve.QWEN25_7B, args.concurrency,
                                          args.requests_per_client, 512, 256, bw, peak, {}, kv_cache_dtype=kv)
            for kv in ("auto", "fp8")}
    peer = {r["concurrency"]: r["tok_s"] for r in runs["auto"]}
    return [serve.e1_row("E1-kv", r, f"Qwen2.5-7B-AWQ c={r['concurrency']} fp8 KV", peer[r["concurrency"]], 0.65, 1.0)
            | {"peer": "the same run with a bf16 KV cache", "copy_GBps": bw / 1e9, "bf16_TFLOPs": peak / 1e12}
            for r in runs["fp8"]]


def peak_blocks(prompt: int, output: int, window: int | None, block_size: int, budget: int) -> tuple[int, int]:
    """(the most blocks the sequence held at once, steps) running it to the end."""
    from engine.block_manager import BlockManager
    from engine.sampler import SampleResult
    from engine.sampling_params import SamplingParams
    from engine.scheduler import Scheduler
    from engine.sequence import Sequence

    total = -(-(prompt + output) // block_size) + 2
    bm = BlockManager(total, block_size, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=budget)
    sched.window = window
    rng = random.Random(0)
    seq = Sequence("long", None, [rng.randrange(1000) for _ in range(prompt)], SamplingParams(max_tokens=output),
                   output)
    sched.add(seq)
    peak = steps = 0
    while seq.num_output_tokens < output:
        out = sched.schedule()
        peak = max(peak, bm.num_blocks - bm.num_free_blocks)
        samples = [SampleResult(rng.randrange(1000), 0.0, None) if s.num_computed_tokens + n == s.num_tokens else None
                   for s, n in out.scheduled]
        sched.update_from_output(out.scheduled, samples)
        steps += 1
    return peak, steps


def sw1(args) -> list[dict]:
    m = MISTRAL_7B
    per_block = m["layers"] * m["kv_heads"] * m["head_dim"] * 2 * m["dtype_bytes"] * args.block_size
    kept, _ = peak_blocks(args.prompt, args.output, None, args.block_size, args.budget)
    released, steps = peak_blocks(args.prompt, args.output, m["window"], args.block_size, args.budget)
    floor = -(-(m["window"] + args.budget) // args.block_size)
    row = {"id": "SW1", "case": f"Mistral-7B window {m['window']}, {args.prompt} + {args.output} tokens, "
                                f"chunk {args.budget}, block {args.block_size}",
           "ratio_to_floor": round(floor / released, 3), "target_floor": None,
           "ratio_to_peer": round(kept / released, 2), "target_peer": None,
           "blocks_held_released": released, "blocks_held_kept": kept, "blocks_floor": floor,
           "kv_gib_released": released * per_block / 2**30, "kv_gib_kept": kept * per_block / 2**30, "steps": steps}
    print(f"SW1 {row['case']}: held {released} blocks ({row['kv_gib_released']:.2f} GiB) releasing below the "
          f"window, {kept} ({row['kv_gib_kept']:.2f} GiB) keeping all: {row['ratio_to_peer']}x less; "
          f"floor {floor} blocks ({row['ratio_to_floor']} of it)")
    return [row]


def main():
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="K2-fp8,E1-kv,SW1" if torch.cuda.is_available() else "SW1")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50], help="E1-kv's")
    ap.add_argument("--requests-per-client", type=int, default=2, help="E1-kv's")
    ap.add_argument("--prompt", type=int, default=32768, help="SW1's prompt tokens")
    ap.add_argument("--output", type=int, default=256, help="SW1's output tokens")
    ap.add_argument("--block-size", type=int, default=16, help="SW1's")
    ap.add_argument("--budget", type=int, default=2048, help="SW1's max_num_batched_tokens (the prefill chunk)")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    only = args.only.split(",")
    rows = []
    for rid, fn in (("SW1", lambda: sw1(args)), ("K2-fp8", k2_fp8), ("E1-kv", lambda: e1_kv(args))):
        if rid in only:
            rows += fn()
            record.save(rows, args.out)
    print(record.table(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
