"""PREFIX_CACHE_TTL_S scrubs: a cached block whose TTL passed leaves the prefix index and
its K and V bytes are zeroed in every layer, at the next step or, on an idle engine, by
the async loop; blocks still in use or still young keep their bytes."""
import asyncio
import time

import torch

from engine import LLM, AsyncLLMEngine, EngineConfig, SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _cached_blocks(engine) -> list[int]:
    return sorted(engine.scheduler.bm.cached.values())


def _nonzero(engine, ids) -> list[bool]:
    kv = engine.runner.kv_cache
    return [bool(kv[:, :, b].abs().sum() > 0) for b in ids]


def test_expired_blocks_are_zeroed_at_the_next_step(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, block_size=8, num_kv_blocks=64, prefix_cache_ttl_s=0.3)
    eng = llm.engine
    llm.generate([{"prompt_token_ids": list(range(5, 45))}], PARAMS)  # 5 full blocks cached
    old = _cached_blocks(eng)
    assert len(old) >= 4 and all(_nonzero(eng, old))
    time.sleep(0.4)
    llm.generate([{"prompt_token_ids": list(range(100, 110))}], PARAMS)  # one step past the TTL
    reused = set(_cached_blocks(eng)) | {b for b in range(64) if eng.scheduler.bm.blocks[b].ref_count}
    gone = [b for b in old if b not in reused]
    assert gone and not any(_nonzero(eng, gone)), "expired KV still in memory"
    assert not any(eng.scheduler.bm.blocks[b].hash is not None for b in gone)


def test_young_blocks_keep_their_bytes_and_hit(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, block_size=8, num_kv_blocks=64, prefix_cache_ttl_s=60)
    prompt = {"prompt_token_ids": list(range(5, 45))}
    first = llm.generate([prompt], PARAMS)[0]
    assert llm.engine.scrub_expired() == 0
    again = llm.generate([prompt], PARAMS)[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_an_idle_async_engine_scrubs_on_its_own(tiny_llama_dir):
    async def main():
        eng = AsyncLLMEngine.from_config(EngineConfig(model=tiny_llama_dir, block_size=8, num_kv_blocks=64,
                                                      prefix_cache_ttl_s=0.2))
        async for _ in eng.generate({"prompt_token_ids": list(range(5, 45))}, PARAMS, request_id="a"):
            pass
        old = _cached_blocks(eng.engine)
        assert old and all(_nonzero(eng.engine, old))
        await asyncio.sleep(0.6)  # no request: the loop wakes after ttl / 2 and scrubs
        assert not eng.engine.scheduler.bm.cached and not any(_nonzero(eng.engine, old))
        await eng.shutdown()

    asyncio.run(main())


def test_scrub_is_one_index_fill_over_all_layers(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, block_size=8, num_kv_blocks=16)
    runner = llm.engine.runner
    runner.kv_cache.fill_(1.0)
    runner.scrub_kv([3, 7])
    assert all(layer.k_cache.data_ptr() >= runner.kv_cache.data_ptr() for layer in runner.attn_layers)
    for k, v in zip(runner.k_caches, runner.v_caches):  # the layers' caches are views of the one tensor
        assert torch.all(k[[3, 7]] == 0) and torch.all(v[[3, 7]] == 0)
        assert torch.all(k[[0, 4, 15]] == 1) and torch.all(v[[0, 4, 15]] == 1)
