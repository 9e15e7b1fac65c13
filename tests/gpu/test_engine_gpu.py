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


def _hf_logprobs(path, dtype, prompt, gen):
    from transformers import AutoModelForCausalLM

    key = (path, dtype)
    if key not in _HF:
        _HF[key] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    with torch.no_grad():
        ids = torch.tensor([prompt + gen], device="cuda")
        return _HF[key](ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]


_HF: dict = {}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_engine_on_cuda_matches_transformers(gpu_ckpts, arch, dtype, block_size):
    """float32: HF's greedy choice at every position of our continuation, logprobs
    within 2e-3. bfloat16: our error against HF float32 is no worse than HF's own
    bfloat16 error (teacher-forced on our continuation)."""
    path = gpu_ckpts[arch]
    rng = random.Random(block_size)
    prompts = [[rng.randrange(5, 400) for _ in range(n)] for n in (1, 9, 16, 17, 50, 130, 200, 333)]
    llm = LLM(path, device="cuda", dtype=dtype, block_size=block_size, num_kv_blocks=512,
              max_num_batched_tokens=256)  # chunked prefill for the long ones
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0))
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    ours_err = hf_err = 0.0
    ours_miss = hf_miss = 0
    for prompt, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        ref = _hf_logprobs(path, torch.float32, prompt, gen)
        pos = torch.arange(len(gen), device="cuda")
        ours = torch.tensor([d[t] for d, t in zip(out.outputs[0].logprobs, gen)], device="cuda")
        ours_err = max(ours_err, float((ours - ref[pos, gen]).abs().max()))
        ours_miss += sum(int(a != b) for a, b in zip(ref.argmax(-1).tolist(), gen))
        if dtype == "bfloat16":
            low = _hf_logprobs(path, torch.bfloat16, prompt, gen)
            hf_err = max(hf_err, float((low[pos, gen] - ref[pos, gen]).abs().max()))
            hf_miss += sum(int(a != b) for a, b in zip(ref.argmax(-1).tolist(), low.argmax(-1).tolist()))
    if dtype == "float32":
        assert ours_miss == 0 and ours_err < 2e-3, (ours_miss, ours_err)
    else:
        assert ours_err <= 1.5 * hf_err + 0.05, (ours_err, hf_err)
        assert ours_miss <= 2 * hf_miss + 4, (ours_miss, hf_miss)  # near-ties of random logits
    print(f"{arch} {dtype} bs={block_size}: ours err {ours_err:.4f} miss {ours_miss}; hf-bf16 err {hf_err:.4f} miss {hf_miss}")


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
