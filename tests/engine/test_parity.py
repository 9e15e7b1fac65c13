"""Greedy parity with transformers in float32 on the CPU: many prompts of
lengths 1..200 submitted together must give the token ids HF `generate`
gives on each prompt alone, across block sizes, prefix caching, chunked
prefill and preemption."""
import random

import pytest

from engine import LLM, SamplingParams
from tests import models

LENGTHS = [1, 2, 7, 15, 16, 17, 33, 64, 120, 200]
MAX_NEW = 12
_REF: dict = {}


def random_prompts(seed: int, vocab: int, lengths=LENGTHS, shared_prefix: int = 0):
    rng = random.Random(seed)
    prefix = [rng.randrange(5, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(5, vocab) for _ in range(n)] for n in lengths]


def reference(path, prompt):
    key = (path, tuple(prompt))
    if key not in _REF:
        _REF[key] = models.hf_greedy(path, prompt, MAX_NEW)
    return _REF[key]


def run_engine(path, prompts, **kwargs):
    llm = LLM(path, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked after all requests ended"
    assert stats["num_running"] == stats["num_waiting"] == 0
    return [o.outputs[0].token_ids for o in outs], stats


def check_greedy_parity(path, block_size):
    """Prompts of LENGTHS tokens submitted together, KV blocks of block_size: each gives the
    tokens HF `generate` gives it alone. Shared by the parity tests of other architectures."""
    prompts = random_prompts(block_size, 400)
    got, _ = run_engine(path, prompts, block_size=block_size, num_kv_blocks=2048 // block_size)
    for prompt, tokens in zip(prompts, got):
        assert tokens == reference(path, prompt), f"prompt of {len(prompt)} tokens"


@pytest.fixture(params=["llama", "qwen2", "mistral", "mistral_sw", "qwen2_sw", "qwen3", "phi3", "gemma3", "gemma2"])
def ckpt(request):
    return request.getfixturevalue(f"tiny_{request.param}_dir")


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_matches_transformers(ckpt, block_size):
    check_greedy_parity(ckpt, block_size)


@pytest.mark.parametrize("block_size", [8, 16])
def test_prefix_caching_hits_and_matches(ckpt, block_size):
    prompts = random_prompts(100 + block_size, 400, lengths=[1, 5, 20, 40, 77], shared_prefix=50)
    llm = LLM(ckpt, block_size=block_size, num_kv_blocks=4096 // block_size)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)  # fills the cache
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    stats = llm.stats()
    # longrope (phi3): a prompt past the switch is rotated with the long factors, so it
    # shares no cached KV with the shorter first prompt
    switch = llm.engine.scheduler.rope_switch
    side = [switch is not None and len(p) > switch for p in prompts]
    same_side = sum(s == side[0] for s in side)
    assert stats["prefix_cache_hit_tokens"] >= same_side * (50 // block_size) * block_size
    assert outs[0].num_cached_tokens > 0
    assert first[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == reference(ckpt, prompt)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_chunked_prefill_matches(ckpt):
    prompts = random_prompts(7, 400)
    got, stats = run_engine(ckpt, prompts, block_size=16, num_kv_blocks=256, max_num_batched_tokens=40)
    for prompt, tokens in zip(prompts, got):
        assert tokens == reference(ckpt, prompt)
    assert stats["num_steps"] > sum(LENGTHS) // 40  # prompts really were split


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_matches(ckpt, caching):
    prompts = random_prompts(11, 400)
    # 14 blocks of 16 = 224 tokens: the longest request (212) fits alone, all together do not
    got, stats = run_engine(ckpt, prompts, block_size=16, num_kv_blocks=14, enable_prefix_caching=caching)
    assert stats["num_preemptions"] > 0
    for prompt, tokens in zip(prompts, got):
        assert tokens == reference(ckpt, prompt)
