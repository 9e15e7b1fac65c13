"""Static SASS census of the kpack AWQ W4A16 GEMM (llm_kernels.awq_kpack._kpack_kernel) for sm_90; no GPU needed.

Each candidate of llm_kernels.awq_configs.kpack_configs but the dense one (SM count forced to 132, the CUDA
branch) is compiled by triton.compile for GPUTarget("cuda", 90, 128) with the signature, specialisation
attributes and constexprs awq_kpack.launch passes for (M, N, K, group 128, bf16). Reported: registers,
spills, stack (ptxas -v), shared memory, pipeline buffers (TTGIR), PTX features, and SASS opcode counts
(cuobjdump -sass) for the kernel and its main loop: the range of the backward branch with the most
HGMMA/HMMA (the `for u` loop) less the forward-skipped ranges holding an STG (the tile-end stores).
At M <= 4 the candidates include llm_kernels.awq_gemv's (no MMA: its main loop is the longest backward
branch, one trip a 128-row block), tabled apart.
Run from the repo root (tables to --md, all numbers to --json):
    .venv/bin/python benchmarks/kernel_sass.py [--m 16 64] [--shapes down qkv] [--jobs 2] [--sass-dir DIR]
"""
import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime's default in triton 3.9, minus the warning

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from llm_kernels import awq_configs, awq_gemv, awq_kpack, dispatch  # noqa: E402
from llm_kernels.cuda_compile import ptxas_numbers  # noqa: E402

SHAPES = {"down": (3584, 18944), "gate_up": (37888, 3584), "qkv": (4608, 3584)}
MS = (16, 64, 128, 256)
GROUP = 128
TARGET = GPUTarget("cuda", 90, 128)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTRS = {"x_ptr": "*bf16", "qk_ptr": "*i16", "z_ptr": "*i16", "s_ptr": "*bf16", "out_ptr": "*bf16",
        "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
_FN = {}
SMS, CLOCK, HBM = 132, 1.755e9, 4.8e12  # H200: SMs, a sustained SM clock (Hz), HBM bytes/s


def candidates(M: int) -> list:
    """kpack_configs(M, bf16, cuda) with 132 SMs (H100/H200), less the dense one."""
    saved = awq_configs.sm_count
    awq_configs.sm_count = lambda device: 132
    try:
        cfgs = awq_configs.kpack_configs(M, torch.bfloat16, torch.device("cuda"))
    finally:
        awq_configs.sm_count = saved
    return [c for c in cfgs if c.get("kind") != "dense"]


def kernel_fn(kind: str = "fused"):
    """_kpack_kernel (or, for kind "gemv", awq_gemv's kernel) as a compiled-mode JITFunction,
    its @jit_helper functions installed."""
    if kind not in _FN:
        lazy = awq_gemv._gemv_kernel if kind == "gemv" else awq_kpack._kpack_kernel
        dispatch._install_helpers(lazy.fn.__module__, lazy.fn.__globals__, False)
        _FN[kind] = JITFunction(lazy.fn, **lazy.jit_kwargs)
    return _FN[kind]


def _specialise(fn, sig: dict, const: dict, attrs: dict, ints: tuple) -> None:
    """Triton's binder on int arguments: 1 becomes a constexpr, multiples of 16 get divisibility 16."""
    for name, val in ints:
        if val == 1:
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if val % 16 == 0:
                attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]


def gemv_launch_args(M: int, N: int, K: int, cfg: dict):
    """(signature, constexprs, attrs, options) as awq_gemv.launch makes them (NBLK, SPLIT plain i32)."""
    fn = kernel_fn("gemv")
    const = dict(G=GROUP, PPG=min(8, GROUP // 16), MB=max(1, 1 << (M - 1).bit_length()), BLOCK_N=cfg["BN"],
                 S=min(awq_kpack.STRIPE, N))
    sig = dict(PTRS)
    attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in PTRS}
    _specialise(fn, sig, const, attrs, (("M", M), ("N", N), ("stride_xm", K), ("stride_om", N)))
    sig.update({name: "i32" for name in ("NBLK", "SPLIT")})
    sig.update({name: "constexpr" for name in const if name not in sig})
    return sig, const, attrs, {"num_warps": cfg.get("warps", 1), "num_stages": cfg.get("stages", 3)}


def launch_args(M: int, N: int, K: int, cfg: dict):
    """(signature, constexprs, attrs, options) as awq_kpack.launch and Triton's binder make them
    for bf16 x [M, K], 16-byte aligned tensors: ints equal to 1 become constexprs, ints and pointers
    divisible by 16 get tt.divisibility 16; U, P, C are do_not_specialize (plain i32)."""
    if cfg.get("kind") == "gemv":
        return gemv_launch_args(M, N, K, cfg)
    fn = kernel_fn()
    BM, BN = cfg["BM"], cfg["BN"]
    swap = bool(cfg.get("swap"))
    fold = bool(cfg.get("fold"))
    asm = [awq_kpack.dequant_asm(j, torch.bfloat16, fold) for j in range(4)]
    const = dict(G=GROUP, NBLK=K // awq_kpack.ROWS, MT=-(-M // BM), BLOCK_M=BM, BLOCK_N=BN,
                 PPG=min(8, GROUP // 16), NBASE=0xC300, A0=asm[0], A1=asm[1], A2=asm[2], A3=asm[3],
                 EXACT=False, SWAP=swap, FOLD=fold, S=min(awq_kpack.STRIPE, N))
    sig = dict(PTRS)
    attrs = {(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in PTRS}
    _specialise(fn, sig, const, attrs, (("M", M), ("N", N), ("stride_xm", K), ("stride_om", N)))
    sig.update({name: "i32" for name in ("U", "P", "C")})
    sig.update({name: "constexpr" for name in const if name not in sig})
    opts = {"num_warps": cfg.get("warps", 4), "num_stages": cfg.get("stages", 3)}
    if cfg.get("maxnreg"):
        opts["maxnreg"] = cfg["maxnreg"]
    return sig, const, attrs, opts


def parse_sass(text: str) -> list:
    """[(address, opcode with modifiers, operand text)] of cuobjdump -sass output."""
    out = []
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;/]*?)\s*;", text):
        toks = m.group(2).split()
        if toks and toks[0] == "@!PT":  # never executes (scheduling filler)
            continue
        if toks and toks[0].startswith("@"):
            toks = toks[1:]
        if toks:
            out.append((int(m.group(1), 16), toks[0], " ".join(toks[1:])))
    return out


def branches(ins: list) -> list:
    """[(address, target)] of the BRA instructions with an immediate target."""
    hits = [(a, re.match(r"(?:P\d+,\s*)?0x([0-9a-f]+)", rest)) for a, op, rest in ins if op == "BRA"]
    return [(a, int(h.group(1), 16)) for a, h in hits if h]


def main_loop(ins: list):
    """(start, end) addresses of the backward branch range with the most HGMMA/HMMA, or None."""
    back = [(t, a) for a, t in branches(ins) if t < a]
    mma = lambda r: sum(1 for a, o, _ in ins if r[0] <= a <= r[1] and o.startswith(("HGMMA", "HMMA")))  # noqa: E731
    return max(back, key=lambda r: (mma(r), r[1] - r[0]), default=None)


def bucket(op: str):
    """The histogram key of an opcode, or None for the ones not tracked."""
    base = op.split(".")[0]
    if base in ("LDSM", "STSM"):
        return op  # .16.M88.4 / .MT88.4 (transposed): 4 8x8 matrices of 16 bits
    if base in ("LDG", "LDS", "STS", "STG", "LDGSTS"):
        width = next((w for w in ("128", "64", "U16", "S16", "U8", "S8") if f".{w}" in op), "32")
        return f"{base}.{width}"
    if op.startswith("HFMA2") or op.startswith("HADD2") or op.startswith("HMUL2"):
        return op  # .BF16_V2 = bf16x2; plain = f16x2
    tracked = ("HGMMA", "HMMA", "UTMALDG", "UBLKCP", "LOP3", "PRMT", "SHF", "BAR", "LDL", "STL", "FFMA", "FADD",
               "FMUL", "F2FP", "I2F", "WARPGROUP", "MEMBAR", "FENCE", "LDGDEPBAR", "DEPBAR", "SYNCS", "IMAD", "IADD3")
    return base if base in tracked else None


def cold_ranges(ins: list, lo: int, hi: int) -> list:
    """Address ranges inside the loop skipped by a forward branch and holding an STG: the
    tile-end stores (output tile or split-K partials), taken once per tile, not per trip."""
    fwd = [(a, t) for a, t in branches(ins) if lo <= a < t <= hi]
    return [(a + 1, t - 1) for a, t in fwd if any(a < x < t and o.startswith("STG") for x, o, _ in ins)]


def histogram(ins: list, lo=None, hi=None, cold=()) -> dict:
    c = Counter()
    for a, op, rest in ins:
        if (lo is None or lo <= a <= hi) and not any(x <= a <= y for x, y in cold):
            c["total"] += 1
            if op == "WARPGROUP.DEPBAR.LE" and rest.endswith("0x0"):
                c["wgmma_wait0"] += 1
            b = bucket(op)
            if b:
                c[b] += 1
    return dict(c)


def analyse(job: tuple) -> dict:
    """Compile one (M, N, K, cfg) and take its census (runs in a worker process)."""
    M, N, K, cfg = job
    triton.knobs.compilation.always_compile = triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v log, printed
    sig, const, attrs, opts = launch_args(M, N, K, cfg)
    res = {"M": M, "N": N, "K": K, "cfg": cfg, "opts": opts}
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            src = triton.compiler.ASTSource(fn=kernel_fn(cfg.get("kind", "fused")), signature=sig, constexprs=const,
                                            attrs=attrs)
            k = triton.compile(src, target=TARGET, options=opts)
    except Exception as exc:  # noqa: BLE001 - a config this compiler rejects: record it, go on
        res["error"] = f"{type(exc).__name__}: {exc}"[:600]
        return res
    res.update(ptxas_numbers(log.getvalue()))
    res["smem"] = k.metadata.shared
    res["ptx"] = {n: n in k.asm["ptx"] for n in ("wgmma.mma_async", "mma.sync", "cp.async.c", "cp.async.bulk",
                                                  "ldmatrix")}
    gir = k.asm["ttgir"]  # shared buffers (pipeline depth) of the words and x; wgmma warp layouts
    alloc = r"(?:_\d+)? = ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x"
    res["bufs"] = {v: sorted(set(re.findall(f"%{v}{alloc}", gir))) for v in ("ha", "x")}
    res["wg_warps"] = sorted(set(re.findall(r"versionMajor = 3, .*?warpsPerCTA = \[(\d+), (\d+)\]", gir)))
    with tempfile.NamedTemporaryFile(suffix=".cubin", buffering=0) as f:
        f.write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
    if os.environ.get("KSASS_DIR"):  # --sass-dir, passed to the workers
        name = f"M{M}_K{K}_{label(cfg).replace(' ', '_').replace('=', '')}.sass"
        with open(os.path.join(os.environ["KSASS_DIR"], name), "w") as f:
            f.write(sass)
    ins = parse_sass(sass)
    loop = main_loop(ins)
    res["all"] = histogram(ins)
    res["loop_range"] = [hex(a) for a in loop] if loop else None
    cold = cold_ranges(ins, *loop) if loop else []
    res["cold"] = [[hex(a), hex(b)] for a, b in cold]
    res["loop"] = histogram(ins, *loop, cold) if loop else {}
    res["hgmma_shapes"] = sorted({op for _, op, _ in ins if op.startswith("HGMMA")})
    return res


def label(cfg: dict) -> str:
    if cfg.get("kind") == "gemv":
        return f"gemv BN{cfg['BN']} w{cfg.get('warps', 1)} waves{cfg.get('waves')}"
    fold = "fold " if cfg.get("fold") else ""
    s = f"{'swap ' if cfg.get('swap') else ''}{fold}{cfg['BM']}x{cfg['BN']} w{cfg.get('warps', 4)} s{cfg.get('stages', 3)}"
    g = cfg.get("grid", "auto")
    return s + ("" if g == "auto" else f" g={g}") + (f" r{cfg['maxnreg']}" if cfg.get("maxnreg") else "")


def fmt_group(h: dict, prefix: str) -> str:
    parts = [f"{k[len(prefix):]}:{v}" for k, v in sorted(h.items()) if k.startswith(prefix)]
    return " ".join(parts) or "-"


def derived(r: dict) -> dict:
    """Per trip (one 128-row block of one BM x BN tile): groups of 8 weights a thread dequantizes,
    dequant-ish ALU ops (LOP3, PRMT, SHF, HFMA2/HADD2; address math included) per 8 weights, warp-instrs
    per distinct weight over all MT row tiles (each re-dequantizes), the time 4 issues/clk/SM at CLOCK
    need for them, and the KB of words in flight per SM (resident CTAs x (word buffers - 1) blocks)."""
    cfg, lp = r["cfg"], r["loop"]
    warps = cfg.get("warps", 4)
    w8 = 128 * cfg["BN"] / (32 * warps) / 8
    deq = sum(v for k, v in lp.items() if k in ("LOP3", "PRMT", "SHF") or k.startswith(("HFMA2", "HADD2")))
    mt = -(-r["M"] // cfg["BM"])
    ipw = lp.get("total", 0) * warps * mt / (128 * cfg["BN"])
    occ = awq_kpack.programs_per_sm(r["regs"], r["smem"], warps)  # the launcher's own estimate
    fly = occ * (int(max(r["bufs"]["ha"] or ["1"], key=int)) - 1) * cfg["BN"] * 64 / 1024  # KB of words
    return {"w8": w8, "deq_per8": deq / w8 if w8 else 0.0, "ipw": ipw, "mt": mt, "occ": f"{occ} ({occ * warps}w)",
            "issue_us": r["N"] * r["K"] * ipw / (4 * SMS * CLOCK) * 1e6, "fly": fly,
            "x_mb": -(-r["N"] // cfg["BN"]) * mt * cfg["BM"] * r["K"] * 2 / 1e6}  # x re-read per column tile


def row(r: dict) -> str:
    count = lambda h, prefix: sum(v for k, v in h.items() if k.startswith(prefix))  # noqa: E731
    if "error" in r:
        return f"| {label(r['cfg'])} | compile failed: {r['error'][:160].replace('|', '/')} |" + " |" * 19
    a, lp = r["all"], r["loop"]
    mma = "HGMMA" if a.get("HGMMA") else "HMMA"
    d = derived(r)
    waits = f" ({lp['wgmma_wait0']} wait0)" if lp.get("wgmma_wait0") else ""
    waits += " " + "+".join(f"[{a},{b}]" for a, b in r["wg_warps"]) if r["wg_warps"] else ""
    bufs = "/".join(",".join(r["bufs"][v]) or "-" for v in ("ha", "x"))
    hf, smem = count(lp, "HFMA2") + count(lp, "HADD2"), r["smem"] // 1024
    return (f"| {label(r['cfg'])} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} ({r['stack']}) "
            f"| {smem}{' >227, no launch' if r['smem'] > 232448 else ''} | {bufs} | {d['occ']} "
            f"| {mma} {a.get(mma, 0)}/{lp.get(mma, 0)}{waits} | {count(a, 'LDSM')}/{count(lp, 'LDSM')} "
            f"| {count(a, 'LDGSTS')}/{a.get('UTMALDG', 0)} | {fmt_group(lp, 'LDG.')} "
            f"| {fmt_group(lp, 'LDS.')} ; {fmt_group(lp, 'STS.')} "
            f"| {lp.get('LOP3', 0)}/{lp.get('PRMT', 0)}/{hf}/{lp.get('SHF', 0)} | {lp.get('BAR', 0)} "
            f"| {lp.get('LDL', 0)}/{lp.get('STL', 0)} | {a.get('total', 0)}/{lp.get('total', 0)} "
            f"| {d['deq_per8']:.1f} | {d['mt']} | {d['ipw']:.3f} | {d['issue_us']:.0f} | {d['fly']:.0f} "
            f"| {d['x_mb']:.0f} |")


HEADER = ("| config | regs | spill st/ld B (stack) | smem KB | bufs words/x | CTAs/SM (warps) | MMA all/loop "
          "| LDSM all/loop | LDGSTS/TMA all | LDG in loop | LDS ; STS in loop | LOP3/PRMT/HFMA2+HADD2/SHF loop "
          "| BAR loop | LDL/STL loop | instr all/loop | dequant-ish ops per 8 w | MT | warp-instr per weight "
          "| issue-bound us | weight KB in flight/SM | x MB via L2 |\n" + "|---" * 21 + "|")


def gemv_row(r: dict) -> str:
    """One gemv kernel: a loop trip is one 128-row block of BN columns for all rows."""
    if "error" in r:
        return f"| {r['N']}x{r['K']} M={r['M']} {label(r['cfg'])} | compile failed: {r['error'][:160].replace('|', '/')} |" + " |" * 7
    cfg, lp = r["cfg"], r["loop"]
    warps = cfg.get("warps", 1)
    ipw = lp.get("total", 0) * warps / (128 * cfg["BN"])
    occ = awq_kpack.programs_per_sm(r["regs"], r["smem"], warps)
    ops = " ".join(f"{k}:{lp[k]}" for k in ("LOP3", "SHF", "PRMT", "FADD", "FFMA", "FMUL", "I2F", "BAR") if lp.get(k))
    return (f"| {r['N']}x{r['K']} M={r['M']} {label(cfg)} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} | {r['smem']} "
            f"| {occ} ({occ * warps}w) | {fmt_group(lp, 'LDG.')} | {fmt_group(lp, 'LDS.')} ; {fmt_group(lp, 'STS.')} "
            f"| {ops} | {lp.get('total', 0)} | {ipw:.2f} |")


GEMV_HEADER = ("| config | regs | spill st/ld B | smem B | CTAs/SM (warps) | LDG in loop | LDS ; STS in loop "
               "| ALU in loop | instr a trip | warp-instr per weight |\n" + "|---" * 10 + "|")


def markdown(results: list) -> str:
    gemv = [r for r in results if r["cfg"].get("kind") == "gemv"]
    results = [r for r in results if r["cfg"].get("kind") != "gemv"]
    out = (["\n### gemv (llm_kernels.awq_gemv): N x K, M\n", GEMV_HEADER] + [gemv_row(r) for r in gemv]) if gemv else []
    for name, (N, K) in SHAPES.items():
        for M in MS:
            rs = [r for r in results if (r["M"], r["N"], r["K"]) == (M, N, K)]
            if rs:
                floor = N * K * 2 / HBM * 1e6  # bf16 weights read once: cuBLAS's floor
                out += [f"\n### {name} N={N} K={K}, M={M} (bf16 W {N * K * 2e-6:.0f} MB at {HBM / 1e12:.1f} "
                        f"TB/s: {floor:.0f} us; int4: {floor / 4:.0f} us)\n", HEADER] + [row(r) for r in rs]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, nargs="*", default=list(MS))
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--md", default="/tmp/sass_tables.md")
    ap.add_argument("--json", default="/tmp/sass_census.json")
    ap.add_argument("--sass-dir", help="also write each kernel's SASS there")
    args = ap.parse_args()
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
        os.environ["KSASS_DIR"] = args.sass_dir
    jobs = [(M, *SHAPES[s], cfg) for s in args.shapes for M in args.m for cfg in candidates(M)]
    # N is a runtime argument (only its divisibility by 16 is specialised): shapes of one K share kernels
    key = lambda j: (j[0], j[2], j[1] % 16 == 0, json.dumps(j[3], sort_keys=True))  # noqa: E731
    uniq = {key(j): j for j in jobs}
    print(f"{len(jobs)} kernels, {len(uniq)} distinct compiles", file=sys.stderr)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        done = dict(zip(uniq, pool.map(analyse, uniq.values())))
    results = [dict(done[key(j)], N=j[1]) for j in jobs]
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    text = markdown(results)
    with open(args.md, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
