"""GPU parity at Qwen2.5 widths: a random-weight model of Qwen2.5-0.5B's
architecture (4 of its layers) in bf16, and its AWQ form, against
transformers running the same weights: teacher-forced logprobs as close to
transformers' float32 as its own bf16 run is, and greedy tokens that leave the
float32 choice, before the first near-tie, about as rarely as its bf16 run's do."""
import json
import os
import random
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from tests import models

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                  num_hidden_layers=4, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0,
                  tie_word_embeddings=True, initializer_range=0.1)
GROUP = 128
NEAR_TIE = 0.3  # top-1 minus top-2 reference logprob below this (about bf16's error here): a near-tie


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """(dense bf16-valued checkpoint, AWQ checkpoint, dense checkpoint of the AWQ weights dequantized)."""
    from safetensors.torch import load_file, save_file

    from llm_kernels import awq_dequantize, pack_awq_int4

    root = tmp_path_factory.mktemp("qwen25")
    dense = models.make_checkpoint(str(root / "dense"), "qwen2", seed=25, **QWEN25_05B)
    sd = load_file(os.path.join(dense, "model.safetensors"))
    # sharper logits (embeddings are tied: the lm_head), fewer near-ties; weights bf16 can hold, both sides
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 4
    sd = {k: v.to(torch.bfloat16).float() for k, v in sd.items()}
    save_file(sd, os.path.join(dense, "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    awq, deq = {}, {}
    for name, t in sd.items():
        if name.endswith("_proj.weight") and ".layers." in name:
            n, k = t.shape
            base = name[: -len(".weight")]
            q = torch.randint(0, 16, (k, n), generator=g)
            z = torch.randint(5, 11, (k // GROUP, n), generator=g)
            # scales that keep each layer's output at the dense init's size
            s = (torch.rand(k // GROUP, n, generator=g) * 0.5 + 0.75) * (QWEN25_05B["initializer_range"] / 4.6)
            s = s.half()
            awq[base + ".qweight"], awq[base + ".qzeros"] = pack_awq_int4(q), pack_awq_int4(z)
            awq[base + ".scales"] = s
            deq[name] = awq_dequantize(awq[base + ".qweight"], awq[base + ".qzeros"], s, GROUP,
                                       torch.float32).t().contiguous()
        else:
            awq[name] = deq[name] = t
    paths = []
    for label, tensors in (("awq", awq), ("dequant", deq)):
        d = root / label
        d.mkdir()
        save_file(tensors, str(d / "model.safetensors"))
        for f in os.listdir(dense):
            if not f.endswith(".safetensors"):
                shutil.copy(os.path.join(dense, f), d / f)
        paths.append(str(d))
    cfg = json.load(open(os.path.join(paths[0], "config.json")))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                  "version": "gemm"}
    json.dump(cfg, open(os.path.join(paths[0], "config.json"), "w"))
    return dense, paths[0], paths[1]


def _hf(path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()


@torch.no_grad()
def _compare(ours_path, ref_path):
    rng = random.Random(1)
    prompts = [[rng.randrange(5, 150000) for _ in range(n)] for n in (7, 60, 200, 513, 31, 129, 300, 1000)]
    llm = LLM(ours_path, device="cuda", dtype="bfloat16", num_kv_blocks=2048, max_num_seqs=8)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=0))
    del llm
    ref32, ref16 = _hf(ref_path, torch.float32), _hf(ref_path, torch.bfloat16)
    d_ours, d_hf16 = [], []
    compared = mism = hf16_mism = 0
    gaps = []
    for prompt, out in zip(prompts, outs):
        gen = out.outputs[0].token_ids
        ids = torch.tensor([prompt + gen], device="cuda")
        lp32 = ref32(ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]
        lp16 = ref16(ids).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]
        pos = torch.arange(len(gen), device="cuda")
        gen_t = torch.tensor(gen, device="cuda")
        ours = torch.tensor([d[t].logprob for d, t in zip(out.outputs[0].logprobs, gen)], device="cuda")
        d_ours.append((ours - lp32[pos, gen_t]).abs())
        d_hf16.append((lp16[pos, gen_t] - lp32[pos, gen_t]).abs())
        top2 = lp32.topk(2, dim=-1).values
        for i, t in enumerate(gen):
            if float(top2[i, 0] - top2[i, 1]) < NEAR_TIE:
                break  # past the first near-tie the continuations may part
            compared += 1
            mism += int(int(lp32[i].argmax()) != t)
            hf16_mism += int(int(lp16[i].argmax()) != int(lp32[i].argmax()))
            if int(lp32[i].argmax()) != t:
                gaps.append(round(float(top2[i, 0] - top2[i, 1]), 3))
    del ref32, ref16
    torch.cuda.empty_cache()
    print(f"reference gaps at our mismatches: {gaps}; HF bf16 mismatches on the same positions: {hf16_mism}")
    return torch.cat(d_ours).cpu(), torch.cat(d_hf16).cpu(), compared, mism, hf16_mism


def _stats(d: torch.Tensor) -> tuple:
    return float(d.mean()), float(d.quantile(0.9)), float(d.max())


@pytest.mark.parametrize("form", ["bf16", "awq"])
def test_qwen25_shapes_match_transformers(ckpts, form):
    dense, awq, dequant = ckpts
    ours, ref = (dense, dense) if form == "bf16" else (awq, dequant)
    d_ours, d_hf16, compared, mism, hf16_mism = _compare(ours, ref)
    (mean, q90, top), (mean16, q90_16, top16) = _stats(d_ours), _stats(d_hf16)
    print(f"{form}: |dlogprob| vs HF fp32 over {d_ours.numel()} positions, ours mean {mean:.4f} p90 {q90:.4f} "
          f"max {top:.4f}; HF bf16 mean {mean16:.4f} p90 {q90_16:.4f} max {top16:.4f}; greedy tokens compared "
          f"before the first near-tie {compared}, mismatches {mism}")
    # bf16 rounding flips a few greedy choices of the float32 reference even in transformers'
    # own bf16 run; ours may flip about as many. The counts are a few in some 35 positions
    # (on an H200: ours 4 and 4, HF bf16's 1 and 4), where a split like 4 : 1 is chance, so the
    # bound is loose (2 x theirs + 3); the logprob bounds below carry the accuracy claim
    assert mism <= 2 * hf16_mism + 3, (mism, hf16_mism)
    assert compared >= 16  # the comparison is not vacuous
    # as close to float32 as transformers' bf16 run, on the mean and the 90th percentile. Not on
    # the max alone: at these sharp logits one bf16 flip moves a whole continuation, and the
    # max then swings (measured on the H200 with kernel families swapped for their references:
    # the max of ours 0.64-2.49 at a mean within 0.8-1.1x HF bf16's). Planted bugs
    # (decode attention missing the newest token; RMSNorm eps + 1e-2) failed the mean bound
    assert mean <= 1.2 * mean16 + 0.02, (mean, mean16)
    assert q90 <= 1.5 * q90_16 + 0.05, (q90, q90_16)
    assert top <= 3 * top16 + 0.1, (top, top16)
