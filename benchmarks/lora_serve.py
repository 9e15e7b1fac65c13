"""E1-lora: serving Qwen2.5-7B-AWQ shapes at concurrency 50 with 8 LoRA adapters of rank 16 (random,
on every projection) taken in turn by all requests, against the same engine without adapters in
the same run (benchmarks/README.md).

    python3 benchmarks/lora_serve.py [--adapters 8] [--rank 16] [--concurrency 50] [--out PATH]

Adapters are written in PEFT's format (adapter_config.json, adapter_model.safetensors) to a
temporary folder: nothing downloads. The floor is E1's plus, each decode step, the bytes of the
adapters' A and B at the copy bandwidth."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record, serve  # noqa: E402 - after the repository root is on the path

PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def projection_shapes(shapes: dict) -> dict[str, tuple[int, int]]:
    """(inputs, outputs) of each adapted projection of one decoder layer."""
    h, i = shapes["hidden_size"], shapes["intermediate_size"]
    kv = shapes["num_key_value_heads"] * h // shapes["num_attention_heads"]
    return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def adapter_bytes(shapes: dict, rank: int) -> int:
    """Bytes of one adapter's A and B (bf16) over every layer."""
    per_layer = sum(rank * (k + n) for k, n in projection_shapes(shapes).values())
    return 2 * per_layer * shapes["num_hidden_layers"]


def write_adapter(path: str, shapes: dict, rank: int, seed: int, b_scale: float = 0.01) -> str:
    """A random rank-`rank` adapter of every projection, in PEFT's format (B of std b_scale)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    dims = projection_shapes(shapes)
    for layer in range(shapes["num_hidden_layers"]):
        for group, names in PROJECTIONS.items():
            for name in names:
                k, n = dims[name]
                key = f"base_model.model.model.layers.{layer}.{group}.{name}"
                tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, k, generator=gen) * k**-0.5).bfloat16()
                tensors[f"{key}.lora_B.weight"] = (torch.randn(n, rank, generator=gen) * b_scale).bfloat16()
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none", "task_type": "CAUSAL_LM",
              "target_modules": [n for names in PROJECTIONS.values() for n in names]}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[50])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("lora_serve.py measures serving on a GPU: no CUDA device here")
    from engine import LoRARequest

    shapes = serve.QWEN25_7B
    bw, peak = serve.measure_ceilings()
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 {peak / 1e12:.0f} TFLOP/s", flush=True)
    path = serve.model_dir(shapes, serve.GROUP)
    folder = tempfile.mkdtemp(prefix="lora-adapters-")
    loras = [LoRARequest(f"adapter-{i}", i + 1, write_adapter(os.path.join(folder, f"a{i}"), shapes, args.rank, i))
             for i in range(args.adapters)]
    common = (shapes, args.concurrency, args.requests_per_client, args.prompt_len, args.output_len, bw, peak, {})
    base = serve.run_engine_workload("E1-base", *common, path=path, profile=False)
    adapted = serve.run_engine_workload("E1-lora", *common, path=path, profile=False, loras=loras, enable_lora=True,
                                        max_loras=args.adapters, max_lora_rank=args.rank)
    rows = []
    extra = adapter_bytes(shapes, args.rank) * args.adapters / bw  # each decode step reads every adapter
    for b, r in zip(base, adapted):
        c = r["concurrency"]
        floor = r["floor_s"] + extra * args.output_len * r["requests"] / c
        rows.append({"id": "E1-lora", "case": f"Qwen2.5-7B-AWQ c={c}, {args.adapters} rank-{args.rank} adapters",
                     "ratio_to_floor": round(floor / r["wall_s"], 3), "target_floor": None,
                     "ratio_to_peer": round(r["tok_s"] / b["tok_s"], 3), "target_peer": 0.85,
                     "tok_s": r["tok_s"], "peer_tok_s": b["tok_s"], "peer": "the same engine without adapters",
                     "adapters": args.adapters, "rank": args.rank, "floor_s": floor,
                     **{k: v for k, v in r.items() if k in ("wall_s", "ttft_p50", "tpot_p50", "tpot_p99",
                                                            "kv_blocks_total", "load_s")}})
    record.save(rows, args.out)
    print(record.table(rows, 44))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
