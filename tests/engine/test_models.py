"""The architectures beyond Llama (Qwen3, Phi-3/4, Gemma 2/3, sliding windows, longrope):
what the parity suite (test_parity.py) does not show by itself. AWQ checkpoints of each
match transformers running the same dequantized weights; the windows and the longrope
switch really change the result; what a family cannot run is refused before weights."""
import json
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import UnsupportedModelError
from tests import models
from tests.engine.test_parity import random_prompts, reference


def _teacher_forced(hf, out, ids):
    """HF's log-probabilities of our generated tokens, scored with our continuation as input."""
    gen = out.outputs[0].token_ids
    with torch.no_grad():
        logprobs = hf(torch.tensor([ids + gen])).logits[0].log_softmax(-1)[len(ids) - 1 : -1]
    return gen, logprobs


@pytest.fixture(scope="module", params=["qwen3", "phi3", "gemma2", "gemma3"])
def awq_model(request, ckpt_dir):
    """(float checkpoint, AWQ g32 checkpoint): AutoAWQ's own for the families it supports
    (Qwen3, Phi3, Gemma2); Gemma 3, which AutoAWQ 0.2.9 lacks, by round-to-nearest."""
    src = request.getfixturevalue(f"tiny_{request.param}_dir")
    dst = str(ckpt_dir / f"{request.param}-awq")
    if request.param == "gemma3":
        return src, models.round_to_nearest_awq(src, dst, 32)
    pytest.importorskip("awq", reason="autoawq (the quant extra) makes the AWQ checkpoints")
    from tests.engine.test_awq import _quantize

    return src, _quantize(src, dst, 32)


def test_awq_checkpoint_matches_hf_with_its_dequantized_weights(awq_model):
    from tests.engine.test_awq import _hf_with_awq_weights

    src, dst = awq_model
    hf = _hf_with_awq_weights(src, dst)
    llm = LLM(dst, num_kv_blocks=128, block_size=16)
    assert llm.engine.spec.quant_group_size == 32
    prompts = random_prompts(3, 400, lengths=[1, 9, 40, 90])
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0))
    for ids, out in zip(prompts, outs):
        gen, logprobs = _teacher_forced(hf, out, ids)
        assert gen == logprobs.argmax(-1).tolist(), f"prompt of {len(ids)}"
        ours = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)])
        torch.testing.assert_close(ours, logprobs[torch.arange(len(gen)), gen], rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", ["mistral_sw", "gemma3", "phi3"])
def test_the_sliding_window_changes_long_prompts(arch, request):
    """Without its window the model no longer matches transformers on prompts several
    windows long: the parity suite's long prompts do exercise the windows."""
    path = request.getfixturevalue(f"tiny_{arch}_dir")
    prompts = random_prompts(21, 400, lengths=[120, 200])
    llm = LLM(path, block_size=16, num_kv_blocks=64)
    params = SamplingParams(max_tokens=12, temperature=0)
    with_window = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in with_window] == [reference(path, p) for p in prompts]
    windows = [m for m in llm.engine.model.modules() if getattr(m, "sliding_window", None)]
    assert windows, "no layer has a window"
    for m in windows:
        m.sliding_window = None
    without = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in without] != [o.outputs[0].token_ids for o in with_window]


def test_longrope_crossing_recomputes_with_the_long_factors(tiny_phi3_dir):
    """A prompt under original_max_position_embeddings (64) whose output crosses it: its KV
    is recomputed with the long factors once (transformers' Phi-3 does the same), and the
    tokens equal HF's; prompts already past the switch start with the long factors."""
    prompts = random_prompts(31, 400, lengths=[58, 63, 80])
    llm = LLM(tiny_phi3_dir, block_size=8, num_kv_blocks=128)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=12, temperature=0))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == reference(tiny_phi3_dir, p), f"prompt of {len(p)}"
    stats = llm.stats()
    assert stats["num_rope_recomputes"] == 2  # the two prompts that cross, once each
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_gemma_norms_load_one_plus_weight(tiny_gemma3_dir):
    from safetensors.torch import load_file

    llm = LLM(tiny_gemma3_dir, num_kv_blocks=16)
    ckpt = load_file(os.path.join(tiny_gemma3_dir, "model.safetensors"))
    model = llm.engine.model
    torch.testing.assert_close(model.layers[0].pre_feedforward_layernorm.weight,
                               ckpt["model.layers.0.pre_feedforward_layernorm.weight"] + 1)
    torch.testing.assert_close(model.layers[1].self_attn.q_norm.weight, ckpt["model.layers.1.self_attn.q_norm.weight"] + 1)
    assert [layer.self_attn.attn.sliding_window for layer in model.layers] == [24, None, 24]
    assert model.rope_of(0) is model.cos_sin_local and model.rope_of(1) is model.cos_sin


@pytest.mark.parametrize("edit,words", [
    (lambda c: c.update(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (lambda c: c.update(hidden_activation="gelu"), "activation 'gelu'"),
    (lambda c: c["rope_parameters"]["full_attention"].update(rope_type="dynamic", factor=2.0), "rope scaling 'dynamic'"),
])
def test_gemma3_refuses_what_it_cannot_run_before_weights(tiny_gemma3_dir, tmp_path, edit, words):
    from tests.engine.test_loading import _copy

    bad = _copy(tiny_gemma3_dir, tmp_path / "bad", edit, drop_weights=True)
    with pytest.raises(UnsupportedModelError) as err:
        LLM(str(bad), num_kv_blocks=8)
    assert words in str(err.value)


def test_phi3_fused_tensor_that_does_not_split_fails_naming_it(tiny_phi3_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from engine.errors import ModelLoadError
    from tests.engine.test_loading import _copy

    dst = _copy(tiny_phi3_dir, tmp_path / "bad-fused", drop_weights=True)
    tensors = load_file(os.path.join(tiny_phi3_dir, "model.safetensors"))
    name = "model.layers.0.self_attn.qkv_proj.weight"
    tensors[name] = tensors[name][:-16]
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with pytest.raises(ModelLoadError, match="qkv_proj"):
        LLM(str(dst), num_kv_blocks=8)
    assert json.load(open(os.path.join(dst, "config.json")))["architectures"] == ["Phi3ForCausalLM"]


@pytest.mark.parametrize("arch", ["mistral_sw", "phi3"])
def test_every_layer_sliding_holds_only_the_window(arch, request):
    """Mistral (window 24) and Phi-3 (48): a 300-token prompt runs in a pool of 24 blocks of 8
    (192 tokens): the blocks below the window go back as it moves, the tokens equal HF's."""
    path = request.getfixturevalue(f"tiny_{arch}_dir")
    prompts = random_prompts(41, 400, lengths=[300, 150, 40])
    llm = LLM(path, block_size=8, num_kv_blocks=24, max_num_batched_tokens=32)
    assert llm.engine.kv_capacity_tokens >= 512  # any length: a window and a chunk fit
    window = llm.engine.scheduler.window
    assert llm.engine.request_kv_tokens == window + 32 + 2 * 8 < llm.engine.max_request_tokens
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=12, temperature=0))
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == reference(path, p), f"prompt of {len(p)}"
    stats = llm.stats()
    assert stats["kv_blocks_released_by_window"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_mixed_sliding_and_full_layers_release_nothing(tiny_gemma3_dir):
    """Gemma 3's full-attention layer reads the whole context: no block is released."""
    llm = LLM(tiny_gemma3_dir, block_size=8, num_kv_blocks=64)
    llm.generate([{"prompt_token_ids": random_prompts(5, 400, lengths=[200])[0]}],
                 SamplingParams(max_tokens=4, temperature=0))
    assert llm.engine.scheduler.window is None and llm.stats()["kv_blocks_released_by_window"] == 0


def test_released_blocks_are_never_read_by_the_triton_kernels(tiny_mistral_sw_dir, monkeypatch):
    """The Triton attention kernels (interpreted) with RELEASED (-1) block table entries below
    the window: they are masked before the table is read, the tokens equal HF's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    prompts = random_prompts(43, 400, lengths=[120, 40])
    llm = LLM(tiny_mistral_sw_dir, block_size=8, num_kv_blocks=12, max_num_batched_tokens=32)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=6, temperature=0))
    assert llm.stats()["kv_blocks_released_by_window"] > 0
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == models.hf_greedy(tiny_mistral_sw_dir, p, 6), f"prompt of {len(p)}"
