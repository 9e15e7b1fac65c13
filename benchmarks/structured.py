"""G5 (benchmarks/README.md): the engine's cost of structured output, against unconstrained decoding in the same
run: batch 32 (closed loop: a finished request is replaced at once), 128-token prompts,
greedy, max_tokens 128, ignore_eos off.

  json      every request constrained by one JSON schema (it completes well within
            max_tokens: bounded strings and numbers, enums, compact whitespace)
  none      unconstrained, each request generating exactly as many tokens as the same
            request did under `json` (max_tokens = that count, ignore_eos): the same
            work but for the grammar: the peer
  half      the even requests constrained, the odd ones as in `none`
  none-128  unconstrained with max_tokens 128 (for reference; longer outputs, fewer prefills)

A first `json` run warms up and fixes the lengths; then none, json and half take turns,
3 runs each (the median run by tok/s is reported, all runs' tok/s beside it). Prefix
caching is off, as every mode replays the same prompts.

ratio_to_peer = output tok/s over the peer's; target 0.95: the masks are computed on the
host while the device runs the forward (engine/structured/masks.py), so what the step
pays is the mask copy and apply on the device plus any host time left over, a few
percent of a decode step of the E1 model at batch 32. Also per mode: the mean decode step
(steps with no new request), the host time of MaskFiller.fill per step, add_request time
(compile, cached after the first, + matcher), and how many constrained outputs parse as
JSON.

Model: --model PATH, or E1's (Qwen2.5-7B-AWQ shapes, random weights, benchmarks/serve.py)
on CUDA, or a tiny random checkpoint (tests.models.make_checkpoint) on the CPU, where only
--quick (a smoke: it runs, the numbers mean little, the forward is not overlapped) makes
sense. --tokenizer PATH pairs another tokenizer with the model (on CUDA the default is
.whl/structured/smollm2-tokenizer when present: a real 49k vocabulary instead of the
test tokenizer's few hundred).

llguidance on a machine without it: `python benchmarks/tools/structured_vendor.py` here puts it
(and the SmolLM2 tokenizer) under .whl/structured/ (git-ignored, ~12 MB); carry that path
and this script puts .whl/structured/site on sys.path.

    python3 benchmarks/structured.py [--quick] [--model PATH] [--tokenizer PATH] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENDOR = os.path.join(ROOT, ".whl", "structured")
if os.path.isdir(os.path.join(VENDOR, "site")):
    sys.path.insert(0, os.path.join(VENDOR, "site"))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import record  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,16}$"},  # no escapes: a bounded token count
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "active", "tags", "address"],
    "additionalProperties": False,
}
STRUCTURED = {"json": SCHEMA, "disable_any_whitespace": True}


def pick_model(args, cuda: bool):
    """(model path, tokenizer path or None, load_format, what)"""
    if args.model:
        return args.model, args.tokenizer, "dummy" if args.dummy else "auto", args.model
    if cuda:
        from benchmarks.serve import GROUP, QWEN25_7B, model_dir

        tok = args.tokenizer
        if tok is None and os.path.isfile(os.path.join(VENDOR, "smollm2-tokenizer", "tokenizer.json")):
            tok = os.path.join(VENDOR, "smollm2-tokenizer")
        return model_dir(QWEN25_7B, GROUP), tok, "dummy", "E1: Qwen2.5-7B-AWQ shapes, random weights"
    from tests.models import make_checkpoint

    path = make_checkpoint(os.path.join(tempfile.mkdtemp(prefix="structured-bench-"), "tiny"))
    return path, args.tokenizer, "auto", "tiny random llama (tests.models.make_checkpoint)"


def closed_loop(eng, prompts, params, batch, tag):
    """Run every (prompt, params) with `batch` in flight; per request: (token count, finish
    reason, text); per step: wall time and whether a request had just been added."""
    n = len(prompts)
    results = [None] * n
    fill_s = []
    real_fill = eng.masks.fill

    def timed_fill(seqs):
        t = time.perf_counter()
        try:
            return real_fill(seqs)
        finally:
            fill_s.append(time.perf_counter() - t)

    eng.masks.fill = timed_fill
    ids = {}
    nxt = 0
    in_flight = 0
    add_s, decode_s, other_s = [], [], []
    steps = 0
    t0 = time.perf_counter()
    try:
        while nxt < n or in_flight:
            added = False
            while nxt < n and in_flight < batch:
                rid = f"{tag}-{nxt}"
                ids[rid] = nxt
                t = time.perf_counter()
                eng.add_request(rid, {"prompt_token_ids": prompts[nxt]}, params[nxt])
                add_s.append(time.perf_counter() - t)
                nxt += 1
                in_flight += 1
                added = True
            t = time.perf_counter()
            outs = eng.step()
            dt = time.perf_counter() - t
            steps += 1
            if not added:  # no prefill in this step
                (decode_s if in_flight == batch else other_s).append(dt)
            for out in outs:
                if out.finished:
                    if out.error is not None:
                        raise out.error
                    o = out.outputs[0]
                    results[ids[out.request_id]] = (len(o.token_ids), o.finish_reason, o.text)
                    in_flight -= 1
    finally:
        eng.masks.fill = real_fill
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    if not decode_s:  # every request in one wave (requests == batch): the batch shrinks as they end
        decode_s = other_s
    return {"wall_s": wall, "output_tokens": tokens, "tok_s": tokens / wall, "requests": n, "steps": steps,
            "decode_step_ms": 1e3 * statistics.fmean(decode_s) if decode_s else None,
            "decode_steps": len(decode_s),
            "mask_fill_ms_per_step": 1e3 * sum(fill_s) / max(1, steps),
            "add_request_ms": 1e3 * statistics.fmean(add_s)}, results


def valid_json(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and set(doc) == set(SCHEMA["required"])


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a checkpoint folder (default: E1's shapes on CUDA, a tiny one on the CPU)")
    ap.add_argument("--dummy", action="store_true", help="with --model: random weights of its shapes")
    ap.add_argument("--tokenizer", help="a tokenizer folder to use with the model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--requests", type=int, help="requests per mode (default 4 x batch; quick: batch)")
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--repeats", type=int, help="runs of each mode, taking turns (default 3, quick 1)")
    ap.add_argument("--quick", action="store_true", help="a smoke: one wave of requests, 32-token prompts, "
                    "one run of each mode")
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    args.prompt_len = args.prompt_len or (32 if args.quick else 128)
    args.max_tokens = args.max_tokens or 128
    return args


def main():
    args = parse_args()
    from engine import EngineConfig, LLMEngine, SamplingParams

    cuda = torch.cuda.is_available()
    path, tok_path, load_format, what = pick_model(args, cuda)
    n = args.requests or (args.batch if args.quick else 4 * args.batch)
    t = time.perf_counter()
    eng = LLMEngine(EngineConfig(
        model=path, tokenizer=tok_path, load_format=load_format, dtype="bfloat16" if cuda else "auto",
        max_model_len=args.prompt_len + args.max_tokens + 16, max_num_seqs=args.batch,
        enable_prefix_caching=False,  # the modes reuse the prompts: no run may find them cached
        **({"gpu_memory_utilization": 0.9} if cuda else {"num_kv_blocks": args.batch * 24})))
    load_s = time.perf_counter() - t
    import llguidance

    tok = eng.tokenizer
    tok_vocab = len(tok)
    rng = random.Random(0)
    lo, hi = 10, min(tok_vocab, eng.input_processor.vocab_size) - 1
    prompts = [[rng.randrange(lo, hi) for _ in range(args.prompt_len)] for _ in range(n)]
    version = getattr(llguidance, "__version__", "")
    print(f"model {what} ({path}); tokenizer {tok_path or 'the model’s'} ({tok_vocab} tokens), EOS "
          f"{sorted(eng.eos_token_ids)}; loaded in {load_s:.0f}s; llguidance {version} "
          f"from {os.path.dirname(llguidance.__file__)}", flush=True)
    greedy = dict(temperature=0.0)
    constrained = SamplingParams(max_tokens=args.max_tokens, structured_outputs=STRUCTURED, **greedy)
    # the first `json` run warms everything (the grammar compiled, then cached; every batch
    # size's path) and gives each request's output length for the matched peer
    first, res_json = closed_loop(eng, prompts, [constrained] * n, args.batch, "json0")
    lengths = [r[0] for r in res_json]
    matched = [SamplingParams(max_tokens=max(1, k), ignore_eos=True, **greedy) for k in lengths]
    params = {"none": matched, "json": [constrained] * n,
              "half": [constrained if i % 2 == 0 else matched[i] for i in range(n)]}
    runs = {m: [] for m in params}
    if args.quick:
        runs["json"].append(first)
    repeats = args.repeats or (1 if args.quick else 3)
    for rep in range(repeats):  # the modes take turns, so drift on the machine hits them alike
        for mode, plist in params.items():
            if args.quick and mode == "json":
                continue
            r, res = closed_loop(eng, prompts, plist, args.batch, f"{mode}{rep}")
            if mode != "none":
                idx = range(0, n, 2) if mode == "half" else range(n)
                r.update(json_valid=sum(valid_json(res[i][2]) for i in idx), constrained=len(idx))
            runs[mode].append(r)
    first.update(json_valid=sum(valid_json(r[2]) for r in res_json), constrained=n)
    if not args.quick:
        runs["none-128"] = [closed_loop(eng, prompts, [SamplingParams(max_tokens=args.max_tokens, **greedy)] * n,
                                        args.batch, "none128")[0]]
    modes = {}
    for mode, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["tok_s"])
        med = dict(rs[len(rs) // 2])  # the median run by tok/s
        med["tok_s_runs"] = [round(r["tok_s"], 1) for r in runs[mode]]
        modes[mode] = med
    modes["json"].update(finish_stop=sum(r[1] == "stop" for r in res_json),
                         mean_output_tokens=statistics.fmean(lengths), json_valid_first_run=first["json_valid"])
    meta = {"model": what, "tokenizer_vocab": tok_vocab, "model_vocab": eng.input_processor.vocab_size,
            "batch": args.batch, "prompt_len": args.prompt_len, "max_tokens": args.max_tokens,
            "requests_per_mode": n, "repeats": repeats, "quick": args.quick, "load_s": round(load_s, 1),
            "llguidance": version}
    report(modes, meta, args)


def report(modes: dict, meta: dict, args) -> None:
    """G5 rows (each mode against the unconstrained peer) into args.out, and a table."""
    peer = modes["none"]
    cases = {"json": f"every request JSON-schema constrained, batch {args.batch}",
             "half": f"half the requests constrained, batch {args.batch}",
             "none": f"unconstrained, the same output lengths (peer), batch {args.batch}",
             "none-128": f"unconstrained, max_tokens {args.max_tokens}, batch {args.batch}"}
    rows = []
    for mode, r in modes.items():
        rows.append({"id": "G5", "case": cases[mode], "ratio_to_floor": None, "target_floor": None,
                     "ratio_to_peer": r["tok_s"] / peer["tok_s"] if mode in ("json", "half") else None,
                     "target_peer": 0.95 if mode in ("json", "half") else None, "mode": mode,
                     "decode_step_ratio_to_peer": (peer["decode_step_ms"] / r["decode_step_ms"]
                                                   if r["decode_step_ms"] and peer["decode_step_ms"] else None),
                     **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}, **meta})
    record.save(rows, args.out)
    print(f"\n{'id':3} {'case':60} {'tok/s':>9} {'x peer':>7} {'target':>6} {'step ms':>8} {'fill ms':>8} "
          f"{'add ms':>7} {'json ok':>8}")
    for r in rows:
        ok = f"{r['json_valid']}/{r['constrained']}" if "json_valid" in r else "-"
        ratio = "-" if r["ratio_to_peer"] is None else f"{r['ratio_to_peer']:.3f}"
        print(f"{r['id']:3} {r['case']:60} {r['tok_s']:9.1f} {ratio:>7} "
              f"{r['target_peer'] or '-':>6} {r['decode_step_ms'] or float('nan'):8.2f} "
              f"{r['mask_fill_ms_per_step']:8.3f} {r['add_request_ms']:7.2f} {ok:>8}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
