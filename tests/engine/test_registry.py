"""The model registry: an architecture added as one file and one line (tiny_fake_arch.py)
generates what the same model in plain PyTorch does; others are refused, naming those we run."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.errors import UnsupportedModelError
from engine.model import registry
from engine.model.loader import read_model_spec
from engine.model.spec import ModelSpec
from tests import models
from tests.engine.tiny_fake_arch import TinyFakeForCausalLM

PROMPTS = [[5, 17, 33, 120, 64, 9, 250], [7], list(range(40, 75))]


@pytest.fixture
def fake_ckpt(tmp_path, monkeypatch):
    """A TinyFake checkpoint (a LlamaConfig naming the architecture, its own tensor names), registered."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    monkeypatch.setitem(registry.ARCHITECTURES, "TinyFakeForCausalLM", TinyFakeForCausalLM)
    tok = models.make_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                      hidden_act="gelu", tie_word_embeddings=True, eos_token_id=2,
                      architectures=["TinyFakeForCausalLM"])
    g = torch.Generator().manual_seed(3)
    shapes = {"tok.weight": (len(tok), 32), "ln_f.weight": (32,)}
    for i in range(2):
        shapes.update({f"blocks.{i}.{k}": s for k, s in {
            "ln1.weight": (32,), "ln2.weight": (32,), "attn.wq.weight": (32, 32), "attn.wk.weight": (16, 32),
            "attn.wv.weight": (16, 32), "attn.wo.weight": (32, 32), "fc1.weight": (64, 32), "fc2.weight": (32, 64),
        }.items()})
    tensors = {k: 1 + 0.1 * torch.randn(s, generator=g) if k.endswith("ln1.weight") or k.endswith("ln2.weight")
               or k == "ln_f.weight" else 0.3 * torch.randn(s, generator=g) for k, s in shapes.items()}
    path = str(tmp_path / "tiny-fake")
    cfg.save_pretrained(path)
    tok.save_pretrained(path)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return path, tensors


def reference_logits(t: dict, spec: ModelSpec, ids: list[int]) -> torch.Tensor:
    """TinyFake in plain PyTorch over a whole sequence: logits [len(ids), vocab]."""
    n, hd, heads, kv_heads = len(ids), spec.head_dim, spec.num_heads, spec.num_kv_heads
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.outer(torch.arange(n).float(), inv)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + spec.rms_norm_eps) * w

    x = t["tok.weight"][ids]
    for i in range(spec.num_layers):
        w = {k.removeprefix(f"blocks.{i}."): v for k, v in t.items() if k.startswith(f"blocks.{i}.")}
        h = rms(x, w["ln1.weight"])
        q = rope((h @ w["attn.wq.weight"].t()).view(n, heads, hd))
        k = rope((h @ w["attn.wk.weight"].t()).view(n, kv_heads, hd)).repeat_interleave(heads // kv_heads, 1)
        v = (h @ w["attn.wv.weight"].t()).view(n, kv_heads, hd).repeat_interleave(heads // kv_heads, 1)
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + att.transpose(0, 1).reshape(n, heads * hd) @ w["attn.wo.weight"].t()
        x = x + F.gelu(rms(x, w["ln2.weight"]) @ w["fc1.weight"].t()) @ w["fc2.weight"].t()
    return rms(x, t["ln_f.weight"]) @ t["tok.weight"].t()


def test_a_registered_architecture_generates_what_its_model_computes(fake_ckpt):
    path, tensors = fake_ckpt
    llm = LLM(path, num_kv_blocks=32, block_size=8)
    assert isinstance(llm.engine.model, TinyFakeForCausalLM)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    spec = llm.engine.spec
    for prompt, out in zip(PROMPTS, outs):
        gen = out.outputs[0].token_ids
        with torch.no_grad():  # teacher-forced: the reference scores our continuation
            logprobs = reference_logits(tensors, spec, prompt + gen).log_softmax(-1)[len(prompt) - 1 : -1]
        assert len(gen) == 8 and gen == logprobs.argmax(-1).tolist()
        ours = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)])
        torch.testing.assert_close(ours, logprobs[torch.arange(len(gen)), gen], rtol=0, atol=1e-4)


def test_an_architecture_refuses_what_it_cannot_run_before_weights(fake_ckpt):
    path, _ = fake_ckpt
    cfg_path = os.path.join(path, "config.json")
    cfg = json.load(open(cfg_path))
    json.dump({**cfg, "hidden_act": "silu"}, open(cfg_path, "w"))
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="TinyFake with activation 'silu'"):
        LLM(path, num_kv_blocks=8)


def test_unregistered_architecture_error_lists_the_registered_ones(fake_ckpt, tmp_path):
    path, _ = fake_ckpt
    assert read_model_spec(path).architecture == "TinyFakeForCausalLM"
    with pytest.raises(UnsupportedModelError) as err:
        registry.model_class("GPT2LMHeadModel")
    assert str(sorted(registry.ARCHITECTURES)) in str(err.value) and "TinyFakeForCausalLM" in str(err.value)


def test_unsupported_quantization_lists_the_methods(tiny_llama_dir, tmp_path):
    import shutil

    bad = shutil.copytree(tiny_llama_dir, tmp_path / "gptq")
    cfg = json.load(open(bad / "config.json"))
    json.dump({**cfg, "quantization_config": {"quant_method": "bitsandbytes"}}, open(bad / "config.json", "w"))
    with pytest.raises(UnsupportedModelError, match=r"quantization method 'bitsandbytes' \(quantization_config.quant_method\) "
                       r"is not supported \(awq, compressed-tensors, fp8, gptq\)"):
        read_model_spec(str(bad))
