"""End-to-end serving on one GPU (benchmarks/README.md E1, E1-fmt, E2, E3): random weights of real
shapes made on the GPU, closed-loop clients, our engine against transformers `generate` side by
side, every figure a ratio to the workload's floor or to a peer measured in the same run.

    python3 benchmarks/serve.py [--workloads E1 E2 E3] [--e1-weights awq fp8 bf16] [--out PATH]

E1: Qwen2.5-7B-AWQ shapes at concurrency 10 and 50, peer HF bf16 static batch.
E1-fmt: E1 in each weight format of --e1-weights (when it names more than AWQ), peer the bf16
    row of the same run.
E1-spec (--spec-too): E1 again with n-gram speculation on, peer the E1 row of the same run
    (no more than 3% slower: above its batch-size switch speculation turns itself off).
E2: Llama-3-70B-AWQ shapes at concurrency 50 (no peer).
E3: 768-token sequences in a 20 GB KV budget, our block manager vs reserving
    max_model_len=4096 per sequence (host only, no GPU needed).
Each E1 row carries a step profile: where the host time of a decode step goes, against the GPU
time of the same step (benchmarks/tools/step_profile.py). E4 (mixture of experts) is
benchmarks/moe.py, the FP8 KV cache's E1-kv benchmarks/kv.py.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path
from benchmarks.tools import step_profile  # noqa: E402

QWEN25_7B = dict(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
LLAMA3_70B = dict(arch="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                  rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
GROUP = 128


# E1's weight formats: an AWQ group size, "fp8" (llm-compressor's FP8_DYNAMIC: e4m3 weights per
# channel, dynamic per-token activations, through torch._scaled_mm) or None (bf16)
WEIGHTS = {"awq": GROUP, "fp8": "fp8", "bf16": None}
FP8_DYNAMIC = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                   "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                   "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                         "dynamic": True}}}}


def model_dir(shapes: dict, awq_group: int | str | None) -> str:
    """A checkpoint folder with config and tokenizer only (weights come from load_format=dummy);
    awq_group: an AWQ group size, "fp8" or None (see WEIGHTS)."""
    from transformers import LlamaConfig, Qwen2Config

    from tests.models import make_tokenizer

    from benchmarks import moe

    path = tempfile.mkdtemp(prefix="serve-model-")
    kw = {k: v for k, v in shapes.items() if k != "arch"}
    if shapes["arch"] == "qwen3_moe":
        cfg = moe.config(shapes)
    else:
        cfg = Qwen2Config(**kw) if shapes["arch"] == "qwen2" else LlamaConfig(**kw)
        cfg.architectures = ["Qwen2ForCausalLM" if shapes["arch"] == "qwen2" else "LlamaForCausalLM"]
    if awq_group == "fp8":
        cfg.quantization_config = FP8_DYNAMIC
    elif awq_group:
        cfg.quantization_config = {"quant_method": "awq", "bits": 4, "group_size": awq_group, "zero_point": True,
                                   "version": "gemm"}
    cfg.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path


def linear_params(shapes: dict) -> int:
    h, i, layers = shapes["hidden_size"], shapes["intermediate_size"], shapes["num_hidden_layers"]
    kv = shapes["num_key_value_heads"] * h // shapes["num_attention_heads"]
    return layers * (h * (h + 2 * kv) + h * h + 3 * h * i)


def weight_bytes(shapes: dict, awq_group: int | str | None) -> float:
    """Bytes one decode step reads: int4 linears with fp16 scales and int4 zeros (FP8: one byte
    a weight; None: bf16), bf16 lm_head."""
    linear = linear_params(shapes)
    head = shapes["vocab_size"] * shapes["hidden_size"] * 2
    if awq_group == "fp8":
        return linear + head
    if awq_group is None:
        return 2 * linear + head
    return linear / 2 + linear / awq_group * (2 + 0.5) + head


def kv_bytes_per_token(shapes: dict, element_bytes: int = 2) -> int:
    hd = shapes.get("head_dim") or shapes["hidden_size"] // shapes["num_attention_heads"]
    return shapes["num_hidden_layers"] * shapes["num_key_value_heads"] * hd * 2 * element_bytes


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def closed_loop(engine, concurrency: int, per_client: int, prompt_len: int, out_len: int, vocab: int,
                      tag: str = "c", loras=()):
    """loras: LoRARequests the requests take in turn (none: the base model)."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True, detokenize=False)
    rng = random.Random(f"{tag}{concurrency}")  # a warm-up wave's prompts share no prefix with the timed ones
    ttft, tpot, tokens = [], [], 0
    kv_used = []

    async def poll():
        while True:
            s = engine.stats()
            kv_used.append(s["kv_blocks_total"] - s["kv_blocks_free"])
            await asyncio.sleep(0.05)

    async def client(c):
        nonlocal tokens
        for r in range(per_client):
            prompt = {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(prompt_len)]}
            t0 = time.perf_counter()
            first = last = None
            n = 0
            lora = loras[(c * per_client + r) % len(loras)] if loras else None
            async for out in engine.generate(prompt, params, request_id=f"{tag}{concurrency}-{c}-{r}", lora_request=lora):
                now = time.perf_counter()
                first = first or now
                last = now
                n = len(out.outputs[0].token_ids)
            ttft.append(first - t0)
            tpot.append((last - first) / max(1, n - 1))
            tokens += n

    poller = asyncio.ensure_future(poll())
    t = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    wall = time.perf_counter() - t
    poller.cancel()
    return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall, "ttft_p50": pct(ttft, 0.5),
            "ttft_p99": pct(ttft, 0.99), "tpot_p50": pct(tpot, 0.5), "tpot_p99": pct(tpot, 0.99),
            "kv_blocks_used_max": max(kv_used or [0])}


def floor_seconds(shapes, awq_group, n_requests, concurrency, prompt_len, out_len, bw, peak, kv_element_bytes=2):
    """Sum over steps of max(bytes / bandwidth, FLOPs / peak): decode steps read all
    weights plus the running KV; prefill costs 2 x params FLOPs per token."""
    if shapes["arch"] == "qwen3_moe":
        from benchmarks import moe

        return moe.floor_seconds(shapes, awq_group, n_requests, concurrency, prompt_len, out_len, bw, peak)
    w = weight_bytes(shapes, awq_group)
    kvt = kv_bytes_per_token(shapes, kv_element_bytes)
    params = linear_params(shapes) + shapes["vocab_size"] * shapes["hidden_size"]
    waves = n_requests / concurrency
    decode = 0.0
    for step in range(out_len):
        ctx = prompt_len + step
        decode += max((w + concurrency * ctx * kvt) / bw, 2 * params * concurrency / peak)
    prefill = n_requests * prompt_len * 2 * params / peak
    return waves * decode + prefill


def measure_ceilings():
    from triton.testing import do_bench

    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    bw = 2 * x.numel() / (do_bench(lambda: y.copy_(x), warmup=25, rep=100, return_mode="median") * 1e-3)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    peak = 2 * 8192**3 / (do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median") * 1e-3)
    del x, y, a, b
    torch.cuda.empty_cache()
    return bw, peak


def hf_peer(shapes, batch, prompt_len, out_len):
    """transformers' model of the shapes in bf16 (random weights made on the GPU), static
    batch `generate`: output tok/s."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from benchmarks import moe

    if shapes["arch"] == "qwen3_moe":
        cfg = moe.config(shapes)
    else:
        cfg = Qwen2Config(**{k: v for k, v in shapes.items() if k != "arch"})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(100, shapes["vocab_size"] - 100, (batch, prompt_len), device="cuda")
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, min_new_tokens=out_len,
                       do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    del model
    torch.cuda.empty_cache()
    return batch * out_len / wall


def run_engine_workload(wid, shapes, concurrencies, per_client, prompt_len, out_len, bw, peak, peers, eager=False,
                        profile=True, kv_cache_dtype="auto", weights=GROUP, async_scheduling=True, path=None,
                        loras=(), **engine_kwargs):
    """path: the model folder (None: made here); loras: LoRARequests the requests take in turn
    (with enable_lora and its sizes in engine_kwargs)."""
    from engine import AsyncLLMEngine, EngineConfig

    path = path or model_dir(shapes, weights)
    t0 = time.perf_counter()
    engine = AsyncLLMEngine.from_config(EngineConfig(
        model=path, load_format="dummy", dtype="bfloat16", max_model_len=4096, max_num_seqs=max(concurrencies),
        gpu_memory_utilization=0.9, enforce_eager=eager, kv_cache_dtype=kv_cache_dtype,
        async_scheduling=async_scheduling, **engine_kwargs))
    load_s = time.perf_counter() - t0
    st = engine.stats()
    mem = engine.engine.memory
    print(f"{wid}: load+profile+capture {load_s:.0f}s, {st['kv_blocks_total']} KV blocks, GPU memory in use "
          f"{st.get('gpu_memory_fraction', 0):.3f}, {mem}", flush=True)
    rows = []
    for c in concurrencies:
        # one short wave first: the prefill kernels tune for this concurrency's batch shape outside the
        # timing (else whichever run comes first in a process pays it in its first wave's TTFT)
        asyncio.run(closed_loop(engine, c, 1, prompt_len, 4, shapes["vocab_size"], tag="warm", loras=loras))
        torch.cuda.reset_peak_memory_stats()
        res = asyncio.run(closed_loop(engine, c, per_client, prompt_len, out_len, shapes["vocab_size"], loras=loras))
        n = c * per_client
        floor = floor_seconds(shapes, weights, n, c, prompt_len, out_len, bw, peak,
                              kv_element_bytes=1 if kv_cache_dtype.startswith("fp8") else 2)
        free, total = torch.cuda.mem_get_info()
        res.update(concurrency=c, requests=n, floor_s=floor, peak_gpu_alloc_gib=torch.cuda.max_memory_allocated() / 2**30,
                   gpu_memory_fraction=(total - free) / total, kv_blocks_total=st["kv_blocks_total"],
                   ratio_to_floor=floor / res["wall_s"], peer_tok_s=peers.get(c), eager=eager, load_s=load_s,
                   kv_cache_dtype=kv_cache_dtype, async_scheduling=async_scheduling,
                   num_async_steps=engine.stats()["num_async_steps"])
        if profile:
            res["step_profile"] = step_profile.step_profile(engine.engine, c, prompt_len, shapes["vocab_size"])
        print(wid, json.dumps(res), flush=True)
        rows.append(res)
    asyncio.run(engine.shutdown())
    engine.engine.runner.graphs = None
    engine.engine.runner.free_kv_cache()
    del engine
    gc.collect()  # the model, its graphs and KV cache hold each other: free them before the next workload
    torch.cuda.empty_cache()
    return rows


def e3_rows(shapes=QWEN25_7B, budget_bytes=20e9, seq_len=768, reserve_len=4096, block_size=16, element_bytes=2):
    """Sequences of seq_len tokens that fit budget_bytes of KV: our block manager
    (allocated until it refuses) against reserving reserve_len tokens each (of a 16-bit
    cache: an FP8 cache, element_bytes=1, holds twice the tokens in the same bytes)."""
    from engine.block_manager import BlockManager
    from engine.sampling_params import SamplingParams
    from engine.sequence import Sequence

    per_token = kv_bytes_per_token(shapes, element_bytes)
    blocks = int(budget_bytes // (per_token * block_size))
    bm = BlockManager(blocks, block_size, enable_prefix_caching=False)
    rng = random.Random(3)
    seqs = []
    while True:
        seq = Sequence(f"e3-{len(seqs)}", None, [rng.randrange(1000) for _ in range(seq_len)],
                       SamplingParams(max_tokens=1), 1)
        if not bm.allocate_slots(seq, seq_len):
            break
        seqs.append(seq)
    used_tokens = sum(len(s.block_table) * block_size for s in seqs)
    waste_blocks = (used_tokens - seq_len * len(seqs)) / block_size / max(1, len(seqs))
    reserved = int(budget_bytes // (kv_bytes_per_token(shapes) * reserve_len))
    kv = "" if element_bytes == 2 else " fp8"
    return {"id": "E3", "case": f"{seq_len}-token sequences in {budget_bytes / 1e9:.0f} GB{kv} KV (Qwen2.5-7B)",
            "ratio_to_floor": None, "target_floor": None,
            "ratio_to_peer": round(len(seqs) / reserved, 2), "target_peer": 5.0,
            "paged_sequences": len(seqs), "reserved_sequences": reserved,
            "waste_blocks_per_sequence": waste_blocks, "kv_blocks": blocks}


def e1_row(rid: str, r: dict, case: str, peer_tok_s, target_floor, target_peer) -> dict:
    """A result row of one E1 run at one concurrency (run_engine_workload's dict r)."""
    return {"id": rid, "case": case, "ratio_to_floor": round(r["ratio_to_floor"], 3), "target_floor": target_floor,
            "ratio_to_peer": round(r["tok_s"] / peer_tok_s, 3) if peer_tok_s else None, "target_peer": target_peer,
            **{k: v for k, v in r.items() if k not in ("ratio_to_floor", "peer_tok_s")}, "peer_tok_s": peer_tok_s}


# E1-fmt's targets by format and concurrency: (of the floor, x the bf16 row of the same run)
FMT_TARGETS = {("awq", 10): (None, 1.8), ("awq", 50): (None, 1.05), ("fp8", 10): (None, 1.35),
               ("fp8", 50): (None, 1.15), ("bf16", 10): (0.75, None), ("bf16", 50): (0.80, None)}
FMT_NAMES = {"awq": "AWQ", "fp8": "FP8", "bf16": "bf16"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4}
SPEC_TARGET_PEER = 0.97  # x the same run without speculation: no workload more than 3% slower with it on


def e1_rows(args, bw, peak) -> list[dict]:
    """E1's runs: the HF peer first, then each weight format, then the variants asked for."""
    peers = {}
    if "awq" in args.e1_weights:
        for c in args.concurrency:  # the peer first, so our KV cache does not crowd it out
            peers[c] = None if args.skip_peer else hf_peer(QWEN25_7B, c, args.prompt_len, args.output_len)
            print(f"peer c={c}: {peers[c]} tok/s", flush=True)
    runs = {w: run_engine_workload(f"E1-{w}", QWEN25_7B, args.concurrency, args.requests_per_client,
                                   args.prompt_len, args.output_len, bw, peak, peers, weights=WEIGHTS[w])
            for w in args.e1_weights}
    variants = []
    if "awq" in runs and args.sync_too:
        variants.append(("synchronous steps", run_engine_workload(
            "E1-sync", QWEN25_7B, args.concurrency, args.requests_per_client, args.prompt_len, args.output_len, bw,
            peak, peers, async_scheduling=False)))
    if "awq" in runs and args.eager_too:
        variants.append(("eager", run_engine_workload(
            "E1-eager", QWEN25_7B, args.concurrency, args.requests_per_client, args.prompt_len, args.output_len, bw,
            peak, peers, eager=True, profile=False)))
    rows = []
    if "awq" in runs and args.spec_too:  # the same run with n-gram speculation on (its batch-size switch at work)
        plain = {r["concurrency"]: r["tok_s"] for r in runs["awq"]}
        for r in run_engine_workload("E1-spec", QWEN25_7B, args.concurrency, args.requests_per_client,
                                     args.prompt_len, args.output_len, bw, peak, peers, speculative_config=NGRAM):
            c = r["concurrency"]
            rows.append(e1_row("E1-spec", r, f"Qwen2.5-7B-AWQ c={c} ngram speculation", plain[c], None,
                               SPEC_TARGET_PEER))
    for suffix, rs in [("", runs.get("awq", []))] + [(" " + v, rs) for v, rs in variants]:
        for r in rs:
            c = r["concurrency"]
            rows.append(e1_row("E1", r, f"Qwen2.5-7B-AWQ c={c}{suffix}", peers.get(c), 0.65, 11 if c == 50 else 25))
    if len(runs) > 1:
        bf16 = {r["concurrency"]: r["tok_s"] for r in runs.get("bf16", [])}
        for w, rs in runs.items():
            for r in rs:
                c = r["concurrency"]
                tf, tp = FMT_TARGETS.get((w, c), (None, None))
                rows.append(e1_row("E1-fmt", r, f"Qwen2.5-7B-{FMT_NAMES[w]} c={c}",
                                   None if w == "bf16" else bf16.get(c), tf, tp) | {"weights": w})
    return rows


def e2_rows(args, bw, peak) -> list[dict]:
    rows = []
    for r in run_engine_workload("E2", LLAMA3_70B, [50], args.e2_requests_per_client, args.prompt_len,
                                 args.output_len, bw, peak, {}):
        rows.append(e1_row("E2", r, "Llama-3-70B-AWQ c=50", None, 0.6, None))
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'id':7} {'case':36} {'tok/s':>7} {'x peer':>7} {'floor':>6} {'ttft50/99':>11} {'tpot50/99 ms':>13} "
          f"{'mem':>5} {'kvmax':>6} {'gap ms':>7}")
    for r in rows:
        if r["id"] == "E3":
            print(f"E3      {r['case']:36} paged {r['paged_sequences']} vs reserved {r['reserved_sequences']}: "
                  f"{r['ratio_to_peer']}x (target {r['target_peer']:g}x), waste {r['waste_blocks_per_sequence']:.2f} "
                  "blocks/seq")
            continue
        prof = r.get("step_profile") or {}
        gap = prof.get("host_gap_s")
        print(f"{r['id']:7} {r['case']:36} {r['tok_s']:7.0f} {r['ratio_to_peer'] or 0:7.2f} {r['ratio_to_floor']:6.3f} "
              f"{r['ttft_p50']:5.2f}/{r['ttft_p99']:5.2f} {r['tpot_p50'] * 1e3:6.1f}/{r['tpot_p99'] * 1e3:6.1f} "
              f"{r['gpu_memory_fraction']:5.2f} {r['kv_blocks_used_max']:6d} "
              f"{gap * 1e3 if gap is not None else float('nan'):7.2f}")
        if prof:
            print("    step profile: " + ", ".join(f"{k} {v * 1e3:.2f}ms" for k, v in prof.items()
                                                   if k.endswith("_s") and v is not None))
    print(record.table(rows, 36))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["E1", "E2", "E3"], choices=["E1", "E2", "E3"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--e2-requests-per-client", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--skip-peer", action="store_true", help="E1 without the HF peer (its rows' ratio_to_peer null)")
    ap.add_argument("--sync-too", action="store_true",
                    help="also run E1 with async_scheduling off (every step waits for its samples)")
    ap.add_argument("--spec-too", action="store_true",
                    help="also run E1 with n-gram speculation on (E1-spec rows: x E1 without it, same run)")
    ap.add_argument("--eager-too", action="store_true", help="also run E1 with enforce_eager (graphs vs eager)")
    ap.add_argument("--e1-weights", nargs="+", default=["awq"], choices=list(WEIGHTS),
                    help="E1's weight formats, each its own engine; E1's rows come from awq, E1-fmt's from all "
                         "when there are several (the bf16 run is their peer)")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    rows = []
    if "E3" in args.workloads:
        rows += [e3_rows(), e3_rows(element_bytes=1) | {"target_peer": 10.0}]  # FP8 cache: twice the 16-bit target
        record.save(rows, args.out)
    bw = peak = None
    if {"E1", "E2"} & set(args.workloads):
        bw, peak = measure_ceilings()
        print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 {peak / 1e12:.0f} TFLOP/s", flush=True)
    ceiling = {} if bw is None else {"copy_GBps": bw / 1e9, "bf16_TFLOPs": peak / 1e12}
    for wid, fn in (("E1", e1_rows), ("E2", e2_rows)):
        if wid in args.workloads:
            rows += [r | ceiling for r in fn(args, bw, peak)]
            record.save(rows, args.out)  # what is done so far survives a later failure
    print_rows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
