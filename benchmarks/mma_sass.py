"""Static SASS census of llm_kernels.awq_mma's and awq_tile's CUDA kernels for sm_90 (or sm_80/sm_89); no GPU needed.

Each config of awq_mma.mma_configs(M, N) is compiled as the engine compiles it (the same
source and defines), here by NVRTC to PTX (pip's nvidia-cuda-nvrtc-cu12, a test dependency,
or the libnvrtc.so.12 given by --nvrtc) and Triton's bundled ptxas -v to a cubin
(llm_kernels.cuda_compile), then read with cuobjdump -sass. Reported: registers, spills, and the main loop's opcodes (the backward
branch with the most HMMA: one trip is U chunks of 64 rows, each 4 k-steps a 16-column
tile, MT MMAs a step) per trip and per weight pair dequantized (NTB tiles x 4 steps x 4
pairs a lane per chunk). The numbers say where a lane's issue slots go between the MMAs;
the device's stall reasons (benchmarks/kpack_ncu.py) say which of them the warps wait on.
With --kernel tile, awq_tile's configs (one trip = one unit: U chunks, NWT tiles x 4 k-steps
x MW x 2 MMAs a warp), counted per MMA.

    .venv/bin/python benchmarks/mma_sass.py [--ms 8 32] [--n 37888] [--arch 90]
    .venv/bin/python benchmarks/mma_sass.py --kernel tile --ms 32 64 256 [--k 3584]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.kernel_sass import BIN, cold_ranges, histogram, main_loop, parse_sass  # noqa: E402
from llm_kernels import awq_mma, awq_tile  # noqa: E402
from llm_kernels.cuda_compile import compile_cubin, nvrtc_path  # noqa: E402


def census(lib, M: int, N: int, cfg: dict, arch: int) -> dict:
    """Compile one config (M tokens: MT = ceil(M / 8) token tiles) and count its main loop."""
    if cfg["kind"] == "tile":
        name, src = awq_tile.kernel_source(cfg["mt"], cfg["nwt"], cfg["wn"], cfg["u"], cfg["st"], cfg["mb"])
        # a lane dequantizes 4 pairs a k-step and tile; the MMAs a trip: U x NWT x 4 x MT
        pairs = cfg["u"] * cfg["nwt"] * 4 * 4
    else:
        mt, ntb, u = -(-M // 8), cfg.get("ntb", 1), cfg["u"]
        name, src = awq_mma.kernel_source(cfg["nw"], mt, u, ntb, cfg.get("sc", 0), cfg.get("mb", 1))
        pairs = u * ntb * 4 * 4  # weight pairs a lane dequantizes a trip
    res = {"M": M, "N": N, "cfg": cfg}
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        res.update(compile_cubin(lib, src, name, arch, cubin))
        if "error" in res:
            return res
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True,
                              text=True, check=True).stdout
    ins = parse_sass(sass)
    loop = main_loop(ins)
    if loop is None:
        res["error"] = "no backward branch around the MMAs"
        return res
    lo, hi = loop
    trip = histogram(ins, lo, hi, cold_ranges(ins, lo, hi))
    alu = sum(trip.get(k, 0) for k in ("LOP3", "SHF", "PRMT", "IMAD", "IADD3"))
    half = sum(v for k, v in trip.items() if k.startswith(("HFMA2", "HADD2", "HMUL2")))
    res.update(trip=trip, per_pair={"issue": round(trip.get("total", 0) / pairs, 2), "int_alu": round(alu / pairs, 2),
                                    "bf16x2": round(half / pairs, 2), "hmma": round(trip.get("HMMA", 0) / pairs, 2)})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvrtc", default=nvrtc_path(), help="path of libnvrtc.so.12 (default: pip's nvidia-cuda-nvrtc-cu12)")
    ap.add_argument("--ms", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--n", type=int, default=37888, help="the layer's columns (which NTB fit)")
    ap.add_argument("--k", type=int, default=3584, help="the layer's rows (--kernel tile: which configs fit)")
    ap.add_argument("--kernel", choices=("mma", "tile"), default="mma")
    ap.add_argument("--smem", type=int, default=227 * 1024, help="--kernel tile: the opt-in shared memory limit")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    rows = []
    print("| M | config | regs | spill st/ld | issue a pair | int ALU a pair | bf16x2 a pair | HMMA a pair |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for M in args.ms:
        cfgs = awq_tile.tile_configs(M, args.n, args.k, args.sms, args.smem) if args.kernel == "tile" \
            else awq_mma.mma_configs(M, args.n)
        for cfg in cfgs:
            r = census(lib, M, args.n, cfg, args.arch)
            rows.append(r)
            name = ",".join(f"{k}{v}" for k, v in cfg.items() if k != "kind")
            if "error" in r:
                print(f"| {M} | {name} | error: {r['error'][:80]} |")
                continue
            p = r["per_pair"]
            print(f"| {M} | {name} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} | {p['issue']} | {p['int_alu']} | "
                  f"{p['bf16x2']} | {p['hmma']} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
