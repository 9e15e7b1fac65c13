"""Tiny random checkpoints of real architectures (saved with transformers; AWQ by
round-to-nearest) with a byte-level BPE tokenizer trained here (English and Korean text)."""
from __future__ import annotations

import json
import os

import torch

TOKENIZER_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Meeting notes: the team discussed the budget, the roadmap and hiring plans for next quarter.",
    "Action items: Alice sends the report on Friday; Bob reviews the contract.",
    "회의록: 오늘 회의에서 예산과 일정, 채용 계획을 논의했습니다.",
    "결정 사항: 다음 주 금요일까지 보고서를 제출합니다. 감사합니다!",
    "What is the capital of France? Paris is the capital of France.",
    "日本語のテキストも少し含めます。東京は日本の首都です。",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _longrope(rotary_dim: int, original: int) -> dict:
    """longrope parameters (Phi-3 128k style) for a rotary of rotary_dim dims."""
    half = rotary_dim // 2
    return {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": original,
            "short_factor": [1.0 + 0.1 * i for i in range(half)], "long_factor": [1.5 + 0.5 * i for i in range(half)]}


def tiny_config(arch: str, vocab_size: int, **overrides):
    import transformers as tf

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, pad_token_id=0,
    )
    common.update(overrides)
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen2":
        common.setdefault("tie_word_embeddings", True)
        return tf.Qwen2Config(**common)
    if arch == "mistral":
        common.setdefault("sliding_window", None)
        return tf.MistralConfig(**common)
    if arch == "qwen3":  # head_dim 32 is not hidden / heads (16)
        common.setdefault("head_dim", 32)
        return tf.Qwen3Config(**common)
    if arch == "qwen3_moe":
        common.update({k: v for k, v in dict(head_dim=32, num_experts=8, num_experts_per_tok=2,
                                               moe_intermediate_size=32, norm_topk_prob=True).items()
                       if k not in overrides})
        return tf.Qwen3MoeConfig(**common)
    if arch == "phi3":  # Phi-4-mini style: partial rotary 0.75, longrope
        head_dim = common["hidden_size"] // common["num_attention_heads"]
        common.setdefault("partial_rotary_factor", 0.75)
        common.setdefault("original_max_position_embeddings", 64)
        rope = _longrope(int(head_dim * common["partial_rotary_factor"]), common["original_max_position_embeddings"])
        rope["partial_rotary_factor"] = common["partial_rotary_factor"]
        common.setdefault("rope_parameters", rope)
        return tf.Phi3Config(**common)
    if arch in ("gemma3", "gemma2"):
        common.update({k: v for k, v in dict(head_dim=32, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh",
                                               tie_word_embeddings=True).items() if k not in overrides})
        common.pop("hidden_act", None)
        return (tf.Gemma3TextConfig if arch == "gemma3" else tf.Gemma2Config)(**common)
    raise ValueError(arch)


def make_checkpoint(path: str, arch: str = "llama", seed: int = 0, **overrides) -> str:
    """Save a random model of `arch` with the tiny tokenizer into path."""
    from transformers import AutoModelForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = make_tokenizer()
    cfg = tiny_config(arch, overrides.pop("vocab_size", len(tok)), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # biases and Gemma's norms start at zero; make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or (arch.startswith("gemma") and "norm" in name):
                p.normal_(0, 0.2)
            elif arch.startswith("gemma") and "embed_tokens" in name:
                p.mul_(cfg.hidden_size**-0.5)  # Gemma scales them up by sqrt(hidden): keep the layers' share
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def llama128(path: str, vocab_size: int) -> str:
    """Untied Llama, hidden 128: room for AWQ groups of 64 per rank; the vocabulary need not split evenly."""
    from transformers import AutoModelForCausalLM

    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = tiny_config("llama", vocab_size, hidden_size=128, intermediate_size=256,
                          num_attention_heads=4, num_key_value_heads=2)
        torch.manual_seed(7)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
        make_tokenizer().save_pretrained(path)
    return path


def round_to_nearest_awq(src: str, dst: str, group: int) -> str:
    """AutoAWQ GEMM format by plain round-to-nearest per group (no calibration: parity
    between tensor-parallel sizes needs only the format)."""
    from safetensors.torch import load_file, save_file

    from llm_kernels import pack_awq_int4

    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    os.makedirs(dst)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, t in sd.items():
        if ".layers." not in name or not name.endswith("proj.weight"):
            out[name] = t
            continue
        w = t.t().float()  # [K, N]
        K, N = w.shape
        g = w.reshape(K // group, group, N)
        lo, hi = g.amin(1), g.amax(1)
        scale = ((hi - lo) / 15).clamp_min(1e-6)
        zero = (-lo / scale).round().clamp(0, 15)
        q = (g / scale[:, None] + zero[:, None]).round().clamp(0, 15).reshape(K, N)
        base = name[: -len(".weight")]
        out[base + ".qweight"] = pack_awq_int4(q.to(torch.int32))
        out[base + ".qzeros"] = pack_awq_int4(zero.to(torch.int32))
        out[base + ".scales"] = scale.half()
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                  "version": "gemm"}
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    make_tokenizer().save_pretrained(dst)
    return dst


def hf_greedy(path: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate on one prompt, float32, EOS stops."""
    from transformers import AutoModelForCausalLM

    model = _hf_model(path)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


_HF_CACHE: dict[str, object] = {}


def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    if path not in _HF_CACHE:
        _HF_CACHE[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _HF_CACHE[path]


def copy_edited(src: str, dst, config_file: str, edit_config=None) -> str:
    """A copy of the folder src at dst, its JSON `config_file` changed in place by edit_config(dict)."""
    import shutil

    shutil.copytree(src, dst)
    if edit_config:
        path = os.path.join(dst, config_file)
        with open(path) as f:
            config = json.load(f)
        edit_config(config)
        with open(path, "w") as f:
            json.dump(config, f)
    return str(dst)
