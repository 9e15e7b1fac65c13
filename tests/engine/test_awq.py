"""AutoAWQ "GEMM" checkpoints: the format's packing, and a checkpoint made by
AutoAWQ itself matching transformers running AutoAWQ's own dequantized weights."""
import os

import pytest
import torch

import llm_kernels
from engine import LLM, SamplingParams
from engine.model.layers import Linear
from engine.quant import AWQ
from llm_kernels import pack_awq_int4, unpack_awq_int4
from llm_kernels.w4a16.select import CHECKPOINT, HOST, HOST_INT4
from tests import models


def test_pack_unpack_roundtrip():
    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 16, (12, 64), generator=g)
    assert torch.equal(unpack_awq_int4(pack_awq_int4(values)), values.to(torch.int32))


def test_awq_gemm_matches_dense_math():
    g = torch.Generator().manual_seed(1)
    K, N, G = 128, 96, 32
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(0, 16, (K // G, N), generator=g)
    s = torch.rand(K // G, N, generator=g) * 0.1
    x = torch.randn(5, K, generator=g)
    w = (q - z.repeat_interleave(G, 0)).float() * s.repeat_interleave(G, 0)
    out = llm_kernels.awq_gemm(x, pack_awq_int4(q), pack_awq_int4(z), s, G)
    torch.testing.assert_close(out, x @ w, rtol=1e-5, atol=1e-5)


awq = pytest.importorskip("awq", reason="autoawq (the quant extra) is needed to make AWQ checkpoints")


def _quantize(src: str, dst: str, group: int) -> str:
    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(src, device_map="cpu")
    tok = AutoTokenizer.from_pretrained(src)
    calib = [t for t in models.TOKENIZER_TEXT] * 6
    model.quantize(tok, quant_config={"zero_point": True, "q_group_size": group, "w_bit": 4, "version": "GEMM"},
                   calib_data=calib, max_calib_seq_len=32, max_calib_samples=len(calib))
    model.save_quantized(dst)
    tok.save_pretrained(dst)
    return dst


def _hf_with_awq_weights(src: str, awq_dir: str):
    """transformers' float model of src with every linear replaced by AutoAWQ's own dequantization."""
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sd = {}
    for f in os.listdir(awq_dir):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(awq_dir, f)))
    group = 0
    import json

    group = json.load(open(os.path.join(awq_dir, "config.json")))["quantization_config"]["group_size"]
    params = dict(model.named_parameters())
    for name in [k[: -len(".qweight")] for k in sd if k.endswith(".qweight")]:
        w = dequantize_gemm(sd[name + ".qweight"], sd[name + ".qzeros"], sd[name + ".scales"].float(), 4, group)
        params[name + ".weight"].data.copy_(w.t())
    for name, t in sd.items():
        if name in params and not name.endswith(("qweight", "qzeros", "scales")):
            params[name].data.copy_(t.float())
    return model


@pytest.fixture(scope="module", params=[32, 64, 128])
def awq_pair(request, ckpt_dir):
    src = models.make_checkpoint(str(ckpt_dir / "llama128"), "llama", seed=5, hidden_size=128,
                                 intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    dst = _quantize(src, str(ckpt_dir / f"llama128-awq-g{request.param}"), request.param)
    return src, dst, request.param


def test_autoawq_checkpoint_matches_hf_dequantized(awq_pair):
    src, dst, group = awq_pair
    hf = _hf_with_awq_weights(src, dst)
    llm = LLM(dst, num_kv_blocks=128, block_size=16)
    assert llm.engine.spec.quant_group_size == group
    prompts = models.TOKENIZER_TEXT[:4] + ["회의록"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0))
    tok = llm.get_tokenizer()
    for prompt, out in zip(prompts, outs):
        ids = tok.encode(prompt)
        gen = out.outputs[0].token_ids
        with torch.no_grad():  # teacher-forced: HF scores our continuation
            logprobs = hf(torch.tensor([ids + gen])).logits[0].log_softmax(-1)[len(ids) - 1 : -1]
        assert gen == logprobs.argmax(-1).tolist(), prompt  # each token is HF's greedy choice
        ours = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)])
        torch.testing.assert_close(ours, logprobs[torch.arange(len(gen)), gen], rtol=0, atol=1e-4)


def test_awq_gemm_path_equals_dense_path(awq_pair, monkeypatch):
    """The CPU keeps a dequantized copy; the checkpoint's own tensors compute the same logits."""
    _, dst, _ = awq_pair
    llm = LLM(dst, num_kv_blocks=64, block_size=16)
    prompt = {"prompt_token_ids": list(range(5, 40))}
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=3, ignore_eos=True)
    dense = llm.generate([prompt], params)[0].outputs[0]
    lins = [m for m in llm.engine.model.modules() if isinstance(m, Linear) and isinstance(m.method, AWQ)]
    assert lins and all(lin.w4a16.layout in (HOST, HOST_INT4) for lin in lins)
    for lin in lins:
        lin.w4a16 = llm_kernels.w4a16_prepare(lin.qweight, lin.qzeros, lin.scales, lin.method.group_size, CHECKPOINT)
    gemm = llm.generate([prompt], params)[0].outputs[0]
    assert gemm.token_ids == dense.token_ids
    for a, b in zip(gemm.logprobs, dense.logprobs):
        assert a.keys() == b.keys()
        for k in a:
            assert abs(a[k].logprob - b[k].logprob) < 1e-4
