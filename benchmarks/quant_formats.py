"""Weight formats on a CUDA GPU (benchmarks/README.md): K1-fmt, the other 4-bit formats (GPTQ,
GPTQ act-order, compressed-tensors W4A16) built from their checkpoint tensors the way the engine
loads them, run by the same W4A16 path as AWQ, beside AWQ itself; and K5, the FP8 linear
(FP8_DYNAMIC layers: whatever llm_kernels.fp8 selects and tunes), the W8A16 kernel alone, the
Triton W8A8 kernel alone and the cuBLAS W8A8 path alone (per-token activations quantized in one
launch, torch._scaled_mm) against bf16 cuBLAS and the bytes floor at M = 1..256; and for
q/k/v, gate/up and down, whose inputs the model's RMSNorm or activation quantizes in its own
launch where the layer's step takes e4m3 (engine.model.layers.quantized_input), a "fed" row:
the layer as the model runs it then, handed that quantization. Ratios
as in benchmarks/kernel_bench.py (ceilings measured in this run, CUDA-graph replays cycling
through input sets to keep L2 cold).

    python3 benchmarks/quant_formats.py [--only K1-fmt,K5] [--out PATH]
"""
import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import llm_kernels  # noqa: E402
import benchmarks.kernel_bench as bk  # noqa: E402
from benchmarks import record  # noqa: E402
# the formats' own unpacking and the engine's repacking, as the engine loads a checkpoint
from engine.quant.repacked import apply_parts, int4_parts  # noqa: E402
from llm_kernels.w4a16.ct_format import ct_int_view  # noqa: E402
from llm_kernels import fp8  # noqa: E402
from llm_kernels.dispatch import TIMINGS, chosen  # noqa: E402
from llm_kernels.fp8 import FP8, dequantize_fp8, fp8_qdq_per_token  # noqa: E402
from llm_kernels.fp8.act_quant import quantize_per_token  # noqa: E402
from llm_kernels.fp8 import scaled_mm_available  # noqa: E402
from llm_kernels.fp8 import weight as fp8_weight  # noqa: E402
from llm_kernels.fp8.configs import shape_key as fp8_shape_key  # noqa: E402
from llm_kernels.w4a16.gptq_format import gptq_unpack, pack_cols, pack_rows  # noqa: E402

SHAPES = [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)]
FED = [(3584, 4608), (3584, 37888), (18944, 3584)]  # q/k/v and gate/up after a norm, down after the activation
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
        return [llm_kernels.w4a16_prepare(llm_kernels.pack_awq_int4(q), llm_kernels.pack_awq_int4(z), s, G)], ref
    if fmt.startswith("gptq"):
        qq, zz = gptq_unpack(pack_rows(q, 4), pack_cols(z - 1, 4), 4, 1)  # v1: zeros stored minus one
        return int4_parts([(qq, zz, s, g_idx)], G, torch.bfloat16), ref
    if want_ref:  # compressed-tensors W4A16 is symmetric: zero 8
        ref = (q - 8).float() * s.float()[g_idx]
    view = ct_int_view(pack_rows(q, 4).t().contiguous(), s.t(), None, None, 4, K)  # weight_packed [N, K/8]
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
            if fmt == "awq":
                run = lambda x, p: llm_kernels.w4a16_linear(x, p[0])  # noqa: E731
            else:
                run = lambda x, p: apply_parts(p, x, None)  # noqa: E731
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
                rows.append(bk.row("K1-fmt", f"{fmt} {K}x{N} M={M}", ours, floor, peer, tf, tp, rel_err=err,
                                   ratio_to_awq=times[("awq", M)] / ours, wrong=not err < 1.5e-2))
            del layers, first, w_ref
        del dense
        torch.cuda.empty_cache()
    return rows


def _fp8_sets(K, N, count, device, gen):
    """`count` FP8_DYNAMIC-style layers (e4m3 per channel, activations per token), as the engine holds them."""
    sets = []
    for _ in range(count):
        w = torch.randn(N, K, device=device, generator=gen) * 0.05
        s = (w.abs().amax(1) / 448).clamp_min(1e-8)
        sets.append(fp8.prepare((w / s[:, None]).to(FP8), s, torch.bfloat16))
    return sets


def _w8a8(x, p, xq=None, xs=None):
    """The cuBLAS W8A8 path: x quantized per token (unless given), torch._scaled_mm on the e4m3 weight."""
    if xq is None:
        xq, xs = quantize_per_token(x)
    return torch._scaled_mm(xq, p.weight.t(), scale_a=xs, scale_b=p.scale.view(1, -1), out_dtype=torch.bfloat16)


def _k5_scaled_mm(x, sets, timer):
    """Seconds per call of the W8A8 path and of its GEMM alone; (None, None) where the
    device has no FP8 tensor cores."""
    if not scaled_mm_available(x.device):
        return None, None
    xq, xs = quantize_per_token(x)
    gemm = timer([lambda p=p: _w8a8(x, p, xq, xs) for p in sets])
    return timer([lambda p=p: _w8a8(x, p) for p in sets]), gemm


def k5_row(K, N, M, sets, dense, ceil, timer, gen):
    """One K5 row: the product's FP8 linear (whatever the selection and the tuner run), the
    W8A16 kernel alone, the Triton W8A8 kernel alone (where FP8 tensor cores are) and the
    cuBLAS W8A8 path alone against bf16 cuBLAS, each with its error against the float32 math
    it computes."""
    bw, peak, fp8_peak = ceil
    x = torch.randn(M, K, device=sets[0].weight.device, generator=gen).to(torch.bfloat16)
    p = sets[0]
    w_deq = dequantize_fp8(p.weight, p.scale)
    out = fp8.linear(x, p)  # tunes this shape (and the W8A16 kernel's configs) before timing
    kernel, _ = fp8.plan(x, p)
    weight_only = x.float() @ w_deq.t()
    ref = weight_only if kernel == "w8a16" else fp8_qdq_per_token(x.float()) @ w_deq.t()
    err = rel(out, ref)
    w8_err = rel(fp8_weight.w8a16_tuned(x, p), weight_only)
    key = fp8_shape_key(M, N, K, p.layout, x.dtype)
    w8_cfg = chosen(fp8_weight.TUNED_KERNEL, key)
    a8 = scaled_mm_available(x.device)
    a8_err = rel(fp8_weight.w8a16_tuned(x, p, a8=True), fp8_qdq_per_token(x.float()) @ w_deq.t()) if a8 else None
    timed = {name: [[str(c), t * 1e6] for c, t in TIMINGS.get((name,) + key, [])]
             for name in (fp8_weight.TUNED_KERNEL, fp8_weight.TUNED_A8, fp8_weight.TUNED_PATH)}
    ours = timer([lambda p=p: fp8.linear(x, p) for p in sets])
    w8 = timer([lambda p=p: fp8_weight.w8a16_tuned(x, p) for p in sets])
    w8a8 = timer([lambda p=p: fp8_weight.w8a16_tuned(x, p, a8=True) for p in sets]) if a8 else None
    sm, gemm = _k5_scaled_mm(x, sets, timer)
    peer = timer([lambda w=w: x @ w for w in dense])
    wbytes = K * N + 4 * N
    floor = max((wbytes + 2 * M * (K + N)) / bw, 2 * M * K * N / (fp8_peak if kernel == "scaled_mm" else peak))
    return bk.row("K5", f"fp8 {K}x{N} M={M}", ours, floor, peer, None, 1.3 if M <= 64 else 1.1, kernel=kernel,
                  rel_err=err, w8a16_us=w8 * 1e6, w8a16_ratio_to_cublas=peer / w8, w8a16_rel_err=w8_err,
                  w8a16_config=str(w8_cfg), w8a16_candidates_us=timed[fp8_weight.TUNED_KERNEL],
                  w8a8_us=None if w8a8 is None else w8a8 * 1e6,
                  w8a8_ratio_to_cublas=None if w8a8 is None else peer / w8a8, w8a8_rel_err=a8_err,
                  w8a8_config=str(chosen(fp8_weight.TUNED_A8, key)), w8a8_candidates_us=timed[fp8_weight.TUNED_A8],
                  path_candidates_us=timed[fp8_weight.TUNED_PATH], scaled_mm_us=None if sm is None else sm * 1e6,
                  scaled_mm_ratio_to_cublas=None if sm is None else peer / sm,
                  scaled_mm_only_us=None if gemm is None else gemm * 1e6,
                  act_quant_share=None if gemm is None else 1 - gemm / sm,
                  wrong=not (err < 1e-2 and w8_err < 1e-2 and (a8_err is None or a8_err < 1e-2)))


def k5_fed_row(K, N, M, sets, ceil, timer, gen, peer):
    """One fed K5 row: the FP8 linear of a layer whose producer can quantize its input
    (FP8Weight.fed: its choice of kernel tuned apart, W8A8 timed without a quantization
    pass), handed x's quantization where its step takes one, against the unfed row's bf16
    cuBLAS time `peer` (seconds). The producer's own cost grows by writing M K bytes and M
    scales more, not counted here (at most about 0.2 us at M 256 on these layers)."""
    bw, peak, fp8_peak = ceil
    x = torch.randn(M, K, device=sets[0].weight.device, generator=gen).to(torch.bfloat16)
    fed = [dataclasses.replace(p, fed=True, wants={}) for p in sets]
    xq = quantize_per_token(x)
    fp8.wants_quantized_input(fed[0], x)
    out = fp8.linear(x, fed[0], xq=xq)  # tunes this shape, fed
    kernel, _ = fp8.plan(x, fed[0])
    handed = kernel in fp8_weight.A8_KERNELS
    w_deq = dequantize_fp8(fed[0].weight, fed[0].scale)
    err = rel(out, (x.float() if kernel == "w8a16" else fp8_qdq_per_token(x.float())) @ w_deq.t())
    key = fp8_shape_key(M, N, K, fed[0].layout, x.dtype) + ("fed",)
    ours = timer([lambda p=p: fp8.linear(x, p, xq=xq if handed else None) for p in fed])
    x_bytes = M * (K + 4) if handed else 2 * M * K  # e4m3 and a scale a token, or bf16
    floor = max((K * N + 4 * N + x_bytes + 2 * M * N) / bw, 2 * M * K * N / (fp8_peak if handed else peak))
    return bk.row("K5", f"fp8 {K}x{N} M={M} fed", ours, floor, peer, None, 1.3 if M <= 64 else 1.1, kernel=kernel,
                  rel_err=err, handed_over=handed,
                  path_candidates_us=[[str(c), t * 1e6] for c, t in TIMINGS.get((fp8_weight.TUNED_PATH,) + key, [])],
                  wrong=not err < 1e-2)


def k5(ceil, ms, shapes=SHAPES, device="cuda", gen=None, timer=None, fed=FED):
    """K5 over `shapes` (K, N) and token counts `ms`: a row each (k5_row), and a fed row each
    for the shapes in `fed` (k5_fed_row). timer: seconds per call of a list of closures
    (default: CUDA-graph replays cycling through them)."""
    rows, timer, gen = [], timer or bk.bench_rot, gen or bk.GEN
    for K, N in shapes:
        sets = _fp8_sets(K, N, bk.nsets(K * N + 4 * N) if device == "cuda" else 2, device, gen)
        dense = [torch.randn(K, N, device=device, generator=gen).to(torch.bfloat16)
                 for _ in range(bk.nsets(2 * K * N) if device == "cuda" else 2)]
        for M in ms:
            rows.append(k5_row(K, N, M, sets, dense, ceil, timer, gen))
            if (K, N) in fed:
                rows.append(k5_fed_row(K, N, M, sets, ceil, timer, gen, rows[-1]["peer_us"] / 1e6))
        del sets, dense
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def fp8_ceiling():
    a = bk.rand((8192, 8192)).to(FP8)
    b = bk.rand((8192, 8192)).to(FP8).t()
    one = torch.ones(1, device="cuda")
    return 2 * 8192**3 / bk.bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    ap.add_argument("--only", default="K1-fmt,K5")
    ap.add_argument("--ms", default="1,16,64,256,1024", help="K1-fmt's token counts")
    ap.add_argument("--fp8-ms", default="1,2,4,8,16,32,64,128,256", help="K5's token counts")
    args = ap.parse_args()
    bk.GEN = torch.Generator(device="cuda").manual_seed(1234)
    bw, peak = bk.ceilings()
    fp8_peak = fp8_ceiling()
    ceiling = {"copy_GBps": bw / 1e9, "bf16_TFLOPs": peak / 1e12, "fp8_TFLOPs": fp8_peak / 1e12}
    only = args.only.split(",")
    rows = []
    if "K1-fmt" in only:
        rows += k1_formats(bw, peak, [int(m) for m in args.ms.split(",")])
        record.save([{**r, **ceiling} for r in rows], args.out)
    if "K5" in only:
        rows += k5((bw, peak, fp8_peak), [int(m) for m in args.fp8_ms.split(",")])
        record.save([{**r, **ceiling} for r in rows], args.out)
    print(f"\ncopy {bw / 1e9:.0f} GB/s, bf16 {peak / 1e12:.0f} TFLOP/s, fp8 {fp8_peak / 1e12:.0f} TFLOP/s "
          f"({record.device()}); wrote {args.out}")
    print(record.table(rows, 36))


if __name__ == "__main__":
    main()
