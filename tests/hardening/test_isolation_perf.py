"""No job can starve the others, shown in one in-process worker on the tiny model: beside a job
with the largest stop list the settings allow, or of 128 choices (with 20 logprobs) at the caps,
a streamed neighbour gets a token in every engine step and nothing is preempted (the wall time
those jobs add to a neighbour's step is benchmark R1's, `benchmarks/isolation.py`); inputs at the
size caps (a 1M-character prompt, 1M token ids, 1M stop token ids, 5 MB of tools) must not stall
the event loop (an asyncio heartbeat's longest gap stays under 0.5 s while they are refused);
jobs of 128 choices are admitted as the KV cache holds them."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from benchmarks.isolation import largest_stop_list
from handler.local import run_job
from handler.worker import Worker
from tests.handler.conftest import settings_for
from tests.handler.tools.test_tools_and_reasoning import TOOL_TEMPLATE
from tests.models import TOKENIZER_TEXT

STALL_LIMIT_S = 0.5
VICTIM_TOKENS = 48
BIG = 1_000_000
ENV = {"MAX_MODEL_LEN": "512", "NUM_KV_BLOCKS": "128", "DEFAULT_MAX_TOKENS": "64", "DEFAULT_BATCH_SIZE": "8",
       "CUSTOM_CHAT_TEMPLATE": TOOL_TEMPLATE,  # a template that renders tools and tool calls
       "MAX_CHOICES": "128"}  # jobs at the engine's limit of choices (the setting's default is 32)
VICTIM = {"prompt": "Meeting notes: the team discussed the budget", "stream": True, "max_batch_size": 1,
          "sampling_params": {"max_tokens": VICTIM_TOKENS, "temperature": 0, "ignore_eos": True}}


@pytest.fixture
def worker(tiny_llama_dir):
    """A worker on its own event loop (the SDK's), loaded and warm."""
    loop = asyncio.new_event_loop()
    w = Worker(settings_for(tiny_llama_dir, **ENV))
    result = loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {
        "prompt": "warm up", "sampling_params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}}}))
    assert result["status"] == "COMPLETED", result
    yield w, loop
    loop.run_until_complete(w.aclose())
    loop.close()


def steps_beside(w: Worker, loop, neighbour: dict, tag: str, outlives: bool = True) -> tuple[int, int, dict]:
    """(the engine steps before the streamed victim's first token, the steps from it to its end,
    its last item) with `neighbour` started beside it (and still running when the victim ends, if
    it `outlives` it). A victim that runs in every step lives about VICTIM_TOKENS steps after its
    first; one the neighbour starved or preempted lives more."""

    async def main():
        task = asyncio.ensure_future(run_job(w.handle, {"id": f"neighbour-{tag}", "input": neighbour}))
        started = w.engine.stats()["num_steps"]
        for _ in range(3000):  # the neighbour has run a few steps before the victim arrives
            stats = w.engine.stats()
            if stats["num_running"] >= 1 and stats["num_steps"] > started + 3:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError(f"the neighbour never ran: {task}")
        arrived, first = w.engine.stats()["num_steps"], None
        async for item in w.handle({"id": f"victim-{tag}", "input": VICTIM}):
            assert not item.get("error"), item
            first = w.engine.stats()["num_steps"] if first is None else first
        ended = w.engine.stats()["num_steps"]
        if outlives:
            assert not task.done(), task.result()  # it ran beside the victim all along
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return first - arrived, ended - first, item

    return loop.run_until_complete(main())


# Steps beyond one a token a streamed victim may take: those in flight when it arrives, gets its
# first token and ends (the engine may run a step ahead of the host)
STEP_SLACK = 4


@pytest.mark.slow
def test_a_job_at_the_stop_list_caps_leaves_its_neighbour_a_token_every_step(worker, figures):
    """The largest stop list the settings allow is accepted and its job runs beside a streamed
    victim, which gets a token in every engine step (how much wall time the stop list costs a
    step is benchmark R1's, benchmarks/isolation.py)."""
    w, loop = worker
    stops = largest_stop_list(w.settings, TOKENIZER_TEXT)
    neighbour = {"prompt": "Action items: Alice sends the report", "sampling_params": {
        "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stop": stops}}
    waited, lived, item = steps_beside(w, loop, neighbour, "stops")
    figures.set("isolation", stop_strings=len(stops), stop_chars=sum(map(len, stops)),
                victim_steps_beside_stops=waited + lived)
    assert item["usage"]["completion_tokens"] == VICTIM_TOKENS, item
    assert waited + lived <= VICTIM_TOKENS + STEP_SLACK, (waited, lived)
    stats = w.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_running"] == 0, stats


async def heartbeat_gap(w: Worker, job_input: dict, tag: str) -> tuple[float, dict]:
    """(longest gap between beats of a 5 ms asyncio heartbeat, the job's result) while the job runs."""
    gaps: list[float] = []

    async def beat():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    hb = asyncio.ensure_future(beat())
    await asyncio.sleep(0.05)
    try:
        result = await run_job(w.handle, {"id": f"big-{tag}", "input": job_input})
        await asyncio.sleep(0.05)
    finally:
        hb.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hb
    return max(gaps), result


def _tool(description: str) -> dict:
    return {"type": "function", "function": {"name": "weather", "description": description,
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def _called(arguments: dict) -> list[dict]:
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]


def _chat(messages=None, **extra) -> dict:
    return {"openai_route": "/v1/chat/completions", "openai_input": {
        "messages": messages or [{"role": "user", "content": "Weather in Paris?"}], **extra}}


BIG_INPUTS = {  # (job input, the code it must fail with, or COMPLETED)
    "1M-character prompt": ({"prompt": ("The quick brown fox jumps over the lazy dog. " * (BIG // 45 + 1))[:BIG]},
                            "prompt_too_long"),
    "1M token ids": ({"prompt": [5] * BIG}, "prompt_too_long"),
    "1M stop token ids": ({"prompt": "Hi", "sampling_params": {"stop_token_ids": list(range(BIG))}},
                          "invalid_input"),
    "1M messages": ({"messages": [{"role": "user", "content": "Hi"}] * BIG}, "invalid_input"),
    # tool definitions, tool-call arguments and bad_words count toward the caps (MAX_INPUT_CHARS, MAX_BAD_WORDS)
    "5 MB tool description": (_chat(tools=[_tool("Returns the weather. " * (5 * BIG // 21))], tool_choice="none"),
                              "invalid_input"),
    "5 MB tool-call arguments": (_chat(messages=_called({"city": "Paris " * (5 * BIG // 6)})), "invalid_input"),
    "100,000 bad_words": ({"prompt": "Hi", "sampling_params": {"bad_words": [f"w{i}" for i in range(100_000)]}},
                          "invalid_input"),
    # within the caps: rendered and tokenized off the loop
    "900,000-character tool description": (_chat(tools=[_tool("Returns the weather. " * (BIG * 9 // 210))],
                                                 tool_choice="none"), "prompt_too_long"),
    "900,000 characters of tool-call arguments": (_chat(messages=_called({"city": "Paris " * (BIG * 9 // 60)})),
                                                  "prompt_too_long"),
    "256 bad_words": ({"prompt": "Hi", "sampling_params": {"bad_words": [f"word{i}" for i in range(256)],
                                                            "max_tokens": 2}}, "COMPLETED"),
    # a document of 1M characters is tokenized in a thread; its deadline ends it meanwhile
    "1M-character summarize": ({"summarize": ("Meeting notes: the budget. " * (BIG // 27 + 1))[:BIG],
                                "timeout_s": 0.3}, "timeout"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BIG_INPUTS)
def test_big_inputs_do_not_stall_the_event_loop(worker, figures, case):
    w, loop = worker
    job_input, code = BIG_INPUTS[case]
    gaps = []
    for r in range(3):  # the best of three: a loaded machine may steal one, never all three
        gap, result = loop.run_until_complete(heartbeat_gap(w, job_input, f"{r}"))
        if code == "COMPLETED":
            assert result["status"] == "COMPLETED", result
        else:
            assert result["status"] == "FAILED" and json.loads(result["error"])["code"] == code, result
        gaps.append(gap)
        if gap < STALL_LIMIT_S:
            break
    figures.set("isolation", **{f"loop_stall_s[{case}]": round(min(gaps), 3)})
    assert min(gaps) < STALL_LIMIT_S, gaps


def test_prompts_processed_off_the_loop_end_as_on_it(worker, monkeypatch):
    """Every prompt through the thread (OFF_LOOP_SIZE 0) gives the same text, and the same coded
    failures naming the same fields, as through the event loop."""
    import handler.job.requests as job_requests

    w, loop = worker
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    jobs = [
        {"prompt": "The quick brown fox", "sampling_params": greedy},
        {"messages": [{"role": "user", "content": "What is the capital of France?"}], "sampling_params": greedy},
        {"prompt": [5, 6, 7, 8], "stream": True, "sampling_params": greedy},
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Meeting notes", **greedy}},
        {"prompt": [5, 10**6]},  # outside the vocabulary
        {"openai_route": "/v1/completions", "openai_input": {"prompt": [5, 10**6]}},
        {"prompt": "fox " * 600},  # too long
        {"summarize": "The team discussed the budget. " * 4, "sampling_params": greedy},
    ]

    def ends(salt: str) -> list:
        """Each job's end: its output without timings and ids, or its error."""
        out = []
        for i, job in enumerate(jobs):
            r = loop.run_until_complete(run_job(w.handle, {"id": f"j{i}", "input": {**job, "cache_salt": salt}}))
            if r["status"] == "FAILED":
                err = json.loads(r["error"])
                out.append((err["code"], err.get("field"), err["message"]))
            else:
                out.append(json.dumps([{k: v for k, v in item.items() if k not in ("timings", "id", "created")}
                                       if isinstance(item, dict) else item for item in r["output"]], sort_keys=True))
        return out

    on_loop = ends("on the loop")  # a salt per pass: no prefix-cache hits from the other one
    monkeypatch.setattr(job_requests, "OFF_LOOP_SIZE", 0)
    calls = []
    real = job_requests.JobRequests._process
    monkeypatch.setattr(job_requests.JobRequests, "_process", lambda self, *a: calls.append(self.ctx.id) or real(self, *a))
    off_loop = ends("off the loop")
    assert set(calls) == {f"j{i}" for i in range(len(jobs))}, calls  # every prompt went through the thread
    assert [e[:2] if isinstance(e, tuple) else "ok" for e in on_loop] == [
        "ok", "ok", "ok", "ok", ("invalid_input", "prompt"), ("invalid_input", "openai_input.prompt"),
        ("prompt_too_long", None), "ok"]
    assert off_loop == on_loop


def test_a_prompt_being_tokenized_off_the_loop_keeps_its_deadline(worker):
    """timeout_s counts while a big prompt waits for (or runs in) its thread: the job fails timeout
    at its deadline, not when tokenizing ends."""
    w, loop = worker
    job_input = {**BIG_INPUTS["1M-character prompt"][0], "timeout_s": 0.05}
    t0 = time.monotonic()
    result = loop.run_until_complete(run_job(w.handle, {"id": "late", "input": job_input}))
    assert result["status"] == "FAILED" and json.loads(result["error"])["code"] == "timeout", result
    assert time.monotonic() - t0 < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("case", ["n", "n and logprobs"])
def test_a_job_at_the_n_and_logprobs_caps_leaves_its_neighbour_a_token_every_step(worker, figures, case):
    """A streamed job of 128 choices (with 20 logprobs a token), with as many tokens as the caps
    allow it in this worker's KV cache (128 blocks: one each), beside a streamed victim: neither is
    preempted, the victim's KV blocks wait at most until the neighbour ends, and from its first token
    it gets a token in every engine step (the wall time a wider step costs
    is benchmark R1's, benchmarks/isolation.py)."""
    w, loop = worker
    top = 20 if "logprobs" in case else None
    neighbour = {"prompt": [5, 17, 33, 120], "stream": True, "sampling_params": {
        "n": 128, "temperature": 1.0, "ignore_eos": True, "logprobs": top, "seed": 1, "max_tokens": 12}}
    preempted = w.engine.stats()["num_preemptions"]
    waited, lived, item = steps_beside(w, loop, neighbour, case, outlives=False)
    figures.set("isolation", **{f"victim_steps_beside_{case.replace(' ', '_')}_cap": [waited, lived]})
    assert item["usage"]["completion_tokens"] == VICTIM_TOKENS, item
    # its KV blocks wait for the neighbour's (which fill the cache) at most until that one ends
    assert waited <= neighbour["sampling_params"]["max_tokens"] + STEP_SLACK, waited
    assert lived <= VICTIM_TOKENS + STEP_SLACK, lived
    assert w.engine.stats()["num_preemptions"] == preempted


N_JOBS, N_CHOICES, N_TOKENS = 6, 128, 28


@pytest.mark.slow
def test_jobs_of_128_choices_are_admitted_as_the_kv_cache_holds_them(tiny_llama_dir, figures):
    """Six jobs of n = 128 (each 256 KV blocks at its end, in a cache of 320 that holds 1.25 of
    them) and a plain job after them, all at once: each runs when its blocks fit, so the engine
    does not preempt in a storm, and the plain job's first token comes within 5 s of its turn (the
    end of the jobs ahead of it)."""
    loop = asyncio.new_event_loop()
    w = Worker(settings_for(tiny_llama_dir, **{**ENV, "NUM_KV_BLOCKS": "320"}))
    try:
        warm = loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {
            "prompt": "warm up", "sampling_params": {"max_tokens": 2, "temperature": 0, "ignore_eos": True}}}))
        assert warm["status"] == "COMPLETED", warm
        admission_run(w, loop, figures)
    finally:
        loop.run_until_complete(w.aclose())
        loop.close()


def admission_run(w: Worker, loop, figures) -> None:
    plain = {"prompt": "Hi there", "stream": True, "max_batch_size": 1,
             "sampling_params": {"max_tokens": N_TOKENS, "temperature": 0, "ignore_eos": True}}
    big = {"prompt": [5, 17, 33, 120], "sampling_params": {"n": N_CHOICES, "max_tokens": N_TOKENS,  # 2 blocks each
                                                            "temperature": 1.0, "ignore_eos": True}}

    async def main():
        ended: list[float] = []

        async def one(jid: str, job: dict):
            result = await run_job(w.handle, {"id": jid, "input": job})
            ended.append(time.monotonic())
            return result

        async def plain_job():
            first, items = None, []
            async for item in w.handle({"id": "plain", "input": plain}):
                first = first or time.monotonic()
                items.append(item)
            return first, items

        before = w.engine.stats()["num_preemptions"]
        t0 = time.monotonic()
        bigs = [asyncio.ensure_future(one(f"big-{i}", big)) for i in range(N_JOBS)]
        await asyncio.sleep(0)
        first, items = await plain_job()
        results = await asyncio.gather(*bigs)
        turn = max([t for t in ended if t <= first], default=t0)
        return results, first - turn, items, w.engine.stats()["num_preemptions"] - before, time.monotonic() - t0

    results, wait, items, preemptions, took = loop.run_until_complete(main())
    for r in results:
        assert r["status"] == "COMPLETED" and len(r["output"][-1]["choices"]) == N_CHOICES, r.get("error")
    assert not any(item.get("error") for item in items) and items[-1]["usage"]["completion_tokens"] == N_TOKENS
    figures.set("isolation", n128_jobs=N_JOBS, n128_preemptions=preemptions, n128_run_s=round(took, 2),
                plain_first_token_after_its_turn_s=round(wait, 2))
    assert preemptions < 10, preemptions
    assert wait < 5, wait
    stats = w.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and getattr(w, "admission").reserved == 0, stats
