"""Tensor parallelism on the CPU: two gloo ranks give the tokens and logprobs of one rank (Llama,
Qwen2, AWQ, uneven vocab) under batching, chunking, preemption; unsplittable models refused first."""
import dataclasses
import gc
import multiprocessing
import os
import random
import signal

import pytest
import torch
import torch.distributed as dist

from engine import LLM, EngineConfig, SamplingParams
from engine.errors import InvalidInputError, UnsupportedModelError
from engine.parallel.launcher import check_shardable
from engine.parallel.step import StepDecoder, StepEncoder
from engine.quant import AWQ
from engine.sequence import Sequence, SequenceStatus
from tests import models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = dict(block_size=16, num_kv_blocks=24, max_num_batched_tokens=48)  # chunked, and too few blocks for all
PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


def _prompts(seed: int, lengths, prefix: int = 0, vocab: int = 400):
    rng = random.Random(seed)
    shared = [rng.randrange(5, vocab) for _ in range(prefix)]
    return [{"prompt_token_ids": shared + [rng.randrange(5, vocab) for _ in range(n)]} for n in lengths]


@pytest.fixture(scope="module")
def tiny_awq_dir(ckpt_dir):
    src = models.llama128(str(ckpt_dir / "llama128-v403"), 403)
    return models.round_to_nearest_awq(src, str(ckpt_dir / "llama128-v403-awq-g64"), 64)


_LIVE: list = []  # the module's shared tensor-parallel engine (one process group per process)


def _release_shared_engine():
    while _LIVE:
        llm = _LIVE.pop()
        procs = list(llm.engine.workers.procs)
        llm.engine.close()
        assert [p.exitcode for p in procs] == [0]


@pytest.fixture(scope="module", params=["llama", "qwen2", "awq"])
def engines(request):
    """(tensor_parallel_size=1 engine, tensor_parallel_size=2 engine) on one checkpoint, shared by the module."""
    path = request.getfixturevalue(f"tiny_{request.param}_dir")
    one = LLM(path, **CONFIG)
    two = LLM(path, tensor_parallel_size=2, **CONFIG)
    _LIVE.append(two)
    yield one, two
    _release_shared_engine()


def _assert_same(outs_one, outs_two):
    for a, b in zip(outs_one, outs_two, strict=True):
        ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
        assert ta == tb, f"prompt of {len(a.prompt_token_ids)} tokens"
        la = torch.tensor([lp[t].logprob for lp, t in zip(a.outputs[0].logprobs, ta)])
        lb = torch.tensor([lp[t].logprob for lp, t in zip(b.outputs[0].logprobs, tb)])
        torch.testing.assert_close(lb, la, rtol=0, atol=1e-4)
        assert a.num_cached_tokens == b.num_cached_tokens


def test_batch_with_chunked_prefill_and_preemption_matches_tp1(engines):
    one, two = engines
    prompts = _prompts(1, [1, 7, 16, 17, 33, 64, 120, 150])
    before = one.stats()["num_preemptions"], two.stats()["num_preemptions"]
    _assert_same(one.generate(prompts, PARAMS), two.generate(prompts, PARAMS))
    s1, s2 = one.stats(), two.stats()
    assert s2["num_preemptions"] - before[1] == s1["num_preemptions"] - before[0] > 0  # preempted and resumed
    assert s2["kv_blocks_free"] == s2["kv_blocks_total"] == CONFIG["num_kv_blocks"]


def test_prefix_cache_hits_match_tp1(engines):
    one, two = engines
    prompts = _prompts(2, [3, 9, 20, 35], prefix=40)
    for llm in (one, two):
        llm.generate(prompts[:1], PARAMS)  # fills the cache
    outs_one, outs_two = one.generate(prompts, PARAMS), two.generate(prompts, PARAMS)
    _assert_same(outs_one, outs_two)
    assert all(o.num_cached_tokens >= 32 for o in outs_two)


def test_each_rank_holds_its_shard(engines):
    one, two = engines
    spec, m1, m2 = one.engine.spec, one.engine.model, two.engine.model
    attn = m2.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (spec.num_heads // 2, spec.num_kv_heads // 2)
    assert m2.spec.num_kv_heads == spec.num_kv_heads // 2 and m2.spec.num_layers == spec.num_layers
    k_cache = two.engine.runner.k_caches[0]
    assert k_cache.shape[2] == spec.num_kv_heads // 2 and k_cache.shape[0] == CONFIG["num_kv_blocks"]
    assert m2.embed_tokens.weight.shape[0] == -(-spec.vocab_size // 2)
    mlp1, mlp2 = m1.layers[0].mlp, m2.layers[0].mlp
    assert mlp2.down_proj.in_features * 2 == mlp1.down_proj.in_features
    assert sum(mlp2.gate_up_proj.output_sizes) * 2 == sum(mlp1.gate_up_proj.output_sizes)


def test_tp1_needs_no_process_group(tiny_llama_dir, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a collective at tensor_parallel_size=1")

    monkeypatch.setattr(dist, "all_reduce", refuse)
    monkeypatch.setattr(dist, "all_gather", refuse)
    llm = LLM(tiny_llama_dir, num_kv_blocks=16)
    assert llm.engine.workers is None
    assert llm.generate(_prompts(3, [20]), PARAMS)[0].outputs[0].token_ids


def test_models_that_do_not_split_are_refused_before_any_process(tiny_mistral_dir, tiny_llama_dir):
    _release_shared_engine()
    children = set(multiprocessing.active_children())
    with pytest.raises(UnsupportedModelError, match="num_key_value_heads=1") as info:
        LLM(tiny_mistral_dir, tensor_parallel_size=2, num_kv_blocks=8)  # MQA: one KV head
    assert info.value.code == "model_load_failed"
    with pytest.raises(UnsupportedModelError, match="num_attention_heads=4"):
        LLM(tiny_llama_dir, tensor_parallel_size=3, num_kv_blocks=8)
    assert set(multiprocessing.active_children()) == children and not dist.is_initialized()


def test_awq_row_split_needs_whole_groups(tiny_awq_dir):
    from engine.model import loader

    spec = loader.read_model_spec(tiny_awq_dir)
    check_shardable(spec, 2)  # groups of 64: o_proj's 128 inputs are one group per rank
    with pytest.raises(UnsupportedModelError, match="o_proj input features=128 .*whole AWQ groups of 128"):
        check_shardable(dataclasses.replace(spec, quant=AWQ(128)), 2)
    # o_proj kept dense: down_proj's 256 inputs still make one group of 128 per rank
    check_shardable(dataclasses.replace(spec, quant=AWQ(128, skip=("o_proj",))), 2)
    with pytest.raises(UnsupportedModelError, match="down_proj input features=256"):
        check_shardable(dataclasses.replace(spec, quant=AWQ(128, skip=("o_proj",)), num_kv_heads=4), 4)


def test_workers_exit_on_close_and_on_collection_and_a_lost_rank_fails_the_step(tiny_llama_dir):
    _release_shared_engine()
    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, num_kv_blocks=8)
    (proc,) = llm.engine.workers.procs
    assert proc.is_alive() and dist.is_initialized()
    llm.engine.close()
    llm.engine.close()  # idempotent
    assert proc.exitcode == 0 and not dist.is_initialized()

    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, num_kv_blocks=8)  # the group forms again
    (proc,) = llm.engine.workers.procs
    del llm
    gc.collect()
    proc.join(timeout=15)
    assert proc.exitcode == 0 and not dist.is_initialized()

    llm = LLM(tiny_llama_dir, tensor_parallel_size=2, num_kv_blocks=8)
    (proc,) = llm.engine.workers.procs
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=15)
    with pytest.raises(RuntimeError, match="rank 1 exited"):
        llm.generate(_prompts(4, [5]), PARAMS)
    llm.engine.close()
    assert not dist.is_initialized()


def test_a_script_without_main_guard_exits_leaving_no_worker(tiny_llama_dir, tmp_path):
    """Spawned ranks do not re-run the parent's __main__; at exit, never closed, the engine stops them."""
    import subprocess
    import sys
    import time

    script = tmp_path / "no_guard.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {ROOT!r})\n"
        "from engine import LLM, SamplingParams\n"
        f"llm = LLM({tiny_llama_dir!r}, tensor_parallel_size=2, num_kv_blocks=8)\n"
        "out = llm.generate({'prompt_token_ids': [5, 6, 7]}, SamplingParams(max_tokens=3, temperature=0))\n"
        "print('pid', llm.engine.workers.procs[0].pid, len(out[0].outputs[0].token_ids), flush=True)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    pid, n = (int(v) for v in run.stdout.split("pid ")[1].split())
    assert n == 3
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {pid} outlived the engine process")


def sharded_linears_recombine(device: str, in_features: int, sizes: list[int], group: int | None, split: str,
                              rows: int, bias: bool = True) -> float:
    """Both ranks' shards of one linear (dense, or AWQ when group is set) built from the same
    checkpoint tensors, run on their part of the input; the outputs put back together (column:
    side by side per merged shard; row: summed, as the all-reduce does) against the whole layer.
    Returns the largest difference relative to the output's scale."""
    from engine.distributed import SINGLE, TPGroup
    from engine.model.layers import Linear

    g = torch.Generator().manual_seed(sum(sizes) + in_features)
    K = in_features
    tensors = []
    for n in sizes:
        t = {"bias": torch.randn(n, generator=g)} if bias else {}
        if group:
            t["qweight"] = torch.randint(-(2**31), 2**31 - 1, (K, n // 8), generator=g, dtype=torch.int32)
            t["qzeros"] = torch.randint(-(2**31), 2**31 - 1, (K // group, n // 8), generator=g, dtype=torch.int32)
            t["scales"] = torch.rand(K // group, n, generator=g) * 0.01 + 0.001
        else:
            t["weight"] = torch.randn(n, K, generator=g) * K**-0.5
        tensors.append(t)

    def build(tp, split):
        lin = Linear(K, sizes, bias, torch.float32, device, tp, split, method=AWQ(group) if group else None)
        for shard, t in enumerate(tensors):
            for name, value in t.items():
                lin.load(shard, name, value)
        lin.finalize()
        return lin

    x = torch.randn(rows, K, generator=g).to(device)
    whole = build(SINGLE, None)(x)
    ranks = [TPGroup(r, 2) for r in range(2)]
    if split == "column":
        outs = [build(tp, "column")(x).split([n // 2 for n in sizes], dim=-1) for tp in ranks]
        got = torch.cat([torch.cat([o[i] for o in outs], dim=-1) for i in range(len(sizes))], dim=-1)
    else:
        parts = x.chunk(2, dim=-1)
        original = TPGroup.all_reduce
        TPGroup.all_reduce = lambda self, y: y  # each rank's partial sum, bias added once per rank
        try:
            got = sum(build(tp, "row")(p) for tp, p in zip(ranks, parts))
        finally:
            TPGroup.all_reduce = original
        if bias:
            got = got - tensors[0]["bias"].to(device)  # each rank added it; after an all-reduce it counts once
    return float((got - whole).abs().max() / whole.abs().max())


@pytest.mark.parametrize("group", [None, 64])
@pytest.mark.parametrize("split,sizes", [("column", [128, 64, 64]), ("row", [96])])
def test_sharded_linears_recombine_to_the_whole_layer(group, split, sizes):
    assert sharded_linears_recombine("cpu", 256, sizes, group, split, rows=5) < 1e-5


def test_step_encoding_sends_only_differences():
    enc, dec = StepEncoder(), StepDecoder()
    a = Sequence("a", None, [1, 2, 3, 4, 5], SamplingParams(), 4)
    a.block_table = [7]

    def roundtrip(scheduled):
        items, gone = enc.encode(scheduled)
        mirrored = dec.decode(items, gone)
        for (seq, n), (m, mn) in zip(scheduled, mirrored, strict=True):
            assert (m.token_ids, m.block_table, m.num_computed_tokens, m.num_tokens, mn) == \
                   (seq.token_ids, seq.block_table, seq.num_computed_tokens, seq.num_tokens, n)
        return items

    assert roundtrip([(a, 3)])[0][4] == [1, 2, 3, 4, 5]  # a new request: all its tokens
    a.num_computed_tokens = 3
    a.token_ids.append(9)
    a.block_table.append(8)
    (item,) = roundtrip([(a, 3)])
    assert item[4] == [9] and item[5:] == (1, [8])  # one new token, one new block
    a.block_table, a.num_computed_tokens = [3, 4], 0  # preempted and readmitted: a new table
    assert roundtrip([(a, 6)])[0][5:] == (0, [3, 4])
    a.block_table.append(2)
    assert roundtrip([(a, 6)])[0][5:] == (2, [2])
    a.block_table[:] = [3, 5, 6]  # the same list refilled after a preemption
    a.num_preemptions += 1
    assert roundtrip([(a, 6)])[0][5:] == (0, [3, 5, 6])
    a.status = SequenceStatus.FINISHED
    b = Sequence("a", None, [6, 6], SamplingParams(), 2)  # a new request reusing the id
    b.block_table = [5]
    (item,) = roundtrip([(b, 2)])
    assert item[1] is True and item[4] == [6, 6]
    b.status = SequenceStatus.FINISHED
    assert enc.encode([]) == ([], ["a"]) and not enc.sent


def test_tensor_parallel_size_setting_reaches_the_engine_config():
    from handler.engine_setup import check_engine_settings, engine_config
    from handler.settings import SettingsError, load_settings

    assert engine_config(load_settings({"TENSOR_PARALLEL_SIZE": "2"}), "m").tensor_parallel_size == 2
    assert engine_config(load_settings({}), "m").tensor_parallel_size == 1
    with pytest.raises(SettingsError, match="^TENSOR_PARALLEL_SIZE='0'"):
        load_settings({"TENSOR_PARALLEL_SIZE": "0"})
    check_engine_settings(load_settings({"TENSOR_PARALLEL_SIZE": "4"}))
    with pytest.raises(InvalidInputError, match="tensor_parallel_size"):
        EngineConfig(model="m", tensor_parallel_size=0)
