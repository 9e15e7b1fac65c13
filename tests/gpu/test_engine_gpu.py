"""The engine on CUDA (Triton kernels inside the model): tiny random
checkpoints agree with transformers on the same GPU; AWQ layers too."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from tests import models


@pytest.fixture(scope="module")
def gpu_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-ckpts")
    return {
        "qwen2": models.make_checkpoint(str(root / "qwen2"), "qwen2", seed=1, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=2),
        "llama": models.make_checkpoint(str(root / "llama"), "llama", seed=2, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=8, head_dim=64),
    }


def _teacher_forced(path, dtype, prompts, outs):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    worst, mismatches = 0.0, 0
    for prompt, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        with torch.no_grad():
            lp = hf(torch.tensor([prompt + gen], device="cuda")).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]
        mismatches += sum(int(a != b) for a, b in zip(lp.argmax(-1).tolist(), gen))
        ours = torch.tensor([d[t] for d, t in zip(out.outputs[0].logprobs, gen)], device="cuda")
        worst = max(worst, float((ours - lp[torch.arange(len(gen)), gen]).abs().max()))
    return worst, mismatches


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_engine_on_cuda_matches_transformers(gpu_ckpts, arch, dtype, block_size):
    path = gpu_ckpts[arch]
    rng = random.Random(block_size)
    prompts = [[rng.randrange(5, 400) for _ in range(n)] for n in (1, 9, 16, 17, 50, 130, 200, 333)]
    llm = LLM(path, device="cuda", dtype=dtype, block_size=block_size, num_kv_blocks=512,
              max_num_batched_tokens=256)  # chunked prefill for the long ones
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0))
    worst, mismatches = _teacher_forced(path, getattr(torch, dtype), prompts, outs)
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if dtype == "float32":
        assert mismatches == 0 and worst < 2e-3, (mismatches, worst)
    else:  # bf16: near-ties may flip; logprobs stay close
        assert mismatches <= 2 and worst < 0.15, (mismatches, worst)


def test_awq_model_on_cuda_matches_cpu(tmp_path):
    """Random AWQ weights of real packing: the CUDA engine (awq_gemm in Triton)
    and the CPU engine (dequantized reference) pick the same tokens."""
    import json
    import os

    from safetensors.torch import load_file, save_file

    from kernels.awq import pack_awq_int4

    src = models.make_checkpoint(str(tmp_path / "dense"), "qwen2", seed=4, hidden_size=256, intermediate_size=512,
                                 num_attention_heads=8, num_key_value_heads=2)
    sd = load_file(os.path.join(src, "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    group = 64
    out = {}
    for name, t in sd.items():
        if name.endswith("_proj.weight") and ".layers." in name:
            n, k = t.shape
            base = name[: -len(".weight")]
            out[base + ".qweight"] = pack_awq_int4(torch.randint(0, 16, (k, n), generator=g))
            out[base + ".qzeros"] = pack_awq_int4(torch.randint(6, 10, (k // group, n), generator=g))
            out[base + ".scales"] = (torch.rand(k // group, n, generator=g) * 0.02 + 0.005).half()
        else:
            out[name] = t
    dst = tmp_path / "awq"
    dst.mkdir()
    save_file(out, str(dst / "model.safetensors"))
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            os.system(f"cp '{src}/{f}' '{dst}/{f}'")
    cfg = json.load(open(dst / "config.json"))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                  "version": "gemm"}
    json.dump(cfg, open(dst / "config.json", "w"))
    prompts = [{"prompt_token_ids": list(range(5 + i, 40 + 7 * i))} for i in range(6)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    cpu = LLM(str(dst), device="cpu", num_kv_blocks=256).generate(prompts, params)
    gpu = LLM(str(dst), device="cuda", dtype="float32", num_kv_blocks=256).generate(prompts, params)
    for a, b in zip(cpu, gpu):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for da, db, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(da[t] - db[t]) < 2e-3
