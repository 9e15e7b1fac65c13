"""Logprobs on CUDA: a decode step where some requests ask for logprobs (top-k, and the
sampled token's only) and others not, with logit_bias / allowed_token_ids / bad_words rows
and n=2 choices in the batch, still synchronises with the host exactly once (the wait for its
samples, no implicit synchronisation); prompt_logprobs in a prefill step too."""
import random

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.gpu.conftest import count_syncs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _prompts(n, seed=0):
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(5, 400) for _ in range(rng.randrange(20, 90))]} for _ in range(n)]


def test_one_host_sync_per_decode_step_with_logprobs(qwen2_ckpt):
    eng = LLMEngine(EngineConfig(model=qwen2_ckpt, device="cuda", dtype="bfloat16", num_kv_blocks=512, max_num_seqs=16))
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=5),
              SamplingParams(max_tokens=40, temperature=0.7, top_k=20, seed=1, ignore_eos=True, logprobs=0),
              SamplingParams(max_tokens=40, temperature=0.9, seed=2, ignore_eos=True, logprobs=20,
                             logit_bias={7: 3.0}, min_p=0.05),
              SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, allowed_token_ids=list(range(5, 300))),
              SamplingParams(max_tokens=40, temperature=1.0, seed=4, ignore_eos=True, n=2, logprobs=2)]
    for i, p in enumerate(_prompts(10, seed=3)):
        eng.add_request(f"r{i}", p, params[i % len(params)])
    for _ in range(10):  # prefills done (n=2's second choice joins after the first's), decodes warm up
        eng.step()
    assert all(s.num_computed_tokens >= s.num_prompt_tokens for s in eng.requests.values())
    torch.cuda.synchronize()
    counts, where = [], []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(10):
            n, at, outs = count_syncs(eng.step)
            assert len(outs) == 10
            counts.append(n)
            where += at
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert counts == [(0, 1)] * 10, (counts, sorted(set(where)))


def test_prompt_logprobs_prefill_syncs_once(qwen2_ckpt):
    eng = LLMEngine(EngineConfig(model=qwen2_ckpt, device="cuda", dtype="float32", num_kv_blocks=512, max_num_seqs=8,
                                 enforce_eager=True))
    prompts = _prompts(3, seed=5)
    eng.add_request("a", prompts[0], SamplingParams(max_tokens=4, prompt_logprobs=3))
    eng.add_request("b", prompts[1], SamplingParams(max_tokens=4, logprobs=1))
    eng.add_request("c", prompts[2], SamplingParams(max_tokens=4))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        n, where, outs = count_syncs(eng.step)  # one prefill step of all three
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert n == (0, 1), where
    a = next(o for o in outs if o.request_id == "a")
    assert len(a.prompt_logprobs) == len(prompts[0]["prompt_token_ids"]) and a.prompt_logprobs[0] is None
