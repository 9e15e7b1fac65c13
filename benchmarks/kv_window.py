"""KV held by one long sequence of a model whose every layer slides (Mistral 7B v0.1: a
4,096-token window, 32 layers, 8 KV heads of 128): our scheduler and block manager (no
model: host only) releasing the blocks below the window, against keeping every block
(what the cache did before the window was honoured, and what a full-attention layer needs).

    python benchmarks/kv_window.py [--prompt 32768] [--output 256] [--out benchmarks/results/kv_window.json]

Rows: ratio_to_floor = the fewest blocks a step can need (the window's and the chunk's)
over the most the sequence held; ratio_to_peer = blocks held without releasing over with.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MISTRAL_7B = dict(window=4096, layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32768)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens (the prefill chunk)")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "kv_window.json"))
    args = ap.parse_args()
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
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": [row]}, f, indent=2)
    print(f"{row['case']}: held {released} blocks ({row['kv_gib_released']:.2f} GiB) releasing below the window, "
          f"{kept} ({row['kv_gib_kept']:.2f} GiB) keeping all: {row['ratio_to_peer']}x less; "
          f"floor {floor} blocks ({row['ratio_to_floor']} of it)")


if __name__ == "__main__":
    main()
