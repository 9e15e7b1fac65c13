"""End-to-end serving benchmark on one GPU (BENCHMARKS.md E1; E2 and E3 are
still to come, see issue 5): random weights of real shapes made on the GPU,
closed-loop clients, our engine against transformers `generate` side by side.

    python benchmarks/serve.py [--requests-per-client 2] [--concurrency 10 50] [--out serve.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)


def model_dir(shapes: dict, awq_group: int | None) -> str:
    """A checkpoint folder with config and tokenizer only (weights come from load_format=dummy)."""
    from transformers import Qwen2Config

    from tests.models import make_tokenizer

    path = tempfile.mkdtemp(prefix="serve-model-")
    cfg = Qwen2Config(**shapes)
    cfg.architectures = ["Qwen2ForCausalLM"]
    if awq_group:
        cfg.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": awq_group, "zero_point": True,
                                   "version": "gemm"}
    cfg.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


def weight_bytes(shapes: dict, awq_group: int) -> float:
    h, i, layers = shapes["hidden_size"], shapes["intermediate_size"], shapes["num_hidden_layers"]
    kv = shapes["num_key_value_heads"] * h // shapes["num_attention_heads"]
    linear = layers * (h * (h + 2 * kv) + h * h + 3 * h * i)
    int4 = linear / 2 + linear / awq_group * (2 + 0.5)  # scales fp16 + zeros int4 per group
    lm_head = shapes["vocab_size"] * h * 2
    return int4 + lm_head


def kv_bytes_per_token(shapes: dict) -> int:
    hd = shapes["hidden_size"] // shapes["num_attention_heads"]
    return shapes["num_hidden_layers"] * shapes["num_key_value_heads"] * hd * 2 * 2


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def closed_loop(engine, concurrency: int, per_client: int, prompt_len: int, out_len: int, vocab: int):
    from engine import SamplingParams

    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True, detokenize=False)
    rng = random.Random(0)
    ttft, tpot, tokens = [], [], 0

    async def client(c):
        nonlocal tokens
        for r in range(per_client):
            prompt = {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]}
            t0 = time.perf_counter()
            first = last = None
            n = 0
            async for out in engine.generate(prompt, params, request_id=f"c{c}-{r}"):
                now = time.perf_counter()
                first = first or now
                last = now
                n = len(out.outputs[0].token_ids)
            ttft.append(first - t0)
            tpot.append((last - first) / max(1, n - 1))
            tokens += n

    t = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    wall = time.perf_counter() - t
    return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall, "ttft_p50": pct(ttft, 0.5),
            "ttft_p99": pct(ttft, 0.99), "tpot_p50": pct(tpot, 0.5), "tpot_p99": pct(tpot, 0.99)}


def floor_seconds(shapes, awq_group, n_requests, concurrency, prompt_len, out_len, bw, peak):
    """Sum over steps of max(bytes / bandwidth, FLOPs / peak): decode steps read all
    weights plus the running KV; prefill costs 2 x params FLOPs per token."""
    w = weight_bytes(shapes, awq_group)
    kvt = kv_bytes_per_token(shapes)
    h, i, layers = shapes["hidden_size"], shapes["intermediate_size"], shapes["num_hidden_layers"]
    kv = shapes["num_key_value_heads"] * h // shapes["num_attention_heads"]
    params = layers * (h * (h + 2 * kv) + h * h + 3 * h * i) + shapes["vocab_size"] * h
    waves = n_requests / concurrency
    decode = 0.0
    for step in range(out_len):
        ctx = prompt_len + step
        decode += max((w + concurrency * ctx * kvt) / bw, 2 * params * concurrency / peak)
    prefill = n_requests * prompt_len * 2 * params / peak
    return waves * decode + prefill


def measure_ceilings():
    x = torch.empty(2**30 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 2 * 20 / (time.perf_counter() - t)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    peak = 2 * 8192**3 * 10 / (time.perf_counter() - t)
    del x, y, a
    torch.cuda.empty_cache()
    return bw, peak


def hf_peer(shapes, batch, prompt_len, out_len):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shapes)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(100, shapes["vocab_size"] - 100, (batch, prompt_len), device="cuda")
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, min_new_tokens=out_len,
                       do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    del model
    torch.cuda.empty_cache()
    return batch * out_len / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "serve.json"))
    args = ap.parse_args()
    from engine import AsyncLLMEngine, EngineConfig

    bw, peak = measure_ceilings()
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 {peak / 1e12:.0f} TFLOP/s", flush=True)
    peers = {}
    for c in args.concurrency:  # the peer first, so our KV cache does not crowd it out
        peers[c] = None if args.skip_peer else hf_peer(QWEN25_7B, c, args.prompt_len, args.output_len)
        print(f"peer c={c}: {peers[c]} tok/s", flush=True)
    group = 128
    path = model_dir(QWEN25_7B, group)
    rows = []
    engine = AsyncLLMEngine.from_config(EngineConfig(
        model=path, load_format="dummy", dtype="bfloat16", max_model_len=4096, max_num_seqs=max(args.concurrency),
        gpu_memory_utilization=0.9))
    stats0 = engine.stats()
    print(f"engine: {stats0['kv_blocks_total']} KV blocks, {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    for c in args.concurrency:
        torch.cuda.reset_peak_memory_stats()
        res = asyncio.run(closed_loop(engine, c, args.requests_per_client, args.prompt_len, args.output_len,
                                      QWEN25_7B["vocab_size"]))
        n = c * args.requests_per_client
        floor = floor_seconds(QWEN25_7B, group, n, c, args.prompt_len, args.output_len, bw, peak)
        res.update(concurrency=c, requests=n, floor_s=floor, peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30,
                   ratio_to_floor=floor / res["wall_s"], peer_tok_s=peers[c], steps=engine.stats()["num_steps"])
        print(res, flush=True)
        rows.append(res)
    table = []
    for r in rows:
        target_peer = 11 if r["concurrency"] == 50 else 25
        table.append({"id": "E1", "case": f"Qwen2.5-7B-AWQ c={r['concurrency']} n={r['requests']}",
                      "ratio_to_floor": round(r["ratio_to_floor"], 3), "target_floor": 0.65,
                      "ratio_to_peer": round(r["tok_s"] / r["peer_tok_s"], 2) if r["peer_tok_s"] else None,
                      "target_peer": target_peer, **{k: r[k] for k in r if k not in ("ratio_to_floor",)}})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"copy_bw": bw, "bf16_peak": peak, "kv_blocks_total": stats0["kv_blocks_total"], "rows": table},
                  f, indent=2)
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 {peak / 1e12:.0f} TFLOP/s; kv blocks {stats0['kv_blocks_total']}")
    print(f"{'case':34} {'tok/s':>8} {'peer':>7} {'x peer':>7} {'floor':>6} {'ttft50':>7} {'tpot50':>7} {'peakGiB':>7}")
    for r in table:
        print(f"{r['case']:34} {r['tok_s']:8.0f} {r['peer_tok_s'] or 0:7.0f} {r['ratio_to_peer'] or 0:7.2f} "
              f"{r['ratio_to_floor']:6.3f} {r['ttft_p50']:7.3f} {r['tpot_p50'] * 1e3:6.1f}ms {r['peak_gpu_gib']:7.1f}")


if __name__ == "__main__":
    main()
