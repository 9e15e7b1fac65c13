"""L2 (benchmarks/README.md): the batched LoRA kernel against a per-adapter loop of torch ops, CUDA.

llm_kernels.add_lora (shrink then expand, every token on its own adapter) at 8 rank-16 adapters
and a batch of 64 tokens, 8 an adapter, on Qwen2.5-7B's layers as the engine holds them (q, k, v
and gate, up merged: a rank-16 pair for each of their output slices), bf16. Peer, same run: a per-adapter loop of torch ops
(gather the adapter's rows, two matmuls, index_add_ into out), its token indices computed
before timing (the loop's most generous form: no host work timed). Floor: the bytes of A and B
of the adapters used, x, and out read and written, at the copy bandwidth measured in this run.
Times are medians of CUDA-graph replays cycling through input sets spanning four times the L2
(benchmarks/kernel_bench.py), so the adapters are read cold, as a decode step reads them.

    python3 benchmarks/lora.py [--batches 64] [--layers qkv,o,gate_up,down] [--out PATH]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import record  # noqa: E402 - after the repository root is on the path

ID = "L2"
# (K, output slices): q, k, v and gate, up each with its own pair
LAYERS = {"qkv": (3584, (3584, 512, 512)), "o": (3584, (3584,)), "gate_up": (3584, (18944, 18944)),
          "down": (18944, (3584,))}
ADAPTERS, RANK, BATCH = 8, 16, 64
TARGET_PEER = 3.0  # at ADAPTERS adapters and a batch of BATCH


def floor_bytes(T: int, K: int, slices, adapters: int, rank: int, elem: int = 2) -> int:
    """What any kernel must move: A [rank, K] of each output slice and B [N, rank] of each
    adapter used, x [T, K] read, out [T, N] read and written."""
    N = sum(slices)
    return elem * (adapters * rank * (len(slices) * K + N) + T * K + 2 * T * N)


def batch_slots(T: int, adapters: int, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """int32 [T]: every token on an adapter, the adapters shuffled over the batch (as decode
    requests arrive), each on T / adapters tokens."""
    order = torch.randperm(T, generator=gen, device=device)
    return (order % adapters).to(torch.int32)


def groups(slots: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """(adapter, int64 token indices) for each adapter in use: the peer's partition, made once."""
    return [(s, torch.nonzero(slots == s).squeeze(1)) for s in torch.unique(slots).tolist() if s >= 0]


def peer_loop(out, x, a, b, parts, slices) -> None:
    """The peer: out[idx] += (x[idx] a[s]^T) b[s]^T one adapter at a time, in torch ops (one
    expand matmul per output slice)."""
    R = b.shape[2]
    for s, idx in parts:
        y = x.index_select(0, idx) @ a[s].t()
        bs = b[s].split(list(slices))
        out.index_add_(0, idx, torch.cat([y[:, i * R : (i + 1) * R] @ bi.t() for i, bi in enumerate(bs)], dim=1))


def update_err(got, before, ref) -> float:
    """Relative error of an update (got - before) against the reference's."""
    d, r = (got.double() - before.double()), (ref.double() - before.double())
    return ((d - r).norm() / r.norm().clamp_min(1e-30)).item()


def input_sets(T, K, slices, n, gen):
    """n sets of (out, x, a, b) in bf16 on the GPU, the update about out's size."""
    sets, N = [], sum(slices)
    for _ in range(n):
        a = (torch.randn(ADAPTERS, len(slices) * RANK, K, device="cuda", generator=gen) * K ** -0.5).bfloat16()
        b = (torch.randn(ADAPTERS, N, RANK, device="cuda", generator=gen) * RANK ** -0.5).bfloat16()
        x = torch.randn(T, K, device="cuda", generator=gen).bfloat16()
        out = torch.randn(T, N, device="cuda", generator=gen).bfloat16()
        sets.append((out, x, a, b))
    return sets


def check(first, slots, parts, slices) -> tuple[float, float]:
    """(our update's rel err, the peer's) against llm_kernels.lora.add_lora_reference on one set."""
    import llm_kernels
    from llm_kernels.lora import add_lora_reference

    out, x, a, b = first
    ref = out.clone()
    add_lora_reference(ref, x, a, b, slots, slices)
    ours, peer = out.clone(), out.clone()
    llm_kernels.add_lora(ours, x, a, b, slots, slices)  # also compiles and tunes this shape
    peer_loop(peer, x, a, b, parts, slices)
    return update_err(ours, out, ref), update_err(peer, out, ref)


def tuner_picks(T, K, slices) -> dict:
    """The configs the tuner chose for the shape's shrink and expand."""
    from llm_kernels.dispatch import chosen
    from llm_kernels.lora.configs import expand_key, shrink_key
    from llm_kernels.lora.kernels import block_r

    return {"shrink_config": str(chosen("lora_shrink", shrink_key(T, K, block_r(len(slices) * RANK), torch.bfloat16))),
            "expand_config": str(chosen("lora_expand", expand_key(T, sum(slices), block_r(RANK), len(slices),
                                                                  torch.bfloat16)))}


def measure(layer: str, T: int, bw: float, gen) -> dict:
    """One row: add_lora and the peer on one layer at batch T."""
    import benchmarks.kernel_bench as bk
    import llm_kernels

    K, slices = LAYERS[layer]
    N = sum(slices)
    nbytes = floor_bytes(T, K, slices, ADAPTERS, RANK)
    sets = input_sets(T, K, slices, bk.nsets(nbytes), gen)
    slots = batch_slots(T, ADAPTERS, torch.Generator().manual_seed(T)).cuda()
    parts = groups(slots)
    err, peer_err = check(sets[0], slots, parts, slices)
    ours = bk.bench_rot([lambda s=s: llm_kernels.add_lora(*s, slots, slices) for s in sets])
    peer = bk.bench_rot([lambda s=s: peer_loop(*s, parts, slices) for s in sets])
    target = TARGET_PEER if T == BATCH else None
    what = f"{len(slices)} slices" if len(slices) > 1 else "one slice"
    r = bk.row(ID, f"{layer} {K}x{N} ({what}) batch {T}, {ADAPTERS} adapters r{RANK}", ours, nbytes / bw, peer, None,
               target, gbps=nbytes / ours / 1e9, rel_err=err, peer_rel_err=peer_err, **tuner_picks(T, K, slices))
    r["wrong"] = not err < 1.5e-2
    del sets
    torch.cuda.empty_cache()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    ap.add_argument("--batches", default=str(BATCH), help="token counts, comma-separated (the target is at 64)")
    ap.add_argument("--layers", default=",".join(LAYERS), help="of " + ", ".join(LAYERS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"{ID} measures the LoRA kernel on a CUDA GPU (its Triton kernels run only there); "
                 "no CUDA device here. The CPU path is covered by tests/kernels/lora.")
    import benchmarks.kernel_bench as bk

    gen = torch.Generator(device="cuda").manual_seed(1234)
    bk.GEN = gen
    bw, _ = bk.ceilings()  # (the matmul rate it also measures plays no part: the floor is bytes)
    rows = []
    for layer in args.layers.split(","):
        for T in (int(t) for t in args.batches.split(",")):
            rows.append({**measure(layer, T, bw, gen), "copy_GBps": bw / 1e9})
            record.save(rows[-1:], args.out)
    print(f"\ncopy {bw / 1e9:.0f} GB/s ({record.device()}); wrote {args.out}")
    for r in rows:
        print(f"    {r['case']}: ours {r['time_us']:.1f} us, loop {r['peer_us']:.1f} us, floor {r['floor_us']:.1f} us "
              f"({r['shrink_config']}; {r['expand_config']})")
    print(record.table(rows, 44))


if __name__ == "__main__":
    main()
