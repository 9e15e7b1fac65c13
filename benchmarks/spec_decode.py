"""S1 and the CPU crossover of speculative decoding (benchmarks/README.md), on the CPU.

S1: summaries of meeting notes (benchmarks/data/notes_*.txt) and a 2,900-word report
(benchmarks/data/report_transit.txt) by the embedded default model (SmolLM2-135M AWQ), as the
worker's summarize job asks for them (its messages, chat template, sampling and speculation), at c=1 (one
document at a time) and c=4 (four clients, closed loop), n-gram speculation on against off in the
same process, modes taking turns --runs times (medians). Same greedy text required; acceptance
reported. `--only sampling` compares the summarize jobs' sampling choices (acceptance, loops).
Crossover: c = 1, 2, 4, 8 notes decoding together, speculation forced on against off.

    python3 benchmarks/spec_decode.py [--model PATH] [--runs 3] [--only S1 crossover sampling] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import record  # noqa: E402 - after the repository root is on the path

DATA = os.path.join(ROOT, "benchmarks", "data")
NOTES = ["notes_launch.txt", "notes_warehouse.txt", "notes_hiring.txt", "notes_clinic.txt"]
REPORT = "report_transit.txt"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def summarize_ngram(dtype: str) -> dict:
    """The n-gram speculation the worker gives summarize jobs on this machine in dtype (its drafts a step)."""
    from handler.engine_setup import summarize_drafts

    return {**NGRAM, "num_speculative_tokens": summarize_drafts(dtype)}


def documents() -> dict[str, str]:
    out = {}
    for name in NOTES + [REPORT]:
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            out[name.removesuffix(".txt")] = f.read()
    return out


def summarize_sampling(**override) -> dict:
    """The worker's summarize sampling for the default model (handler.summarize.job.summary_defaults)."""
    from handler.prepare.default_model import SUMMARIZE_SAMPLING
    from handler.summarize.core import SUMMARY_MAX_TOKENS, SUMMARY_SAMPLING

    return {**SUMMARY_SAMPLING, **SUMMARIZE_SAMPLING, "max_tokens": SUMMARY_MAX_TOKENS, **override}


def prompts(tok, docs: dict[str, str]) -> dict[str, list[int]]:
    """Each document as the summarize job's one-call prompt (its messages through the chat template)."""
    from handler.summarize.core import summary_messages

    return {name: tok.encode(tok.apply_chat_template(summary_messages(text), add_generation_prompt=True,
                                                     tokenize=False), add_special_tokens=False)
            for name, text in docs.items()}


def run_closed_loop(engine, jobs: list[tuple[str, list[int]]], params, clients: int) -> dict:
    """`clients` requests in flight, the next job submitted as one ends. Per job its text, tokens
    and times; the run's wall time and the time spent with every request past its first token."""
    from engine import SamplingParams

    sp = SamplingParams(**params)
    queue = list(jobs)
    live, res = {}, {}
    t0 = time.perf_counter()

    def submit():
        name, ids = queue.pop(0)
        engine.add_request(name, {"prompt_token_ids": ids}, sp)
        live[name] = {"start": time.perf_counter(), "first": None}

    while queue and len(live) < clients:
        submit()
    while live:
        for out in engine.step():
            info = live.get(out.request_id)
            if info is None:
                continue
            if info["first"] is None and out.outputs[0].token_ids:
                info["first"] = time.perf_counter()
            if out.finished:
                if out.error is not None:
                    raise out.error
                c = out.outputs[0]
                res[out.request_id] = {**info, "end": time.perf_counter(), "text": c.text,
                                       "tokens": len(c.token_ids), "token_ids": list(c.token_ids), **out.metrics}
                del live[out.request_id]
                if queue:
                    submit()
    wall = time.perf_counter() - t0
    return {"jobs": res, "wall_s": wall, "tokens": sum(r["tokens"] for r in res.values())}


def measure(path: str, jobs, params, clients: int, runs: int, spec: dict | None, dtype: str):
    """Both engines built once; modes taking turns, `runs` times each. Returns per mode the runs."""
    from engine import LLM

    llms = {"off": LLM(path, max_model_len=8192, num_kv_blocks=2048, dtype=dtype, enable_prefix_caching=False),
            "on": LLM(path, max_model_len=8192, num_kv_blocks=2048, dtype=dtype, enable_prefix_caching=False,
                      speculative_config=spec)}
    for llm in llms.values():  # warm-up: kernels' first calls, the int4 packs
        run_closed_loop(llm.engine, jobs[:1], {**params, "max_tokens": 8}, 1)
    out = {"off": [], "on": []}
    for _ in range(runs):
        for mode, llm in llms.items():
            before = dict(llm.stats())
            r = run_closed_loop(llm.engine, jobs, params, clients)
            after = llm.stats()
            r["draft"] = after.get("spec_draft_tokens", 0) - before.get("spec_draft_tokens", 0)
            r["accepted"] = after.get("spec_accepted_tokens", 0) - before.get("spec_accepted_tokens", 0)
            r["steps"] = after["num_steps"] - before["num_steps"]
            r["verifies"] = after.get("spec_verify_requests", 0) - before.get("spec_verify_requests", 0)
            out[mode].append(r)
    dt = str(llms["off"].engine.dtype).removeprefix("torch.")
    return out, dt


def tpot_rate(r: dict) -> float:
    """One request's decode speed: output tokens after the first over the time from its first
    token to its end, summed over the run's requests (the prefill left out)."""
    jobs = r["jobs"].values()
    return sum(j["tokens"] - 1 for j in jobs) / sum(j["end"] - j["first"] for j in jobs)


def summary(runs: dict, case: str, target: float | None, extra: dict) -> dict:
    """A result row from both modes' runs: medians, the ratios, the same-text check, acceptance."""
    e2e = {m: statistics.median(r["tokens"] / r["wall_s"] for r in rs) for m, rs in runs.items()}
    dec = {m: statistics.median(tpot_rate(r) for r in rs) for m, rs in runs.items()}
    off0 = runs["off"][0]["jobs"]
    diverged = sorted({k for r in runs["off"] + runs["on"] for k, j in r["jobs"].items() if j["text"] != off0[k]["text"]})
    on = runs["on"][-1]
    rate = on["accepted"] / on["draft"] if on["draft"] else 0.0
    return {"id": "S1", "case": case, "ratio_to_floor": None, "target_floor": None,
            "ratio_to_peer": round(dec["on"] / dec["off"], 2), "target_peer": target,
            "on_decode_tok_s": round(dec["on"], 1), "off_decode_tok_s": round(dec["off"], 1),
            "e2e_ratio": round(e2e["on"] / e2e["off"], 2), "on_tok_s": round(e2e["on"], 1),
            "off_tok_s": round(e2e["off"], 1), "same_text": not diverged, "wrong": bool(diverged),
            "texts_differ": diverged, "acceptance_rate": round(rate, 3),
            "tokens_per_verify": round(on["accepted"] / on["verifies"] + 1, 2) if on["verifies"] else None,
            "draft_tokens": on["draft"], "accepted_tokens": on["accepted"], "output_tokens": on["tokens"],
            "steps_on": on["steps"], "steps_off": runs["off"][-1]["steps"], "runs": len(runs["on"]),
            "decode_ratio_each_run": [round(tpot_rate(a) / tpot_rate(b), 2) for a, b in zip(runs["on"], runs["off"])],
            **extra}


def s1(path: str, runs: int, dtype: str, sampling: dict) -> list[dict]:
    """c=1 and c=4 over the four notes and the report, the summarize job's own sampling. Cases in
    float32 carry the plain names; other dtypes add theirs."""
    from transformers import AutoTokenizer

    ids = prompts(AutoTokenizer.from_pretrained(path), documents())
    jobs = list(ids.items())
    params = summarize_sampling(**sampling)
    rows = []
    for clients, docs, label in ((1, jobs[:4], "notes"), (1, jobs[4:], "report"), (4, jobs, "notes+report")):
        spec = summarize_ngram(dtype)
        res, dt = measure(path, docs, params, clients, runs, spec, dtype)
        case = f"summarize c={clients} ngram" + ("" if label == "notes" or clients == 4 else f", {label}")
        case += "" if dt == "float32" else f", {dt}"
        case += "".join(f", {k} {v}" for k, v in sampling.items())
        rows.append(summary(res, case, 1.8, {"documents": label, "dtype": dt, "sampling": params,
                                             "speculative_config": spec,
                                             "prompt_tokens": sum(len(i) for _, i in docs)}))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "sampling"}), flush=True)
    return rows


def crossover(path: str, runs: int, dtype: str) -> list[dict]:
    """Batch sizes 1-8 of notes decoding together (ignore_eos, 128 tokens each), speculation
    forced on (no batch-size switch) against off: where a verify step stops paying."""
    from transformers import AutoTokenizer

    ids = list(prompts(AutoTokenizer.from_pretrained(path), documents()).items())[:4]
    params = summarize_sampling(max_tokens=128, ignore_eos=True)
    rows = []
    for c in (1, 2, 4, 8):
        jobs = [(f"{n}-{i}", x) for i in range(2) for n, x in ids][:c]
        res, dt = measure(path, jobs, params, c, runs, {**NGRAM, "disable_by_batch_size": 1024}, dtype)
        row = summary(res, f"crossover c={c} ngram, no switch, {dt}", None, {"dtype": dt, "sampling": params})
        rows.append(row | {"id": "S1-x"})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "sampling"}), flush=True)
    return rows


def sampling(path: str, dtype: str) -> list[dict]:
    """Acceptance under each sampling choice for summaries (one run each, c=1, every document)."""
    from transformers import AutoTokenizer

    ids = list(prompts(AutoTokenizer.from_pretrained(path), documents()).items())
    rows = []
    for label, override in SAMPLINGS.items():
        params = summarize_sampling(**override)
        res, dt = measure(path, ids, params, 1, 1, NGRAM, dtype)
        row = summary(res, f"summarize c=1 ngram, {label}, {dt}", None, {"dtype": dt, "sampling": params})
        row["loops"] = {k: loop_report(j["text"]) for k, j in res["on"][0]["jobs"].items()}
        row["texts"] = {k: j["text"] for k, j in res["on"][0]["jobs"].items()}
        outs = {k: j["token_ids"] for k, j in res["on"][0]["jobs"].items()}
        row["replay_tokens_per_step"] = replay(ids, outs, prompt_only=False)
        row["replay_prompt_only"] = replay(ids, outs, prompt_only=True)
        rows.append(row | {"id": "S1-sampling"})
    return rows


def replay(prompts: list[tuple[str, list[int]]], outputs: dict[str, list[int]], prompt_only: bool, k: int = 4) -> float:
    """Output tokens a step if every verify were free: prompt lookup (NGRAM's k, the engine's
    n-gram sizes) replayed over the outputs, each step taking the drafts that match the output
    plus one token. prompt_only: drafts only from matches inside the prompt (the source's words;
    otherwise also from the output so far, where a summary that repeats itself feeds its drafts)."""
    from engine.spec_decode.config import SpeculativeConfig
    from engine.spec_decode.ngram import NgramIndex

    cfg = SpeculativeConfig.from_value(NGRAM)
    tokens = steps = 0
    for name, prompt in prompts:
        out = outputs[name]
        index, source, i = NgramIndex(cfg.prompt_lookup_min, cfg.prompt_lookup_max), None, 0
        if prompt_only:
            source = NgramIndex(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            source.propose(prompt + [-1], k)  # indexes the prompt's n-grams followed by a prompt token
        while i < len(out):
            seq = prompt + out[:i]
            if prompt_only:
                p = source.latest(seq)
                drafts = prompt[p:p + k] if p is not None and p < len(prompt) else []
            else:
                drafts = index.propose(seq, k)
            m = 0
            while m < len(drafts) and i + m < len(out) and drafts[m] == out[i + m]:
                m += 1
            i += m + 1
            steps += 1
        tokens += len(out)
    return round(tokens / steps, 2) if steps else 0.0


def loop_report(text: str) -> dict:
    """Signs of a loop in a summary: its longest word sequence that occurs twice (in words) and
    its sentences that repeat an earlier one."""
    words = text.split()
    longest, seen = 0, set()
    for n in range(1, len(words)):
        grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
        if len(set(grams)) == len(grams):
            break
        longest = n
    sentences = [s.strip().lower() for s in text.replace("\n", ". ").split(".") if len(s.split()) >= 3]
    repeats = 0
    for s in sentences:
        repeats += s in seen
        seen.add(s)
    return {"longest_repeat_words": longest, "repeated_sentences": repeats, "words": len(words)}


SAMPLINGS = {"frequency_penalty 0.5": {}, "no penalty": {"frequency_penalty": 0.0}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an AWQ checkpoint folder (default: the embedded default model)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], help="each its own rows")
    ap.add_argument("--sampling", type=json.loads, default={},
                    help='JSON over the summarize sampling, e.g. \'{"frequency_penalty": 0}\' (S1 only)')
    ap.add_argument("--only", nargs="+", default=["S1", "crossover"], choices=["S1", "crossover", "sampling"])
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    path = args.model
    if path is None:
        from handler.prepare.default_model import ensure_default_model

        path = ensure_default_model()
    rows = []
    for dtype in args.dtype:
        if "S1" in args.only:
            rows += s1(path, args.runs, dtype, args.sampling)
        if "crossover" in args.only:
            rows += crossover(path, args.runs, dtype)
        if "sampling" in args.only:
            rows += sampling(path, dtype)
    record.save([r | {"torch_threads": torch.get_num_threads()} for r in rows], args.out)
    print(f"{'case':48} {'decode on':>9} {'off':>7} {'ratio':>6} {'e2e':>5} {'accept':>7} {'tok/verify':>10} same")
    for r in rows:
        print(f"{r['case'][:48]:48} {r['on_decode_tok_s']:>9} {r['off_decode_tok_s']:>7} {r['ratio_to_peer']:>6} "
              f"{r['e2e_ratio']:>5} {r['acceptance_rate']:>7} {r['tokens_per_verify'] or '-':>10} {r['same_text']}")
    print(record.table(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
