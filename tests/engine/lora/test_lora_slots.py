"""Adapters in a fixed number of device slots: more adapters than slots wait and evict the least
recently used idle one, never one in use; the CPU cache keeps max_cpu_loras; prefix caching never
shares KV blocks between adapters (or with the base model)."""
import random

import torch

from engine import LLM, LoRARequest, SamplingParams
from engine.lora.manager import LoRAManager
from tests import lora_adapters


def test_more_adapters_than_slots_wait_their_turn_and_match(tiny_llama_dir, adapters):
    rng = random.Random(1)
    names = ["all", "attn", "mlp"] * 2
    ps = [[rng.randrange(5, 400) for _ in range(rng.randrange(3, 40))] for _ in names]
    loras = {name: LoRARequest(name, i + 1, adapters[name]) for i, name in enumerate(["all", "attn", "mlp"])}
    params = SamplingParams(max_tokens=8, temperature=0)
    llm = LLM(tiny_llama_dir, enable_lora=True, max_loras=1, max_cpu_loras=2, max_lora_rank=8, num_kv_blocks=256)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, lora_request=[loras[n] for n in names])
    for p, name, out in zip(ps, names, outs):
        assert out.outputs[0].token_ids == lora_adapters.peft_greedy(tiny_llama_dir, adapters[name], p, 8), name
    stats = llm.engine.stats()
    assert stats["lora_slots_total"] == 1 and stats["lora_evictions"] >= 2
    assert stats["lora_adapters_cached"] <= 2  # max_cpu_loras once no request needs the others
    assert llm.engine.lora.refs == [0]


def _manager(tiny_llama_dir, max_loras, max_cpu):
    llm = LLM(tiny_llama_dir, num_kv_blocks=16)
    return LoRAManager(llm.engine.model, max_loras, 8, max_cpu, torch.float32, "cpu")


def test_an_adapter_in_use_keeps_its_slot(tiny_llama_dir, adapters):
    m = _manager(tiny_llama_dir, max_loras=1, max_cpu=3)
    a, b = LoRARequest("all", 1, adapters["all"]), LoRARequest("attn", 2, adapters["attn"])
    m.add(a), m.add(b)
    slot = m.acquire(1)
    assert slot == 0 and m.acquire(1) == 0  # a second sequence of the same adapter shares it
    assert not m.can_acquire(2) and m.acquire(2) is None  # in use: b waits
    m.release(0)
    assert m.acquire(2) is None  # still one user of a
    m.release(0)
    assert m.acquire(2) == 0 and m.evictions == 1
    weights = next(iter(m.slots.weights.values()))
    assert weights.a[0].abs().sum() > 0  # b's weights are in the slot now


def test_cpu_cache_drops_the_least_recently_used_adapter_no_request_needs(tiny_llama_dir, adapters):
    m = _manager(tiny_llama_dir, max_loras=1, max_cpu=1)
    a, b, c = (LoRARequest(n, i + 1, adapters[n]) for i, n in enumerate(["all", "attn", "mlp"]))
    m.add(a), m.add(b)
    assert set(m.cpu) == {1, 2}  # both are needed by queued requests: kept past max_cpu_loras
    m.remove(a)
    assert set(m.cpu) == {2}
    m.remove(b)
    m.add(c)
    assert set(m.cpu) == {3} and m.loads == 3


def test_prefix_cache_is_keyed_by_adapter(tiny_llama_dir, adapters):
    prompt = {"prompt_token_ids": [random.Random(2).randrange(5, 400) for _ in range(70)]}
    params = SamplingParams(max_tokens=6, temperature=0)
    llm = LLM(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=256, block_size=16)
    a, b = LoRARequest("all", 1, adapters["all"]), LoRARequest("attn", 2, adapters["attn"])
    hits = []
    outs = []
    for lora in (a, b, None, a, b, None):
        outs.append(llm.generate([prompt], params, lora_request=lora)[0].outputs[0].token_ids)
        hits.append(llm.engine.stats()["prefix_cache_hit_tokens"])
    assert hits[:3] == [0, 0, 0], "a prompt reused another adapter's (or the base model's) KV blocks"
    assert hits[3] > hits[2] and hits[4] > hits[3] and hits[5] > hits[4]  # each its own blocks again
    assert outs[:3] == outs[3:]
    assert outs[0] == lora_adapters.peft_greedy(tiny_llama_dir, adapters["all"], prompt["prompt_token_ids"], 6)


def test_merged_linears_hold_each_slice_at_its_own_rank(tiny_llama_dir, adapters):
    """q/k/v and gate/up: A stacks a rank-R block per output slice, B holds R columns (not the
    slices times R of a block diagonal: its zeros would double gate_up's bytes and triple
    qkv's); an adapter's pair of each shard lands in its own slice's rows."""
    m = _manager(tiny_llama_dir, max_loras=2, max_cpu=2)
    R = m.slots.max_rank
    merged = set()
    for name, w in m.slots.weights.items():
        linear = m.slots.linears[name]
        n = len(linear.output_sizes)
        assert w.output_slices == tuple(linear.output_sizes)
        assert tuple(w.a.shape) == (2, n * R, linear.in_features)
        assert tuple(w.b.shape) == (2, sum(linear.output_sizes), R)
        if n > 1:
            merged.add(name.rpartition(".")[2])
    assert merged == {"qkv_proj", "gate_up_proj"}
    m.add(LoRARequest("all", 1, adapters["all"]))
    slot = m.acquire(1)
    adapter = m.cpu[1]
    for (name, shard), (a, b) in adapter.pairs.items():
        w, linear = m.slots.weights[name], m.slots.linears[name]
        r, off = a.shape[0], linear.shard_offset(shard)
        assert torch.equal(w.a[slot, shard * R : shard * R + r], a.to(w.a.dtype))
        assert torch.equal(w.b[slot, off : off + linear.output_sizes[shard], :r], b.to(w.b.dtype))
