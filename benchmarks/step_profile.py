"""The step profile of a serving run: host time of decode steps by phase against the GPU
time of the same forward, and the host gap between them (benchmarks/serve.py's rows)."""
from __future__ import annotations

import random
import time

import torch


def step_profile(llm_engine, concurrency: int, prompt_len: int, vocab: int, steps: int = 40) -> dict:
    """Host time of decode steps split by phase, against the GPU time of the
    same forward (the graph of that batch replayed alone)."""
    from engine import SamplingParams

    eng = llm_engine
    rng = random.Random(7)
    params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True, detokenize=False)
    for i in range(concurrency):
        eng.add_request(f"prof-{concurrency}-{i}", {"prompt_token_ids": [rng.randrange(100, vocab - 100)
                                                                       for _ in range(prompt_len)]}, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.requests.values()):
        eng.step()
    eng.step()
    from engine.sampler import PendingSamples

    phases = {"schedule": 0.0, "execute": 0.0, "sample": 0.0, "wait": 0.0, "postprocess": 0.0}

    def timed(obj, name, key):
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[key] += time.perf_counter() - t
        setattr(obj, name, wrapper)
        return fn

    saved = [(eng.scheduler, "schedule", timed(eng.scheduler, "schedule", "schedule")),
             (eng.runner, "execute", timed(eng.runner, "execute", "execute")),
             (eng.sampler, "launch", timed(eng.sampler, "launch", "sample")),
             (PendingSamples, "result", timed(PendingSamples, "result", "wait")),
             (eng.scheduler, "update_from_output", timed(eng.scheduler, "update_from_output", "postprocess")),
             (eng, "_postprocess", timed(eng, "_postprocess", "postprocess"))]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    wall = (time.perf_counter() - t) / steps
    for obj, name, fn in saved:
        if obj is PendingSamples:
            setattr(obj, name, fn)
        else:
            delattr(obj, name)  # the instance's wrapper: the class's method again
    gpu = None
    graphs = eng.runner.graphs
    if graphs is not None:
        bs = graphs.padded_size(concurrency)
        graph = graphs.graphs[bs][0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        end.synchronize()
        gpu = start.elapsed_time(end) * 1e-3 / 10
    for rid in list(eng.requests):
        eng.abort_request(rid)
    per = {k: v / steps for k, v in phases.items()}
    return {"concurrency": concurrency, "step_s": wall, "gpu_forward_s": gpu,
            "host_gap_s": (wall - gpu) if gpu else None, **{f"{k}_s": v for k, v in per.items()}}
