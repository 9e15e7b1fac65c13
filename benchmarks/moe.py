"""E4 (benchmarks/README.md): serving a mixture of experts on one GPU, Qwen3-30B-A3B shapes
(48 layers, 128 experts, top-8), AWQ experts through the fused MoE path, E1's workload and
clients (benchmarks/serve.py), against its floor and HF `generate` bf16 in the same run.

The floor of a decode step reads the dense weights (attention, routers, lm_head) and
the experts the step's tokens route to: with c tokens each picking k of E experts,
E (1 - (1 - k/E)^c) distinct experts per layer on average (routing of random weights
and inputs is close to uniform), each 3 H I 4-bit weights with their scales/zeros.

    python3 benchmarks/moe.py [--concurrency 10 50] [--requests-per-client 1] [--skip-peer] [--out PATH]
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path

QWEN3_30B_A3B = dict(arch="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)


def config(shapes: dict):
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(**{k: v for k, v in shapes.items() if k != "arch"})
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg


def _int4_bytes(params: float, group: int) -> float:
    return params / 2 + params / group * (2 + 0.5)  # int4 weights, fp16 scales and int4 zeros per group


def _attention_params(s: dict) -> int:
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    return s["hidden_size"] * (q + 2 * kv) + q * s["hidden_size"]


def expert_params(s: dict) -> int:
    return 3 * s["hidden_size"] * s["moe_intermediate_size"]


def distinct_experts(s: dict, tokens: int) -> float:
    """Expected experts of one layer that `tokens` tokens route to (uniform routing)."""
    e, k = s["num_experts"], s["num_experts_per_tok"]
    return e * (1 - (1 - k / e) ** tokens)


def step_bytes(s: dict, group: int, tokens: int) -> float:
    """Weight bytes a step of `tokens` tokens reads: AWQ attention, the routed AWQ experts,
    bf16 routers and lm_head."""
    layers, h = s["num_hidden_layers"], s["hidden_size"]
    dense = layers * (_int4_bytes(_attention_params(s), group) + h * s["num_experts"] * 2)
    experts = layers * distinct_experts(s, tokens) * _int4_bytes(expert_params(s), group)
    return dense + experts + s["vocab_size"] * h * 2


def active_params(s: dict) -> int:
    """Parameters one token multiplies through (FLOPs / 2)."""
    per_layer = _attention_params(s) + s["num_experts_per_tok"] * expert_params(s) + s["hidden_size"] * s["num_experts"]
    return s["num_hidden_layers"] * per_layer + s["vocab_size"] * s["hidden_size"]


def kv_bytes_per_token(s: dict) -> int:
    return s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * 2 * 2


def floor_seconds(s, group, n_requests, concurrency, prompt_len, out_len, bw, peak):
    """Sum over decode steps of max(bytes / bandwidth, FLOPs / peak), bytes = the routed
    weights plus the running KV; prefill 2 x active params FLOPs per token."""
    waves = n_requests / concurrency
    w = step_bytes(s, group, concurrency)
    decode = sum(max((w + concurrency * (prompt_len + i) * kv_bytes_per_token(s)) / bw,
                     2 * active_params(s) * concurrency / peak) for i in range(out_len))
    prefill = n_requests * prompt_len * 2 * active_params(s) / peak
    return waves * decode + prefill


TARGET_FLOOR = {10: 0.40, 50: 0.35}


def main():
    from benchmarks import serve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--skip-peer", action="store_true", help="without the HF peer (ratio_to_peer null)")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    bw, peak = serve.measure_ceilings()
    peers = {}
    for c in args.concurrency:  # the peer first, so our KV cache does not crowd it out
        peers[c] = None if args.skip_peer else serve.hf_peer(QWEN3_30B_A3B, c, args.prompt_len, args.output_len)
        print(f"E4 peer c={c}: {peers[c]} tok/s", flush=True)
    runs = serve.run_engine_workload("E4", QWEN3_30B_A3B, args.concurrency, args.requests_per_client,
                                     args.prompt_len, args.output_len, bw, peak, peers)
    rows = [serve.e1_row("E4", r, f"Qwen3-30B-A3B-AWQ c={r['concurrency']}", peers.get(r["concurrency"]),
                         TARGET_FLOOR.get(r["concurrency"]), None) | {"copy_GBps": bw / 1e9, "bf16_TFLOPs": peak / 1e12}
            for r in runs]
    record.save(rows, args.out)
    serve.print_rows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
