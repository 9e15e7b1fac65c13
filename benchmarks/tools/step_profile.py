"""Where a decode step's time goes. step_profile(): the host time of decode steps by phase
(schedule, execute, sample, wait, postprocess) against the GPU time of the same forward (its
CUDA graph replayed alone), and the host gap between them; benchmarks/serve.py puts it in its
rows. Run as a script: an engine of E1's, a small or E4's shapes (random weights) at the given
batch sizes, that profile and a torch.profiler trace of steady decode steps: the device's
kernels and copies by time (each charged its time past the end of the work before it, so a
kernel's wait under programmatic dependent launch is not counted as its own), by kernel
family, and the device's idle time between them.

    python3 benchmarks/tools/step_profile.py [--shapes qwen2.5-7b|qwen2.5-0.5b|qwen3-30b-a3b]
        [--batch 10 50] [--steps 20] [--sync] [--eager] [--max-cudagraph-tokens 0] [--lora N] [--out DIR]

--eager runs the steps without CUDA graphs, one launch a kernel (the graphs replay the same
kernels); --sync turns asynchronous scheduling off; --out writes a chrome trace a batch size
and summary.json. --lora N: N random rank-16 adapters on every projection
(benchmarks/lora_serve.py's), taken in turn by the traced requests, then the same steps without
adapters (trace-B-base).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

QWEN25_05B = dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
# a kernel's family: the first key its name contains
FAMILIES = (("_shrink_", "LoRA"), ("_expand_", "LoRA"), ("moe", "MoE"), ("_route_kernel", "MoE"), ("_align_kernel", "MoE"),
            ("w4a16", "W4A16 GEMM"), ("awq", "W4A16 GEMM"), ("kpack", "W4A16 GEMM"), ("_wide_tile", "W4A16 GEMM"),
            ("fp8", "FP8 GEMM"), ("scaled_mm", "FP8 GEMM"), ("w8a16", "FP8 GEMM"), ("_dequant_kernel", "FP8 GEMM"),
            ("quant_kernel", "FP8 activation quant"), ("decode", "paged decode attention"),
            ("prefill", "prefill attention"), ("rms", "RMSNorm"), ("rotary", "rotary"), ("silu", "SiLU-mul"),
            ("act_and_mul", "SiLU-mul"), ("write_kv", "KV write"), ("logits", "sampling"), ("sampl", "sampling"),
            ("token_mask", "structured output"), ("gemm", "cuBLAS"),
            ("nvjet", "cuBLAS"), ("sm90", "cuBLAS"), ("cutlass", "cuBLAS"), ("memcpy", "copies"),
            ("memset", "copies"))


def step_profile(llm_engine, concurrency: int, prompt_len: int, vocab: int, steps: int = 40) -> dict:
    """Host time of decode steps split by phase, against the GPU time of the
    same forward (the graph of that batch replayed alone)."""
    from engine import SamplingParams

    eng = llm_engine
    rng = random.Random(7)
    params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(concurrency):
        eng.add_request(f"prof-{concurrency}-{i}", {"prompt_token_ids": [rng.randrange(100, vocab - 100)
                                                                       for _ in range(prompt_len)]}, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.requests.values()):
        eng.step()
    eng.step()
    from engine.sampler import PendingSamples

    phases = {"schedule": 0.0, "execute": 0.0, "sample": 0.0, "wait": 0.0, "postprocess": 0.0}

    def timed(obj, name, key):
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[key] += time.perf_counter() - t
        setattr(obj, name, wrapper)
        return fn

    saved = [(eng.scheduler, "schedule", timed(eng.scheduler, "schedule", "schedule")),
             (eng.runner, "execute", timed(eng.runner, "execute", "execute")),
             (eng.sampler, "launch", timed(eng.sampler, "launch", "sample")),
             (PendingSamples, "result", timed(PendingSamples, "result", "wait")),
             (eng.scheduler, "update_from_output", timed(eng.scheduler, "update_from_output", "postprocess")),
             (eng, "_postprocess", timed(eng, "_postprocess", "postprocess"))]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    wall = (time.perf_counter() - t) / steps
    for obj, name, fn in saved:
        if obj is PendingSamples:
            setattr(obj, name, fn)
        else:
            delattr(obj, name)  # the instance's wrapper: the class's method again
    gpu = None
    graphs = eng.runner.graphs
    if graphs is not None:
        bs = graphs.padded_size(concurrency)
        graph = graphs.graphs[bs, False][0]  # its requests use no adapter
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        end.synchronize()
        gpu = start.elapsed_time(end) * 1e-3 / 10
    for rid in list(eng.requests):
        eng.abort_request(rid)
    per = {k: v / steps for k, v in phases.items()}
    return {"concurrency": concurrency, "step_s": wall, "gpu_forward_s": gpu,
            "host_gap_s": (wall - gpu) if gpu else None, **{f"{k}_s": v for k, v in per.items()}}


def kernel_family(name: str) -> str:
    low = name.lower()
    return next((family for key, family in FAMILIES if key in low), "other")


def summary(events, steps: int) -> dict:
    """Per step: busy and idle device time (us), time by kernel family, the costliest names.
    `events` come in start order. Under programmatic dependent launch (llm_kernels.pdl) a
    kernel starts while the one before it runs and waits for it, so its recorded span holds
    that wait: summed as recorded, a step's kernels came to 1.5x its graph's replay time on an
    H100. Each event is charged only its time past the latest end before it (its own work,
    not the wait), so the names' and families' times add up to the busy time."""
    busy, idle, by_name, last_end = 0.0, 0.0, {}, None
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if last_end is not None and start > last_end:
            idle += start - last_end
        own = end - start if last_end is None else max(0.0, end - max(start, last_end))
        last_end = end if last_end is None else max(last_end, end)
        busy += own
        stat = by_name.setdefault(e.name[:90], [0, 0.0])
        stat[0] += 1
        stat[1] += own
    families: dict = {}
    for name, (_, t) in by_name.items():
        families[kernel_family(name)] = families.get(kernel_family(name), 0.0) + t / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    return {"busy_us_per_step": busy / steps, "idle_us_per_step": idle / steps,
            "by_family_us": dict(sorted(families.items(), key=lambda kv: -kv[1])),
            "top": [{"name": n, "calls_per_step": c / steps, "us_per_step": t / steps} for n, (c, t) in top]}


def trace(eng, batch: int, steps: int, vocab: int, loras=()):
    """torch.profiler over `steps` steady decode steps of `batch` sequences (taking `loras` in
    turn): (summary, profile)."""
    from engine import SamplingParams

    rng = random.Random(batch)
    params = SamplingParams(max_tokens=steps + 16, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(batch):
        eng.add_request(f"t{batch}-{i}", {"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(512)]},
                        params, lora_request=loras[i % len(loras)] if loras else None)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.requests.values()):
        eng.step()
    for _ in range(3):  # steady decoding, tuned and warm
        eng.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    for rid in list(eng.requests):
        eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return summary(events, steps), prof


def main():
    from benchmarks import moe, serve
    from engine import EngineConfig, LLMEngine

    shapes_by_name = {"qwen2.5-7b": serve.QWEN25_7B, "qwen2.5-0.5b": QWEN25_05B, "qwen3-30b-a3b": moe.QWEN3_30B_A3B}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen2.5-7b", choices=list(shapes_by_name), help="AWQ, random weights")
    ap.add_argument("--batch", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sync", action="store_true", help="asynchronous scheduling off")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs: one launch a kernel")
    ap.add_argument("--max-cudagraph-tokens", type=int, default=0,
                    help="graphs for mixed steps up to this many tokens (default 0: the traced steps are pure "
                         "decode, and the engine starts without tuning and capturing mixed steps)")
    ap.add_argument("--lora", type=int, default=0, help="trace with this many rank-16 adapters taken in turn")
    ap.add_argument("--out", default=None, help="a folder for the chrome traces and summary.json")
    args = ap.parse_args()
    shapes = shapes_by_name[args.shapes]
    loras, lora_kw = [], {}
    if args.lora:
        import tempfile

        from benchmarks.lora_serve import write_adapter
        from engine import LoRARequest

        folder = tempfile.mkdtemp(prefix="lora-adapters-")
        loras = [LoRARequest(f"adapter-{i}", i + 1, write_adapter(os.path.join(folder, f"a{i}"), shapes, 16, i))
                 for i in range(args.lora)]
        lora_kw = dict(enable_lora=True, max_loras=args.lora, max_lora_rank=16)
    t0 = time.monotonic()
    eng = LLMEngine(EngineConfig(model=serve.model_dir(shapes, serve.GROUP), load_format="dummy", dtype="bfloat16",
                                 max_model_len=4096, max_num_seqs=max(args.batch), gpu_memory_utilization=0.5,
                                 enforce_eager=args.eager, max_cudagraph_tokens=args.max_cudagraph_tokens,
                                 async_scheduling=not args.sync, **lora_kw))
    print(f"engine ready in {time.monotonic() - t0:.0f} s", flush=True)  # a run stopped later still says this much
    results = {"shapes": args.shapes, "eager": args.eager, "async_scheduling": not args.sync, "lora": args.lora}
    for batch in args.batch:
        if not loras:
            results[f"profile-{batch}"] = step_profile(eng, batch, 512, shapes["vocab_size"])
        results[f"trace-{batch}"], prof = trace(eng, batch, args.steps, shapes["vocab_size"], loras)
        if loras:  # the same engine's steps without adapters: what the adapters add, kernel by kernel
            results[f"trace-{batch}-base"], _ = trace(eng, batch, args.steps, shapes["vocab_size"])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(args.out, f"trace-{batch}.json"))
        print(json.dumps({k: v for k, v in results.items() if k.endswith(f"-{batch}")}, indent=1), flush=True)
    if args.out:
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
