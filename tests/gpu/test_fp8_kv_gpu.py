"""The FP8 KV cache on CUDA: the write kernel stores exactly the reference's bytes, the
decode and prefill kernels read FP8 (bf16 queries) as the reference does, and the engine
(CUDA graphs, float32 compute) keeps greedy parity with transformers reading K and V
through the same FP8 rounding."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from llm_kernels.attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_prefill_attention,
    paged_prefill_attention_reference,
)
from llm_kernels.kv_cache import write_kv_cache, write_kv_cache_reference
from tests.engine.test_fp8_kv import MAX_NEW, assert_parity, hf_fp8_greedy
from tests.gpu.conftest import cases

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("cache_dtype,dtype", cases([(FP8[0], torch.bfloat16), (FP8[1], torch.float16)],
                                                    [(c, d) for c in FP8 for d in (torch.bfloat16, torch.float16,
                                                                                    torch.float32)]))
def test_write_kernel_stores_the_reference_bytes(cache_dtype, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    T, H, D, bs, nb = 300, 4, 128, 16, 32
    key = (torch.randn(T, H, D, device="cuda", generator=g) * 40).to(dtype)
    value = (torch.randn(T, H, D, device="cuda", generator=g) * 0.01).to(dtype)
    slots = torch.randperm(nb * bs, device="cuda", generator=g)[:T]
    slots[::7] = -1
    caches = [torch.zeros(nb, bs, H, D, dtype=cache_dtype, device="cuda") for _ in range(4)]
    write_kv_cache(key, value, caches[0], caches[1], slots, 0.125, 0.001)
    write_kv_cache_reference(key, value, caches[2], caches[3], slots, 0.125, 0.001)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))


@pytest.mark.parametrize("cache_dtype,window", cases([(FP8[0], None), (FP8[1], 100)],
                                                     [(c, w) for c in FP8 for w in (None, 100)]))
def test_fp8_decode_and_prefill_match_reference(cache_dtype, window):
    g = torch.Generator(device="cuda").manual_seed(1)
    hq, hkv, d, bs = 28, 4, 128, 16
    ks, vs = 0.02, 0.5
    seqs = [(300, 0), (17, 500), (1, 900), (64, 64)]  # (new, cached)
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32, device="cuda")
    max_blocks = int(-(-int(lens.max()) // bs))
    nb = len(seqs) * max_blocks + 1
    kc = (torch.randn(nb, bs, hkv, d, device="cuda", generator=g) / ks).to(cache_dtype)
    vc = (torch.randn(nb, bs, hkv, d, device="cuda", generator=g) / vs).to(cache_dtype)
    tables = torch.randperm(nb, device="cuda", generator=g)[: len(seqs) * max_blocks].view(len(seqs), -1).int()
    opts = dict(sliding_window=window, k_scale=ks, v_scale=vs)
    qd = torch.randn(len(seqs), hq, d, device="cuda", generator=g).bfloat16()
    ref = paged_decode_attention_reference(qd, kc, vc, tables, lens, d**-0.5, **opts)
    out = paged_decode_attention(qd, kc, vc, tables, lens, d**-0.5, **opts)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    n_new = torch.tensor([n for n, _ in seqs], device="cuda")
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32, device="cuda")
    qsl[1:] = n_new.cumsum(0)
    qp = torch.randn(int(n_new.sum()), hq, d, device="cuda", generator=g).bfloat16()
    ref = paged_prefill_attention_reference(qp, kc, vc, tables, qsl, lens, d**-0.5, **opts)
    out = paged_prefill_attention(qp, kc, vc, tables, qsl, lens, d**-0.5, **opts)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_engine_fp8_cache_on_cuda_matches_transformers_reading_fp8(tiny_llama_dir):
    rng = random.Random(5)
    prompts = [[rng.randrange(5, 400) for _ in range(n)] for n in (1, 16, 33, 120)]
    llm = LLM(tiny_llama_dir, device="cuda", dtype="float32", block_size=16, kv_cache_dtype="fp8", max_num_seqs=8,
              num_kv_blocks=256)  # a few decode graphs: the cache's path in graphs, not a ladder of compiles
    assert llm.engine.runner.kv_cache.dtype == torch.float8_e4m3fn and llm.engine.runner.graphs is not None
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    for prompt, out in zip(prompts, outs):
        want, gaps = hf_fp8_greedy(tiny_llama_dir, prompt, 1.0, 1.0)
        assert_parity(out.outputs[0].token_ids, want, gaps, f"cuda fp8, prompt of {len(prompt)}")
