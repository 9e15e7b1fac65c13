"""AsyncLLMEngine: streaming with deltas, abort and cancellation free blocks,
one request's failure fails only that request, the out-of-memory fault hook."""
import asyncio

import pytest

from engine import AsyncLLMEngine, EngineConfig, SamplingParams
from engine.detokenizer import Detokenizer
from engine.errors import KVCapacityError, OutOfMemoryError, PromptTooLongError, RequestFailedError

PROMPTS = ["Meeting notes: the team", "회의록: 오늘", "The quick brown fox", "Action items:", "Paris is"]
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def make(path, **kw):
    return AsyncLLMEngine.from_config(EngineConfig(model=path, num_kv_blocks=kw.pop("num_kv_blocks", 128), **kw))


async def collect(engine, prompt, rid, params=PARAMS):
    outs = []
    async for out in engine.generate(prompt, params, request_id=rid):
        outs.append(out)
    return outs


def test_concurrent_streams_match_and_deltas_join(tiny_llama_dir):
    async def run():
        engine = make(tiny_llama_dir)
        streams = await asyncio.gather(*(collect(engine, p, f"r{i}") for i, p in enumerate(PROMPTS)))
        alone = [await collect(engine, p, f"alone{i}") for i, p in enumerate(PROMPTS)]
        stats = engine.stats()
        await engine.shutdown()
        return streams, alone, stats

    streams, alone, stats = asyncio.run(run())
    for outs, solo in zip(streams, alone):
        final = outs[-1]
        assert final.finished and not any(o.finished for o in outs[:-1])
        assert "".join(o.outputs[0].delta_text for o in outs) == final.outputs[0].text
        assert final.outputs[0].token_ids == solo[-1].outputs[0].token_ids  # batching changes nothing
        assert final.outputs[0].finish_reason == "length" and len(final.outputs[0].token_ids) == 24
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_cancelling_the_consumer_aborts_and_frees_blocks(tiny_llama_dir):
    async def run():
        engine = make(tiny_llama_dir)
        seen = asyncio.Event()

        async def consume():
            async for out in engine.generate("The quick", SamplingParams(max_tokens=400, ignore_eos=True),
                                             request_id="victim"):
                seen.set()

        task = asyncio.create_task(consume())
        await seen.wait()
        during = engine.stats()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        after = engine.stats()
        other = await collect(engine, "Paris is", "after")  # the engine goes on
        await engine.shutdown()
        return during, after, other

    during, after, other = asyncio.run(run())
    assert during["kv_blocks_free"] < during["kv_blocks_total"]
    assert after["kv_blocks_free"] == after["kv_blocks_total"] and after["num_running"] == 0
    assert other[-1].finished


def test_abort_by_id(tiny_llama_dir):
    async def run():
        engine = make(tiny_llama_dir)
        outs = []

        async def consume():
            async for out in engine.generate("Hello", SamplingParams(max_tokens=400, ignore_eos=True), request_id="a"):
                outs.append(out)
                if len(outs) == 3:
                    await engine.abort("a")

        await asyncio.wait_for(consume(), 30)
        stats = engine.stats()
        await engine.shutdown()
        return outs, stats

    outs, stats = asyncio.run(run())
    assert len(outs) == 4 and outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert outs[-1].outputs[0].text.startswith(outs[-2].outputs[0].text)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_failure_in_one_request_fails_only_it(tiny_llama_dir, monkeypatch):
    async def run():
        engine = make(tiny_llama_dir)
        baseline = await asyncio.gather(*(collect(engine, p, f"b{i}") for i, p in enumerate(PROMPTS)))

        orig = Detokenizer.update

        def broken(detok, token, num_output_tokens):
            if detok is failing[0] and num_output_tokens == 5:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return orig(detok, token, num_output_tokens)

        failing = [None]
        add = engine.engine.add_request

        def add_request(request_id, *args, **kwargs):
            seq = add(request_id, *args, **kwargs)
            if request_id == "f2":
                failing[0] = seq.detok
            return seq

        engine.engine.add_request = add_request
        monkeypatch.setattr(Detokenizer, "update", broken)
        results = await asyncio.gather(*(collect(engine, p, f"f{i}") for i, p in enumerate(PROMPTS)),
                                       return_exceptions=True)
        stats = engine.stats()
        await engine.shutdown()
        return baseline, results, stats

    baseline, results, stats = asyncio.run(run())
    assert isinstance(results[2], RequestFailedError)
    assert results[2].to_dict()["partial_text"] != ""
    for i in (0, 1, 3, 4):
        assert results[i][-1].outputs[0].token_ids == baseline[i][-1].outputs[0].token_ids
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_injected_out_of_memory_fails_one_request(tiny_llama_dir):
    async def run(fault):
        engine = make(tiny_llama_dir, fault_injection=fault)
        results = await asyncio.gather(*(collect(engine, p, f"j{i}") for i, p in enumerate(PROMPTS)),
                                       return_exceptions=True)
        stats = engine.stats()
        await engine.shutdown()
        return results, stats

    clean, _ = asyncio.run(run(None))
    faulty, stats = asyncio.run(run({"oom_at_step": 6, "oom_request_id": "j1"}))
    assert isinstance(faulty[1], OutOfMemoryError) and faulty[1].code == "out_of_memory"
    assert faulty[1].retryable and faulty[1].details["partial_text"]
    for i in (0, 2, 3, 4):
        assert faulty[i][-1].outputs[0].text == clean[i][-1].outputs[0].text
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_prompt_too_long_and_kv_capacity_raise_before_work(tiny_llama_dir):
    async def run():
        engine = make(tiny_llama_dir, max_model_len=64, num_kv_blocks=2, block_size=16)
        with pytest.raises(PromptTooLongError) as long_err:
            await collect(engine, {"prompt_token_ids": [5] * 64}, "long")
        with pytest.raises(KVCapacityError) as kv_err:
            await collect(engine, {"prompt_token_ids": [5] * 20}, "kv", SamplingParams(max_tokens=20))
        ok = await collect(engine, {"prompt_token_ids": [5] * 20}, "ok", SamplingParams(max_tokens=5))
        stats = engine.stats()
        await engine.shutdown()
        return long_err.value, kv_err.value, ok, stats

    long_err, kv_err, ok, stats = asyncio.run(run())
    assert long_err.details == {"prompt_tokens": 64, "max_model_len": 64}
    assert kv_err.details == {"needed_tokens": 40, "capacity_tokens": 32}
    assert ok[-1].finished and stats["kv_blocks_free"] == 2


def test_non_finite_logits_fail_only_that_request(tiny_llama_dir):
    async def run():
        engine = make(tiny_llama_dir)
        runner = engine.engine.runner
        real = runner.execute

        def poisoned(scheduled, **kw):
            logits = real(scheduled, **kw).clone()
            rows = [s for s, n in scheduled if s.num_computed_tokens + n >= s.num_tokens]
            for i, s in enumerate(rows):
                if s.request_id == "n3" and s.num_output_tokens == 4:
                    logits[i, 7] = float("nan")
            return logits

        runner.execute = poisoned
        results = await asyncio.gather(*(collect(engine, p, f"n{i}") for i, p in enumerate(PROMPTS)),
                                       return_exceptions=True)
        stats = engine.stats()
        await engine.shutdown()
        return results, stats

    results, stats = asyncio.run(run())
    assert isinstance(results[3], RequestFailedError) and "NaN" in str(results[3])
    assert all(r[-1].finished for i, r in enumerate(results) if i != 3)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_dead_device_fails_every_request_with_engine_dead(tiny_llama_dir):
    from engine.errors import EngineDeadError

    async def run():
        engine = make(tiny_llama_dir, fault_injection={"dead_at_step": 3})
        results = await asyncio.gather(*(collect(engine, p, f"d{i}") for i, p in enumerate(PROMPTS)),
                                       return_exceptions=True)
        with pytest.raises(EngineDeadError):
            await collect(engine, "after", "late")
        dead = engine.is_dead
        await engine.shutdown()
        return results, dead

    results, dead = asyncio.run(run())
    assert dead and all(isinstance(r, EngineDeadError) and r.code == "engine_dead" for r in results)
