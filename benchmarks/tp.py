"""E1-tp (benchmarks/README.md): tensor parallelism on the GPUs of one host. The E1 workload
(Qwen2.5-7B-AWQ shapes, random weights, 512-token prompts, 256 output tokens, closed-loop
clients) at tensor_parallel_size 1 and 2, each size in its own process; rows: output tok/s as a
ratio to the workload's floor (t GPUs: t times the bandwidth and FLOP rate measured on one) and
to tp=1 of the same run.

    NCCL_NVLS_ENABLE=0 python3 benchmarks/tp.py [--tp 1 2] [--concurrency 10 50] [--requests 200] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record, serve  # noqa: E402 - after the repository root is on the path

QWEN25_7B = serve.QWEN25_7B


def closed_loop(engine, concurrency: int, requests: int, prompt_len: int, output_len: int, seed: int) -> dict:
    """`concurrency` requests in flight until `requests` are done; output tok/s over the wall time."""
    from engine import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    started = done = tokens = 0
    tpots = []
    t0 = time.monotonic()
    while done < requests:
        while started < requests and started - done < concurrency:
            ids = [rng.randrange(5, QWEN25_7B["vocab_size"]) for _ in range(prompt_len)]
            engine.add_request(f"r{seed}-{started}", {"prompt_token_ids": ids}, params)
            started += 1
        for out in engine.step():
            if out.finished:
                done += 1
                n = len(out.outputs[0].token_ids)
                tokens += n
                m = out.metrics
                if n > 1 and m["first_token_time"]:
                    tpots.append((m["finished_time"] - m["first_token_time"]) / (n - 1))
    wall = time.monotonic() - t0
    tpots.sort()
    return {"concurrency": concurrency, "requests": requests, "tok_s": tokens / wall, "wall_s": wall,
            "tpot_p50_ms": 1e3 * tpots[len(tpots) // 2] if tpots else None}


def single(tp: int, args) -> list[dict]:
    from engine import EngineConfig, LLMEngine

    bw, peak = serve.measure_ceilings()  # one GPU's, before the engine takes the memory
    engine = LLMEngine(EngineConfig(model=serve.model_dir(QWEN25_7B, serve.GROUP), load_format="dummy",
                                    tensor_parallel_size=tp, max_model_len=2048, gpu_memory_utilization=0.9))
    try:
        closed_loop(engine, 4, 8, args.prompt_len, 16, seed=999)  # warm-up: prefill kernels compile
        rows = []
        for c in args.concurrency:
            n = max(args.requests, c)
            r = closed_loop(engine, c, n, args.prompt_len, args.output_len, seed=c)
            floor = serve.floor_seconds(QWEN25_7B, serve.GROUP, n, c, args.prompt_len, args.output_len, tp * bw,
                                        tp * peak)
            rows.append({"tp": tp, **r, "floor_s": floor, "ratio_to_floor": floor / r["wall_s"],
                         "kv_blocks": engine.stats()["kv_blocks_total"], "copy_GBps": bw / 1e9,
                         "bf16_TFLOPs": peak / 1e12})
            print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        engine.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--single", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    if args.single is not None:
        print("RESULT " + json.dumps(single(args.single, args)), flush=True)
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    runs = []
    for tp in args.tp:
        cmd = [sys.executable, os.path.abspath(__file__), "--single", str(tp), "--requests", str(args.requests),
               "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len),
               "--concurrency", *map(str, args.concurrency)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"tp={tp} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}", flush=True)
            continue
        runs += json.loads(lines[-1][len("RESULT "):])
    base = {r["concurrency"]: r["tok_s"] for r in runs if r["tp"] == 1}
    rows = [{"id": "E1-tp", "case": f"Qwen2.5-7B-AWQ tp={r['tp']} c={r['concurrency']}",
             "ratio_to_floor": round(r["ratio_to_floor"], 3), "target_floor": None,
             "ratio_to_peer": round(r["tok_s"] / base[r["concurrency"]], 3)
             if r["tp"] != 1 and r["concurrency"] in base else None, "target_peer": None,
             **{k: v for k, v in r.items() if k != "ratio_to_floor"}} for r in runs]
    if rows:
        record.save(rows, args.out)
    print("| tp | concurrency | requests | output tok/s | TPOT p50 ms | of floor | ratio to tp=1 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['tp']} | {r['concurrency']} | {r['requests']} | {r['tok_s']:.0f} | "
              f"{r['tpot_p50_ms'] or 0:.2f} | {r['ratio_to_floor']} | {r['ratio_to_peer']} |")


if __name__ == "__main__":
    main()
