"""Tensor parallelism on the GPUs of one host: the E1 workload (Qwen2.5-7B-AWQ
shapes, random weights, 512-token prompts, 256 output tokens, closed-loop
clients) at tensor_parallel_size 1 and 2; prints output tok/s per size and
the throughput ratio to size 1. Each size runs in its own process.

    NCCL_NVLS_ENABLE=0 python benchmarks/tp.py [--tp 1 2] [--concurrency 10 50] [--requests 200] [--out tp.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)


def model_dir() -> str:
    """Config and tokenizer only: the weights come from load_format=dummy on each rank."""
    from transformers import Qwen2Config

    from tests.models import make_tokenizer

    path = tempfile.mkdtemp(prefix="tp-model-")
    cfg = Qwen2Config(**QWEN25_7B)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                               "version": "gemm"}
    cfg.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


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

    engine = LLMEngine(EngineConfig(model=model_dir(), load_format="dummy", tensor_parallel_size=tp,
                                    max_model_len=2048, gpu_memory_utilization=0.9))
    try:
        closed_loop(engine, 4, 8, args.prompt_len, 16, seed=999)  # warm-up: prefill kernels compile
        rows = []
        for c in args.concurrency:
            r = closed_loop(engine, c, max(args.requests, c), args.prompt_len, args.output_len, seed=c)
            rows.append({"tp": tp, **r, "kv_blocks": engine.stats()["kv_blocks_total"]})
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
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", ROOT), "tp.json"))
    args = ap.parse_args()
    if args.single is not None:
        print("RESULT " + json.dumps(single(args.single, args)), flush=True)
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rows = []
    for tp in args.tp:
        cmd = [sys.executable, os.path.abspath(__file__), "--single", str(tp), "--requests", str(args.requests),
               "--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len),
               "--concurrency", *map(str, args.concurrency)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"tp={tp} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}", flush=True)
            continue
        rows += json.loads(lines[-1][len("RESULT "):])
    base = {r["concurrency"]: r["tok_s"] for r in rows if r["tp"] == 1}
    for r in rows:
        r["ratio_to_tp1"] = round(r["tok_s"] / base[r["concurrency"]], 3) if r["concurrency"] in base else None
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print("| tp | concurrency | requests | output tok/s | TPOT p50 ms | ratio to tp=1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['tp']} | {r['concurrency']} | {r['requests']} | {r['tok_s']:.0f} | "
              f"{r['tpot_p50_ms'] or 0:.2f} | {r['ratio_to_tp1']} |")


if __name__ == "__main__":
    main()
