"""Where a decode step's time goes outside its CUDA graph: a torch.profiler trace of steady
decode steps (asynchronous scheduling on, or off with --sync), the device's kernels and
copies by total time, and the idle time between them.

    python3 benchmarks/step_trace.py [--batch 10] [--sync] [--max-cudagraph-tokens 0] [--out DIR]

Qwen2.5-0.5B shapes by default (dummy AWQ weights, the real vocabulary of 151,936, which
sets the sampler's cost): the work between graphs does not depend on the layers."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import serve, step_profile  # noqa: E402 - after the repository root is on the path

QWEN25_05B = dict(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)


def device_events(prof) -> list:
    """The trace's device-side events (kernels, memcpys, memsets), in start order."""
    out = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(out, key=lambda e: e.time_range.start)


def summary(events, steps: int) -> dict:
    """Per step: busy and idle device time (us) and the ten costliest names."""
    busy, idle, by_name, last_end = 0.0, 0.0, {}, None
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if last_end is not None and start > last_end:
            idle += start - last_end
        last_end = end if last_end is None else max(last_end, end)
        busy += end - start
        stat = by_name.setdefault(e.name[:90], [0, 0.0])
        stat[0] += 1
        stat[1] += end - start
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    return {"busy_us_per_step": busy / steps, "idle_us_per_step": idle / steps,
            "top": [{"name": n, "calls_per_step": c / steps, "us_per_step": t / steps} for n, (c, t) in top]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sync", action="store_true", help="asynchronous scheduling off")
    ap.add_argument("--max-cudagraph-tokens", type=int, default=0,
                    help="graphs for mixed steps up to this many tokens (default 0: the traced steps are pure decode, "
                         "and on a fresh machine the mixed graphs' tuning and compiling kept the run past 270 s)")
    ap.add_argument("--out", default=None, help="a folder for the chrome traces and summary.json")
    args = ap.parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams

    path = serve.model_dir(QWEN25_05B, serve.GROUP)
    t0 = time.monotonic()
    eng = LLMEngine(EngineConfig(model=path, load_format="dummy", dtype="bfloat16", max_model_len=4096,
                                 max_num_seqs=max(args.batch), gpu_memory_utilization=0.5,
                                 max_cudagraph_tokens=args.max_cudagraph_tokens,
                                 async_scheduling=not args.sync))
    print(f"engine ready in {time.monotonic() - t0:.0f} s", flush=True)  # a run stopped later still says this much
    results = {}
    for batch in args.batch:
        results[f"profile-{batch}"] = step_profile.step_profile(eng, batch, 512, QWEN25_05B["vocab_size"])
        rng = random.Random(batch)
        params = SamplingParams(max_tokens=args.steps + 16, temperature=0, ignore_eos=True, detokenize=False)
        for i in range(batch):
            eng.add_request(f"t{batch}-{i}", {"prompt_token_ids": [rng.randrange(100, 150000) for _ in range(512)]},
                            params)
        for _ in range(6):  # prefill, then steady decoding
            eng.step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                eng.step()
            torch.cuda.synchronize()
        for rid in list(eng.requests):
            eng.abort_request(rid)
        while eng.has_unfinished_requests():
            eng.step()
        results[f"trace-{batch}"] = summary(device_events(prof), args.steps)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(args.out, f"trace-{batch}.json"))
        print(json.dumps({k: v for k, v in results.items() if k.endswith(str(batch))}, indent=1), flush=True)
    if args.out:
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
