"""An FP8 KV cache (kv_cache_dtype, vLLM's names): K and V stored as e4m3 (or e5m2) with
per-tensor scales (the checkpoint's, else 1.0). Greedy parity with transformers whose
attention sees K and V rounded the same way, across block sizes and prefix-cache hits;
the checkpoint's scales reach the layers; half the bytes of a 16-bit cache."""
import os
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, EngineConfig, SamplingParams
from engine.errors import InvalidInputError
from engine.memory import kv_bytes_per_block
from tests import models

MAX_NEW = 12
LENGTHS = [1, 7, 16, 17, 40, 120]


def fp8_round(x: torch.Tensor, scale: float, dtype=torch.float8_e4m3fn) -> torch.Tensor:
    top = torch.finfo(dtype).max
    return ((x.float() / scale).clamp(-top, top).to(dtype).float() * scale).to(x.dtype)


def hf_fp8_greedy(path: str, prompt: list[int], k_scale: float, v_scale: float) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens, its attention reading K and V through FP8 (the rounding of
    our cache), and each step's gap between the two best logits (for near ties)."""
    import transformers.models.llama.modeling_llama as llama
    from transformers import AutoModelForCausalLM

    real = llama.eager_attention_forward
    calls = []

    def fp8_attention(module, query, key, value, *args, **kwargs):
        calls.append(1)
        return real(module, query, fp8_round(key, k_scale), fp8_round(value, v_scale), *args, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    llama.eager_attention_forward = fp8_attention
    try:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                                 pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    finally:
        llama.eager_attention_forward = real
    assert calls, "transformers did not call the eager attention"
    gaps = [float(lg[0].topk(2).values[0] - lg[0].topk(2).values[1]) for lg in out.logits]
    return out.sequences[0, len(prompt):].tolist(), gaps


def assert_parity(got: list[int], want: list[int], gaps: list[float], what: str):
    """Token ids equal, or the first difference at a reference near tie (then the rest may differ)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            assert gaps[i] < 1e-3, f"{what}: token {i} differs ({a} vs {b}) with a logit gap of {gaps[i]:.2e}"
            return
    assert len(got) == len(want), what


@pytest.fixture(scope="module")
def scaled_llama_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with per-tensor KV scales in its checkpoint (as llm-compressor writes
    them: self_attn.k_scale / v_scale), powers of two so a rounded value rounds again to itself."""
    dst = str(tmp_path_factory.mktemp("fp8kv") / "llama")
    shutil.copytree(tiny_llama_dir, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    layers = {k.split(".")[2] for k in tensors if k.startswith("model.layers.")}
    for i in layers:
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.5)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.25)
    save_file(tensors, path, metadata={"format": "pt"})
    return dst


def _prompts(seed):
    rng = random.Random(seed)
    return [[rng.randrange(5, 400) for _ in range(n)] for n in LENGTHS]


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_fp8_cache_greedy_matches_transformers_reading_fp8(tiny_llama_dir, block_size):
    prompts = _prompts(block_size)
    llm = LLM(tiny_llama_dir, block_size=block_size, num_kv_blocks=2048 // block_size, kv_cache_dtype="fp8")
    assert llm.engine.runner.kv_cache.dtype == torch.float8_e4m3fn
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    for prompt, out in zip(prompts, outs):
        want, gaps = hf_fp8_greedy(tiny_llama_dir, prompt, 1.0, 1.0)
        assert_parity(out.outputs[0].token_ids, want, gaps, f"prompt of {len(prompt)}")


def test_checkpoint_scales_are_used_with_fp8_and_ignored_without(scaled_llama_dir):
    prompts = _prompts(3)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    llm = LLM(scaled_llama_dir, block_size=16, num_kv_blocks=128, kv_cache_dtype="fp8")
    layers = llm.engine.runner.attn_layers
    assert {(a.k_scale, a.v_scale) for a in layers} == {(0.5, 0.25)}
    first = llm.generate([{"prompt_token_ids": prompts[-1]}], params)  # fills the prefix cache
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert outs[-1].num_cached_tokens > 0 and outs[-1].outputs[0].token_ids == first[0].outputs[0].token_ids
    for prompt, out in zip(prompts, outs):
        want, gaps = hf_fp8_greedy(scaled_llama_dir, prompt, 0.5, 0.25)
        assert_parity(out.outputs[0].token_ids, want, gaps, f"scaled, prompt of {len(prompt)}")
    plain = LLM(scaled_llama_dir, block_size=16, num_kv_blocks=128)  # a float32 cache: no scales
    assert {(a.k_scale, a.v_scale) for a in plain.engine.runner.attn_layers} == {(1.0, 1.0)}
    got = plain.generate([{"prompt_token_ids": prompts[2]}], params)[0].outputs[0].token_ids
    assert got == models.hf_greedy(scaled_llama_dir, prompts[2], MAX_NEW)


def test_fp8_scrub_and_bytes(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, block_size=16, num_kv_blocks=64, kv_cache_dtype="fp8_e5m2")
    runner = llm.engine.runner
    assert runner.kv_cache.dtype == torch.float8_e5m2
    llm.generate([{"prompt_token_ids": list(range(5, 60))}], SamplingParams(max_tokens=2, temperature=0))
    used = [i for i in range(64) if runner.kv_cache[:, :, i].float().abs().sum() > 0]
    assert used
    runner.scrub_kv(used)
    assert runner.kv_cache.float().abs().sum() == 0
    spec = llm.engine.model.spec
    assert kv_bytes_per_block(spec, 16, torch.float8_e4m3fn) * 2 == kv_bytes_per_block(spec, 16, torch.bfloat16)


@pytest.mark.parametrize("bad", ["fp8_e4m3fnuz", "int8", "", None])
def test_unknown_kv_cache_dtype_names_the_field(bad):
    with pytest.raises(InvalidInputError) as err:
        EngineConfig(model="m", kv_cache_dtype=bad)
    assert err.value.field == "kv_cache_dtype"
