"""K1 rows for the other 4-bit formats (GPTQ, GPTQ act-order, compressed-tensors
W4A16), each repacked at load into AWQ's layout and run by the same kernel as AWQ,
beside AWQ itself; and K5: the FP8 W8A8 GEMM (per-token dynamic activations,
torch._scaled_mm) against bf16 cuBLAS and its bytes floor at M = 1..256.
Ratios as in benchmarks/kernel_bench.py (ceilings measured in this run, CUDA-graph
replays cycling through input sets to keep L2 cold).

    python benchmarks/quant_formats.py --out $OUT/quant_formats.json [--only K1,K5]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchmarks.kernel_bench as bk  # noqa: E402
from engine.quant.repacked import apply_parts, int4_parts  # noqa: E402
from llm_kernels import awq  # noqa: E402
from llm_kernels.awq import pack_awq_int4  # noqa: E402
from llm_kernels.ct_format import ct_int_view, ct_pack  # noqa: E402
from llm_kernels.fp8 import FP8, fp8_linear, fp8_prepare, per_token_scales, quantize_fp8  # noqa: E402
from llm_kernels.gptq_format import gptq_unpack, pack_cols, pack_rows  # noqa: E402

SHAPES = [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)]
G = 128


def _ints(K, N):
    gen = bk.GEN
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen)
    z = torch.randint(1, 16, (K // G, N), device="cuda", generator=gen)  # v1 GPTQ cannot store zero 0
    s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
    return q, z, s


def _format_parts(fmt, K, N, want_ref=False):
    """One layer of `fmt` built from its checkpoint tensors the way the engine loads it,
    and (want_ref) its weight [K, N] in float32 straight from the integers."""
    q, z, s = _ints(K, N)
    g_idx = torch.arange(K, device="cuda") // G
    if fmt == "gptq-act-order":
        g_idx = g_idx[torch.randperm(K, device="cuda", generator=bk.GEN)]
    ref = (q - z[g_idx]).float() * s.float()[g_idx] if want_ref else None
    if fmt == "awq":
        return [awq.awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G)], ref
    if fmt.startswith("gptq"):
        qq, zz = gptq_unpack(pack_rows(q, 4), pack_cols(z - 1, 4), 4, 1)  # v1: zeros stored minus one
        return int4_parts([(qq, zz, s, g_idx)], G, torch.bfloat16), ref
    if want_ref:  # compressed-tensors W4A16 is symmetric: zero 8
        ref = (q - 8).float() * s.float()[g_idx]
    view = ct_int_view(ct_pack(q.t(), 4), s.t(), None, None, 4, K)
    return int4_parts([view], G, torch.bfloat16), ref


def k1_formats(bw, peak, ms):
    rows = []
    for K, N in SHAPES:
        wbytes = K * N // 2 + (K // G) * N * 2 + (K // G) * N // 2
        dense = [bk.rand((K, N)) for _ in range(bk.nsets(2 * K * N))]
        times = {}
        for fmt in ("awq", "gptq", "gptq-act-order", "compressed-tensors"):
            first, w_ref = _format_parts(fmt, K, N, want_ref=True)
            layers = [first] + [_format_parts(fmt, K, N)[0] for _ in range(bk.nsets(wbytes) - 1)]
            run = (lambda x, p: awq.awq_linear(x, p[0])) if fmt == "awq" else (lambda x, p: apply_parts(p, x, None))
            for M in ms:
                x = bk.rand((M, K))
                got = run(x, layers[0])  # tunes this shape before timing
                ref = x.float() @ w_ref
                err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
                ours = bk.bench_rot([lambda p=p: run(x, p) for p in layers])
                peer = bk.bench_rot([lambda w=w: x @ w for w in dense])
                times[(fmt, M)] = ours
                floor = max((wbytes + 2 * M * (K + N)) / bw, 2 * M * K * N / peak)
                large = N == 37888 or K == 18944
                tf, tp = ((0.80 if large else None), 3.0) if M <= 16 else ((None, 1.0) if M <= 256 else (None, 0.8))
                r = bk.row("K1", f"{fmt} {K}x{N} M={M}", ours, floor, peer, tf, tp, rel_err=err,
                           ratio_to_awq=times[("awq", M)] / ours)
                if not err < 1.5e-2:
                    r["case"] += " WRONG"
                rows.append(r)
            del layers, first, w_ref
        del dense
        torch.cuda.empty_cache()
    return rows


def k5(bw, peak, fp8_peak, ms):
    rows = []
    for K, N in SHAPES:
        wbytes = K * N + 4 * N
        sets = []
        for _ in range(bk.nsets(wbytes)):
            w = bk.rand((N, K), torch.float32, 0.05)
            s = (w.abs().amax(1) / 448).clamp_min(1e-8)
            sets.append(fp8_prepare((w / s[:, None]).to(FP8), s, torch.bfloat16))
        dense = [bk.rand((K, N)) for _ in range(bk.nsets(2 * K * N))]
        for M in ms:
            x = bk.rand((M, K))
            p = sets[0]
            ref = x.float() @ (p.weight_t.float() * p.scale)
            err = ((fp8_linear(x, p).double() - ref.double()).norm() / ref.double().norm()).item()
            ours = bk.bench_rot([lambda p=p: fp8_linear(x, p) for p in sets])
            xs = per_token_scales(x.float())
            xq = quantize_fp8(x.float(), xs)
            gemm = bk.bench_rot([lambda p=p: torch._scaled_mm(xq, p.weight_t, scale_a=xs, scale_b=p.scale,
                                                              out_dtype=torch.bfloat16) for p in sets])
            peer = bk.bench_rot([lambda w=w: x @ w for w in dense])
            floor = max((wbytes + 2 * M * (K + N)) / bw, 2 * M * K * N / fp8_peak)
            large = N == 37888 or K == 18944
            tf, tp = ((0.6 if large else None), 1.6) if M <= 16 else (None, 1.3)
            r = bk.row("K5", f"fp8 {K}x{N} M={M}", ours, floor, peer, tf, tp, rel_err=err,
                       scaled_mm_only_us=gemm * 1e6, act_quant_share=1 - gemm / ours)
            if not err < 6e-2:  # e4m3 on both operands: a few percent
                r["case"] += " WRONG"
            rows.append(r)
        del sets, dense
        torch.cuda.empty_cache()
    return rows


def fp8_ceiling():
    a = bk.rand((8192, 8192)).to(FP8)
    b = bk.rand((8192, 8192)).to(FP8).t()
    one = torch.ones(1, device="cuda")
    return 2 * 8192**3 / bk.bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "quant_formats.json"))
    ap.add_argument("--only", default="K1,K5")
    ap.add_argument("--ms", default="1,16,64,256,1024")
    ap.add_argument("--fp8-ms", default="1,2,4,8,16,32,64,128,256")
    args = ap.parse_args()
    bk.GEN = torch.Generator(device="cuda").manual_seed(1234)
    bw, peak = bk.ceilings()
    fp8_peak = fp8_ceiling()
    rows = []
    if "K1" in args.only:
        rows += k1_formats(bw, peak, [int(m) for m in args.ms.split(",")])
    if "K5" in args.only:
        rows += k5(bw, peak, fp8_peak, [int(m) for m in args.fp8_ms.split(",")])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": bw / 1e9,
              "bf16_matmul_TFLOPs": peak / 1e12, "fp8_matmul_TFLOPs": fp8_peak / 1e12, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\ncopy {bw / 1e9:.0f} GB/s, bf16 {peak / 1e12:.0f} TFLOP/s, fp8 {fp8_peak / 1e12:.0f} TFLOP/s "
          f"({result['device']})")
    print(f"{'id':3} {'case':36} {'us':>9} {'floor':>6} {'tgt':>5} {'peer':>6} {'tgt':>5} {'/awq':>5}  verdict")
    for r in rows:
        print(f"{r['id']:3} {r['case']:36} {r['time_us']:9.1f} {bk.fmt(r['ratio_to_floor']):>6} "
              f"{bk.fmt(r['target_floor']):>5} {bk.fmt(r['ratio_to_peer']):>6} {bk.fmt(r['target_peer']):>5} "
              f"{bk.fmt(r.get('ratio_to_awq')):>5}  {bk.verdict(r)}")


if __name__ == "__main__":
    main()
