"""G1-G4 (benchmarks/README.md): the grammar engines for structured output side by side, on the CPU: llguidance
(what engine/structured/ uses), xgrammar and outlines-core, each through a small adapter
(compile a spec; make a per-sequence matcher; fill a batch's int32 bitmask; advance by a
token), against one tokenizer (the embedded default model's, SmolLM2-135M, 49,152 tokens;
or the tests' tiny BPE one).

G1  per-token overhead at batch 32: 32 sequences, each constrained by a JSON schema
    (flat, nested + arrays, $ref + anyOf, and the three mixed), each walking the tokens
    of real valid documents (the same token path for every backend; a sequence whose
    document ends starts the next one with a fresh matcher). Timed per step: the 32 masks
    (llguidance LLExecutor, xgrammar BatchGrammarMatcher, outlines-core has no batch API:
    a loop over Guide.write_mask_into) plus the advance by the 32 tokens (llguidance
    consume_token_par, xgrammar batch_accept_token, outlines-core Guide.advance). Every
    mask is checked to allow the document's next token (outside the timing).
G2  compile time per schema: the first compile (a cold compiler), a cached one where the
    library caches, making one matcher, and the first mask of a fresh matcher.
G3  JSON Schema coverage: ~30 features, each a small schema with a valid and a violating
    document, walked token by token: enforced (valid accepted, violating rejected),
    ignored (both accepted), refused (does not compile) or wrong (valid rejected).
G4  regex, choice and a context-free grammar (Lark, GBNF/EBNF) in each.

Settings: the JSON grammars allow the same whitespace, at most 64 characters between
tokens (llguidance with a bound like engine/structured/grammar.py's; xgrammar
any_whitespace with max_whitespace_cnt=64; outlines-core whitespace_pattern
[ \\t\\n\\r]{0,64}); documents are json.dumps' default layout (", " and ": ").

    python3 benchmarks/structured_backends.py [--tokenizer default|tiny|PATH] [--quick] [--threads N]
        [--backends llguidance,xgrammar,outlines-core] [--out PATH]

xgrammar and outlines-core are not the product's dependencies: install them beside it to
compare.

Rows: ratio_to_peer = the best other backend's time over this backend's (above 1: this
one is faster than every other), or for coverage this backend's count over the best
other's; target_peer null (a comparison, not a goal). A backend that is not installed
is skipped (its rows say so).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCH = 32
BACKENDS = ("llguidance", "xgrammar", "outlines-core")

from benchmarks import record  # noqa: E402
from benchmarks.structured_adapters import ADAPTERS, DISTRIBUTIONS, WS_REGEX, Unsupported, load_tokenizer  # noqa: E402
from benchmarks.structured_cases import FEATURES, OTHER_SPECS, SCHEMAS, make_doc  # noqa: E402



# --------------------------------------------------------------------------- #
# Driving a matcher
# --------------------------------------------------------------------------- #

def encode(tok, text: str, eos: int) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [eos]


def walk(backend, compiled, tokens) -> bool:
    """True when every token is accepted and the grammar is complete after the EOS."""
    m = backend.matcher(compiled)
    for t in tokens:
        if not backend.advance_one(m, t):
            return False
    return backend.done(m)


def allows(buf_np, row, token) -> bool:
    return bool((int(buf_np[row, token >> 5]) >> (token & 31)) & 1)


def batch_walk(backend, compiled_by_kind, streams, slot_kinds, steps, vocab_size):
    """G1: `steps` steps of BATCH sequences. streams[kind] is a list of token lists (valid
    documents + EOS); slot i walks documents of slot_kinds[i] in turn. Returns timings."""
    words = -(-vocab_size // 32)
    buf = torch.zeros(BATCH, words, dtype=torch.int32)
    buf_np = buf.numpy()
    next_doc = {k: 0 for k in streams}
    slots = []
    matcher_s = []

    def start(kind):
        docs = streams[kind]
        d = docs[next_doc[kind] % len(docs)]
        next_doc[kind] += 1
        t = time.perf_counter()
        m = backend.matcher(compiled_by_kind[kind])
        matcher_s.append(time.perf_counter() - t)
        return [m, d, 0, kind]

    for i, kind in enumerate(slot_kinds):
        slots.append(start(kind))
        s = slots[-1]
        for t in s[1][:(i * len(s[1])) // BATCH]:  # staggered: slot i starts i/32 of the way in (untimed)
            backend.advance_one(s[0], t)
            s[2] += 1
    fill_s, adv_s, cpu_s = [], [], []
    banned = rejected = completed = incomplete = 0
    for _ in range(steps):
        ms = [s[0] for s in slots]
        toks = [s[1][s[2]] for s in slots]
        c0 = time.process_time()
        t0 = time.perf_counter()
        backend.fill(ms, buf)
        t1 = time.perf_counter()
        ok = backend.advance(ms, toks)
        t2 = time.perf_counter()
        cpu_s.append(time.process_time() - c0)
        fill_s.append(t1 - t0)
        adv_s.append(t2 - t1)
        for i, s in enumerate(slots):
            if not allows(buf_np, i, toks[i]):
                banned += 1
            s[2] += 1
            if not ok[i]:
                rejected += 1
                slots[i] = start(s[3])
            elif s[2] == len(s[1]):
                if backend.done(s[0]):
                    completed += 1
                else:
                    incomplete += 1
                slots[i] = start(s[3])
    step_s = [a + b for a, b in zip(fill_s, adv_s)]
    return {"step_s": step_s, "cpu_us_per_step": 1e6 * statistics.fmean(cpu_s), "steps": steps,
            "us_per_step": 1e6 * statistics.fmean(step_s), "p50_us": 1e6 * pct(step_s, 0.5),
            "p99_us": 1e6 * pct(step_s, 0.99), "fill_us": 1e6 * statistics.fmean(fill_s),
            "advance_us": 1e6 * statistics.fmean(adv_s), "us_per_token": 1e6 * statistics.fmean(step_s) / BATCH,
            "matcher_us": 1e6 * statistics.fmean(matcher_s), "documents_completed": completed,
            "mask_banned_the_document_token": banned, "tokens_rejected": rejected, "incomplete_at_eos": incomplete}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# --------------------------------------------------------------------------- #
# The measurements
# --------------------------------------------------------------------------- #

def g1(backends, compiled, tok, eos, vocab_size, steps, rounds, schema_names, threads_list):
    rows = []
    for n in threads_list:
        for b in backends.values():
            b.set_threads(n)
        rows += _s1(backends, compiled, tok, eos, vocab_size, steps, rounds, schema_names, n)
    return rows


def _s1(backends, compiled, tok, eos, vocab_size, steps, rounds, schema_names, threads):
    """compiled[(backend, schema)] from s2. Each run (one schema, or the schemas mixed
    across the batch) is measured in `rounds` rounds, the backends taking turns within a
    round (so a noisy neighbour on the machine hits them alike); per step: mean over all
    steps, the median of the round means beside it, p99 over all steps."""
    rng = random.Random(1234)
    streams = {k: [encode(tok, json.dumps(make_doc(k, rng), ensure_ascii=False), eos) for _ in range(96)]
               for k in SCHEMAS}
    lengths = {k: statistics.fmean(len(d) for d in v) for k, v in streams.items()}
    runs = {name: BATCH * [name] for name in schema_names}
    if len(schema_names) > 1:
        runs["mixed"] = [schema_names[i % len(schema_names)] for i in range(BATCH)]
    for b in backends.values():  # warm the code paths
        batch_walk(b, {k: compiled[(b.name, k)] for k in schema_names}, streams, runs[schema_names[0]], 4, vocab_size)
    results = {}
    for run, slot_kinds in runs.items():
        parts = {b.name: [] for b in backends.values()}
        for _ in range(rounds):
            for b in backends.values():
                parts[b.name].append(batch_walk(b, {k: compiled[(b.name, k)] for k in schema_names}, streams,
                                                slot_kinds, steps, vocab_size))
        for name, rs in parts.items():
            step_s = [x for r in rs for x in r["step_s"]]
            mean = statistics.fmean(step_s)
            r = {"steps": len(step_s), "rounds": rounds, "us_per_step": 1e6 * mean,
                 "round_median_us": 1e6 * statistics.median(statistics.fmean(r["step_s"]) for r in rs),
                 "p50_us": 1e6 * pct(step_s, 0.5), "p99_us": 1e6 * pct(step_s, 0.99),
                 "us_per_token": 1e6 * mean / BATCH, "threads": threads,
                 "cpu_us_per_step": statistics.fmean(r["cpu_us_per_step"] for r in rs),
                 "fill_us": statistics.fmean(r["fill_us"] for r in rs),
                 "advance_us": statistics.fmean(r["advance_us"] for r in rs),
                 "matcher_us": statistics.fmean(r["matcher_us"] for r in rs),
                 **{k: sum(r[k] for r in rs) for k in ("documents_completed", "mask_banned_the_document_token",
                                                       "tokens_rejected", "incomplete_at_eos")}}
            results[(name, run)] = r
            print(f"G1 t={threads:<2} {name:14} {run:7} {r['us_per_step']:9.1f} us/step  p99 {r['p99_us']:9.1f}  "
                  f"{r['us_per_token']:7.2f} us/token  (fill {r['fill_us']:.1f}, advance {r['advance_us']:.1f}; "
                  f"cpu {r['cpu_us_per_step']:.0f} us; matcher {r['matcher_us']:.1f} us; "
                  f"docs {r['documents_completed']}, banned "
                  f"{r['mask_banned_the_document_token']}, rejected {r['tokens_rejected']})", flush=True)
    rows = []
    for (name, run), r in results.items():
        others = [v["us_per_step"] for (n, rr), v in results.items() if rr == run and n != name]
        best = min(others) if others else None
        llg = results.get(("llguidance", run))
        kinds = schema_names if run == "mixed" else [run]
        rows.append({"id": "G1", "case": f"{name} json {run} batch{BATCH} threads={threads} us/token",
                     "ratio_to_floor": None, "target_floor": None,
                     "ratio_to_peer": best / r["us_per_step"] if best else None, "target_peer": None,
                     "backend": name, "schema": run, "batch": BATCH,
                     "time_to_llguidance": r["us_per_step"] / llg["us_per_step"] if llg else None,
                     "tokens_per_document": round(statistics.fmean(lengths[k] for k in kinds), 1),
                     **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}})
    return rows


def g2(backends, schema_names, vocab_size, alt_whitespace=True):
    """Compile times; returns the rows and the compiled grammars (for G1)."""
    compiled = {}
    words = -(-vocab_size // 32)
    buf = torch.zeros(1, words, dtype=torch.int32)
    times = {}
    for b in backends.values():
        for k in schema_names:
            t = time.perf_counter()
            c = compiled[(b.name, k)] = b.compile("json", SCHEMAS[k], fresh=True)
            first = time.perf_counter() - t
            cached = None
            if b.caches:
                t = time.perf_counter()
                b.compile("json", SCHEMAS[k])
                cached = time.perf_counter() - t
            t = time.perf_counter()
            m = b.matcher(c)
            matcher = time.perf_counter() - t
            t = time.perf_counter()
            b.fill([m], buf)
            first_mask = time.perf_counter() - t
            extra = {}
            if b.name == "outlines-core" and alt_whitespace:  # its own default whitespace ("[ ]?"), a smaller automaton
                b.whitespace = None
                t = time.perf_counter()
                b.compile("json", SCHEMAS[k])
                extra["compile_ms_default_whitespace"] = round(1e3 * (time.perf_counter() - t), 2)
                b.whitespace = WS_REGEX
            if b.name == "llguidance":
                t = time.perf_counter()
                m.deep_copy()
                extra["deep_copy_us"] = round(1e6 * (time.perf_counter() - t), 1)
            times[(b.name, k)] = dict(first=first, cached=cached, matcher=matcher, first_mask=first_mask, **extra)
            print(f"G2 {b.name:14} {k:7} compile {1e3 * first:9.2f} ms  cached "
                  f"{'-' if cached is None else f'{1e3 * cached:.3f} ms':>10}  matcher {1e6 * matcher:8.1f} us  "
                  f"first mask {1e6 * first_mask:8.1f} us {extra or ''}", flush=True)
    rows = []
    for (name, k), v in times.items():
        ready = v["first"] + v["matcher"] + v["first_mask"]
        others = [o["first"] + o["matcher"] + o["first_mask"] for (n, kk), o in times.items() if kk == k and n != name]
        rows.append({"id": "G2", "case": f"{name} compile {k} (to the first mask)", "ratio_to_floor": None,
                     "target_floor": None, "ratio_to_peer": min(others) / ready if others else None,
                     "target_peer": None, "backend": name, "schema": k,
                     "to_first_mask_ms": round(1e3 * ready, 3), "compile_ms": round(1e3 * v["first"], 3),
                     "cached_compile_ms": None if v["cached"] is None else round(1e3 * v["cached"], 4),
                     "matcher_us": round(1e6 * v["matcher"], 1), "first_mask_us": round(1e6 * v["first_mask"], 1),
                     **{kk: vv for kk, vv in v.items() if kk not in ("first", "cached", "matcher", "first_mask")}})
    return rows, compiled


def _verdict(b, kind, spec, valid_tokens, invalid_tokens):
    try:
        c = b.compile(kind, spec, fresh=True)
        ok_valid = walk(b, c, valid_tokens)
        ok_invalid = walk(b, c, invalid_tokens)
    except Unsupported as exc:
        return "refused", str(exc)
    if not ok_valid:
        return "wrong", "rejects the valid document"
    return ("ignored", "accepts the violating document") if ok_invalid else ("enforced", "")


def g3_g4(backends, tok, eos):
    table, rows = {}, []
    for fname, schema, good, bad in FEATURES:
        vt = encode(tok, json.dumps(good, ensure_ascii=False), eos)
        it = encode(tok, json.dumps(bad, ensure_ascii=False), eos)
        for b in backends.values():
            table[(b.name, fname)] = _verdict(b, "json", schema, vt, it)
    other = {}
    for name, kind, spec, good, bad in OTHER_SPECS:
        vt, it = encode(tok, good, eos), encode(tok, bad, eos)
        for b in backends.values():
            other[(b.name, name)] = _verdict(b, kind, spec, vt, it)
    names = [b.name for b in backends.values()]
    print(f"\nG3 {'feature':30}" + "".join(f"{n:>15}" for n in names))
    for fname, *_ in FEATURES:
        print(f"   {fname:30}" + "".join(f"{table[(n, fname)][0]:>15}" for n in names))
    for name, *_ in OTHER_SPECS:
        print(f"G4 {name:30}" + "".join(f"{other[(n, name)][0]:>15}" for n in names))
    counts = {n: {v: sum(1 for (nn, _), (vv, _) in table.items() if nn == n and vv == v)
                  for v in ("enforced", "ignored", "refused", "wrong")} for n in names}
    for n in names:
        best = max((counts[o]["enforced"] for o in names if o != n), default=None)
        rows.append({"id": "G3", "case": f"{n} JSON Schema features enforced (of {len(FEATURES)})",
                     "ratio_to_floor": None, "target_floor": None,
                     "ratio_to_peer": counts[n]["enforced"] / best if best else None, "target_peer": None,
                     "backend": n, "features": len(FEATURES), **counts[n],
                     "by_feature": {f: {"verdict": table[(n, f)][0], **({"note": table[(n, f)][1]} if table[(n, f)][1]
                                                                         else {})} for f, *_ in FEATURES}})
        for name, *_ in OTHER_SPECS:
            v, note = other[(n, name)]
            rows.append({"id": "G4", "case": f"{n} {name}", "ratio_to_floor": None, "target_floor": None,
                         "ratio_to_peer": None, "target_peer": None, "backend": n, "verdict": v,
                         **({"note": note} if note else {})})
    print("G3 enforced / ignored / refused / wrong: " + ", ".join(
        f"{n} {c['enforced']}/{c['ignored']}/{c['refused']}/{c['wrong']}" for n, c in counts.items()))
    return rows


def wheel_info(name: str) -> dict:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTIONS[name])
    except importlib.metadata.PackageNotFoundError:
        return {"installed": False}
    tags = []
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    size = sum((f.size or 0) for f in dist.files or [])
    requires = [r for r in (dist.requires or []) if "extra ==" not in r]
    return {"installed": True, "version": dist.version, "wheel_tags": tags[:4], "installed_mb": round(size / 2**20, 1),
            "requires": requires}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="default", help="default (SmolLM2-135M), tiny, or a tokenizer folder")
    ap.add_argument("--quick", action="store_true", help="fewer steps (under a minute)")
    ap.add_argument("--steps", type=int, help="G1 steps per round (default 400, quick 60)")
    ap.add_argument("--rounds", type=int, help="G1 rounds per run, the backends taking turns (default 3, quick 1)")
    ap.add_argument("--threads", default=f"1,{min(os.cpu_count() or 1, 16)}",
                    help="thread counts for the batched mask APIs (llguidance, xgrammar), comma-separated")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--out", default=record.default_out(__file__), help="the result file (rows of a case replaced)")
    args = ap.parse_args()
    steps = args.steps or (60 if args.quick else 150)
    rounds = args.rounds or (1 if args.quick else 6)
    threads_list = sorted({int(x) for x in args.threads.split(",")})
    if args.quick:
        threads_list = threads_list[-1:]
    t0 = time.perf_counter()
    tok, tok_name = load_tokenizer(args.tokenizer)
    vocab_size = len(tok)
    eos = [tok.eos_token_id]
    print(f"tokenizer {tok_name}: {vocab_size} tokens, EOS {eos}, loaded in {time.perf_counter() - t0:.1f}s; "
          f"threads {threads_list}", flush=True)
    backends, skipped = {}, {}
    for name in args.backends.split(","):
        try:
            backends[name] = ADAPTERS[name](tok, vocab_size, eos, threads_list[-1])
            print(f"{name}: tokenizer set-up {backends[name].setup_s * 1e3:.0f} ms", flush=True)
        except ImportError as exc:
            skipped[name] = str(exc)
            print(f"{name}: skipped ({exc})", flush=True)
    schema_names = list(SCHEMAS)
    if args.quick and "outlines-core" in backends:
        # its Index over a 64-character whitespace bound takes tens of seconds per schema:
        # quick uses outlines-core's own default whitespace ("[ ]?": what the documents use)
        backends["outlines-core"].whitespace = None
    t = time.perf_counter()
    rows, compiled = g2(backends, schema_names, vocab_size, alt_whitespace=not args.quick)
    print(f"G2 took {time.perf_counter() - t:.0f}s", flush=True)
    t = time.perf_counter()
    rows = g1(backends, compiled, tok, eos[0], vocab_size, steps, rounds, schema_names, threads_list) + rows
    print(f"G1 took {time.perf_counter() - t:.0f}s", flush=True)
    if "outlines-core" in backends:  # coverage does not depend on it, and its own default builds faster
        backends["outlines-core"].whitespace = None
    t = time.perf_counter()
    rows += g3_g4(backends, tok, eos[0])
    print(f"G3/G4 took {time.perf_counter() - t:.0f}s", flush=True)
    for name in skipped:
        rows.append({"id": "G1", "case": f"{name} not installed", "ratio_to_floor": None, "target_floor": None,
                     "ratio_to_peer": None, "target_peer": None, "backend": name, "skipped": skipped[name]})
    run = {"tokenizer": tok_name, "vocab_size": vocab_size, "steps_per_round": steps, "rounds": rounds,
           "quick": args.quick, "backends": {n: {**wheel_info(n), "setup_ms": round(b.setup_s * 1e3, 1),
                                                  "batch_fill": b.batch_fill, "batch_advance": b.batch_advance}
                                              for n, b in backends.items()}}
    record.save([r | run for r in rows], args.out)
    print(f"\n{'id':3} {'case':62} {'us/step':>9} {'p99':>9} {'us/tok':>7} {'cpu us':>8} {'x best other':>12}")
    for r in rows:
        if r["id"] == "G1" and "us_per_step" in r:
            print(f"{r['id']:3} {r['case']:62} {r['us_per_step']:9.1f} {r['p99_us']:9.1f} {r['us_per_token']:7.2f} "
                  f"{r['cpu_us_per_step']:8.0f} {r['ratio_to_peer'] or 0:12.2f}")
    for r in rows:
        if r["id"] == "G2":
            print(f"{r['id']:3} {r['case']:62} {r['to_first_mask_ms']:9.2f} ms to the first mask "
                  f"(compile {r['compile_ms']:.2f}, cached {r['cached_compile_ms']})  x best other "
                  f"{r['ratio_to_peer'] or 0:.2f}")
    for r in rows:
        if r["id"] == "G3":
            print(f"{r['id']:3} {r['case']:62} {r['enforced']:3d} enforced, {r['ignored']} ignored, "
                  f"{r['refused']} refused, {r['wrong']} wrong")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
