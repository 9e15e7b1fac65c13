"""CPU benchmarks C1 and C2 (benchmarks/README.md), on a machine without a GPU.

C1: the embedded default model (SmolLM2-135M AWQ), 128 output tokens, 1 request and 8
concurrent, against transformers `generate` on the same weights dequantized, in the same dtype,
same prompts, same run. C2: cold start of `python -m handler --test_input` (process start to
first token) with the model prepared.

    python3 benchmarks/cpu.py [--model PATH] [--tokens 128] [--dtypes float32,bfloat16] [--skip-c2] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path

PROMPTS = [
    "Summarize the meeting: the team agreed to move the launch to May.",
    "Write a short note about the budget review held on Monday.",
    "List three action items from a planning meeting about hiring.",
    "Explain in two sentences why the release was delayed.",
    "Draft a reminder to send the quarterly report by Friday.",
    "Describe the agenda of a product roadmap meeting.",
    "Summarize: sales grew by ten percent and costs stayed flat.",
    "What decisions were made about the office move next year?",
]


def hf_peer(path: str, dtype: torch.dtype = torch.float32):
    """transformers' model with every AWQ linear dequantized (our reference unpacking)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    import llm_kernels

    cfg = AutoConfig.from_pretrained(path)
    group = cfg.quantization_config["group_size"]
    del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    sd = {}
    for f in os.listdir(path):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(path, f)))
    params = dict(model.named_parameters())
    for name, t in sd.items():
        if name.endswith(".qweight"):
            base = name[: -len(".qweight")]
            w = llm_kernels.awq_dequantize(t, sd[base + ".qzeros"], sd[base + ".scales"], group, torch.float32)
            params[base + ".weight"].data.copy_(w.t())
        elif name in params:
            params[name].data.copy_(t.float())
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype)


def same_length_prompts(tok, n: int) -> list[list[int]]:
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in PROMPTS[:n]]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    shortest = min(len(x) for x in ids)
    return [x[-shortest:] for x in ids]  # equal lengths: the peer needs no padding


def c1(path: str, tokens: int, dtype: str = "float32") -> list[dict]:
    """Ours and transformers in the same dtype ("auto" is what our engine picks here)."""
    from engine import LLM, SamplingParams

    llm = LLM(path, max_model_len=2048, num_kv_blocks=1024, dtype=dtype)
    dtype = str(llm.engine.dtype).removeprefix("torch.")
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    peer = hf_peer(path, getattr(torch, dtype))
    rows = []
    for n in (1, 8):
        prompts = same_length_prompts(llm.get_tokenizer(), n)
        llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=4, temperature=0))  # warm
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        ours = n * tokens / (time.perf_counter() - t)
        ids = torch.tensor(prompts)
        with torch.no_grad():
            peer.generate(ids[:1, :8], max_new_tokens=4, do_sample=False)  # warm
            t = time.perf_counter()
            peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=0)
            theirs = n * tokens / (time.perf_counter() - t)
        rows.append({"id": "C1", "case": f"{n} request(s) x {tokens} tokens, {dtype}", "ours_tok_s": round(ours, 1),
                     "peer_tok_s": round(theirs, 1), "ratio_to_peer": round(ours / theirs, 2),
                     "target_peer": 1.5 if n == 8 else None, "ratio_to_floor": None, "target_floor": None})
    return rows


def c2() -> list[dict]:
    job = json.dumps({"input": {"prompt": "Say hello.", "sampling_params": {"max_tokens": 8}}})
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "handler", "--test_input", job], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    total = time.perf_counter() - t
    line = next((l for l in (proc.stdout + proc.stderr).splitlines() if "cold start" in l.lower()), "")
    return [{"id": "C2", "case": "python -m handler --test_input, model prepared", "process_s": round(total, 1),
             "cold_start_line": line.strip(), "exit_code": proc.returncode,
             "ratio_to_floor": None, "target_floor": None, "ratio_to_peer": None, "target_peer": None}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an AWQ checkpoint folder (default: the embedded default model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--skip-c2", action="store_true")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="C1 in each (ours and transformers alike; 'auto' is what our engine picks here)")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    path = args.model
    if path is None:
        from handler.prepare.default_model import ensure_default_model

        path = ensure_default_model()
    rows = [r for dt in args.dtypes.split(",") for r in c1(path, args.tokens, dt)] + ([] if args.skip_c2 else c2())
    record.save([r | {"torch_threads": torch.get_num_threads()} for r in rows], args.out)
    print(f"{'id':4} {'case':48} {'ours':>9} {'peer':>9} {'ratio':>6} {'target':>6}")
    for r in rows:
        if r["id"] == "C1":
            print(f"{r['id']:4} {r['case']:48} {r['ours_tok_s']:>9} {r['peer_tok_s']:>9} {r['ratio_to_peer']:>6} "
                  f"{r['target_peer'] or '-':>6}")
        else:
            print(f"{r['id']:4} {r['case']:48} {r['process_s']:>8}s  {r['cold_start_line']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
