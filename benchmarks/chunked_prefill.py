"""E1-chunked (benchmarks/README.md): E1 with chunked prefill under load. 50 clients decode
(512-token prompts, 256 tokens out) while new 2,048-token prompts arrive, the token budget
small enough that each arrival is prefilled in chunks beside the 50 decodes (mixed steps).
The same run twice in one process: mixed steps replaying CUDA graphs (engine.mixed_graphs) and
eagerly (max_cudagraph_tokens=0); decode-only steps replay their graphs in both.

    python3 benchmarks/chunked_prefill.py [--budget 512] [--arrivals 12] [--every 0.15] [--out PATH]

Row: ratio_to_peer = tok/s with mixed graphs / tok/s eager (same workload, same process),
ratio_to_floor = the floor (decode steps' bytes, the arrivals' prefill FLOPs) / wall time.
Each engine runs the whole workload once untimed first (short outputs), so kernels tune
for the mixed steps' shapes outside the timing."""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record, serve  # noqa: E402 - after the repository root is on the path


async def load_run(engine, args, out_len: int, tag: str) -> dict:
    """The decoding clients and the arrivals together; per-kind latencies."""
    from engine import SamplingParams

    vocab = serve.QWEN25_7B["vocab_size"]
    rng = random.Random(tag)
    decode_tpot, arrival_ttft, tokens = [], [], 0

    async def one(prompt_len, max_tokens, rid, sink):
        nonlocal tokens
        prompt = {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]}
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        first = last = None
        n = 0
        async for out in engine.generate(prompt, params, request_id=rid):
            last = time.perf_counter()
            first = first or last
            n = len(out.outputs[0].token_ids)
        tokens += n
        sink.append((first - t0, (last - first) / max(1, n - 1)))

    async def arrivals():
        await asyncio.sleep(args.start)
        tasks = []
        for i in range(args.arrivals):
            tasks.append(asyncio.ensure_future(one(args.arrival_len, args.arrival_out, f"{tag}-a{i}", arrival_ttft)))
            await asyncio.sleep(args.every)
        await asyncio.gather(*tasks)

    t = time.perf_counter()
    await asyncio.gather(arrivals(), *(one(args.prompt_len, out_len, f"{tag}-d{c}", decode_tpot)
                                       for c in range(args.concurrency)))
    wall = time.perf_counter() - t
    tpots = [tp for _, tp in decode_tpot]
    ttfts = [tf for tf, _ in arrival_ttft]
    return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall,
            "decode_tpot_p50": serve.pct(tpots, 0.5), "decode_tpot_p99": serve.pct(tpots, 0.99),
            "arrival_ttft_p50": serve.pct(ttfts, 0.5), "arrival_ttft_p99": serve.pct(ttfts, 0.99)}


def floor_seconds(args, bw, peak) -> float:
    """The 50 streams' decode floor (serve.floor_seconds) plus the arrivals' prefill FLOPs."""
    shapes = serve.QWEN25_7B
    params = serve.linear_params(shapes) + shapes["vocab_size"] * shapes["hidden_size"]
    decode = serve.floor_seconds(shapes, serve.GROUP, args.concurrency, args.concurrency, args.prompt_len,
                                 args.output_len, bw, peak)
    return decode + args.arrivals * args.arrival_len * 2 * params / peak


def run(args, graph_tokens: int, bw, peak) -> dict:
    from engine import AsyncLLMEngine, EngineConfig

    path = serve.model_dir(serve.QWEN25_7B, serve.GROUP)
    t0 = time.perf_counter()
    engine = AsyncLLMEngine.from_config(EngineConfig(
        model=path, load_format="dummy", dtype="bfloat16", max_model_len=4096, max_num_seqs=args.concurrency + 16,
        max_num_batched_tokens=args.budget, gpu_memory_utilization=0.9, max_cudagraph_tokens=graph_tokens))
    load_s = time.perf_counter() - t0
    runner = engine.engine.runner
    asyncio.run(load_run(engine, args, 8, f"warm{graph_tokens}"))
    steps0 = engine.stats().get("num_steps")
    replays0 = runner.mixed.replays if runner.mixed else 0
    res = asyncio.run(load_run(engine, args, args.output_len, f"timed{graph_tokens}"))
    res.update(load_s=load_s, max_cudagraph_tokens=graph_tokens, budget=args.budget,
               mixed_graphs=runner.mixed.sizes if runner.mixed else [],
               mixed_capture_s=runner.mixed.capture_seconds if runner.mixed else 0.0,
               mixed_graph_replays=(runner.mixed.replays if runner.mixed else 0) - replays0,
               floor_s=floor_seconds(args, bw, peak), steps=(engine.stats().get("num_steps") or 0) - (steps0 or 0))
    res["ratio_to_floor"] = res["floor_s"] / res["wall_s"]
    print(json.dumps(res), flush=True)
    asyncio.run(engine.shutdown())
    runner.graphs = runner.mixed = None
    runner.free_kv_cache()
    del engine, runner
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--arrivals", type=int, default=12)
    ap.add_argument("--arrival-len", type=int, default=2048)
    ap.add_argument("--arrival-out", type=int, default=16)
    ap.add_argument("--start", type=float, default=0.5, help="seconds before the first arrival")
    ap.add_argument("--every", type=float, default=0.15, help="seconds between arrivals")
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens (the chunk + the decodes)")
    ap.add_argument("--graph-tokens", type=int, default=512, help="max_cudagraph_tokens of the graphed run")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    bw, peak = serve.measure_ceilings()
    eager = run(args, 0, bw, peak)
    graphs = run(args, args.graph_tokens, bw, peak)
    case = (f"Qwen2.5-7B-AWQ c={args.concurrency} + {args.arrivals} x {args.arrival_len}-token arrivals, "
            f"budget {args.budget}")
    ceiling = {"copy_GBps": bw / 1e9, "bf16_TFLOPs": peak / 1e12}
    rows = [{"id": "E1-chunked", "case": case + ", mixed steps in CUDA graphs",
             "ratio_to_floor": round(graphs["ratio_to_floor"], 3), "target_floor": 0.5,
             "ratio_to_peer": round(graphs["tok_s"] / eager["tok_s"], 3), "target_peer": 1.0,
             "peer": "the same run with eager mixed steps",
             **{k: v for k, v in graphs.items() if k != "ratio_to_floor"}, **ceiling},
            {"id": "E1-chunked", "case": case + ", mixed steps eager",
             "ratio_to_floor": round(eager["ratio_to_floor"], 3), "target_floor": 0.5,
             "ratio_to_peer": None, "target_peer": None,
             **{k: v for k, v in eager.items() if k != "ratio_to_floor"}, **ceiling}]
    record.save(rows, args.out)
    for r in rows:
        print(f"{r['case']}: {r['tok_s']:.0f} tok/s, x eager {r['ratio_to_peer']}, floor {r['ratio_to_floor']}, "
              f"decode TPOT p50/p99 {r['decode_tpot_p50'] * 1e3:.1f}/{r['decode_tpot_p99'] * 1e3:.1f} ms, "
              f"arrival TTFT p50/p99 {r['arrival_ttft_p50']:.2f}/{r['arrival_ttft_p99']:.2f} s")


if __name__ == "__main__":
    main()
