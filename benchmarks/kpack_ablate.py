"""Where the kpack GEMM's time goes, by timing (benchmarks/kpack_ncu.py reads the hardware
counters where ncu runs): the tuned config of each K1 layer and M timed beside variants
of itself with one thing changed, the differences read as that thing's cost.

- no_dequant: each nibble plane's PTX is one `mov` (the loop keeps its loads, ldmatrix
  and MMAs; the output is wrong and not checked): what the dequant costs.
- programs x1/2, x2: the stream-K grid halved / doubled (fewer programs resident or a
  second wave): whether occupancy or the split-K fix-up matters.
- stages -1, +1: copy pipeline depth (words in flight).
- copy: a plain read of the same bytes (torch's sum over the packed words), the
  layout's bandwidth with no GEMM around it.
A tuned gemv config (llm_kernels.awq_gemv, M <= 4) gets its K split halved / doubled instead.

Times are CUDA-graph replays rotating through enough weight sets to keep L2 cold, as
K1's. Prints a table; --out writes the rows (diagnostics, not targets: no floor).

    python3 benchmarks/kpack_ablate.py --ms 1,16,64 [--shapes 18944x3584] [--out $OUT/ablate.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llm_kernels import awq, awq_gemv, awq_kpack  # noqa: E402
from llm_kernels.awq import pack_awq_int4  # noqa: E402
from llm_kernels.awq_configs import KPACK, chosen_config, shape_key  # noqa: E402
from llm_kernels.dispatch import TIMINGS, graph_time  # noqa: E402

G = 128
SHAPES = [(3584, 37888), (18944, 3584), (3584, 4608)]
L2_SPAN = 240e6  # bytes of weights rotated through: 4x the 60 MB L2
NO_DEQUANT = "mov.b32 $0, $1;"


def weight_sets(K: int, N: int, gen) -> list:
    """Prepared (K-packed) random AWQ layers, enough of them to span L2_SPAN."""
    n = max(1, min(32, int(-(-L2_SPAN // (K * N // 2)))))
    out = []
    for _ in range(n):
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
        s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
        out.append(awq.awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G))
    return out


def rotated(fns) -> float:
    """Seconds per call, graph replays cycling through fns (one per weight set)."""
    return graph_time(lambda: [f() for f in fns], calls=max(1, 20 // len(fns))) / len(fns)


def variants(cfg: dict, programs: int) -> list:
    """(name, config, asm or None) of the tuned config and its one-change variants; programs:
    the launch's program count (a gemv config's: its K split)."""
    if cfg["kind"] == "gemv":
        return [("as tuned", cfg, None)] + [(f"split x{f}", {**cfg, "split": max(1, int(programs * f))}, None)
                                            for f in (0.5, 2)]
    out = [("as tuned", cfg, None), ("no_dequant", cfg, [NO_DEQUANT] * 4)]
    out += [(f"programs x{f}", {**cfg, "grid": max(1, int(programs * f))}, None) for f in (0.5, 2)]
    out += [(f"stages {d:+d}", {**cfg, "stages": cfg.get("stages", 3) + d}, None) for d in (-1, 1)
            if cfg.get("stages", 3) + d >= 2]
    return out


def ablate(K: int, N: int, M: int, sets: list, gen) -> list:
    x = (torch.randn((M, K), device="cuda", generator=gen)).to(torch.bfloat16)
    awq.awq_linear(x, sets[0])  # tunes this shape
    cfg = chosen_config(KPACK, M, N, K, G, torch.bfloat16)
    for c, t in sorted(TIMINGS.get((KPACK,) + shape_key(M, N, K, G, torch.bfloat16), []), key=lambda ct: ct[1]):
        print(f"  tuner {K}x{N} M={M}: {t * 1e6:7.1f} us  {c}")  # net of the L2 flush
    if cfg is None or cfg["kind"] == "dense":
        return [{"case": f"{K}x{N} M={M}", "variant": "as tuned", "config": str(cfg),
                 "time_us": rotated([lambda p=p: awq.awq_linear(x, p) for p in sets]) * 1e6}]
    if cfg["kind"] == "gemv":
        programs = awq_gemv.split_count(cfg, -(-N // cfg["BN"]), K // awq_kpack.ROWS, x.device)
    else:
        tiles = -(-M // cfg["BM"]) * -(-N // cfg["BN"])
        programs = awq_kpack.program_count(cfg, tiles, K // awq_kpack.ROWS, x, N)
    rows, base = [], None
    for name, c, asm in variants(cfg, programs):
        def fns(c=c, asm=asm):
            return [lambda p=p: awq_kpack.launch(x, p.qk, p.zeros_k, p.scales, G, c, asm=asm) for p in sets]
        try:
            t = rotated(fns())
        except Exception as e:  # noqa: BLE001 - e.g. a deeper pipeline over the shared memory limit
            rows.append({"case": f"{K}x{N} M={M}", "variant": name, "config": str(c), "error": repr(e)[:160]})
            continue
        base = t if base is None else base
        rows.append({"case": f"{K}x{N} M={M}", "variant": name, "config": str(c), "time_us": t * 1e6,
                     "ratio_to_tuned": t / base})
    words = [p.qk for p in sets]
    copy = rotated([lambda w=w: w.sum(dtype=torch.int32) for w in words])
    rows.append({"case": f"{K}x{N} M={M}", "variant": "copy (sum of the words)", "time_us": copy * 1e6,
                 "ratio_to_tuned": copy / base})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--shapes", default=None, help="KxN,KxN (default: gate+up, down, qkv of Qwen2.5-7B)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    rows = []
    for K, N in shapes:
        sets = weight_sets(K, N, gen)
        for M in (int(m) for m in args.ms.split(",")):
            rows += ablate(K, N, M, sets, gen)
        del sets
        torch.cuda.empty_cache()
    for r in rows:
        t = f"{r['time_us']:8.1f} us  x{r.get('ratio_to_tuned', 1):.2f}" if "time_us" in r else r["error"]
        print(f"{r['case']:18} {r['variant']:24} {t}   {r.get('config', '')}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
