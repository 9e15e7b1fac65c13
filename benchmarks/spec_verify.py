"""S2 (benchmarks/README.md), on a GPU: what a verify step of k + 1 = 5 positions a request
costs against a plain decode step, on Qwen2.5-7B-AWQ shapes (random weights), at batch 1, 4
and 10, each request at a 512-token context. Both engines in one process, CUDA graphs on (a
decode step replays its decode graph; a verify step of B x 5 tokens its mixed-step graph),
synchronous steps in both (the step's own cost, not the overlap of asynchronous scheduling).
Each verify step drafts k tokens for every request (the drafts' acceptance does not change what
the step costs); the projected speed-up divides the tokens a request gains per verify step at
S1's measured acceptance (benchmarks/results/spec_decode.json) by the cost ratio.

    python3 benchmarks/spec_verify.py [--batch 1 4 10] [--k 4] [--context 512] [--steps 30] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path
from benchmarks.serve import GROUP, QWEN25_7B, model_dir  # noqa: E402

TARGET = 1.15


def step_times(engine, batch: int, context: int, steps: int, vocab: int) -> list[float]:
    """Seconds of each of `steps` steady steps of `batch` requests past a `context`-token prompt."""
    from engine import SamplingParams

    rng = random.Random(batch)
    params = SamplingParams(max_tokens=8 * steps + 16, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(batch):
        engine.add_request(f"s2-{batch}-{i}", {"prompt_token_ids": [rng.randrange(100, vocab - 100)
                                                                   for _ in range(context)]}, params)
    while any(s.num_output_tokens == 0 for s in engine.requests.values()):
        engine.step()
    for _ in range(3):
        engine.step()
    out = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    for rid in list(engine.requests):
        engine.abort_request(rid)
    return out


def s1_tokens_per_verify() -> float | None:
    """Tokens a request gained per verify step in S1's c=1 row (None before S1 ran)."""
    path = os.path.join(ROOT, "benchmarks", "results", "spec_decode.json")
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        return None
    row = next((r for r in rows if r.get("case") == "summarize c=1 ngram"), None)
    return row.get("tokens_per_verify") if row else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 10])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "S2 measures GPU steps"
    from engine import LLMEngine, EngineConfig
    from engine.spec_decode.speculator import Speculator

    k = args.k
    Speculator.draft = lambda self, seq, room: [seq.token_ids[-1]] * room  # k drafts every step
    path = model_dir(QWEN25_7B, GROUP)
    # two engines, a fixed KV cache each: room for the largest batch's every request at its longest
    # (a cache short of it would hold part of the batch back and time a smaller one)
    longest = args.context + 8 * args.steps + 16 + k
    blocks = max(args.batch) * -(-longest // 16) + 64
    common = dict(model=path, load_format="dummy", dtype="bfloat16", max_model_len=4096,
                  max_num_seqs=max(args.batch), num_kv_blocks=blocks, async_scheduling=False)
    plain = LLMEngine(EngineConfig(**common))
    spec = LLMEngine(EngineConfig(**common, speculative_config={
        "method": "ngram", "num_speculative_tokens": k, "disable_by_batch_size": 1024}))
    gain = s1_tokens_per_verify()
    rows = []
    for b in args.batch:
        decode = statistics.median(step_times(plain, b, args.context, args.steps, QWEN25_7B["vocab_size"]))
        verify = statistics.median(step_times(spec, b, args.context, args.steps, QWEN25_7B["vocab_size"]))
        ratio = verify / decode
        rows.append({"id": "S2", "case": f"verify k+1={k + 1} vs decode, batch {b}", "ratio_to_floor": None,
                     "target_floor": None, "ratio_to_peer": round(decode / verify, 3), "target_peer": round(1 / TARGET, 3),
                     "cost_ratio": round(ratio, 3), "target_cost_ratio": TARGET, "decode_step_ms": round(decode * 1e3, 3),
                     "verify_step_ms": round(verify * 1e3, 3), "context": args.context,
                     "s1_tokens_per_verify": gain, "projected_speedup": round(gain / ratio, 2) if gain else None,
                     "mixed_graph_replays": spec.runner.mixed.replays if spec.runner.mixed else 0})
        print(json.dumps(rows[-1]), flush=True)
    record.save(rows, args.out)
    print(record.table(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
