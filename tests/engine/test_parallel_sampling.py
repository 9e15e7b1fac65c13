"""n > 1 and best_of: the prompt prefilled once (the other choices hit its blocks in the
prefix cache), choice i sampling from seed + i (reproducible), outputs indexed, aborts and
failures covering every choice."""
import asyncio

import pytest

from engine import LLM, AsyncLLMEngine, EngineConfig, SamplingParams

PROMPT = {"prompt_token_ids": list(range(5, 5 + 40))}  # 2 full blocks of 16 and 8 tokens


@pytest.fixture()
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=128, block_size=16)


def test_n_choices_share_one_prefill_and_are_indexed(llm):
    out = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=11, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    assert all(len(c.token_ids) == 6 for c in out.outputs)
    stats = llm.engine.stats()
    # choices 1 and 2 found the 2 full prompt blocks of choice 0: 2 * 32 of 3 * 40 prompt tokens
    assert stats["prefix_cache_hit_tokens"] == 64 and stats["prefix_cache_query_tokens"] == 120
    assert out.num_cached_tokens == 0 and len(out.prompt_token_ids) == 40
    assert not llm.engine.parents and not llm.engine.requests
    llm.engine.scheduler.bm.check_invariants([])


def test_n_seeds_are_seed_plus_index_and_reproducible(llm):
    params = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    a = llm.generate([PROMPT], params)[0]
    b = llm.generate([PROMPT], params)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert a.outputs[0].token_ids != a.outputs[1].token_ids
    for i in (0, 1):  # choice i is the single request seeded with seed + i
        single = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=5 + i, ignore_eos=True))
        assert single[0].outputs[0].token_ids == a.outputs[i].token_ids


def test_best_of_keeps_the_most_likely(llm):
    params = SamplingParams(n=2, best_of=4, max_tokens=8, temperature=1.0, seed=1, ignore_eos=True)
    out = llm.generate([PROMPT], params)[0]
    assert [c.index for c in out.outputs] == [0, 1]
    every = llm.generate([PROMPT], SamplingParams(n=4, max_tokens=8, temperature=1.0, seed=1, ignore_eos=True))[0]
    best = sorted(every.outputs, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in best]


def test_async_n_streams_every_choice_and_abort_stops_all(tiny_llama_dir):
    async def run():
        engine = AsyncLLMEngine.from_config(EngineConfig(model=tiny_llama_dir, num_kv_blocks=128))
        seen = []
        params = SamplingParams(n=2, max_tokens=5, temperature=0.8, seed=2, ignore_eos=True)
        async for out in engine.generate(PROMPT, params, request_id="r"):
            seen.append([len(c.token_ids) for c in out.outputs])
        gen = engine.generate(PROMPT, SamplingParams(n=3, max_tokens=500, ignore_eos=True), request_id="long")
        await gen.__anext__()
        await gen.aclose()  # the consumer gone: every choice aborted
        for _ in range(50):
            if not engine.engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        state = (engine.engine.requests, engine.engine.parents, engine.stats()["kv_blocks_free"])
        await engine.shutdown()
        return seen, state

    seen, (requests, parents, free) = asyncio.run(run())
    assert seen[-1] == [5, 5] and all(len(s) == 2 for s in seen)
    assert not requests and not parents and free == 128
