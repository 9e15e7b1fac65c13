"""Where a decode step's GPU time goes: torch.profiler over eager decode steps
of the E1 engine (Qwen2.5-7B-AWQ shapes, random weights) at the given batch
sizes, GPU time summed by kernel. Eager mode runs the same kernels the CUDA
graphs replay, one launch each.

    python benchmarks/profile_step.py [--batch 10 50] [--out profile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.serve import GROUP, QWEN25_7B, model_dir  # noqa: E402


def kernel_family(name: str) -> str:
    for key, family in (("kpack", "AWQ GEMM (kpack)"), ("awq", "AWQ GEMM"), ("decode", "paged decode attention"),
                        ("prefill", "prefill attention"), ("rms", "RMSNorm"), ("rotary", "rotary"),
                        ("silu", "SiLU-mul"), ("write_kv", "KV write"), ("gemm", "cuBLAS (lm_head)"),
                        ("nvjet", "cuBLAS (lm_head)"), ("sm90", "cuBLAS (lm_head)"), ("cutlass", "cuBLAS (lm_head)")):
        if key in name.lower():
            return family
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "profile_step.json"))
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=model_dir(QWEN25_7B, GROUP), load_format="dummy", dtype="bfloat16",
                                 max_model_len=4096, max_num_seqs=max(args.batch), enforce_eager=True,
                                 num_kv_blocks=8192))
    rng = random.Random(0)
    result = {}
    for b in args.batch:
        params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, detokenize=False)
        for i in range(b):
            eng.add_request(f"p{b}-{i}", {"prompt_token_ids": [rng.randrange(100, 150000) for _ in range(512)]},
                            params)
        while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.requests.values()):
            eng.step()
        for _ in range(3):
            eng.step()  # tuned and warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                eng.step()
            torch.cuda.synchronize()
        fam: dict = {}
        for ev in prof.key_averages():
            t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
            if t:
                f = kernel_family(ev.key)
                fam[f] = fam.get(f, 0.0) + t / args.steps / 1e3  # ms per step
        total = sum(fam.values())
        result[b] = {"gpu_ms_per_step": total, "by_kernel_ms": dict(sorted(fam.items(), key=lambda kv: -kv[1]))}
        print(f"batch {b}: {total:.2f} ms of GPU time per decode step (eager)")
        for f, t in result[b]["by_kernel_ms"].items():
            print(f"    {f:28} {t:7.3f} ms  {100 * t / total:5.1f}%")
        for rid in list(eng.requests):
            eng.abort_request(rid)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
