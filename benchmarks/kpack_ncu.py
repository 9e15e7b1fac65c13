"""Hardware counters of the AWQ GEMM's configs on the device (Nsight Compute): the Triton
kpack and gemv kernels, llm_kernels/awq_mma.py's and awq_tile.py's CUDA kernels and
benchmarks/w4a16_wide.py's variant. Where the warps of one launch stall, how full the SMs are, how busy DRAM and the
tensor pipes are. The evidence K1's tuning cannot give: a time says how slow, the stall
reasons say why.

Run under ncu, which profiles only the launches between the profiler's start and stop
(one launch a case, its weights cold in L2: ncu flushes caches per replay):

    ncu --profile-from-start off --clock-control none --cache-control all \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis -o $OUT/kpack \\
        python3 benchmarks/kpack_ncu.py [--cases 0,2]
    python3 benchmarks/kpack_ncu.py --report $OUT/kpack.ncu-rep   # the summary table

A case is (K, N, M, config): the tuner's picks of session 14 (benchmarks/results/kernels.json)
at M = 1, 16, 64, 128 on the Qwen2.5-7B layers (cases 0-7; the H200's counters of session 16
are in benchmarks/NOTES.md), then awq_mma's picks of session 19 at M = 8-64 and the wide
variant at M = 64 (cases 8-15; 8 and 11-14 profiled in session 20, benchmarks/NOTES.md: why the kernel stays near 0.6 of the floor
on the large layers at M = 8, and why it falls behind cuBLAS from M = 32;
`--cases 8,9,10,11,12,13,14,15`), session 20's SC and MB configs beside them (16-19), and
session 21's llm_kernels/awq_tile.py at M = 32-128 (20-23).
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llm_kernels.awq_configs import kpack_config  # noqa: E402
from llm_kernels.awq_gemv import gemv_config  # noqa: E402

G = 128
CASES = [
    (3584, 4608, 1, gemv_config(32, 1, 16)),
    (3584, 4608, 1, kpack_config(16, 64)),
    (3584, 37888, 16, kpack_config(16, 128, warps=2, stages=4)),
    (18944, 3584, 16, kpack_config(16, 128, warps=2, stages=4)),
    (18944, 3584, 16, kpack_config(16, 128, warps=2, stages=4, grid=264)),
    (3584, 4608, 64, kpack_config(32, 128, swap=True)),
    (3584, 37888, 64, kpack_config(64, 128, swap=True)),
    (3584, 37888, 128, kpack_config(128, 128, warps=8, swap=True)),
    # awq_mma (results/kernels.json and awq_mma.json, session 19): its picks, and its best M = 64 config
    (3584, 37888, 8, {"kind": "mma", "nw": 8, "u": 2, "ntb": 2}),
    (18944, 3584, 8, {"kind": "mma", "nw": 16, "u": 4}),
    (3584, 4608, 16, {"kind": "mma", "nw": 8, "u": 4}),
    (3584, 4608, 32, {"kind": "mma", "nw": 8, "u": 2, "ntb": 2}),
    (3584, 4608, 64, {"kind": "mma", "nw": 4, "u": 2}),
    (18944, 3584, 32, {"kind": "mma", "nw": 8, "u": 2, "ntb": 2}),
    (18944, 3584, 64, {"kind": "mma", "nw": 8, "u": 2}),
    (3584, 4608, 64, {"kind": "mma_wide", "wn": 4, "ntb": 1, "u": 1, "s": 3, "ks": 4}),
    # session 20's configs (not timed yet): SC at M = 8 beside case 8, MB at M = 32 beside 11 and 13
    (3584, 37888, 8, {"kind": "mma", "nw": 8, "u": 2, "ntb": 2, "sc": 1}),
    (3584, 37888, 8, {"kind": "mma", "nw": 4, "u": 2, "ntb": 4, "sc": 1}),
    (3584, 4608, 32, {"kind": "mma", "nw": 16, "u": 2, "mb": 2}),
    (18944, 3584, 32, {"kind": "mma", "nw": 16, "u": 2, "mb": 2}),
    # session 21's awq_tile (not timed yet): M = 64 beside cases 12 and 14, M = 32 beside 11, M = 128
    (3584, 4608, 64, {"kind": "tile", "mt": 8, "nwt": 4, "wn": 8, "u": 1, "st": 4, "mb": 1}),
    (18944, 3584, 64, {"kind": "tile", "mt": 8, "nwt": 4, "wn": 8, "u": 1, "st": 6, "mb": 1}),
    (3584, 4608, 32, {"kind": "tile", "mt": 4, "nwt": 4, "wn": 8, "u": 1, "st": 4, "mb": 1}),
    (3584, 37888, 128, {"kind": "tile", "mt": 8, "nwt": 4, "wn": 4, "u": 1, "st": 4, "mb": 2}),
]

# metric name -> short column
METRICS = {
    "gpu__time_duration.sum": "us",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed|dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
}
# stall reasons: cycles a warp waited per issued instruction, by reason (WarpStateStats)
STALL = re.compile(r"smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio")


def run_cases(which) -> None:
    import torch

    from benchmarks import w4a16_wide
    from llm_kernels import awq, awq_kpack, awq_mma, awq_tile
    from llm_kernels.awq import pack_awq_int4

    gen = torch.Generator(device="cuda").manual_seed(1234)
    for i in which:
        K, N, M, cfg = CASES[i]
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
        s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
        x = torch.randn((M, K), device="cuda", generator=gen).to(torch.bfloat16)
        if cfg.get("kind") in ("mma", "mma_wide", "tile"):
            words, sz = awq_mma.mma_pack(q, z, s)
            fn = {"mma": awq_mma.mma_launch, "mma_wide": w4a16_wide.wide_launch, "tile": awq_tile.tile_launch}[cfg["kind"]]
            launch = (lambda f=fn, w=words, sc=sz, c=cfg: f(x, w, sc, c))
        else:
            p = awq.awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G, mma=False)
            launch = (lambda p=p, c=cfg: awq_kpack.launch(x, p.qk, p.zeros_k, p.scales, G, c))
        for _ in range(3):  # compile, and let the auto grid learn the programs resident per SM
            launch()
        torch.cuda.synchronize()
        print(f"case {i}: {K}x{N} M={M} {cfg}", flush=True)
        torch.cuda.profiler.start()
        launch()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del q, z, s, launch


def summary(report: str) -> str:
    """One line a profiled launch: time, DRAM and SM use, occupancy, then its largest stall
    reasons (cycles waited per issued instruction)."""
    raw = subprocess.run(["ncu", "--import", report, "--page", "raw", "--csv", "--print-units", "base"],
                         capture_output=True, text=True, check=True).stdout
    rows = [r for r in csv.DictReader(io.StringIO(raw)) if r.get("ID", "").strip().isdigit()]
    out = ["case " + " ".join(f"{c:>7}" for c in METRICS.values()) + "  stalls (cycles per issue)"]
    for i, r in enumerate(rows):
        vals = []
        for m in METRICS:  # a|b: the first of these names the report has (they differ between ncu versions)
            f = next((_num(r[k]) for k in m.split("|") if k in r), None)
            vals.append(f"{'-':>7}" if f is None else f"{f / 1e3:7.1f}" if m.startswith("gpu__time") else f"{f:7.1f}")
        stalls = sorted(((_num(v) or 0.0, STALL.fullmatch(k).group(1)) for k, v in r.items()
                         if k and STALL.fullmatch(k)), reverse=True)
        out.append(f"{i:4} " + " ".join(vals) + "  " + ", ".join(f"{n} {v:.1f}" for v, n in stalls[:6] if v >= 0.05))
    return "\n".join(out)


def _num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=None, help="indices into CASES (default: all)")
    ap.add_argument("--report", default=None, help="print the summary of this .ncu-rep instead of running")
    args = ap.parse_args()
    if args.report:
        print("\n".join(f"{i}: {K}x{N} M={M} {cfg}" for i, (K, N, M, cfg) in enumerate(CASES)))
        print(summary(args.report))
        return
    run_cases([int(c) for c in args.cases.split(",")] if args.cases else range(len(CASES)))


if __name__ == "__main__":
    main()
