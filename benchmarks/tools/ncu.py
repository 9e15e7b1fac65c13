"""Nsight Compute on the product's W4A16 linear (llm_kernels.w4a16_linear, whatever kernel it picks
for the device and token count): where the warps of each launch stall, how full the SMs are,
how busy DRAM is. What K1 cannot give: a time says how slow, the stall reasons say why.

Run under ncu, which profiles only the launches between the profiler's start and stop (one call
a case, its weights cold in L2: ncu flushes caches per replay), then summarize the report:

    ncu --profile-from-start off --clock-control none --cache-control all \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section SchedulerStats --section MemoryWorkloadAnalysis -o $OUT/w4a16 \\
        python3 benchmarks/tools/ncu.py [--cases 3584x4608:1,18944x3584:64]
    python3 benchmarks/tools/ncu.py --report $OUT/w4a16.ncu-rep   # one line a launch

A case is KxN:M (a Qwen2.5-7B layer and a token count; default: K1's four layers at M = 1, 16,
64, 128). Each case is called a few times first, so the tuner has picked before the profiled call.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

G = 128
DEFAULT_CASES = ",".join(f"{kn}:{m}" for kn in ("3584x4608", "3584x3584", "3584x37888", "18944x3584")
                         for m in (1, 16, 64, 128))
# metric name (a|b: the first of these the report has; they differ between ncu versions) -> column
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


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    out = []
    for case in text.split(","):
        kn, m = case.split(":")
        k, n = kn.split("x")
        out.append((int(k), int(n), int(m)))
    return out


def run_cases(cases) -> None:
    import torch

    import llm_kernels

    gen = torch.Generator(device="cuda").manual_seed(1234)
    for K, N, M in cases:
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
        s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
        x = torch.randn((M, K), device="cuda", generator=gen).to(torch.bfloat16)
        layer = llm_kernels.w4a16_prepare(llm_kernels.pack_awq_int4(q), llm_kernels.pack_awq_int4(z), s, G)
        for _ in range(3):  # tune, compile, and let an auto grid learn the programs resident per SM
            llm_kernels.w4a16_linear(x, layer)
        torch.cuda.synchronize()
        print(f"case {K}x{N} M={M}", flush=True)
        torch.cuda.profiler.start()
        llm_kernels.w4a16_linear(x, layer)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        del q, z, s, layer


def _num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def summary(report: str) -> str:
    """One line a profiled launch: its kernel, time, DRAM and SM use, occupancy, then its largest
    stall reasons (cycles waited per issued instruction)."""
    raw = subprocess.run(["ncu", "--import", report, "--page", "raw", "--csv", "--print-units", "base"],
                         capture_output=True, text=True, check=True).stdout
    rows = [r for r in csv.DictReader(io.StringIO(raw)) if r.get("ID", "").strip().isdigit()]
    out = ["id   " + " ".join(f"{c:>7}" for c in METRICS.values()) + "  kernel; stalls (cycles per issue)"]
    for i, r in enumerate(rows):
        vals = []
        for m in METRICS:
            f = next((_num(r[k]) for k in m.split("|") if k in r), None)
            vals.append(f"{'-':>7}" if f is None else f"{f / 1e3:7.1f}" if m.startswith("gpu__time") else f"{f:7.1f}")
        stalls = sorted(((_num(v) or 0.0, STALL.fullmatch(k).group(1)) for k, v in r.items()
                         if k and STALL.fullmatch(k)), reverse=True)
        name = r.get("Kernel Name", "")[:40]
        out.append(f"{i:4} " + " ".join(vals) + f"  {name}; "
                   + ", ".join(f"{n} {v:.1f}" for v, n in stalls[:6] if v >= 0.05))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="KxN:M,... (default: K1's layers at M = 1, 16, 64, 128)")
    ap.add_argument("--report", default=None, help="print the summary of this .ncu-rep instead of running")
    args = ap.parse_args()
    if args.report:
        print(summary(args.report))
        return
    run_cases(parse_cases(args.cases))


if __name__ == "__main__":
    main()
