"""The engine on CUDA (Triton kernels inside the model): tiny random
checkpoints agree with transformers on the same GPU; AWQ layers too."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from tests import models
from tests.gpu.conftest import cases


@pytest.fixture(scope="module")
def gpu_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-ckpts")
    return {
        "qwen2": models.make_checkpoint(str(root / "qwen2"), "qwen2", seed=1, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=2),
        "llama": models.make_checkpoint(str(root / "llama"), "llama", seed=2, hidden_size=256, intermediate_size=512,
                                        num_attention_heads=8, num_key_value_heads=8, head_dim=64),
        **_new_architectures(root),
    }


def _new_architectures(root):
    """Qwen3 (yarn), Phi-3 (fused, partial rotary, longrope's short side, window 100), Gemma 3
    (windows of 48, two rope bases), Gemma 2 (soft-capping, window 40), Mistral (window 72),
    Qwen3-MoE (8 experts, top-2, layer 1 dense)."""
    from tests.conftest import GEMMA3_ROPE

    wide = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2)
    return {
        "qwen3": models.make_checkpoint(
            str(root / "qwen3"), "qwen3", seed=3, head_dim=64, **wide,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 128}),
        "phi3": models.make_checkpoint(str(root / "phi3"), "phi3", seed=4, sliding_window=100,
                                       original_max_position_embeddings=1024, max_position_embeddings=2048, **wide),
        "gemma3": models.make_checkpoint(
            str(root / "gemma3"), "gemma3", seed=5, head_dim=64, num_hidden_layers=3, sliding_window=48,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_parameters=GEMMA3_ROPE,
            **wide),
        "gemma2": models.make_checkpoint(str(root / "gemma2"), "gemma2", seed=6, head_dim=64, sliding_window=40,
                                         attn_logit_softcapping=2.0, final_logit_softcapping=5.0, **wide),
        "mistral_sw": models.make_checkpoint(str(root / "mistral-sw"), "mistral", seed=7, sliding_window=72, **wide),
        "qwen3_moe": models.make_checkpoint(str(root / "qwen3-moe"), "qwen3_moe", seed=8, head_dim=64, num_experts=8,
                                            num_experts_per_tok=2, moe_intermediate_size=128, mlp_only_layers=[1],
                                            **wide),
    }


def _hf_logprobs(path, dtype, prompt, gen):
    from transformers import AutoModelForCausalLM

    key = (path, dtype)
    if key not in _HF:
        # eager: the plain math (on CUDA transformers may pick an attention that drops Gemma 2's soft-capping)
        _HF[key] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").cuda().eval()
    with torch.no_grad():
        ids = torch.tensor([prompt + gen], device="cuda")
        return _HF[key](ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]


_HF: dict = {}


ARCHS = ["qwen2", "llama", "qwen3", "phi3", "gemma3", "gemma2", "mistral_sw", "qwen3_moe"]
# every architecture in bfloat16 at block 16, and float32 at block 32 once, by default; the rest slow
CASES = cases([(a, "bfloat16", 16) for a in ARCHS] + [("llama", "float32", 32)],
              [(a, d, b) for a in ARCHS for d in ("float32", "bfloat16") for b in (16, 32)])


@pytest.mark.parametrize("arch,dtype,block_size", CASES)
def test_engine_on_cuda_matches_transformers(gpu_ckpts, arch, dtype, block_size):
    """float32: HF's greedy choice at every position of our continuation, logprobs
    within 2e-3. bfloat16: our error against HF float32 is no worse than HF's own
    bfloat16 error (teacher-forced on our continuation)."""
    path = gpu_ckpts[arch]
    rng = random.Random(block_size)
    prompts = [[rng.randrange(5, 400) for _ in range(n)] for n in (1, 9, 16, 17, 50, 130, 200, 333)]
    llm = LLM(path, device="cuda", dtype=dtype, block_size=block_size, num_kv_blocks=512, max_num_seqs=16,
              max_num_batched_tokens=256)  # chunked prefill for the long ones
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0))
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    ours_err = hf_err = ours_sum = hf_sum = 0.0
    count = 0
    ours_miss = hf_miss = 0
    for prompt, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        ref = _hf_logprobs(path, torch.float32, prompt, gen)
        pos = torch.arange(len(gen), device="cuda")
        ours = torch.tensor([d[t].logprob for d, t in zip(out.outputs[0].logprobs, gen)], device="cuda")
        ours_err = max(ours_err, float((ours - ref[pos, gen]).abs().max()))
        ours_sum += float((ours - ref[pos, gen]).abs().sum())
        count += len(gen)
        ours_miss += sum(int(a != b) for a, b in zip(ref.argmax(-1).tolist(), gen))
        if dtype == "bfloat16":
            low = _hf_logprobs(path, torch.bfloat16, prompt, gen)
            hf_err = max(hf_err, float((low[pos, gen] - ref[pos, gen]).abs().max()))
            hf_sum += float((low[pos, gen] - ref[pos, gen]).abs().sum())
            hf_miss += sum(int(a != b) for a, b in zip(ref.argmax(-1).tolist(), low.argmax(-1).tolist()))
    print(f"{arch} {dtype} bs={block_size}: ours err {ours_err:.4f} (mean {ours_sum / count:.4f}) miss {ours_miss}; "
          f"hf-bf16 err {hf_err:.4f} (mean {hf_sum / count:.4f}) miss {hf_miss}")
    if dtype == "float32":
        assert ours_miss == 0 and ours_err < 2e-3, (ours_miss, ours_err)
    elif arch == "qwen3_moe":
        # a bf16 near-tie of the router sends a token to another expert: one such flip moves
        # a logprob by ~1 in ours or in HF's bf16 run alike, so the max is chance; the mean is not
        assert ours_sum <= 1.5 * hf_sum + 0.05 * count, (ours_sum / count, hf_sum / count)
        assert ours_miss <= 2 * hf_miss + 4, (ours_miss, hf_miss)
    else:
        assert ours_err <= 1.5 * hf_err + 0.05, (ours_err, hf_err)
        assert ours_miss <= 2 * hf_miss + 4, (ours_miss, hf_miss)  # near-ties of random logits


def test_awq_model_on_cuda_matches_cpu(tmp_path):
    """Random AWQ weights of real packing: the CUDA engine (awq_gemm in Triton)
    and the CPU engine (dequantized reference) pick the same tokens."""
    import json
    import os

    from safetensors.torch import load_file, save_file

    from llm_kernels import pack_awq_int4

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
    gpu = LLM(str(dst), device="cuda", dtype="float32", num_kv_blocks=256, max_num_seqs=16).generate(prompts, params)
    for a, b in zip(cpu, gpu):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for da, db, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(da[t].logprob - db[t].logprob) < 2e-3
