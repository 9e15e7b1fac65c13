"""R1: what a job at the worker's caps costs a neighbour. One in-process worker (the RunPod
handler, its admission and caps) on a tiny random Llama on the CPU; a streamed 48-token victim
runs beside (a) a job with the largest stop list the settings allow, (b) a job of as many
choices as MAX_CHOICES allows (32 by default; --choices for another width), (c) the same with
20 logprobs a token. The peer is the victim beside a plain job of the same
kind without the costly part, measured in the same run, the rounds interleaved so a slow spell
of the machine hits both alike: ratio_to_peer is the victim's speed beside the job at the caps
over its speed beside the plain one (target 1 / 1.5: no job within the caps makes a neighbour's
time per token more than 1.5x).

    python3 benchmarks/isolation.py [--rounds 5] [--choices N] [--gpu]

--gpu: the same cases on the engine alone (no worker: `AsyncLLMEngine`, CUDA graphs,
asynchronous steps) serving Qwen2.5-7B-AWQ shapes (random weights), the victim streamed beside
the job of many choices (with and without 20 logprobs) or beside its plain peer; the victim's
time per token after its first.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import record  # noqa: E402 - after the repository root is on the path

VICTIM_TOKENS = 48
ENV = {"MAX_MODEL_LEN": "512", "NUM_KV_BLOCKS": "128", "DEFAULT_MAX_TOKENS": "64", "DEFAULT_BATCH_SIZE": "8",
       "METRICS_LOG_INTERVAL_S": "0"}
VICTIM = {"prompt": "Meeting notes: the team discussed the budget", "stream": True,
          "sampling_params": {"max_tokens": VICTIM_TOKENS, "temperature": 0, "ignore_eos": True}}
TARGET = round(1 / 1.5, 3)


def largest_stop_list(settings, text: list[str]) -> list[str]:
    """As many stop strings, of as many characters, as the settings allow: pieces of `text` (what
    the model was trained on), so its output keeps matching their beginnings, each ending in a ☃
    it never writes (none ever stops it)."""
    count, chars = settings.max_stop_strings, settings.max_stop_chars
    length = max(2, chars // count)
    corpus = " ".join(text) * (1 + length // 100)
    stops = [(corpus[i % 40:] + corpus)[: length - 1 - len(str(i))] + f"{i}☃" for i in range(count)]
    assert sum(map(len, stops)) <= chars and len(set(stops)) == count
    return stops


async def victim_mean_tpot(w, neighbour: dict, tag: str) -> float:
    """The victim's mean time per output token (its whole stream over its tokens) with
    `neighbour` started beside it (it may finish first: the cost it adds is what counts)."""
    from handler.local import run_job

    task = asyncio.ensure_future(run_job(w.handle, {"id": f"neighbour-{tag}", "input": neighbour}))
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    async for item in w.handle({"id": f"victim-{tag}", "input": VICTIM}):
        assert not item.get("error"), item
    took = time.perf_counter() - t0
    result = await task
    assert result["status"] == "COMPLETED", result.get("error")
    return took / VICTIM_TOKENS


def cases(settings, text: list[str], choices: int) -> dict[str, tuple[dict, dict]]:
    """case -> (the job at the caps, its plain peer); `choices` the wide job's n."""
    prose = {"prompt": "Action items: Alice sends the report", "sampling_params": {
        "max_tokens": 400, "temperature": 0, "ignore_eos": True}}
    stops = {**prose, "sampling_params": {**prose["sampling_params"], "stop": largest_stop_list(settings, text)}}
    plain = {"prompt": [5, 17, 33, 120], "stream": True, "sampling_params": {
        "max_tokens": VICTIM_TOKENS, "temperature": 0, "ignore_eos": True}}
    wide = {"prompt": [5, 17, 33, 120], "stream": True, "sampling_params": {
        "n": choices, "temperature": 1.0, "ignore_eos": True, "seed": 1, "max_tokens": 12}}
    logprobs = {**wide, "sampling_params": {**wide["sampling_params"], "logprobs": 20}}
    return {"stop list at its caps": (stops, prose), f"n = {choices}": (wide, plain),
            f"n = {choices}, 20 logprobs": (logprobs, plain)}


def r1_row(loop, case: str, costly, plain, rounds: int, victim_tpot) -> dict:
    """R1's row of one case: the victim's time per token beside `costly` and beside `plain`,
    the two taking turns `rounds` times (medians); victim_tpot(job, tag) is the measuring coroutine."""
    tpot: dict[str, list[float]] = {"costly": [], "plain": []}
    for r in range(rounds):
        order = [("costly", costly), ("plain", plain)][:: 1 if r % 2 else -1]
        for name, job in order:
            tpot[name].append(loop.run_until_complete(victim_tpot(job, f"{case}-{r}-{name}")))
    beside_costly, beside_plain = statistics.median(tpot["costly"]), statistics.median(tpot["plain"])
    return {"id": "R1", "case": case, "ratio_to_floor": None, "target_floor": None,
            "ratio_to_peer": round(beside_plain / beside_costly, 3), "target_peer": TARGET,
            "victim_tpot_ms": round(beside_costly * 1000, 3),
            "victim_tpot_beside_plain_ms": round(beside_plain * 1000, 3), "rounds": rounds}


async def engine_victim_tpot(engine, neighbour, tag: str) -> float:
    """The victim's time per token after its first, streamed from `engine` beside `neighbour`
    (prompt ids, SamplingParams) started first."""
    from engine import SamplingParams

    prompt, params = neighbour
    other = asyncio.ensure_future(_drain(engine.generate({"prompt_token_ids": prompt}, params, f"n-{tag}")))
    await asyncio.sleep(0)
    victim = SamplingParams(max_tokens=VICTIM_TOKENS, temperature=0, ignore_eos=True)
    first = end = None
    async for out in engine.generate({"prompt_token_ids": [11, 12, 13, 14, 15, 16]}, victim, f"v-{tag}"):
        end = time.perf_counter()
        first = first or end
    await other
    return (end - first) / (VICTIM_TOKENS - 1)


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def gpu_rows(rounds: int, choices: int) -> list[dict]:
    """R1's n cases on the engine alone, on a GPU (--gpu)."""
    from dataclasses import replace

    from engine import AsyncLLMEngine, EngineConfig, SamplingParams

    from benchmarks.serve import GROUP, QWEN25_7B, model_dir

    engine = AsyncLLMEngine.from_config(EngineConfig(model=model_dir(QWEN25_7B, GROUP), load_format="dummy",
                                                     dtype="bfloat16", max_model_len=4096, max_num_seqs=256))
    prompt = [5, 17, 33, 120]
    wide = SamplingParams(n=choices, temperature=1.0, ignore_eos=True, seed=1, max_tokens=12)
    plain = SamplingParams(max_tokens=VICTIM_TOKENS, temperature=0, ignore_eos=True)
    cases = {f"n = {choices}, GPU engine": (prompt, wide),
             f"n = {choices}, 20 logprobs, GPU engine": (prompt, replace(wide, logprobs=20))}
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine_victim_tpot(engine, (prompt, plain), "warm"))
    loop.run_until_complete(engine_victim_tpot(engine, (prompt, wide), "warm-wide"))
    rows = []
    for case, costly in cases.items():
        rows.append(r1_row(loop, case, costly, (prompt, plain), rounds,
                           lambda job, tag: engine_victim_tpot(engine, job, tag)))
        print(rows[-1], flush=True)
    loop.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gpu", action="store_true", help="the n cases on the engine alone, Qwen2.5-7B-AWQ shapes, CUDA")
    ap.add_argument("--choices", type=int, default=None,
                    help="the wide job's n (default: the MAX_CHOICES setting's default; above it, raised to match)")
    ap.add_argument("--out", default=record.default_out(__file__))
    args = ap.parse_args()
    from handler.settings import load_settings

    choices = args.choices or load_settings({}).max_choices
    if args.gpu:
        rows = gpu_rows(args.rounds, choices)
        record.save(rows, args.out)
        print(record.table(rows))
        return

    from handler.local import run_job
    from handler.worker import Worker
    from tests.models import TOKENIZER_TEXT, make_checkpoint

    path = make_checkpoint(os.path.join(tempfile.mkdtemp(prefix="isolation-bench-"), "llama"))
    loop = asyncio.new_event_loop()
    w = Worker(load_settings({"MODEL_NAME": path, **ENV, "MAX_CHOICES": str(choices)}))
    warm = loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": VICTIM}))
    assert warm["status"] == "COMPLETED", warm
    rows = [r1_row(loop, case, costly, plain, args.rounds, lambda job, tag: victim_mean_tpot(w, job, tag))
            for case, (costly, plain) in cases(w.settings, TOKENIZER_TEXT, choices).items()]
    loop.run_until_complete(w.aclose())
    loop.close()
    record.save(rows, args.out)
    print(record.table(rows))


if __name__ == "__main__":
    main()
