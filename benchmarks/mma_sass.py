"""Static SASS census of llm_kernels.awq_mma's CUDA kernel for sm_90 (or sm_80/sm_89); no GPU needed.

Each config of awq_mma.mma_configs(M, N) is compiled as the engine compiles it (the same
source and defines), here by NVRTC to PTX (pip's nvidia-cuda-nvrtc-cu12: pass its
libnvrtc.so.12 with --nvrtc) and Triton's bundled ptxas -v to a cubin, then read with
cuobjdump -sass. Reported: registers, spills, and the main loop's opcodes (the backward
branch with the most HMMA: one trip is U chunks of 64 rows, each 4 k-steps a 16-column
tile, MT MMAs a step) per trip and per weight pair dequantized (NTB tiles x 4 steps x 4
pairs a lane per chunk). The numbers say where a lane's issue slots go between the MMAs;
the device's stall reasons (benchmarks/kpack_ncu.py) say which of them the warps wait on.

    .venv/bin/python benchmarks/mma_sass.py --nvrtc DIR/libnvrtc.so.12 [--ms 8 32] [--n 37888] [--arch 90]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.kernel_sass import BIN, cold_ranges, histogram, main_loop, parse_sass, ptxas_numbers  # noqa: E402
from llm_kernels import awq_mma  # noqa: E402


def nvrtc_ptx(lib, src: str, name: str, arch: int) -> str:
    """PTX of src for compute_<arch>, or RuntimeError with NVRTC's log."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = [f"--gpu-architecture=compute_{arch}".encode(), b"-std=c++17"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc:
            raise RuntimeError(f"NVRTC: {log.value.decode(errors='replace')}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def census(lib, M: int, N: int, cfg: dict, arch: int) -> dict:
    """Compile one config (M tokens: MT = ceil(M / 8) token tiles) and count its main loop."""
    mt, ntb, u = -(-M // 8), cfg.get("ntb", 1), cfg["u"]
    name, src = awq_mma.kernel_source(cfg["nw"], mt, u, ntb, cfg.get("sc", 0), cfg.get("mb", 1))
    res = {"M": M, "N": N, "cfg": cfg}
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx_path, "w") as f:
            f.write(nvrtc_ptx(lib, src, name, arch))
        run = subprocess.run([os.path.join(BIN, "ptxas"), f"-arch=sm_{arch}", "-v", "-o", cubin, ptx_path],
                             capture_output=True, text=True)
        if run.returncode:
            res["error"] = run.stderr[-600:]
            return res
        res.update(ptxas_numbers(run.stderr + run.stdout))
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True,
                              text=True, check=True).stdout
    ins = parse_sass(sass)
    loop = main_loop(ins)
    if loop is None:
        res["error"] = "no backward branch around the MMAs"
        return res
    lo, hi = loop
    trip = histogram(ins, lo, hi, cold_ranges(ins, lo, hi))
    pairs = u * ntb * 4 * 4  # weight pairs a lane dequantizes a trip
    alu = sum(trip.get(k, 0) for k in ("LOP3", "SHF", "PRMT", "IMAD", "IADD3"))
    half = sum(v for k, v in trip.items() if k.startswith(("HFMA2", "HADD2", "HMUL2")))
    res.update(trip=trip, per_pair={"issue": round(trip.get("total", 0) / pairs, 2), "int_alu": round(alu / pairs, 2),
                                    "bf16x2": round(half / pairs, 2), "hmma": round(trip.get("HMMA", 0) / pairs, 2)})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvrtc", required=True, help="path of libnvrtc.so.12 (pip's nvidia-cuda-nvrtc-cu12)")
    ap.add_argument("--ms", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--n", type=int, default=37888, help="the layer's columns (which NTB fit)")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    rows = []
    print("| M | config | regs | spill st/ld | issue a pair | int ALU a pair | bf16x2 a pair | HMMA a pair |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for M in args.ms:
        for cfg in awq_mma.mma_configs(M, args.n):
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
