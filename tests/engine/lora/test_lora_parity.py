"""Greedy parity with PEFT in float32 on the CPU: the engine with an adapter gives the tokens
PEFT's generate gives with the same adapter, unmerged (beside the weights) and merged into them;
requests of different adapters and of the base model share batches."""
import os
import random

import pytest

from engine import LLM, LoRARequest, SamplingParams
from tests import lora_adapters, models

MAX_NEW = 10


def prompts(seed: int, lengths=(3, 21, 50)):
    rng = random.Random(seed)
    return [[rng.randrange(5, 400) for _ in range(n)] for n in lengths]


def generate(llm, prompt_ids, loras, **params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids],
                        SamplingParams(max_tokens=MAX_NEW, temperature=0, **params), lora_request=loras)
    return [o.outputs[0].token_ids for o in outs]


def expected(base, adapter, prompt, merged=False):
    if adapter is None:
        return models.hf_greedy(base, prompt, MAX_NEW)
    return lora_adapters.peft_greedy(base, adapter, prompt, MAX_NEW, merged=merged)


ARCHS = ["llama", "qwen2", "mistral", "qwen3", "phi3", "gemma3", "gemma2"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_matches_peft_unmerged_and_merged(arch, request, tmp_path):
    base = request.getfixturevalue(f"tiny_{arch}_dir")
    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] if arch == "phi3" else None
    adapter = lora_adapters.make_adapter(base, str(tmp_path / "adapter"), seed=ARCHS.index(arch), targets=targets)
    llm = LLM(base, enable_lora=True, max_lora_rank=8, num_kv_blocks=128)
    ps = prompts(ARCHS.index(arch), lengths=(4, 37))
    got = generate(llm, ps, LoRARequest("tuned", 1, adapter))
    for p, tokens in zip(ps, got):
        assert tokens == expected(base, adapter, p), f"unmerged, prompt of {len(p)}"
        assert tokens == expected(base, adapter, p, merged=True), f"merged, prompt of {len(p)}"
    assert got != generate(llm, ps, None), "the adapter changed nothing: the test proves nothing"


@pytest.mark.parametrize("chunk", [None, 16])
def test_three_adapters_and_the_base_model_in_one_batch(tiny_llama_dir, adapters, chunk):
    """Each request matches its own PEFT run; chunk 16: prefills split into chunks beside decodes."""
    names = [None, "all", "attn", "mlp"]
    loras = {name: LoRARequest(name, i, adapters[name]) for i, name in enumerate(names) if name}
    ps = prompts(3, lengths=(5, 18, 33, 2, 45, 12, 26, 9))
    which = [names[i % 4] for i in range(len(ps))]
    llm = LLM(tiny_llama_dir, enable_lora=True, max_loras=3, max_lora_rank=8, num_kv_blocks=256,
              max_num_batched_tokens=chunk)
    got = generate(llm, ps, [loras.get(w) for w in which])
    for p, w, tokens in zip(ps, which, got):
        assert tokens == expected(tiny_llama_dir, adapters.get(w), p), f"adapter {w}, prompt of {len(p)}"
    stats = llm.engine.stats()
    assert stats["lora_slots_used"] == 3 and stats["lora_evictions"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert llm.engine.lora.refs == [0, 0, 0], "a finished request kept its adapter's slot"


def test_rank_and_alpha_patterns(tiny_llama_dir, tmp_path):
    """PEFT's per-module rank_pattern and alpha_pattern: each module its own rank and scaling."""
    adapter = lora_adapters.make_adapter(tiny_llama_dir, str(tmp_path / "patterns"), seed=21, r=8, alpha=16,
                                         rank_pattern={"o_proj": 2, "down_proj": 4}, alpha_pattern={"v_proj": 64})
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=128)
    ps = prompts(4, lengths=(6, 30))
    for p, tokens in zip(ps, generate(llm, ps, LoRARequest("patterns", 7, adapter))):
        assert tokens == expected(tiny_llama_dir, adapter, p)


def test_an_adapter_on_an_autoawq_base(ckpt_dir, tmp_path):
    """The adapter runs in the model's dtype beside the 4-bit GEMM: PEFT with the same adapter on
    AutoAWQ's own dequantized weights gives the same tokens."""
    from tests.engine.test_awq import _hf_with_awq_weights, _quantize

    src = models.make_checkpoint(str(ckpt_dir / "llama128"), "llama", seed=5, hidden_size=128,
                                 intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    awq_dir = _quantize(src, str(ckpt_dir / "llama128-awq-g64"), 64)
    dequantized = str(tmp_path / "dequantized")
    _hf_with_awq_weights(src, awq_dir).save_pretrained(dequantized)
    models.make_tokenizer().save_pretrained(dequantized)
    adapter = lora_adapters.make_adapter(src, str(tmp_path / "adapter"), seed=31, scale=0.15)
    llm = LLM(awq_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=128)
    assert llm.engine.spec.quant is not None
    ps = prompts(5, lengths=(7, 40))
    got = generate(llm, ps, LoRARequest("on-awq", 1, adapter))
    for p, tokens in zip(ps, got):
        assert tokens == expected(dequantized, adapter, p)
    assert got != generate(llm, ps, None)


def test_safetensors_and_bin_weights_load_alike(tiny_llama_dir, adapters, tmp_path):
    """An adapter saved as adapter_model.bin (older PEFT) runs like its safetensors twin."""
    import shutil

    import torch
    from safetensors.torch import load_file

    legacy = tmp_path / "legacy"
    shutil.copytree(adapters["attn"], legacy)
    torch.save(load_file(str(legacy / "adapter_model.safetensors")), str(legacy / "adapter_model.bin"))
    os.remove(legacy / "adapter_model.safetensors")
    llm = LLM(tiny_llama_dir, enable_lora=True, max_lora_rank=8, num_kv_blocks=128, max_loras=2)
    ps = prompts(6, lengths=(9,))
    assert generate(llm, ps, LoRARequest("legacy", 2, str(legacy))) == generate(
        llm, ps, LoRARequest("attn", 1, adapters["attn"]))


def test_the_gpu_kernels_under_the_interpreter_match_peft(tiny_llama_dir, adapters, monkeypatch):
    """The whole step on the Triton kernels (the interpreter runs them on the CPU): the LoRA
    kernels fed each token's slot by the runner, beside attention and the norms."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    llm = LLM(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=64)
    ps = prompts(8, lengths=(3, 19))
    loras = [LoRARequest("all", 1, adapters["all"]), LoRARequest("attn", 2, adapters["attn"])]
    got = generate(llm, ps, loras)
    for p, lora, tokens in zip(ps, loras, got):
        assert tokens == expected(tiny_llama_dir, lora.lora_path, p)


def test_a_mixture_of_experts_takes_attention_adapters_not_expert_ones(ckpt_dir, tmp_path):
    """Qwen3-MoE: an adapter of the attention projections matches PEFT; one PEFT made on the MLP
    projections (which it puts on the sparse layers' fused experts) is refused, naming the module."""
    from engine.errors import LoRAError

    base = models.make_checkpoint(str(ckpt_dir / "qwen3-moe-lora"), "qwen3_moe", seed=14, mlp_only_layers=[1])
    adapter = lora_adapters.make_adapter(base, str(tmp_path / "attn"), seed=41, targets=lora_adapters.ATTN)
    llm = LLM(base, enable_lora=True, max_lora_rank=8, num_kv_blocks=128)
    ps = prompts(9, lengths=(5, 33))
    for p, tokens in zip(ps, generate(llm, ps, LoRARequest("attn", 1, adapter))):
        assert tokens == expected(base, adapter, p)
    experts = lora_adapters.make_adapter(base, str(tmp_path / "experts"), seed=42, targets=["gate_proj", "up_proj"])
    with pytest.raises(LoRAError, match=r"layers\.0\.mlp\.experts") as err:
        generate(llm, ps[:1], LoRARequest("experts", 2, experts))
    assert err.value.reason == "unknown_module"
