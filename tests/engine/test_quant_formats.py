"""GPTQ, compressed-tensors and FP8 checkpoints: greedy parity with transformers in
float32 on the CPU (batched, block sizes 8/16/32), the repacked AWQ-kernel path
against the dense one, and the formats' packing against known words."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model.layers import Linear
from llm_kernels.w4a16 import weight as w4a16_weight
from llm_kernels.w4a16.ct_format import ct_unpack
from llm_kernels.w4a16.select import CHECKPOINT
from llm_kernels.w4a16.gptq_format import int4_to_awq, pack_cols, pack_rows, unpack_cols, unpack_rows
from tests.quant_models import ct_pack
from tests import models, quant_models

MAX_NEW = 8
LENGTHS = [1, 3, 16, 17, 40, 77]
NEAR_TIE = 1e-3  # a divergence is accepted only where the reference's top two log-probs are this close


def test_gptq_packing_is_autogptqs():
    """Row k of a group of 8 lives at bits 4k of its int32 (qweight along K, qzeros along N)."""
    vals = torch.arange(1, 9, dtype=torch.int32).reshape(8, 1)
    word = 0x87654321 - 2**32  # as int32
    assert pack_rows(vals, 4).item() == word and pack_cols(vals.t(), 4).item() == word
    assert pack_rows(torch.tensor([[1], [2], [3], [255]]), 8).item() == int.from_bytes(bytes([1, 2, 3, 255]), "little") - 2**32
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (64, 24), generator=g)
    assert torch.equal(unpack_rows(pack_rows(q, 4), 4), q.int()) and torch.equal(unpack_cols(pack_cols(q, 4), 4), q.int())


def test_ct_packing_matches_compressed_tensors():
    ct = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    g = torch.Generator().manual_seed(1)
    for bits in (4, 8):
        signed = torch.randint(-(1 << bits - 1), 1 << bits - 1, (48, 64), generator=g).to(torch.int8)
        packed = ct.pack_to_int32(signed, bits)
        assert torch.equal(ct_pack(signed.int() + (1 << bits - 1), bits), packed)
        assert torch.equal(ct_unpack(packed, bits, 64), signed.int().t() + (1 << bits - 1))


def test_act_order_repack_is_the_same_product():
    """A shuffled g_idx: x[:, perm] @ W_awq equals x @ W on the checkpoint's own rows."""
    from llm_kernels import awq_dequantize

    g = torch.Generator().manual_seed(2)
    K, N, G = 128, 32, 32
    g_idx = torch.empty(K, dtype=torch.long)
    g_idx[torch.randperm(K, generator=g)] = torch.arange(K) // G
    q, z = torch.randint(0, 16, (K, N), generator=g), torch.randint(0, 16, (K // G, N), generator=g)
    s = torch.rand(K // G, N, generator=g)
    w = (q - z[g_idx]).float() * s[g_idx]
    qweight, qzeros, scales, kg, perm = int4_to_awq(q, z, s, g_idx, G)
    x = torch.randn(3, K, generator=g)
    torch.testing.assert_close(x[:, perm] @ awq_dequantize(qweight, qzeros, scales, kg, torch.float32), x @ w)


def _prompts(seed: int):
    rng = random.Random(seed)
    return [[rng.randrange(5, 400) for _ in range(n)] for n in LENGTHS]


def _check(ref_path: str, prompt: list[int], got: list[int]) -> None:
    """got equals transformers' greedy tokens, or leaves them only where the reference
    itself is at a near-tie (and then takes its runner-up)."""
    want = models.hf_greedy(ref_path, prompt, MAX_NEW)
    if got == want:
        return
    i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    with torch.no_grad():
        lp = models._hf_model(ref_path)(torch.tensor([prompt + want[:i]])).logits[0, -1].log_softmax(-1)
    top = lp.topk(2)
    assert top.values[0] - top.values[1] < NEAR_TIE and got[i] == top.indices[1], (
        f"prompt of {len(prompt)}: ours {got}, transformers {want} (diverge at {i}, margin "
        f"{float(top.values[0] - top.values[1]):.2e})")


def _parity(path: str, ref_path: str, block_size: int) -> LLM:
    prompts = _prompts(block_size)
    llm = LLM(path, block_size=block_size, num_kv_blocks=1024 // block_size)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    for p, o in zip(prompts, outs):
        _check(ref_path, p, o.outputs[0].token_ids)
    return llm


@pytest.fixture(scope="session")
def base128(ckpt_dir):
    return models.make_checkpoint(str(ckpt_dir / "llama128q"), "llama", seed=5, hidden_size=128,
                                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


GPTQ_VARIANTS = {  # bits, group, sym, desc_act, checkpoint_format, q/k/v share their act order
    "4b-g128-sym": (4, 128, True, False, "gptq", True),
    "4b-g64-asym-act": (4, 64, False, True, "gptq", True),
    "4b-g32-sym-act-own-orders-v2": (4, 32, True, True, "gptq_v2", False),
    "4b-channel-asym-v2": (4, -1, False, False, "gptq_v2", True),
    "8b-g64-asym-act": (8, 64, False, True, "gptq", True),
    "8b-channel-sym-v2": (8, -1, True, False, "gptq_v2", True),
}


@pytest.fixture(scope="session", params=list(GPTQ_VARIANTS))
def gptq_pair(request, base128, ckpt_dir):
    bits, group, sym, act, fmt, shared = GPTQ_VARIANTS[request.param]
    return quant_models.gptq_checkpoint(base128, str(ckpt_dir / f"gptq-{request.param}"), bits, group, sym, act, fmt,
                                        shared, seed=len(request.param))


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_gptq_greedy_matches_transformers(gptq_pair, block_size):
    path, ref = gptq_pair
    llm = _parity(path, ref, block_size)
    assert llm.engine.spec.quant.name == "gptq"


def test_gptq_kernel_path_equals_dense_path(gptq_pair, monkeypatch):
    """The CPU keeps a dequantized copy of the repacked weight; the repacked tensors held in
    the checkpoint layout (act-order gather included) compute the same logits."""
    path, _ = gptq_pair
    prompt = {"prompt_token_ids": list(range(5, 40))}
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=3, ignore_eos=True)
    dense = LLM(path, num_kv_blocks=64, block_size=16).generate([prompt], params)[0].outputs[0]
    monkeypatch.setattr(w4a16_weight, "default_layout", lambda *a: CHECKPOINT)
    llm = LLM(path, num_kv_blocks=64, block_size=16)
    lins = [m for m in llm.engine.model.modules() if isinstance(m, Linear) and hasattr(m, "parts")]
    assert lins and all(p.w4a16.layout == CHECKPOINT for lin in lins for p in lin.parts if p.dense is None)
    gemm = llm.generate([prompt], params)[0].outputs[0]
    assert gemm.token_ids == dense.token_ids
    for a, b in zip(gemm.logprobs, dense.logprobs):
        assert a.keys() == b.keys() and all(abs(a[k].logprob - b[k].logprob) < 1e-4 for k in a)


def test_gptq_act_order_merges_shards_that_share_an_order(ckpt_dir, base128):
    shared, _ = quant_models.gptq_checkpoint(base128, str(ckpt_dir / "gptq-4b-g64-asym-act"), 4, 64, False, True)
    own, _ = quant_models.gptq_checkpoint(base128, str(ckpt_dir / "gptq-4b-g32-sym-act-own-orders-v2"), 4, 32, True,
                                          True, "gptq_v2", False)
    attn = LLM(shared, num_kv_blocks=8).engine.model.layers[0].self_attn.qkv_proj
    assert len(attn.parts) == 1 and attn.parts[0].perm is not None
    assert len(LLM(own, num_kv_blocks=8).engine.model.layers[0].self_attn.qkv_proj.parts) == 3


CT_SCHEMES = {"w4a16-g128": "W4A16", "w4a16-g64": "W4A16:64", "w4a16-asym-g32": "W4A16_ASYM:32",
              "w8a16-channel": "W8A16", "fp8-dynamic": "FP8_DYNAMIC"}


@pytest.fixture(scope="session")
def llmc_dirs(base128, ckpt_dir):
    pytest.importorskip("compressed_tensors", reason="the compressed-tensors package is transformers' reference")
    dirs = {k: str(ckpt_dir / f"ct-{k}") for k in CT_SCHEMES}
    try:
        quant_models.llmc_quantize(base128, {dirs[k]: CT_SCHEMES[k] for k in CT_SCHEMES})
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"llm-compressor is not available here: {exc}")
    return dirs


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("scheme", list(CT_SCHEMES))
def test_compressed_tensors_greedy_matches_transformers(llmc_dirs, base128, scheme, block_size):
    """llm-compressor's own checkpoints against transformers + compressed-tensors on the
    same folder (asymmetric: transformers 5.24 cannot load its zero points, so the
    reference runs compressed-tensors' own decompression of the weights)."""
    path = llmc_dirs[scheme]
    ref = quant_models.ct_decompressed_reference(path, base128) if "asym" in scheme else path
    llm = _parity(path, ref, block_size)
    assert llm.engine.spec.quant.name == "compressed-tensors"


def _fp8_group_qdq(x: torch.Tensor, group: int = 128) -> torch.Tensor:
    """The reference's activations: e4m3 per token and group, dynamic scales amax / 448."""
    v = x.unflatten(-1, (x.shape[-1] // group, group))
    s = v.abs().amax(-1, keepdim=True) / 448
    s = torch.where(s == 0, torch.finfo(s.dtype).eps, s)
    return ((v / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype) * s).flatten(-2)


@pytest.fixture(scope="session")
def fp8_block_pair(base128, ckpt_dir):
    """A quant_method "fp8" checkpoint (128x128 weight blocks) and transformers running its
    dequantized weights with activations quantized per token and group of 128 (transformers'
    FP8Linear math; on the CPU transformers itself would run the weights alone)."""
    path, ref = quant_models.fp8_block_checkpoint(base128, str(ckpt_dir / "fp8-block"))
    hf = models._hf_model(ref)
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            mod.register_forward_pre_hook(lambda m, args: (_fp8_group_qdq(args[0]),))
    return path, ref


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_fp8_block_checkpoint_greedy_matches_transformers(fp8_block_pair, block_size):
    path, ref = fp8_block_pair
    llm = _parity(path, ref, block_size)
    assert llm.engine.spec.quant.name == "fp8"
