"""Greedy output with speculation is token-identical to the same requests without it, over the
parity models (Llama, Qwen2, Qwen3, Gemma 3 with sliding windows), block sizes 8 and 16, with
prefix caching, chunked prefill and preemption: drafts from prompt lookup, oracle drafts
(tests/engine/spec_decode/oracle.py) that make every verify path run, and a draft model (the
target itself: nearly every draft accepted; a one-layer random sibling of the same tokenizer:
nearly none).

Where floating-point order differs: a verify step computes k + 1 positions of a request in
one forward, through the prefill attention path (k + 1 query rows over the paged context) and
(k + 1)-row matmuls, where decoding one token a step takes the decode attention path and
1-row matmuls; sums are then taken in another order (float32 on the CPU: differences near
1e-6 of the logits). A token flips only on a near tie of the top two logits; these runs show
none does."""
import random

import pytest

from engine import LLM, SamplingParams
from tests.engine.spec_decode.oracle import use_oracle

MAX_NEW = 24
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": 64}
_REF: dict = {}


def prompts(seed: int, lengths=(3, 17, 40, 90)) -> list[list[int]]:
    """Random prompts that repeat a stretch of themselves (something for prompt lookup to find)."""
    rng = random.Random(seed)
    out = []
    for n in lengths:
        head = [rng.randrange(5, 400) for _ in range(n)]
        out.append(head + head[: n // 2])
    return out


def generate(path, ps, **kwargs):
    llm = LLM(path, **kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"
    llm.engine.scheduler.bm.check_invariants([])
    return [o.outputs[0].token_ids for o in outs], stats


def reference(path, ps, **kwargs):
    key = (path, tuple(map(tuple, ps)), tuple(sorted(kwargs.items())))
    if key not in _REF:
        _REF[key] = generate(path, ps, **kwargs)[0]
    return _REF[key]


@pytest.fixture(params=["llama", "qwen2", "qwen3", "gemma3"])
def ckpt(request):
    return request.getfixturevalue(f"tiny_{request.param}_dir")


@pytest.mark.parametrize("block_size", [8, 16])
def test_ngram_and_oracle_drafts_keep_greedy_output(ckpt, block_size, monkeypatch):
    ps = prompts(block_size)
    kw = dict(block_size=block_size, num_kv_blocks=2048 // block_size)
    ref = reference(ckpt, ps, **kw)
    got, stats = generate(ckpt, ps, speculative_config=NGRAM, **kw)
    assert got == ref
    use_oracle(monkeypatch, {tuple(p): r for p, r in zip(ps, ref)}, 400)
    got, stats = generate(ckpt, ps, speculative_config=NGRAM, **kw)
    assert got == ref
    assert stats["spec_accepted_tokens"] > 0.5 * stats["spec_draft_tokens"] > 0
    assert stats["num_steps"] < 0.6 * MAX_NEW + 4  # several tokens a step


def test_prefix_caching_chunked_prefill_and_preemption(ckpt, monkeypatch):
    ps = prompts(3, lengths=(20, 60, 100, 140))
    ps.append(ps[2][:120] + [7, 8, 9])  # shares cached blocks with the third prompt
    cases = [dict(max_num_batched_tokens=40, num_kv_blocks=256),  # chunked prefill beside verify steps
             dict(num_kv_blocks=20, enable_prefix_caching=True),  # preemption (5 requests do not fit 320 slots)
             dict(num_kv_blocks=20, enable_prefix_caching=False)]
    for kw in cases:
        ref = reference(ckpt, ps, block_size=16, **kw)
        use_oracle(monkeypatch, {tuple(p): r for p, r in zip(ps, ref)}, 400)
        got, stats = generate(ckpt, ps, block_size=16, speculative_config=NGRAM, **kw)
        assert got == ref, kw
        assert stats["spec_accepted_tokens"] > 0
        if kw["num_kv_blocks"] == 20:
            assert stats["num_preemptions"] > 0
        if kw.get("enable_prefix_caching"):
            assert stats["prefix_cache_hit_tokens"] > 0


def draft_configs(ckpt, ckpt_dir, name):
    """draft_model configs: the target drafting for itself, and a one-layer random sibling."""
    from tests import models

    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}[name]
    small = models.make_checkpoint(str(ckpt_dir / f"{name}-draft"), arch, seed=77, num_hidden_layers=1)
    return [{"method": "draft_model", "model": m, "num_speculative_tokens": 4, "disable_by_batch_size": 64}
            for m in (ckpt, small)]


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_a_draft_model_keeps_greedy_output(name, block_size, request, ckpt_dir):
    ckpt = request.getfixturevalue(f"tiny_{name}_dir")
    ps = prompts(block_size)
    kw = dict(block_size=block_size, num_kv_blocks=2048 // block_size)
    ref = reference(ckpt, ps, **kw)
    itself, sibling = draft_configs(ckpt, ckpt_dir, name)
    got, stats = generate(ckpt, ps, speculative_config=itself, **kw)
    assert got == ref
    assert stats["spec_accepted_tokens"] > 0.9 * stats["spec_draft_tokens"] > 0
    assert stats["num_steps"] < 0.4 * MAX_NEW + 4  # about k + 1 tokens a step
    got, stats = generate(ckpt, ps, speculative_config=sibling, **kw)
    assert got == ref and stats["spec_draft_tokens"] > 0


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_a_draft_model_with_prefix_caching_chunked_prefill_and_preemption(name, request, ckpt_dir):
    ckpt = request.getfixturevalue(f"tiny_{name}_dir")
    itself, _ = draft_configs(ckpt, ckpt_dir, name)
    ps = prompts(3, lengths=(20, 60, 100, 140))
    ps.append(ps[2][:120] + [7, 8, 9])  # shares cached blocks with the third prompt
    cases = [dict(max_num_batched_tokens=40, num_kv_blocks=256),  # chunked prefill; the draft's catch-up in chunks
             dict(num_kv_blocks=20, enable_prefix_caching=True),  # preemption: the draft KV recomputed after
             dict(num_kv_blocks=20, enable_prefix_caching=False)]
    for kw in cases:
        ref = reference(ckpt, ps, block_size=16, **kw)
        got, stats = generate(ckpt, ps, block_size=16, speculative_config=itself, **kw)
        assert got == ref, kw
        assert stats["spec_accepted_tokens"] > 0.9 * stats["spec_draft_tokens"] > 0, kw
        if kw["num_kv_blocks"] == 20:
            assert stats["num_preemptions"] > 0
        if kw.get("enable_prefix_caching"):
            assert stats["prefix_cache_hit_tokens"] > 0
