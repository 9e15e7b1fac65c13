"""The W4A16 tuner's picks on a model's linear layers at every token-count bucket: which
config won, and each candidate's time relative to it. Run on a GPU, with an empty tuner
cache (LLM_KERNELS_CACHE_DIR), to decide which candidates earn their place.

    python benchmarks/tools/tuner_picks.py --out $OUT/picks.json
    python benchmarks/tools/tuner_picks.py --models llama-3-70b --ms 16 50   # E2's layers
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import llm_kernels  # noqa: E402
from llm_kernels import dispatch  # noqa: E402

# (K, N, group) of each linear: qkv, o, gate+up, down
MODELS = {
    "qwen2.5-7b": [(3584, 4608, 128), (3584, 3584, 128), (3584, 37888, 128), (18944, 3584, 128)],
    "smollm2-135m": [(576, 960, 64), (576, 576, 64), (576, 3072, 64), (1536, 576, 64)],
    "llama-3-70b": [(8192, 10240, 128), (8192, 8192, 128), (8192, 57344, 128), (28672, 8192, 128)],
}
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def layer(K: int, N: int, G: int, gen) -> object:
    q = torch.randint(-2**31, 2**31 - 1, (K, N // 8), dtype=torch.int32, device="cuda", generator=gen)
    z = torch.randint(-2**31, 2**31 - 1, (K // G, N // 8), dtype=torch.int32, device="cuda", generator=gen)
    s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
    return llm_kernels.w4a16_prepare(q, z, s, G)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-7b", "smollm2-135m"], choices=list(MODELS))
    ap.add_argument("--ms", nargs="+", type=int, default=list(MS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for model in args.models:
        for K, N, G in MODELS[model]:
            w = layer(K, N, G, gen)
            for M in args.ms:
                before = set(dispatch._TUNED)
                llm_kernels.w4a16_linear(torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16), w)
                torch.cuda.synchronize()
                for key in set(dispatch._TUNED) - before:
                    timed = sorted(dispatch.TIMINGS.get(key, []), key=lambda ct: ct[1])
                    best = timed[0][1] if timed else None
                    rows.append({"model": model, "K": K, "N": N, "group": G, "M": M, "kernel": key[0],
                                 "pick": repr(dispatch._TUNED[key]),
                                 "candidates": [[repr(c), t / best if best else None, t * 1e6] for c, t in timed]})
                    r = rows[-1]
                    print(f"{model:13s} {K:6d}x{N:<6d} M={M:<4d} {r['kernel']:10s} {r['pick']}  "
                          f"next {[round(c[1], 2) for c in r['candidates'][1:4]]}", flush=True)
                if args.out:  # after every shape: a run cut short keeps what it timed
                    with open(args.out, "w") as f:
                        json.dump({"device": torch.cuda.get_device_name(), "rows": rows,
                                   "failed": {repr(k): v for k, v in dispatch.FAILED.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
