"""Tensor parallelism on 2 GPUs (NCCL, rank r on cuda:r): tp=2 gives tp=1's tokens and logprobs (CUDA graphs,
eager, dense, AWQ); sharded linears of real shapes need one GPU. Run: pytest -q tests/gpu/test_tp_gpu.py"""
import os
import random

import pytest
import torch

from tests.gpu.conftest import slow

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on the lent machines

from engine import LLM, SamplingParams  # noqa: E402
from tests import models  # noqa: E402
from tests.engine.test_tensor_parallel import sharded_linears_recombine  # noqa: E402

two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
QWEN25_7B_LINEARS = [  # (in_features, merged output sizes, split): qkv, o, gate_up, down
    (3584, [3584, 512, 512], "column"), (3584, [3584], "row"), (3584, [18944, 18944], "column"), (18944, [3584], "row"),
]
PARAMS = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-gpu")
    dense = models.llama128(str(root / "llama128-v403"), 403)
    return {
        "qwen2": models.make_checkpoint(str(root / "qwen2"), "qwen2", seed=1, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=2),
        "llama": dense,
        "awq": models.round_to_nearest_awq(dense, str(root / "llama128-awq-g64"), 64),
    }


def _prompts(seed: int):
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(5, 400) for _ in range(n)]} for n in (1, 9, 16, 17, 50, 130, 333)]


def _run(path, tp: int, **kw):
    llm = LLM(path, device="cuda", dtype="float32", tensor_parallel_size=tp, max_num_batched_tokens=128, **kw)
    try:
        outs = llm.generate(_prompts(0), PARAMS)
        procs = list(llm.engine.workers.procs) if llm.engine.workers else []
        stats = llm.stats()
    finally:
        llm.engine.close()
    assert all(p.exitcode == 0 for p in procs)
    return outs, stats


@pytest.mark.parametrize("group", [128, None])
@pytest.mark.parametrize("rows", [1, 600, slow(16)])
def test_sharded_linears_of_real_shapes_recombine_on_cuda(group, rows):
    for k, sizes, split in QWEN25_7B_LINEARS:
        err = sharded_linears_recombine("cuda", k, sizes, group, split, rows, bias=split == "column")
        assert err < 1e-3, (k, sizes, split, err)


@two_gpus
@pytest.mark.parametrize("arch", ["qwen2", "llama", "awq"])
@pytest.mark.parametrize("eager", [False, True])
def test_tp2_matches_tp1_on_cuda(ckpts, arch, eager):
    one, _ = _run(ckpts[arch], 1, num_kv_blocks=256, enforce_eager=eager)
    two, stats = _run(ckpts[arch], 2, num_kv_blocks=256, enforce_eager=eager)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    worst = 0.0
    for a, b in zip(one, two, strict=True):
        ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
        assert ta == tb, f"{arch}: prompt of {len(a.prompt_token_ids)} tokens"
        for da, db, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, ta):
            worst = max(worst, abs(da[t].logprob - db[t].logprob))
    assert worst < 2e-3, worst
    print(f"{arch} eager={eager}: tokens equal, worst logprob difference {worst:.2e}")


@two_gpus
def test_tp2_sizes_kv_from_memory_on_every_rank(ckpts):
    """No num_kv_blocks: the activation peak is profiled on both ranks, then graphs are captured."""
    outs, stats = _run(ckpts["qwen2"], 2, gpu_memory_utilization=0.3)
    assert stats["kv_blocks_total"] > 256 and all(o.outputs[0].token_ids for o in outs)
