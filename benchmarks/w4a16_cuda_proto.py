"""The CUDA C++ W4A16 kernel of llm_kernels.awq_mma (issue 20; the technique is in that
module's docstring), and with --kinds mma_wide the experiment of benchmarks/w4a16_wide.py:
every config at M <= 64 on Qwen2.5-7B's four layers, checked against x @ dequant(w) and
timed cold-L2 (CUDA-graph replays over weight sets, as K1) beside the Triton kpack pick and
K1's peers (cuBLAS on dequantized bf16 weights, tinygemm, gemlite) of the same shape in the
same run: the evidence for where awq_linear uses it (MAX_M).

    python3 benchmarks/w4a16_cuda_proto.py [--ms 1,8,16,32,48,64] [--shapes 18944x3584] [--kinds mma,mma_wide]
        [--out $OUT/cuda_proto.json]

On the CPU, tests/kernels/test_awq_mma.py checks the layout the way the lanes read it.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llm_kernels import awq_mma  # noqa: E402
from benchmarks import w4a16_wide  # noqa: E402

G = 128  # K1's group size
SHAPES = [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)]  # (K, N) of Qwen2.5-7B's layers


def candidates(M: int, N: int, K: int, kinds: list) -> list:
    """Every config of the asked kernels (mma: awq_mma's, mma_wide: w4a16_wide's) at this
    shape, with its launch."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfgs = (awq_mma.mma_configs(M, N) if "mma" in kinds else []) + \
        (w4a16_wide.wide_configs(M, N, K, sms) if "mma_wide" in kinds else [])
    return [(c, awq_mma.mma_launch if c["kind"] == "mma" else w4a16_wide.wide_launch) for c in cfgs]


def config_name(cfg: dict) -> str:
    if cfg["kind"] == "mma":
        return f"nw={cfg['nw']} u={cfg['u']} ntb={cfg.get('ntb', 1)}"
    return f"wide wn={cfg['wn']} ntb={cfg['ntb']} u={cfg['u']} s={cfg['s']} ks={cfg['ks']}"


def time_shape(K: int, N: int, ms: list, gen, gemlite, kinds: list) -> list:
    """Rows for one layer: every CUDA config checked against x @ dequant(w) and timed on
    CUDA-graph replays rotating through weight sets (cold L2, as K1), beside the Triton pick
    and K1's peers (cuBLAS on dequantized bf16 weights, tinygemm, gemlite) in the same run."""
    from benchmarks import int4_peers
    from benchmarks.kernel_bench import bench_rot, nsets, time_int4_peers
    from llm_kernels import awq, awq_dequantize
    from llm_kernels.awq import pack_awq_int4

    wbytes = K * N // 2 + (K // G) * N * 2 + (K // G) * N // 2  # K1's: int4 words, bf16 scales, int4 zeros
    sets, peer_sets, dense = [], [], []
    for i in range(nsets(wbytes)):
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
        s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
        sets.append((awq.awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G, mma=False), *awq_mma.mma_pack(q, z, s)))
        peer_sets.append(int4_peers.build(gemlite, q, z, s, G))
        if i < nsets(2 * K * N):
            dense.append(awq_dequantize(pack_awq_int4(q), pack_awq_int4(z), s, G))
        if i == 0:
            ref_w = ((q - z.repeat_interleave(G, 0)).float() * s.float().repeat_interleave(G, 0))
    rows = []
    bw = 4.27e12  # GPU.md's measured copy rate; ratios below are to this floor
    for M in ms:
        x = (torch.randn(M, K, device="cuda", generator=gen)).to(torch.bfloat16)
        ref = x.float() @ ref_w
        awq.awq_linear(x, sets[0][0])  # the tuner picks the Triton config first
        triton_s = bench_rot([lambda p=st[0]: awq.awq_linear(x, p) for st in sets])
        peers = {"cublas": bench_rot([lambda w=w: x @ w for w in dense]), **time_int4_peers(x, ref, peer_sets)}
        timed = {k: v for k, v in peers.items() if isinstance(v, float) and not k.endswith("_rel_err")}
        best_peer = min(timed.values())
        floor = (wbytes + 2 * M * (K + N)) / bw
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        for cfg, launch in candidates(M, N, K, kinds):
            out.fill_(float("nan"))
            launch(x, sets[0][1], sets[0][2], cfg, out)
            err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
            t = bench_rot([lambda st=st, c=cfg, f=launch: f(x, st[1], st[2], c, out) for st in sets])
            name = config_name(cfg)
            rows.append({"case": f"{K}x{N} M={M}", "config": name, "rel_err": err,
                         "time_us": t * 1e6, "triton_us": triton_s * 1e6, "ratio_to_triton": triton_s / t,
                         "ratio_to_floor": floor / t, "triton_ratio_to_floor": floor / triton_s,
                         "best_peer": min(timed, key=timed.get), "ratio_to_peer": best_peer / t,
                         **{f"{k}_us": v * 1e6 for k, v in timed.items()}})
    del sets, peer_sets, dense
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,8,16,32,48,64")
    ap.add_argument("--shapes", default=None, help="KxN,KxN (default: Qwen2.5-7B's four layers)")
    ap.add_argument("--kinds", default="mma",
                    help="the kernels timed: mma (awq_mma), mma_wide (benchmarks/w4a16_wide.py, an experiment)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(1234)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    from benchmarks import int4_peers

    gemlite, why = int4_peers.load_gemlite()
    if gemlite is None:
        print("no gemlite peer:", why)
    rows = []
    for K, N in shapes:
        rows += time_shape(K, N, [int(m) for m in args.ms.split(",")], gen, gemlite, args.kinds.split(","))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(f"{'case':20} {'config':30} {'rel err':>8} {'us':>7} {'floor':>6} {'triton us':>9} {'floor':>6} "
          f"{'x triton':>8} {'x peer':>7}")
    for r in rows:
        print(f"{r['case']:20} {r['config']:30} {r['rel_err']:8.1e} {r['time_us']:7.1f} {r['ratio_to_floor']:6.2f} "
              f"{r['triton_us']:9.1f} {r['triton_ratio_to_floor']:6.2f} {r['ratio_to_triton']:8.2f} "
              f"{r['ratio_to_peer']:7.2f}")
    best = {}
    for r in rows:
        if r["rel_err"] < 1e-2 and (r["case"] not in best or r["time_us"] < best[r["case"]]["time_us"]):
            best[r["case"]] = r
    print("best correct config a case:")
    for case, r in best.items():
        print(f"  {case:20} {r['config']:30} {r['ratio_to_floor']:.2f} of the floor (Triton "
              f"{r['triton_ratio_to_floor']:.2f}), {r['ratio_to_triton']:.2f}x the Triton pick, "
              f"{r['ratio_to_peer']:.2f}x the best peer ({r['best_peer']} {r[r['best_peer'] + '_us']:.1f} us)")


if __name__ == "__main__":
    main()
